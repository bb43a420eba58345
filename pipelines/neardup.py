"""Near-duplicate removal with MinHash and locality-sensitive hashing, as Beam transforms.

MinHash (Broder 1997, "On the resemblance and containment of documents") estimates the
Jaccard similarity of word-shingle sets; LSH banding (Leskovec, Rajaraman & Ullman, "Mining
of Massive Datasets", section 3.4) makes documents that agree on all rows of some band
candidates. Per band bucket, ``CombinePerKey(min)`` reduces the members' ids to the
smallest (the keeper) without holding the bucket; members are then compared with their
bucket's keeper only, so a document is dropped when some keeper with a smaller id has an
estimated Jaccard similarity ≥ ``threshold``. The outcome is the same on every runner.
"""
from __future__ import annotations

import functools
import hashlib

import apache_beam as beam
import numpy as np

from .config import DedupConfig
from .records import Doc
from .stats import EVENTS, event

_MERSENNE = np.uint64((1 << 61) - 1)
_SEED = 1234


@functools.lru_cache(maxsize=4)
def _permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(_SEED)
    a = rng.randint(1, 2**31 - 1, size=num_perm, dtype=np.int64).astype(np.uint64)
    b = rng.randint(0, 2**31 - 1, size=num_perm, dtype=np.int64).astype(np.uint64)
    return a, b


def shingles(text: str, n: int) -> set[str]:
    """Set of lower-cased word ``n``-grams (the whole text as one shingle when it has fewer than ``n`` words)."""
    words = text.lower().split()
    if len(words) < n:
        return {" ".join(words)}
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def minhash(text: str, cfg: DedupConfig) -> np.ndarray:
    """MinHash signature of ``text``: ``cfg.num_perm`` uint32 values (``(a*x + b) mod (2^61-1)``, low 32 bits)."""
    a, b = _permutations(cfg.num_perm)
    x = np.array([int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=4).digest(), "little")
                  for s in sorted(shingles(text, cfg.ngram))], dtype=np.uint64)
    values = ((x[:, None] * a[None, :] + b[None, :]) % _MERSENNE) & np.uint64(0xFFFFFFFF)
    return values.min(axis=0).astype(np.uint32)


def band_keys(signature: np.ndarray, bands: int) -> list[str]:
    """LSH bucket ids ``band:digest`` of a signature split into ``bands`` equal bands."""
    rows = len(signature) // bands
    return [f"{i}:{hashlib.blake2b(signature[i * rows:(i + 1) * rows].tobytes(), digest_size=8).hexdigest()}"
            for i in range(bands)]


def similarity(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Estimated Jaccard similarity: the fraction of equal MinHash values."""
    return float(np.mean(sig_a == sig_b))


def _signature(doc: Doc, cfg: DedupConfig) -> tuple[str, bytes]:
    return doc.id, minhash(doc.text, cfg).tobytes()


def _memberships(item: tuple[str, bytes], bands: int):
    doc_id, sig = item
    for key in band_keys(np.frombuffer(sig, dtype=np.uint32), bands):
        yield key, doc_id


def _candidates(item):
    _, grouped = item
    keepers = grouped["keeper"]
    if not keepers:
        return
    keeper = keepers[0]
    for doc_id in grouped["members"]:  # streamed; never materialised as a list
        if doc_id != keeper:
            yield keeper, doc_id


def _attach_keeper_sig(item):
    _, grouped = item
    for sig in grouped["sig"]:
        for member in grouped["member"]:
            yield member, sig


def _is_loser(item, threshold: float):
    doc_id, grouped = item
    for sig in grouped["sig"]:
        mine = np.frombuffer(sig, dtype=np.uint32)
        if any(similarity(mine, np.frombuffer(k, dtype=np.uint32)) >= threshold for k in grouped["keeper_sig"]):
            yield doc_id, 1
            return


def _drop_losers(item):
    _, grouped = item
    near = bool(grouped["loser"])
    for doc in grouped["doc"]:
        if near:
            yield event(doc.source, "filtered:near_duplicate")
        else:
            yield doc


class NearDedup(beam.PTransform):
    """``PCollection[Doc]`` → documents that are not near-duplicates of a smaller-id document.

    Shuffles carry ids only, except two joins that bring each candidate pair its signatures:
    (1) ``(band bucket, id)`` per band; (2) ``CombinePerKey(min)`` → bucket keeper; (3) members
    streamed past their keeper → candidate pairs; (4) keeper signature, then member signature,
    joined by id; (5) documents joined with the losers by id. Emits ``filtered:near_duplicate``
    events on tag ``events``.
    """

    def __init__(self, cfg: DedupConfig):
        super().__init__()
        if cfg.num_perm % cfg.bands:
            raise ValueError(f"dedup.num_perm={cfg.num_perm} must be a multiple of dedup.bands={cfg.bands}")
        self.cfg = cfg

    def expand(self, docs):
        sigs = docs | "Signature" >> beam.Map(_signature, self.cfg)
        members = sigs | "Bands" >> beam.FlatMap(_memberships, self.cfg.bands)
        keepers = members | "KeeperPerBucket" >> beam.CombinePerKey(min)
        pairs = ({"members": members, "keeper": keepers}
                 | "JoinBucket" >> beam.CoGroupByKey()
                 | "Candidates" >> beam.FlatMap(_candidates)
                 | "OncePerPair" >> beam.Distinct())
        with_keeper = ({"sig": sigs, "member": pairs}
                       | "JoinKeeperSig" >> beam.CoGroupByKey()
                       | "KeeperSig" >> beam.FlatMap(_attach_keeper_sig))
        losers = ({"sig": sigs, "keeper_sig": with_keeper}
                  | "JoinMemberSig" >> beam.CoGroupByKey()
                  | "Compare" >> beam.FlatMap(_is_loser, self.cfg.threshold))
        return ({"doc": docs | "KeyById" >> beam.Map(lambda d: (d.id, d)), "loser": losers}
                | "JoinDoc" >> beam.CoGroupByKey()
                | "Drop" >> beam.FlatMap(_drop_losers).with_outputs(EVENTS, main="docs"))
