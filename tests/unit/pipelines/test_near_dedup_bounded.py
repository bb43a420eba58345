"""Near-dedup holds a bounded number of elements per key however large the largest LSH bucket:
30,000 near-copies of one document (every band bucket holds all of them) on the DirectRunner. Its
clustering holds one node's neighbourhood per key, at most the node's cluster: 2,000 clusters hold
no more than one cluster's ids at a key (the union-find combine before held all 10,000)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from pipelines.config import DedupConfig
from pipelines.stages.keys import doc_keys
from pipelines.stages.near_dedup import HELD_METRIC, LIST_MAX, NEIGHBOURS_METRIC, Clusters, NearDedup
from pipelines.records import Doc
from pipelines.accounting.stats import NAMESPACE

COPIES = 30_000  # the bound below must stay under COPIES // 100
BASE = " ".join(f"w{i % 37} x{i % 11}" for i in range(50))  # 100 words


def _copies(start: int, n: int, cfg: DedupConfig):
    yield from doc_keys([Doc(f"d{i:05d}", f"{BASE} variant {i}", "s") for i in range(start, start + n)], f"s{start}", 0,
                        cfg)


def matches_all_but_few(actual):
    (ids,) = actual
    if ids[0] != "d00000" or len(ids) > 20:
        raise BeamAssertException(f"expected d00000 and at most 19 escapes, got {len(ids)}: {ids[:5]}")


def test_30k_near_copies_hold_a_bounded_number_per_key():
    cfg = DedupConfig(near=True, num_perm=16, bands=4)
    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    p = beam.Pipeline(runner=runner)
    pairs = p | beam.Create(range(0, COPIES, 1000)) | beam.FlatMap(_copies, 1000, cfg)
    docs = pairs | "Keys" >> beam.Keys()
    out = docs | NearDedup(cfg, lambda _: pairs | "Signatures" >> beam.Map(lambda pair: (pair[0].id, pair[1])))
    kept = out.docs | beam.Map(lambda d: d.id) | beam.combiners.ToList() | beam.Map(sorted)
    # a few copies escape: 16 MinHash values estimate Jaccard 0.9 coarsely (LSH is approximate)
    assert_that(kept, matches_all_but_few, label="KeeperAndFewEscapes")
    dropped = out.events | beam.Map(lambda e: e[1]) | beam.CombineGlobally(sum)
    total = ((kept | beam.Map(len), dropped) | beam.Flatten() | "Total" >> beam.CombineGlobally(sum))
    assert_that(total, equal_to([COPIES]), label="EveryCopyAccounted")
    result = p.run()
    result.wait_until_finish()
    steps = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(HELD_METRIC))["distributions"]
    assert all(any(f"/{name}" in d.key.step for d in steps) for name in ("SigPerPair", "HotKeepers", "Drop"))
    held = max(d.committed.max for d in steps)
    bound = cfg.bands * (LIST_MAX + 1) + 1
    assert 1 <= held <= bound < COPIES // 100  # the old join held ~all 30,000 for the keeper
    # one cluster of ~30,000: its smallest id holds its neighbourhood, the whole cluster (ids only)
    assert 1 <= _largest(result, NEIGHBOURS_METRIC) <= COPIES


def _largest(result, metric: str) -> int:
    found = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(metric))["distributions"]
    return max(d.committed.max for d in found)


def _cluster_pairs(first: int, n: int):
    """Clusters ``first .. first + n - 1`` of 5 ids each, a chain in a scrambled id order."""
    for c in range(first, first + n):
        ids = [f"k{(c * 7919 + j * 104729) % 1_000_003:07d}" for j in range(5)]
        yield from zip(ids, ids[1:])


def test_2000_clusters_hold_one_cluster_per_key():
    clusters = 2000
    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    p = beam.Pipeline(runner=runner)
    reps, events = (p | beam.Create(range(0, clusters, 100)) | beam.FlatMap(_cluster_pairs, 100)
                    | Clusters(rounds=8, resolve_max=0))
    assert_that(reps | beam.Distinct() | beam.combiners.Count.Globally(), equal_to([clusters * 4]), label="Dropped")
    assert_that(events, equal_to([]), label="Converged")
    result = p.run()
    result.wait_until_finish()
    assert 1 <= _largest(result, NEIGHBOURS_METRIC) <= 5  # 4 neighbours, or 4 children and a label
