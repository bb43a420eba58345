"""Near-dedup holds a bounded number of elements per key however large the largest LSH bucket:
3,000 near-copies of one document (every band bucket holds all of them) on the DirectRunner: a
bucket's keeper is combined (one member held) and joined with the bucket's members a part of about
``PART_MEMBERS`` at a time (3 parts here), never with the whole bucket (3,000 at one key). Its clustering
holds one node's neighbourhood per key, at most the node's cluster: 2,000 clusters hold no more than one
cluster's ids at a key (the union-find combine before held all 10,000)."""
from __future__ import annotations

import json

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.direct.direct_runner import DirectRunner
from apache_beam.testing.util import BeamAssertException, assert_that, equal_to

from pipelines.config import DedupConfig
from pipelines.stages.keys import doc_keys
from pipelines.stages.near_dedup import HELD_METRIC, NEIGHBOURS_METRIC, PART_MEMBERS, Clusters
from pipelines.records import Doc
from pipelines.accounting.stats import NAMESPACE, RUN_SOURCE
from tests.support.near import near_dedup

COPIES = 3_000  # each bucket in 3 parts (PART_MEMBERS): a whole bucket at one key would break the bound below
BASE = " ".join(f"w{i % 37} x{i % 11}" for i in range(50))  # 100 words


def all_but_few(counts):
    (n,) = counts
    if not COPIES - 20 <= n < COPIES:
        raise BeamAssertException(f"expected all but d00000 and at most 19 escapes dropped, got {n}")


def test_3k_near_copies_hold_a_bounded_number_per_key(tmp_path):
    cfg = DedupConfig(near=True, num_perm=16, bands=4)
    runner = DirectRunner()
    runner.is_interactive()  # skip the Prism download attempt (offline)
    p = beam.Pipeline(runner=runner)
    pairs = [pair for start in range(0, COPIES, 1000) for pair in doc_keys(
        [Doc(f"d{i:05d}", f"{BASE} variant {i}", "s") for i in range(start, start + 1000)], f"s{start}", 0, cfg)]
    out = near_dedup(p, pairs, cfg, str(tmp_path))
    listed = (out.duplicates | "Lines" >> beam.Flatten() | beam.Map(lambda line: json.loads(line)["duplicate_of"])
              | beam.Distinct())
    assert_that(listed, equal_to(["d00000"]), label="AllDuplicatesOfTheKeeper")
    # a few copies escape: 16 MinHash values estimate Jaccard 0.9 coarsely (LSH is approximate)
    dropped = out.dropped | beam.combiners.Count.Globally()
    assert_that(dropped, all_but_few, label="AllButFewDropped")
    counted = out.events | beam.Filter(lambda e: e[0][0] != RUN_SOURCE) | beam.Map(lambda e: e[1]) | beam.CombineGlobally(sum)
    # one number seen twice: as many filtered:near_duplicate events as dropped documents
    assert_that((dropped, counted) | "Both" >> beam.Flatten() | beam.combiners.Count.PerElement() | beam.Map(lambda kv: kv[1]),
                equal_to([2]), label="EveryDropCounted")
    result = p.run()
    result.wait_until_finish()
    steps = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE).with_name(HELD_METRIC))["distributions"]
    held = {step: max(d.committed.max for d in steps if f"/{step}" in d.key.step) for step in ("Compare", "Drop")}
    assert 1 <= held["Drop"] <= 2  # a document and its representative
    # a part of a bucket and its keeper: ids hashed into the 3 parts, about PART_MEMBERS each (the
    # whole bucket of 3,000 is never grouped; one part's members are not all of them either)
    assert PART_MEMBERS // 2 <= held["Compare"] <= PART_MEMBERS * 5 // 4
    # one cluster of ~3,000: its smallest id holds its neighbourhood, the whole cluster (ids only)
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
