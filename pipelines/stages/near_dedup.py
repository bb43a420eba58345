"""Near-duplicate removal with MinHash and locality-sensitive hashing, as Beam transforms.

MinHash (Broder 1997, "On the resemblance and containment of documents") estimates the
Jaccard similarity of word-shingle sets; LSH banding (Leskovec, Rajaraman & Ullman, "Mining
of Massive Datasets", section 3.4) makes documents that agree on all rows of some band
candidates. Per band bucket, a combiner reduces the members' ids to the smallest (the
keeper) without holding the bucket; the candidate pairs are each bucket's keeper with its other
members (as datatrove pairs a bucket's first document with the rest). The pairs whose estimated
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
import logging
import zlib
from collections import defaultdict
from typing import Iterator, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from pipelines.accounting.stats import EVENTS, NAMESPACE, RUN_SOURCE, event
from pipelines.config import DedupConfig
from pipelines.records import DUPLICATES, DedupOutput, duplicate_record

LIST_MAX = 64  # bucket members listed by the combiner before a bucket counts as hot
PARTITION_DOCS = 50_000  # documents whose band buckets share one BucketTable accumulator
CHUNK_ROWS = 8192  # shingles per broadcast: 8192 x num_perm x 8 bytes (7 MB at 112)
_SEED = 1234
_ROLL = np.uint64(0x100000001B3)  # FNV-1 64-bit prime, multiplier of the rolling shingle hash
_MIX = np.uint64(0xFF51AFD7ED558CCD)  # MurmurHash3 fmix64 constant
HELD_METRIC = "neardup_held"
_HELD = Metrics.distribution(NAMESPACE, HELD_METRIC)  # elements held for one key after a grouping
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


def partitions(num_docs: int) -> int:
    """Partitions per band: about ``PARTITION_DOCS`` documents' buckets each (at least 1)."""
    return max(1, -(-num_docs // PARTITION_DOCS))


class Membership(NamedTuple):
    """A document in one LSH band bucket (:func:`band_keys`)."""

    bucket: bytes
    doc_id: str


class BucketEntry(NamedTuple):
    """A :class:`BucketTable` entry of a bucket with more than one member.

    Attributes:
        count: members of the bucket.
        ids: their ids while at most ``list_max`` (unsorted, repeats possible), else ``None`` (a hot bucket).
        keeper: the smallest id.
    """

    count: int
    ids: list[str] | None
    keeper: str


class BucketTable(beam.CombineFn):
    """Combine the :class:`Membership` s of one band partition into a table ``{bucket: id}`` (one
    member) or ``{bucket: BucketEntry}``.

    Ids are listed while a bucket has at most ``list_max`` members (else ``None``: a hot
    bucket), so an entry is bounded, and a partition holds about ``PARTITION_DOCS`` buckets
    (:func:`partitions`), so the accumulator is bounded too. Keying by partition instead of by
    bucket lets the runner pre-combine memberships where they are made: a shuffle moves one
    table per partition, not one element per (document, band).
    """

    def __init__(self, list_max: int):
        self.list_max = list_max

    def create_accumulator(self):
        """An empty table ``{bucket bytes: entry}``."""
        return {}

    def _add(self, table: dict, bucket: bytes, entry) -> None:
        old = table.get(bucket)
        if old is None:
            table[bucket] = entry
            return
        if isinstance(old, str):  # a bucket of one member is its id alone: most buckets, kept small
            old = BucketEntry(1, [old], old)
        if isinstance(entry, str):
            entry = BucketEntry(1, [entry], entry)
        ids = None if old.ids is None or entry.ids is None or len(old.ids) + len(entry.ids) > self.list_max \
            else old.ids + entry.ids
        table[bucket] = BucketEntry(old.count + entry.count, ids, min(old.keeper, entry.keeper))

    def add_input(self, acc, member: Membership):
        """Add one membership to the table."""
        self._add(acc, member.bucket, member.doc_id)
        return acc

    def merge_accumulators(self, accumulators):
        """Merge partial tables bucket by bucket (member lists capped at ``list_max``)."""
        accumulators = iter(accumulators)
        out = next(accumulators)
        for acc in accumulators:
            for bucket, entry in acc.items():
                self._add(out, bucket, entry)
        return out

    def extract_output(self, acc):
        """The partition's table: per bucket a doc id, or a :class:`BucketEntry`."""
        return acc


def similarity(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Estimated Jaccard similarity: the fraction of equal MinHash values."""
    return float(np.mean(sig_a == sig_b))


def _memberships(item: tuple[str, bytes], bands: int, num_docs: int):
    doc_id, sig = item
    parts = partitions(num_docs)
    for key in band_keys(sig, bands):
        yield key[0] * parts + int.from_bytes(key[1:5], "little") % parts, Membership(key, doc_id)


def _bucket_pairs(item):
    _, table = item
    for bucket, entry in table.items():  # order is irrelevant: pairs are made distinct downstream
        if isinstance(entry, str):
            continue
        if entry.ids is None:  # a hot bucket: its pairs come from the side-input pass
            yield beam.pvalue.TaggedOutput("hot", (bucket, entry.keeper))
            continue
        for doc_id in sorted(set(entry.ids)):
            if doc_id != entry.keeper:
                yield entry.keeper, doc_id


def _held(n: int) -> int:
    """Record ``n`` elements held at once for one key (Beam distribution ``colaflow/neardup_held``)."""
    _HELD.update(n)
    return n


class HotKeeper(NamedTuple):
    """The keeper of a hot bucket: its id and MinHash signature (uint32 bytes)."""

    id: str
    signature: bytes


def _hot_keepers(item):
    """``(keeper id, {"sig": [its signature], "hot": [its hot buckets]})`` → ``(bucket, HotKeeper)``."""
    keeper, grouped = item
    sigs, hot = list(grouped["sig"]), list(grouped["hot"])  # 1 signature, at most ``bands`` buckets
    _held(len(sigs) + len(hot))
    for sig in sigs:
        for bucket in hot:
            yield bucket, HotKeeper(keeper, sig)


def _hot_losers(item: tuple[str, bytes], bands: int, threshold: float, hot: dict):
    """A document against the keeper of each hot bucket it is in: ``(doc id, keeper)`` when similar."""
    if not hot:  # the usual case: no bucket over LIST_MAX members
        return
    doc_id, sig = item
    for key in band_keys(sig, bands):
        keeper = hot.get(key)
        if keeper is not None and keeper.id != doc_id and similarity(
                np.frombuffer(keeper.signature, dtype=np.uint32), np.frombuffer(sig, dtype=np.uint32)) >= threshold:
            yield doc_id, keeper.id


_AS_KEEPER, _AS_MEMBER = 0, 1  # which side of a candidate pair a signature is: (side, signature)


def _sig_per_pair(item):
    doc_id, grouped = item
    as_keeper, as_member = list(grouped["as_keeper"]), list(grouped["as_member"])
    _held(len(as_keeper) + len(as_member) + 1)  # listed buckets only: <= bands * (LIST_MAX + 1)
    for sig in grouped["sig"]:
        for member in as_keeper:
            yield (doc_id, member), (_AS_KEEPER, sig)
        for keeper in as_member:
            yield (keeper, doc_id), (_AS_MEMBER, sig)


def _compare(item, threshold: float):
    (keeper, member), sides = item
    sigs = dict(sides)
    if len(sigs) == 2 and similarity(np.frombuffer(sigs[_AS_KEEPER], dtype=np.uint32),
                                     np.frombuffer(sigs[_AS_MEMBER], dtype=np.uint32)) >= threshold:
        yield member, keeper


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
    _, grouped = item
    reps = list(grouped["rep"])  # at most 2, equal: the document's cluster representative (see Clusters)
    _held(len(reps) + 1)
    for doc in grouped["doc"]:
        if reps:
            yield event(doc.source, "filtered:near_duplicate")
            yield beam.pvalue.TaggedOutput(DUPLICATES, duplicate_record(doc.id, doc.source, reps[0], "near"))
        else:
            yield doc


class NearDedup(beam.PTransform):
    """``PCollection[DocKey]`` (:class:`~pipelines.stages.keys.DocKey` s) → :class:`~pipelines.records.DedupOutput`:
    one per cluster of near-duplicates (its smallest id), ``filtered:near_duplicate`` events, and one
    :func:`~pipelines.records.duplicate_record` line (kind ``near``) per dropped document, naming
    its cluster's kept representative.

    Shuffles carry ids, plus signatures where a comparison needs them:
    (1) ``(band partition, (bucket, id))`` per band; (2) ``CombinePerKey(BucketTable)`` → per
    bucket the smallest id (the keeper) and, for buckets of at most ``LIST_MAX`` members, all
    members; (3) listed buckets → candidate pairs ``(keeper, member)``, signatures joined with
    the pairs by id (as keeper and as member), the two signatures of each pair grouped by the pair
    and compared; (4) hot buckets (more than ``LIST_MAX`` members): each keeper's signature is
    joined to its hot buckets by the keeper's id, and that side input (hot buckets only: at most
    ``bands * documents / LIST_MAX`` entries) is read by a pass over all signatures that compares
    each member with the keeper directly, so a hot bucket's members are never grouped or paired;
    (5) the similar pairs of (3) and (4) are the edges of :class:`Clusters` (``dedup.near_rounds``
    rounds of two groupings by node, then a check that every edge's ends agree on their label,
    what disagrees settled up to ``dedup.near_resolve_max`` pairs and counted as the run-level
    event ``near_unresolved``); (6) documents joined with their cluster's representative by id.

    Memory per key is bounded whatever the size of the largest bucket: every grouping holds at
    most ``bands * (LIST_MAX + 1) + 1`` elements for one key (a document is keeper or member of
    at most ``bands`` listed buckets of at most ``LIST_MAX`` members; a keeper of at most
    ``bands`` hot buckets; a dropped document has at most two copies of its representative). The
    largest count held is reported as the Beam distribution ``colaflow/neardup_held``. The
    clustering of (5) holds one node's neighbourhood (ids) per key, at most the node's cluster,
    never the corpus (``colaflow/neardup_neighbours``); the settling after it holds at most
    ``dedup.near_resolve_max`` pairs.

    Args:
        cfg: the dedup settings (``num_perm``, ``bands``, ``threshold``, ``near_rounds``,
            ``near_resolve_max``).
        signatures: ``signatures(docs)``: the PCollection of ``(id, MinHash signature as uint32
            bytes)`` of the documents ``docs`` (the job reads them from the split records, where
            Work put them, so they cross no global step before this one).

    Raises:
        ValueError: ``num_perm`` is not a multiple of ``bands`` (at construction).
        UnconvergedError: in the run, when the clustering leaves more than ``dedup.near_resolve_max``
            label pairs unjoined.
    """

    def __init__(self, cfg: DedupConfig, signatures):
        super().__init__()
        if cfg.num_perm % cfg.bands:
            raise ValueError(f"dedup.num_perm={cfg.num_perm} must be a multiple of dedup.bands={cfg.bands}")
        self.cfg, self.signatures = cfg, signatures

    def expand(self, docs):
        """Drop, count and list every document of a near-duplicate cluster but its smallest id: a
        :class:`~pipelines.records.DedupOutput` (not annotated: Beam warns about a return type that is not a PCollection)."""
        sigs = self.signatures(docs)
        num_docs = docs | "Count" >> beam.combiners.Count.Globally()
        buckets = (sigs
                   | "Bands" >> beam.FlatMap(_memberships, self.cfg.bands, beam.pvalue.AsSingleton(num_docs))
                   | "Buckets" >> beam.CombinePerKey(BucketTable(LIST_MAX))
                   | "Pairs" >> beam.FlatMap(_bucket_pairs).with_outputs("hot", main="pairs"))
        pairs = buckets.pairs | "OncePerPair" >> beam.Distinct()
        listed_losers = ({"sig": sigs, "as_keeper": pairs,
                          "as_member": pairs | "ByMember" >> beam.KvSwap()}
                         | "JoinSig" >> beam.CoGroupByKey()
                         | "SigPerPair" >> beam.FlatMap(_sig_per_pair)
                         | "PerPair" >> beam.GroupByKey()
                         | "Compare" >> beam.FlatMap(_compare, self.cfg.threshold))
        hot = ({"sig": sigs, "hot": buckets.hot | "ByKeeper" >> beam.KvSwap()}
               | "JoinKeeperSig" >> beam.CoGroupByKey()
               | "HotKeepers" >> beam.FlatMap(_hot_keepers))
        hot_losers = sigs | "HotLosers" >> beam.FlatMap(_hot_losers, self.cfg.bands, self.cfg.threshold,
                                                        beam.pvalue.AsDict(hot))
        reps, unresolved = ((listed_losers, hot_losers)
                            | "AllPairs" >> beam.Flatten()
                            | "Clusters" >> Clusters(self.cfg.near_rounds, self.cfg.near_resolve_max))
        out = ({"doc": docs | "KeyById" >> beam.Map(lambda d: (d.id, d)), "rep": reps}
               | "JoinDoc" >> beam.CoGroupByKey()
               | "Drop" >> beam.FlatMap(_drop_losers).with_outputs(EVENTS, DUPLICATES, main="docs"))
        events = (out[EVENTS], unresolved) | "NearEvents" >> beam.Flatten()
        return DedupOutput(docs=out.docs, events=events, duplicates=(out[DUPLICATES],))
