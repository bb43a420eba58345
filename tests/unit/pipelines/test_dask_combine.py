"""The Dask runner's lifted combine: a bounded table of accumulators per bundle, exact results."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.runners.dask.combine import CombineTable, LiftedCombine, _merge
from pipelines.stages.exact_dedup import KeepSmallestId
from pipelines.stages.keys import DocKey


def _bundle(fn: CombineTable, elements) -> tuple[list, int]:
    """Run one bundle by hand: the emitted (key, accumulator) pairs and the largest table size."""
    fn.setup()
    fn.start_bundle()
    out, largest = [], 0
    for element in elements:
        out.extend(fn.process(element))
        largest = max(largest, len(fn._table))
    out.extend(wv.value for wv in fn.finish_bundle())
    return out, largest


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(-50, 50)), max_size=300), st.integers(1, 12))
def test_table_is_bounded_and_merges_to_the_exact_result(elements, max_keys):
    fn = CombineTable(beam.CombineFn.from_callable(sum), max_keys)
    out, largest = _bundle(fn, elements)
    assert largest <= max_keys
    grouped: dict = {}
    for key, acc in out:
        grouped.setdefault(key, []).append(acc)
    merged = dict(_merge(item, fn.combine_fn) for item in grouped.items())
    expected: dict = {}
    for key, value in elements:
        expected[key] = expected.get(key, 0) + value
    assert merged == expected


def test_oldest_tenth_is_evicted_when_full():
    fn = CombineTable(beam.CombineFn.from_callable(sum), 20)
    out, largest = _bundle(fn, [(k, 1) for k in range(21)] + [(0, 5)])
    assert largest == 20
    assert out[:2] == [(0, [1]), (1, [1])]  # compacted accumulators, evicted before key 20 came in; key 0 starts again
    assert (0, [5]) in out and len(out) == 22


def test_exact_dedup_keepers_across_evictions():
    docs = [DocKey(f"text {i % 40}", f"d{i:03d}", "s", "split", i, 0, 7) for i in range(200)]
    fn = CombineTable(KeepSmallestId(), 8)
    out, _ = _bundle(fn, [(d.hash, d) for d in docs])
    grouped: dict = {}
    for key, acc in out:
        grouped.setdefault(key, []).append(acc)
    assert len(out) > 40  # keys were evicted and came back
    for key, accs in grouped.items():
        _, (keeper, counts, members) = _merge((key, accs), fn.combine_fn)
        assert keeper.id == f"d{int(key.split()[1]):03d}" and counts == {"s": 5} and len(members) == 5


def test_lifted_combine_matches_combine_per_key_on_the_direct_runner():
    data = [(k % 13, k) for k in range(2000)]
    with beam.Pipeline() as p:
        pcoll = p | beam.Create(data)
        lifted = pcoll | "Lifted" >> LiftedCombine(sum)
        assert_that(lifted, equal_to([(k, sum(range(k, 2000, 13))) for k in range(13)]))
