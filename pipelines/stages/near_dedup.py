"""Near-duplicate removal with MinHash and locality-sensitive hashing, as Beam transforms.

MinHash (Broder 1997, "On the resemblance and containment of documents") estimates the
Jaccard similarity of word-shingle sets; LSH banding (Leskovec, Rajaraman & Ullman, "Mining
of Massive Datasets", section 3.4) makes documents that agree on all rows of some band
candidates. The buckets are found on compact arrays, one per split, of each document's band hashes
(:func:`band_rows`), combined on disk (:class:`BandStats`); only the documents in a bucket of two
or more are read back, and per bucket the member of the smallest id (the keeper) is compared with
each other member (as datatrove pairs a bucket's first document with the rest). The pairs whose estimated
Jaccard similarity is ≥ ``threshold`` are the edges of a graph whose connected components are the
clusters (:class:`Clusters`: alternating large-star and small-star rounds, Kiveris et al. 2014,
"Connected Components in MapReduce and Beyond"): each cluster keeps its smallest id and drops the
rest, so a chain of near-copies A~B~C goes whole even where A and C alone would not match. The
outcome is the same on every runner.

Signatures are computed with numpy for a batch of documents at once: each word is hashed
once (CRC-32), shingle hashes are rolled from word hashes, and the ``num_perm`` hash
functions are multiply-shift hashes ``(a*x + b) mod 2^64 >> 32`` (Dietzfelbinger et al. 1997,
"A reliable randomized algorithm for the closest-pair problem"), evaluated by numpy
broadcasting over chunks of at most ``CHUNK_ROWS`` shingles (bounded memory).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import zlib
from collections import defaultdict
from typing import Iterator, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from pipelines.accounting.stats import EVENTS, NAMESPACE, RUN_SOURCE, event
from pipelines.config import DedupConfig
from pipelines.records import DUPLICATES, duplicate_record
from pipelines.stages.sorted_runs import BUCKET_BITS, SortedRun, SpilledRuns, read_range

CHUNK_ROWS = 8192  # shingles per broadcast: 8192 x num_perm x 8 bytes (7 MB at 112)
# members of a band bucket compared with its keeper at one key: a bucket of more documents is
# split into parts (1,000 members of 448-byte signatures: about 0.5 MB held per key)
PART_MEMBERS = 1000
_SEED = 1234
_ROLL = np.uint64(0x100000001B3)  # FNV-1 64-bit prime, multiplier of the rolling shingle hash
_MIX = np.uint64(0xFF51AFD7ED558CCD)  # MurmurHash3 fmix64 constant
HELD_METRIC = "neardup_held"
_HELD = Metrics.distribution(NAMESPACE, HELD_METRIC)  # elements held for one key after a grouping (Compare, Drop)
NEIGHBOURS_METRIC = "neardup_neighbours"
_NEIGHBOURS = Metrics.distribution(NAMESPACE, NEIGHBOURS_METRIC)  # one node's neighbourhood in a clustering round


@functools.lru_cache(maxsize=4)
def _permutations(num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(_SEED)
    a = rng.randint(0, 2**63 - 1, size=num_perm, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    b = rng.randint(0, 2**63 - 1, size=num_perm, dtype=np.int64).astype(np.uint64)
    return a, b


def shingle_hashes(text: str, n: int) -> np.ndarray:
    """32-bit hashes (held in uint64) of the lower-cased word ``n``-grams of ``text``, one per position.

    A text with fewer than ``n`` words has one shingle (all its words; no words → hash of nothing).
    Repeated shingles give repeated values; MinHash ignores repeats.
    """
    words = text.lower().split()
    w = np.fromiter((zlib.crc32(x.encode("utf-8")) for x in words), dtype=np.uint64, count=len(words))
    k = max(len(w) - n + 1, 1)
    h = np.zeros(k, dtype=np.uint64)
    for j in range(min(n, len(w))):
        h = h * _ROLL + w[j:j + k]  # wraps mod 2^64
    h ^= h >> np.uint64(33)
    h *= _MIX
    h ^= h >> np.uint64(33)
    return h >> np.uint64(32)


def _hashed(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (x[:, None] * a[None, :] + b[None, :]) >> np.uint64(32)


def minhash_batch(texts: list[str], cfg: DedupConfig) -> np.ndarray:
    """MinHash signatures of ``texts``: array ``(len(texts), cfg.num_perm)`` of uint32.

    Each row is independent of the others in the batch (batching only saves overhead).
    """
    a, b = _permutations(cfg.num_perm)
    out = np.empty((len(texts), cfg.num_perm), dtype=np.uint32)
    group, rows = [], 0

    def flush():
        x = np.concatenate([h for _, h in group])
        starts = np.cumsum([0] + [len(h) for _, h in group[:-1]])
        out[[i for i, _ in group]] = np.minimum.reduceat(_hashed(x, a, b), starts, axis=0)

    for i, text in enumerate(texts):
        h = shingle_hashes(text, cfg.ngram)
        if len(h) > CHUNK_ROWS:  # a long document alone, in chunks
            sig = np.full(cfg.num_perm, np.iinfo(np.uint64).max, dtype=np.uint64)
            for s in range(0, len(h), CHUNK_ROWS):
                sig = np.minimum(sig, _hashed(h[s:s + CHUNK_ROWS], a, b).min(axis=0))
            out[i] = sig
            continue
        if rows + len(h) > CHUNK_ROWS:
            flush()
            group, rows = [], 0
        group.append((i, h))
        rows += len(h)
    if group:
        flush()
    return out


def minhash(text: str, cfg: DedupConfig) -> np.ndarray:
    """MinHash signature of one text: ``cfg.num_perm`` uint32 values (see :func:`minhash_batch`)."""
    return minhash_batch([text], cfg)[0]


def band_keys(signature: np.ndarray | bytes, bands: int) -> list[bytes]:
    """LSH buckets of a signature split into ``bands`` equal bands: the band number (one byte)
    followed by the band's raw uint32 rows, so equal buckets mean exactly equal bands."""
    raw = signature if isinstance(signature, bytes) else np.ascontiguousarray(signature, dtype=np.uint32).tobytes()
    width = len(raw) // bands
    return [bytes((i,)) + raw[i * width:(i + 1) * width] for i in range(bands)]


# One document in one LSH band bucket: the band's 64-bit hash (:func:`band_hashes`), the document's
# content hash (two big-endian halves, as keys.HASH), its split (:func:`split_number`) and its index in
# the split's record. 40 bytes, not a Python object each.
BAND_ROW = np.dtype([("key", "u8"), ("t1", "u8"), ("t2", "u8"), ("split", "u8"), ("index", "u8")])
DOC_REF = np.dtype([("split", "u8"), ("index", "u8")])  # a document: its split number, its index there


def band_hashes(signatures: np.ndarray, bands: int) -> np.ndarray:
    """64-bit hashes of the LSH band buckets of ``signatures`` (as :func:`band_keys` splits them, the
    band number mixed in): equal buckets give equal hashes; unequal ones rarely do, and
    :class:`NearDedup` tells those apart by their :func:`band_keys`.

    Args:
        signatures: uint32 ``(documents, num_perm)``, ``num_perm`` a multiple of ``bands``.
        bands: LSH bands.
    Returns:
        uint64 ``(documents, bands)``.
    """
    rows = signatures.reshape(len(signatures), bands, -1).astype(np.uint64)
    h = np.broadcast_to(np.arange(1, bands + 1, dtype=np.uint64) * _MIX, rows.shape[:2]).copy()
    for j in range(rows.shape[2]):
        h = (h ^ rows[:, :, j]) * _ROLL  # wraps mod 2^64
    h ^= h >> np.uint64(33)
    h *= _MIX
    h ^= h >> np.uint64(33)
    return h


def split_number(split: str) -> int:
    """A split's id (:func:`pipelines.io.resume.split_id`) as the 64-bit number :data:`BAND_ROW` holds
    (BLAKE2b of any string, so two splits share one only by a 2^-64 chance, which costs comparisons,
    never a wrong outcome: the documents are told apart by id)."""
    return int.from_bytes(hashlib.blake2b(split.encode("utf-8"), digest_size=8).digest(), "big")


def band_rows(split: str, signatures: np.ndarray, texts: np.ndarray, bands: int) -> np.ndarray:
    """The :data:`BAND_ROW` s of one split's documents: ``bands`` per document.

    Args:
        split: the split's id.
        signatures: uint32 ``(documents, num_perm)``: row ``i`` is the document of index ``i``.
        texts: the documents' content hashes, fields ``h1`` and ``h2`` (uint64; :data:`pipelines.stages.keys.HASH`).
        bands: LSH bands.
    Returns:
        a :data:`BAND_ROW` array of ``documents * bands`` rows.
    """
    hashes = band_hashes(signatures, bands)
    rows = np.empty(hashes.size, BAND_ROW)
    rows["key"] = hashes.ravel()
    rows["t1"] = np.repeat(texts["h1"], bands)
    rows["t2"] = np.repeat(texts["h2"], bands)
    rows["split"] = split_number(split)
    rows["index"] = np.repeat(np.arange(len(signatures), dtype=np.uint64), bands)
    return rows


class NearCandidates(NamedTuple):
    """What :class:`BandStats` finds in all documents' :data:`BAND_ROW` s.

    Attributes:
        keys: uint64, sorted: the band hashes held by two documents or more.
        refs: :data:`DOC_REF`, sorted: the documents that hold one of them (the candidates).
        hot: uint64, sorted: those of ``keys`` held by more than :data:`PART_MEMBERS` documents.
        hot_parts: uint32, one per ``hot``: the parts its bucket is compared in, ``ceil(documents / PART_MEMBERS)``.
    """

    keys: np.ndarray
    refs: np.ndarray
    hot: np.ndarray
    hot_parts: np.ndarray

    def _span(self, split: str) -> slice:
        number = np.uint64(split_number(split))
        col = self.refs["split"]
        return slice(int(np.searchsorted(col, number, side="left")), int(np.searchsorted(col, number, side="right")))

    def any_in(self, split: str) -> bool:
        """Whether a document of ``split`` is a candidate."""
        span = self._span(split)
        return span.stop > span.start

    def shared(self, hashes: np.ndarray) -> np.ndarray:
        """Whether each of uint64 band hashes ``hashes`` is held by two documents or more (bool array;
        a binary search in the sorted ``keys``: ``np.isin`` would sort them again at every call)."""
        at = np.minimum(np.searchsorted(self.keys, hashes), max(len(self.keys) - 1, 0))
        return self.keys[at] == hashes if len(self.keys) else np.zeros(len(hashes), bool)

    def parts(self, hashes: np.ndarray) -> np.ndarray:
        """The parts the bucket of each of uint64 band hashes ``hashes`` is compared in: 1 but for the
        ``hot`` ones (int64 array)."""
        if not len(self.hot):
            return np.ones(len(hashes), np.int64)
        at = np.minimum(np.searchsorted(self.hot, hashes), len(self.hot) - 1)
        return np.where(self.hot[at] == hashes, self.hot_parts[at], 1).astype(np.int64)

    def in_split(self, split: str, count: int) -> np.ndarray:
        """Whether each of the ``count`` documents of ``split`` is a candidate (bool array)."""
        return np.isin(np.arange(count, dtype=np.uint64), self.refs["index"][self._span(split)])


class BandStats(SpilledRuns):
    """Combine :data:`BAND_ROW` arrays (one per split) into :class:`NearCandidates`, on disk
    (:class:`~pipelines.stages.sorted_runs.SpilledRuns`): a run holds its rows sorted, and the
    output is found one range of the band hash at a time over all runs, so it holds ``RUN_ROWS``
    rows and about 1/2**BUCKET_BITS of all rows (40 bytes a band a document), not one bucket
    membership object per band and document. A bucket's rows counted there tell how many parts its
    comparison is split into (:data:`PART_MEMBERS`): they are all of its documents, exact
    duplicates included, at least as many as its members.

    Args:
        folder: the spill folder (fsspec URL; ``OUT/.work/spill``), which every worker can reach.
        distinct_texts: a bucket is shared when it holds two distinct content hashes (``dedup.exact``:
            exact dedup keeps one copy of a text, so a text's copies alone make no candidate), else
            when it holds two documents.
    """

    def __init__(self, folder: str, distinct_texts: bool):
        super().__init__(folder)
        self.distinct_texts = distinct_texts

    def sections(self, rows: np.ndarray) -> list[np.ndarray]:
        """One section: ``rows`` sorted, in place (the run's own array)."""
        rows.sort()
        return [rows]

    def found(self, runs: list[SortedRun]) -> NearCandidates:
        """The shared band hashes, the documents that hold them and the hot ones' parts, a range of the
        hash at a time."""
        keys, refs = [np.empty(0, np.uint64)], [np.empty(0, DOC_REF)]
        hot, hot_parts = [np.empty(0, np.uint64)], [np.empty(0, np.uint32)]
        for b in range(1 << BUCKET_BITS):
            rows = read_range(runs, 0, BAND_ROW, b)  # sorted by band hash, then content hash
            if not len(rows):
                continue
            first = np.flatnonzero(np.concatenate([[True], rows["key"][1:] != rows["key"][:-1]]))
            last = np.concatenate([first[1:], [len(rows)]]) - 1
            if self.distinct_texts:  # a group's first and last rows differ in text when it holds two texts
                shared = (rows["t1"][first] != rows["t1"][last]) | (rows["t2"][first] != rows["t2"][last])
            else:
                shared = last > first
            keys.append(rows["key"][first[shared]])
            refs.append(rows[np.repeat(shared, last - first + 1)][["split", "index"]].astype(DOC_REF))
            parts = (last - first + PART_MEMBERS) // PART_MEMBERS  # ceil(rows / PART_MEMBERS)
            split = shared & (parts > 1)
            hot.append(rows["key"][first[split]])
            hot_parts.append(parts[split].astype(np.uint32))
        return NearCandidates(np.concatenate(keys), np.unique(np.concatenate(refs)), np.concatenate(hot),
                              np.concatenate(hot_parts))


class NearDoc(NamedTuple):
    """A candidate of near dedup (a document in a band bucket of two or more), as read from its split's record.

    Attributes:
        id: its id (made unique, :func:`pipelines.stages.payload.unique_keys`).
        source: the corpus it came from.
        split: the id of its split.
        index: its index in the split's record.
        signature: its MinHash signature (uint32 bytes); ``None`` where only its place is needed.
    """

    id: str
    source: str
    split: str
    index: int
    signature: bytes | None


class Member(NamedTuple):
    """A candidate in one of its band buckets: its id and signature (uint32 bytes)."""

    id: str
    signature: bytes


# Beam keys are plain tuples (deterministically encoded): a band bucket (:func:`band_keys`) with the
# number of parts it is compared in (:meth:`NearCandidates.parts`), and one part of a bucket.
Bucket = tuple[bytes, int]  # (bucket, parts)
BucketPart = tuple[bytes, int]  # (bucket, part), 0 <= part < parts


class DocPlace(NamedTuple):
    """Where a document lies: its split's id and its index in the split's record."""

    split: str
    index: int


class _SmallestId(beam.CombineFn):
    """Combine a bucket's :class:`Member` s into the one of the smallest id (its keeper): one member held."""

    def create_accumulator(self):
        """No member yet."""
        return None

    def add_input(self, acc, member: Member):
        """Keep the smaller id."""
        return member if acc is None or member.id < acc.id else acc

    def merge_accumulators(self, accumulators):
        """The smallest of the partial keepers."""
        best = None
        for acc in accumulators:
            if acc is not None:
                best = self.add_input(best, acc)
        return best

    def extract_output(self, acc):
        """The keeper."""
        return acc


def similarity(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Estimated Jaccard similarity: the fraction of equal MinHash values."""
    return float(np.mean(sig_a == sig_b))


def _buckets(doc: NearDoc, bands: int, candidates: NearCandidates) -> Iterator[tuple[Bucket, Member]]:
    """``doc``'s band buckets that hold another document (by hash): ``((bucket, parts), Member)``
    each, the bucket as :func:`band_keys` makes it, so that a hash shared by two unequal bands splits
    apart; ``parts`` (:meth:`NearCandidates.parts`, of the hash) is the same for all of a bucket's members."""
    sig = np.frombuffer(doc.signature, dtype=np.uint32)
    hashes = band_hashes(sig[None, :], bands)[0]
    member = Member(doc.id, doc.signature)
    for key, is_shared, parts in zip(band_keys(doc.signature, bands), candidates.shared(hashes),
                                     candidates.parts(hashes)):
        if is_shared:
            yield (key, int(parts)), member


def _part(member_id: str, parts: int) -> int:
    """The part of its bucket a member is compared in: a stable hash (CRC-32) of its id mod ``parts``,
    the same in every worker (Python's ``hash`` of a str differs per process)."""
    return zlib.crc32(member_id.encode("utf-8")) % parts


def _member_part(item: tuple[Bucket, Member]) -> tuple[BucketPart, Member]:
    """A member keyed by its part of its bucket."""
    (bucket, parts), member = item
    return (bucket, _part(member.id, parts)), member


def _keeper_parts(item: tuple[Bucket, Member]) -> Iterator[tuple[BucketPart, Member]]:
    """A bucket's keeper once per part of the bucket, where that part's members meet it."""
    (bucket, parts), keeper = item
    for part in range(parts):
        yield (bucket, part), keeper


def _similar(item: tuple[BucketPart, dict], threshold: float) -> Iterator[tuple[str, str]]:
    """One part of a bucket, ``{"keeper": [its keeper], "member": [its members]}``: each member against
    the keeper, ``(member id, keeper id)`` when similar. It holds the part: about
    :data:`PART_MEMBERS` members (a hash spreads them; one id's copies, ``dedup.exact`` off, go to one part)."""
    _, grouped = item
    (keeper,) = grouped["keeper"]  # every part of a bucket has its keeper, once
    members = list(grouped["member"])
    _held(len(members) + 1)
    sig = np.frombuffer(keeper.signature, dtype=np.uint32)
    for member in members:
        if member.id != keeper.id and similarity(sig, np.frombuffer(member.signature, dtype=np.uint32)) >= threshold:
            yield member.id, keeper.id


def _held(n: int) -> int:
    """Record ``n`` elements held at once for one key (Beam distribution ``colaflow/neardup_held``)."""
    _HELD.update(n)
    return n


def large_star(node: str, neighbours) -> Iterator[tuple[str, str]]:
    """The large-star step of Kiveris et al. 2014 ("Connected Components in MapReduce and Beyond")
    at one node: each neighbour larger than ``node`` is linked to the smallest id of the
    neighbourhood, ``node`` included.

    Args:
        node: a document id.
        neighbours: the ids it shares an edge with (repeats allowed).
    Returns:
        the new edges ``(larger id, smaller id)``.
    """
    nbrs = set(neighbours)
    _NEIGHBOURS.update(len(nbrs))
    least = min(nbrs | {node})
    return ((v, least) for v in nbrs if v > node)


def small_star(node: str, smaller) -> Iterator[tuple[str, str]]:
    """The small-star step of Kiveris et al. 2014 at one node: the node and its smaller neighbours
    are linked to the smallest of them.

    Args:
        node: a document id.
        smaller: its neighbours with a smaller id (at least one; repeats allowed).
    Returns:
        the new edges ``(larger id, smaller id)``.
    """
    nbrs = set(smaller)
    _NEIGHBOURS.update(len(nbrs))
    least = min(nbrs)
    return ((v, least) for v in nbrs | {node} if v != least)


def _both_ways(edge: tuple[str, str]):
    yield edge
    yield edge[1], edge[0]


def _labels(item):
    """A node's parents (smaller neighbours) after the last round → its label (the smallest parent)
    and, keyed by each parent, that label (for the parent's agreement check)."""
    node, parents = item
    parents = set(parents)
    _NEIGHBOURS.update(len(parents))
    label = min(parents)
    yield beam.pvalue.TaggedOutput("label", (node, label))
    for parent in parents:
        yield parent, label


def _disagreements(item):
    """At a node: its own label (none for a root: its id) against its children's labels; yields the
    pairs of labels that differ, which the rounds left unjoined."""
    node, grouped = item
    own = min(grouped["label"], default=node)  # at most one
    children = set(grouped["child"])
    _NEIGHBOURS.update(len(children) + 1)
    for label in children:
        if label != own:
            yield min(label, own), max(label, own)


class _CappedPairs(beam.CombineFn):
    """The distinct pairs while at most ``cap`` (``(set, n)``), else only their count (``(None, n)``,
    at least ``cap + 1``): bounded memory whatever the input."""

    def __init__(self, cap: int):
        self.cap = cap

    def create_accumulator(self):
        """No pair yet."""
        return set(), 0

    def _capped(self, pairs: set):
        return (None, len(pairs)) if len(pairs) > self.cap else (pairs, len(pairs))

    def add_input(self, acc, pair: tuple[str, str]):
        """Add one pair (or count it past the cap)."""
        pairs, n = acc
        if pairs is None:
            return None, n + 1
        pairs.add(pair)
        return self._capped(pairs)

    def merge_accumulators(self, accumulators):
        """Union of the sets, or the sum of the counts once any is past the cap."""
        pairs, n = set(), 0
        for acc_pairs, acc_n in accumulators:
            if pairs is None or acc_pairs is None:
                pairs, n = None, n + acc_n
            else:
                pairs |= acc_pairs
                pairs, n = self._capped(pairs)
        return pairs, n

    def extract_output(self, acc):
        """``(pairs or None, count)``."""
        return acc


class UnconvergedError(RuntimeError):
    """The clustering rounds left more disagreeing label pairs than ``dedup.near_resolve_max``."""


def settle(pairs: set[tuple[str, str]]) -> dict[str, str]:
    """Components of a small graph, in memory, by the same large-star and small-star steps repeated
    until nothing changes.

    Args:
        pairs: its edges ``(id, id)``.
    Returns:
        ``{id: the smallest id of its component}`` for every id but those smallest ids.
    """
    edges = {(max(a, b), min(a, b)) for a, b in pairs if a != b}
    while True:
        nbrs: dict[str, list[str]] = defaultdict(list)
        for a, b in edges:
            nbrs[a].append(b)
            nbrs[b].append(a)
        large = {e for node, ns in nbrs.items() for e in large_star(node, ns)}
        smaller: dict[str, list[str]] = defaultdict(list)
        for a, b in large:
            smaller[a].append(b)
        new = {e for node, ns in smaller.items() for e in small_star(node, ns)}
        if new == edges:  # a fixed point is a set of stars around each component's smallest id
            return dict(edges)
        edges = new


def _resolve(capped, rounds: int, cap: int):
    """The disagreeing pairs after the rounds → ``{label: its component's smallest id}``, logged and
    counted (``near_unresolved``, ``stats.json``'s ``run.near_unresolved_pairs``) when not empty.

    Args:
        capped: ``(pairs or None, count)`` from :class:`_CappedPairs`.
        rounds, cap: ``dedup.near_rounds`` and ``dedup.near_resolve_max``, for the messages.
    Returns:
        ``{label: its component's smallest id}`` for the labels that are not that id (empty when converged).
    Raises:
        UnconvergedError: more than ``cap`` pairs.
    """
    pairs, n = capped
    if not n:
        return {}
    if pairs is None:
        raise UnconvergedError(
            f"near-dedup clustering did not converge in dedup.near_rounds={rounds} rounds: more than "
            f"dedup.near_resolve_max={cap} label pairs still disagree; raise dedup.near_rounds (each round "
            f"about halves the longest chain of near-copies left)")
    logging.warning("near-dedup clustering did not converge in dedup.near_rounds=%d rounds: %d label pairs "
                    "still disagreed and were settled in one place (at most dedup.near_resolve_max=%d); "
                    "raise dedup.near_rounds", rounds, n, cap)
    return settle(pairs)


def _unresolved_event(capped):
    _, n = capped
    if n:
        yield event(RUN_SOURCE, "near_unresolved", n)


def _settled(item: tuple[str, str], settled: dict):
    node, label = item
    yield node, settled.get(label, label)


class Clusters(beam.PTransform):
    """``PCollection[(id, id)]`` (the similar pairs) → ``(id, representative)`` for every id of a
    cluster but its representative, the cluster's smallest id, and events (tag ``events``).

    Connected components by alternating large-star and small-star rounds (Kiveris et al. 2014,
    "Connected Components in MapReduce and Beyond"), unrolled ``rounds`` times since a Beam graph is
    static: each step groups the edges by node, so one key holds one node's current neighbourhood
    (at most its cluster, never the corpus); the rounds keep each cluster connected, and their fixed
    point is a star around the cluster's smallest id. After the last round each node's label is its
    smallest neighbour below it; the edges whose two ends disagree on their label are the clusters
    the rounds did not finish. Their label pairs, when at most ``resolve_max``, are settled in one
    place (:func:`settle`) and counted as ``near_unresolved``; more raise :class:`UnconvergedError`.
    The largest neighbourhood held is the Beam distribution ``colaflow/neardup_neighbours``.

    Args:
        rounds: large-star/small-star rounds (``dedup.near_rounds``).
        resolve_max: the most disagreeing label pairs settled after them (``dedup.near_resolve_max``).
    Returns:
        (from ``expand``) the representatives ``(id, smallest id of its cluster)`` and the events.
    Raises:
        UnconvergedError: in the run, more than ``resolve_max`` pairs disagree after the rounds.
    """

    def __init__(self, rounds: int, resolve_max: int):
        super().__init__()
        self.rounds, self.resolve_max = rounds, resolve_max

    def expand(self, pairs):
        """Unrolled rounds, labels, the agreement check and the settling of what is left."""
        edges = pairs | "Canonical" >> beam.Map(lambda e: (max(e), min(e))) | "NoLoops" >> beam.Filter(
            lambda e: e[0] != e[1])
        for r in range(self.rounds):
            edges = (edges
                     | f"BothWays{r}" >> beam.FlatMap(_both_ways)
                     | f"Neighbourhoods{r}" >> beam.GroupByKey()
                     | f"LargeStar{r}" >> beam.FlatMapTuple(large_star)
                     | f"Smaller{r}" >> beam.GroupByKey()
                     | f"SmallStar{r}" >> beam.FlatMapTuple(small_star))
        labelled = (edges
                    | "Parents" >> beam.GroupByKey()
                    | "Labels" >> beam.FlatMap(_labels).with_outputs("label", main="child"))
        capped = ({"label": labelled.label, "child": labelled.child}
                  | "JoinLabels" >> beam.CoGroupByKey()
                  | "Disagree" >> beam.FlatMap(_disagreements)
                  | "Unresolved" >> beam.CombineGlobally(_CappedPairs(self.resolve_max)))
        settled = capped | "Settle" >> beam.Map(_resolve, self.rounds, self.resolve_max)
        # A root of the last round that the settling joined to a smaller root has no label, so it
        # is represented from the settled map; a node with a label and in the map arrives twice,
        # with the same representative (both are its cluster's smallest id).
        reps = ((labelled.label | "Represent" >> beam.FlatMap(_settled, beam.pvalue.AsSingleton(settled)),
                 settled | "SettledRoots" >> beam.FlatMap(dict.items))
                | "AllReps" >> beam.Flatten())
        events = (capped | "UnresolvedEvent" >> beam.FlatMap(_unresolved_event).with_outputs(EVENTS))[EVENTS]
        return reps, events


def _drop_losers(item):
    """``(id, {"doc": [NearDoc], "rep": [representative]})`` → for a dropped document its
    :class:`DocPlace`, its ``filtered:near_duplicate`` event and its duplicates line."""
    _, grouped = item
    reps = list(grouped["rep"])  # at most 2, equal: the document's cluster representative (see Clusters)
    docs = list(grouped["doc"])  # one, or the copies of one text under one id (dedup.exact off)
    _held(len(reps) + len(docs))
    if not reps:
        return
    for doc in docs:
        yield event(doc.source, "filtered:near_duplicate")
        yield beam.pvalue.TaggedOutput(DUPLICATES, duplicate_record(doc.id, doc.source, reps[0], "near"))
        yield DocPlace(doc.split, doc.index)


class NearOutput(NamedTuple):
    """:class:`NearDedup`'s outputs, each a ``PCollection``.

    Attributes:
        dropped: the :class:`DocPlace` of every dropped document (the final pass leaves them out).
        events: ``((source, name), n)``: ``filtered:near_duplicate``, and ``near_unresolved`` (run-level).
        duplicates: a tuple of one PCollection of :func:`~pipelines.records.duplicate_record` lines (kind ``near``).
    """

    dropped: "beam.PCollection"
    events: "beam.PCollection"
    duplicates: tuple


class NearDedup(beam.PTransform):
    """``PCollection[BAND_ROW array]`` (:func:`band_rows`, one per split) → :class:`NearOutput`:
    every document of a near-duplicate cluster but its smallest id dropped, counted
    (``filtered:near_duplicate``) and listed (a :func:`~pipelines.records.duplicate_record` of kind
    ``near`` naming its cluster's smallest id).

    Per LSH band bucket, the member of the smallest id is the keeper, and each other member is
    compared with the keeper only (as datatrove pairs a bucket's first document with the rest);
    similarity ``>= threshold`` makes an edge; the connected components of the edges are the
    clusters (:class:`Clusters`). Steps:
    (1) :class:`BandStats` combines the splits' band rows on disk into the band hashes held by
    two documents or more (two texts under ``dedup.exact``) and those documents (:class:`NearCandidates`, a side input of two
    arrays); (2) ``candidates`` reads those documents back from the split records (a
    :class:`NearDoc` each, with its signature): a document in no shared bucket never crosses a
    grouping, a side input or a join; (3) each candidate's shared buckets (:func:`band_keys`, so
    that a hash shared by unequal bands splits apart), their keepers (``CombinePerKey``: one member
    held per bucket), and each member joined with its bucket's keeper (``CoGroupByKey``) to be
    compared: a bucket of more than :data:`PART_MEMBERS` documents (counted by :class:`BandStats`)
    is split into ``ceil(documents / PART_MEMBERS)`` parts, a member going to the part of a stable
    hash of its id and the keeper to every part, so a key holds one keeper and about
    :data:`PART_MEMBERS` members however hot the bucket (a side input of the keepers was held
    whole by every worker: one signature per shared bucket); (4) :class:`Clusters` over the similar
    pairs (``dedup.near_rounds`` rounds of two groupings by node, then the label check, what
    disagrees settled up to ``dedup.near_resolve_max`` pairs and counted as the run-level event
    ``near_unresolved``); (5) the candidates joined with their representative by id. What steps (2)
    to (5) hold in all grows with the candidates, not the corpus; what one key holds is bounded by
    :data:`PART_MEMBERS` (step 3), one cluster's ids (step 4) and one id's copies (step 5), and no
    worker holds a side input that grows with the candidates but the :class:`NearCandidates` arrays
    (8 bytes a shared bucket and 16 a candidate).

    Args:
        cfg: the dedup settings (``num_perm``, ``bands``, ``threshold``, ``near_rounds``,
            ``near_resolve_max``).
        folder: the spill folder (fsspec URL; ``OUT/.work/spill``) of :class:`BandStats`' runs.
        candidates: ``candidates(found)``: the PCollection of :class:`NearDoc` s of the documents that
            ``found`` (the :class:`NearCandidates` side input) marks, ids made unique and exact
            dedup's duplicates left out (the job reads them from the split records).

    Raises:
        ValueError: ``num_perm`` is not a multiple of ``bands`` (at construction).
        UnconvergedError: in the run, when the clustering leaves more than ``dedup.near_resolve_max``
            label pairs unjoined.
    """

    def __init__(self, cfg: DedupConfig, folder: str, candidates):
        super().__init__()
        if cfg.num_perm % cfg.bands:
            raise ValueError(f"dedup.num_perm={cfg.num_perm} must be a multiple of dedup.bands={cfg.bands}")
        self.cfg, self.folder, self.candidates = cfg, folder, candidates

    def expand(self, rows):
        """Drop, count and list every document of a near-duplicate cluster but its smallest id: a
        :class:`NearOutput` (not annotated: Beam warns about a return type that is not a PCollection)."""
        found = beam.pvalue.AsSingleton(
            rows | "Buckets" >> beam.CombineGlobally(BandStats(self.folder, distinct_texts=self.cfg.exact)))
        docs = self.candidates(found)
        members = docs | "Shared" >> beam.FlatMap(_buckets, self.cfg.bands, found)
        keepers = (members | "Keepers" >> beam.CombinePerKey(_SmallestId())
                   | "KeeperParts" >> beam.FlatMap(_keeper_parts))
        pairs = ({"keeper": keepers, "member": members | "MemberParts" >> beam.Map(_member_part)}
                 | "JoinKeeper" >> beam.CoGroupByKey()
                 | "Compare" >> beam.FlatMap(_similar, self.cfg.threshold))
        reps, unresolved = pairs | "Clusters" >> Clusters(self.cfg.near_rounds, self.cfg.near_resolve_max)
        out = ({"doc": docs | "KeyById" >> beam.Map(lambda d: (d.id, d._replace(signature=None))), "rep": reps}
               | "JoinDoc" >> beam.CoGroupByKey()
               | "Drop" >> beam.FlatMap(_drop_losers).with_outputs(EVENTS, DUPLICATES, main="dropped"))
        events = (out[EVENTS], unresolved) | "NearEvents" >> beam.Flatten()
        return NearOutput(dropped=out.dropped, events=events, duplicates=(out[DUPLICATES],))
