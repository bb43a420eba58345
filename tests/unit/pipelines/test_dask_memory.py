"""What bounds a Dask worker's memory under :class:`ColaflowDaskRunner`: partitions held as bytes
(:mod:`pipelines.runners.dask.parts`), no bundle state kept by a reused DoFn, and spilling to disk with
colaflow's worker settings (:func:`tests.support.local_engines.dask_spill_env`) on a real scheduler
and 2 workers on 127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import apache_beam as beam
import cloudpickle
import dask
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("distributed")
import dask.bag as db  # noqa: E402
from distributed import Client  # noqa: E402

from pipelines.runners.dask.parts import group, shuffle, spread  # noqa: E402
from pipelines.runners.dask.trim import PLUGIN_NAME, TrimMemory  # noqa: E402
from pipelines.io.frames import decode, decode_list, encode  # noqa: E402
from apache_beam.pipeline import PipelineVisitor  # noqa: E402
from apache_beam.runners.dask.overrides import _GroupByKeyOnly, dask_overrides  # noqa: E402
from pipelines.runners.dask.runner import ColaflowDaskRunner, _flatten, _LiftCombines, _single_key  # noqa: E402
from tests.support.local_engines import SPILL_TARGET, child_env, start_dask  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module


def _partitions(bag) -> list[list]:
    return [decode_list(part) for part in dask.compute(*bag.to_delayed(optimize_graph=False), scheduler="sync")]


@settings(max_examples=40, deadline=None)
@given(pairs=st.lists(st.tuples(st.sampled_from(["a", "b", "c", 7, (1, "x")]), st.integers()), max_size=60),
       parts=st.integers(1, 14), n=st.integers(1, 14))
def test_shuffle_groups_every_value_under_its_key_in_one_partition(pairs, parts, n):
    bag = db.from_sequence(pairs, npartitions=parts).map_partitions(encode)
    out = _partitions(shuffle(bag, n).map_partitions(group))
    assert len(out) == n
    grouped = [kv for part in out for kv in part]
    keys = [k for k, _ in grouped]
    assert len(keys) == len(set(keys))  # each key in exactly one partition, once
    expected: dict = {}
    for k, v in pairs:
        expected.setdefault(k, []).append(v)
    assert {k: sorted(vs) for k, vs in grouped} == {k: sorted(vs) for k, vs in expected.items()}


@settings(max_examples=40, deadline=None)
@given(items=st.lists(st.integers(), max_size=50), parts=st.integers(1, 4), n=st.integers(1, 9))
def test_spread_keeps_every_element_in_order_over_at_least_n_partitions(items, parts, n):
    bag = db.from_sequence(items, npartitions=parts).map_partitions(encode)
    out = _partitions(spread(bag, n))
    assert len(out) >= n
    assert [x for part in out for x in part] == items


def test_large_shuffles_take_two_stages_of_few_pieces():
    bag = db.from_sequence(range(100), npartitions=40).map_partitions(encode)
    pairs = bag.map_partitions(lambda part: encode([(x % 13, x) for x in decode(part)]))
    out = shuffle(pairs, 40)
    pieces = [k for k in dict(out.__dask_graph__()) if "-piece" in str(k[0])]
    assert 0 < len(pieces) <= 2 * 40 * 7 < 40 * 40  # 2 x partitions x ceil(sqrt(40)), not 40 x 40
    grouped = [kv for part in _partitions(out.map_partitions(group)) for kv in part]
    assert sorted((k, sorted(vs)) for k, vs in grouped) == [(k, list(range(k, 100, 13))) for k in range(13)]


@pytest.mark.parametrize("n", [12, 40])
def test_int_keys_below_the_partition_count_get_a_partition_each(n):
    # shard buckets 0..9: one bucket per group task, so no task holds two shards' samples
    bag = db.from_sequence([(b, i) for i in range(5) for b in range(10)], npartitions=12).map_partitions(encode)
    out = _partitions(shuffle(bag, n).map_partitions(group))
    assert sorted(len(part) for part in out if part) == [1] * 10
    assert sorted(k for part in out for k, _ in part) == list(range(10))


def test_flatten_joins_bags_of_one_partition_count_partition_by_partition():
    bags = [db.from_sequence(range(k, 40, 4), npartitions=n).map_partitions(encode) for k, n in
            [(0, 5), (1, 5), (2, 5), (3, 2)]]
    flat = _flatten(bags, "AllEvents")
    assert flat.npartitions == 5 + 2  # not 17: the group after it splits 7 inputs
    assert sorted(x for part in _partitions(flat) for x in part) == list(range(40))


def test_groups_inside_combine_globally_have_one_key_also_after_the_runner_api_round_trip():
    p = beam.Pipeline()
    nums = p | beam.Create(range(10))
    nums | "Total" >> beam.CombineGlobally(sum)
    nums | "Fanned" >> beam.CombineGlobally(sum).with_fanout(3)
    nums | "PerKey" >> beam.Map(lambda x: (x % 2, x)) | beam.CombinePerKey(sum)
    for pipeline in (p, beam.Pipeline.from_runner_api(p.to_runner_api(use_fake_coders=True), p.runner, p._options)):
        pipeline.replace_all([_LiftCombines()] + dask_overrides())
        groups = {}

        class Groups(PipelineVisitor):
            def visit_transform(self, node):
                if isinstance(node.transform, _GroupByKeyOnly):
                    groups[node.full_label.split("/")[0] + ("/pre" if "PreCombineFn" in node.full_label else "")] = \
                        _single_key(node)
        pipeline.visit(Groups())
        assert groups == {"Total": True, "Fanned": True, "Fanned/pre": False, "CombinePerKey(sum)": False}


def _dump(element, folder: str):
    with open(os.path.join(folder, uuid.uuid4().hex), "w") as f:
        json.dump(element, f)


def _read(folder) -> list:
    return [json.load(open(os.path.join(folder, n))) for n in sorted(os.listdir(folder))]


def _run(address: str, build, tmp_path, npartitions: int = 8):
    out = tmp_path / "out"
    out.mkdir()
    p = beam.Pipeline(runner=ColaflowDaskRunner(), options=PipelineOptions(
        [f"--dask_client_address={address}", f"--dask_npartitions={npartitions}"]))
    build(p, str(out))
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        result.client.close()
    return _read(out)


class _KeepsAcrossBundles(beam.DoFn):
    """Builds ``self.seen`` without resetting it in ``start_bundle``: reports its length per bundle."""

    def setup(self):
        self.setup_value = 42

    def process(self, x):
        self.seen = getattr(self, "seen", []) + [x]
        return []

    def finish_bundle(self):
        yield beam.transforms.window.GlobalWindows.windowed_value((len(self.seen), self.setup_value))


def test_reused_dofn_keeps_its_setup_state_but_not_a_bundles_state(tmp_path):
    engine = start_dask(tmp_path / "logs", workers=1, env=child_env())
    try:
        def build(p, out_dir):
            (p | beam.Create(range(400)) | beam.Reshuffle() | beam.ParDo(_KeepsAcrossBundles())
             | beam.Map(list) | beam.Map(_dump, out_dir))

        out = _run(engine.address, build, tmp_path)
    finally:
        engine.stop()
    # one worker thread runs all 8 bundles on one instance: state built by a bundle does not
    # reach the next (it would count 400 elements in the last bundle), setup's does
    assert sum(n for n, _ in out) == 400 and len(out) == 8
    assert {v for _, v in out} == {42}


def _blob(i: int) -> list[str]:
    return [f"{i}:{j}:" + "x" * 1000 for j in range(1000)]  # about 1 MB per input element


def _spilled(dask_worker) -> float:
    return dask_worker.data.cumulative_metrics.get(("disk-write", "bytes"), 0.0)


@pytest.mark.timeout(120)  # about 10 s; a worker paused on its own memory stalls the job for good
def test_workers_with_a_memory_limit_spill_held_partitions_and_finish(tmp_path):
    """120 MB of strings are held behind a side input (their count) on 2 workers limited to
    200 MB each: stored results beyond SPILL_TARGET of the limit go to disk and the job ends
    (dask's default thresholds pause a worker on its own memory and stall such a job)."""
    limit = 200_000_000
    engine = start_dask(tmp_path / "logs", workers=2, env=child_env(), memory_limit=str(limit))
    try:
        def build(p, out_dir):
            strings = p | beam.Create(range(120)) | beam.Reshuffle() | beam.FlatMap(_blob)
            count = strings | beam.combiners.Count.Globally()
            (strings | beam.Map(lambda s, n: (len(s), n), beam.pvalue.AsSingleton(count))
             | beam.CombineGlobally(lambda pairs: [sum(a for a, _ in pairs), max(n for _, n in pairs)])
             | beam.Map(_dump, out_dir))

        out = _run(engine.address, build, tmp_path)
        with Client(engine.address) as client:
            spilled = client.run(_spilled)
            worker_memory = client.run(lambda dask_worker: (
                dask_worker.memory_manager.memory_limit, dask_worker.memory_manager.memory_target_fraction,
                dask_worker.memory_manager.memory_spill_fraction, dask_worker.memory_manager.memory_pause_fraction))
            profiled = client.run(lambda dask_worker: len(dask_worker.profile_history) + len(dask_worker.profile_keys))
            trims = client.run(lambda dask_worker: (os.environ.get("PYTHONMALLOC"), dask_worker.plugins[PLUGIN_NAME].trims,
                                                    dask_worker.state.executed_count))
    finally:
        engine.stop()
    total = sum(len(s) for i in range(120) for s in _blob(i))
    assert out == [[total, 120_000]]
    assert set(worker_memory.values()) == {(limit, SPILL_TARGET, False, False)}  # no pause, no process-memory spill
    assert set(profiled.values()) == {0}  # no profiler call trees kept (dask_worker_env)
    # glibc's heap for Python objects, trimmed after every task the worker ran (pipelines.runners.dask.trim)
    assert {env for env, _, _ in trims.values()} == {"malloc"}
    assert all(n >= executed > 0 for _, n, executed in trims.values()), trims
    assert sum(spilled.values()) > 120e6 - 2 * SPILL_TARGET * limit  # what did not fit under the target



_FRAGMENTED_HEAP = """
from pipelines.runners.dask.trim import trim_heap

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

strings = [str(i) * 20 for i in range(2_000_000)]  # about 200 MB of small objects
survivors = strings[::64]  # one in 64 outlives the rest, on pages across the whole heap
del strings
before = rss_mb()
released = trim_heap()
print(before, rss_mb(), released)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim and /proc are glibc/Linux")
def test_trim_heap_returns_the_free_pages_between_survivors():
    """With ``PYTHONMALLOC=malloc`` (dask_spill_env), small objects freed among survivors stay
    resident until ``malloc_trim`` returns the free pages: what ``TrimMemory`` does per task."""
    out = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP], env=child_env(PYTHONMALLOC="malloc"),
                         capture_output=True, text=True, check=True).stdout.split()
    before, after, released = float(out[0]), float(out[1]), out[2]
    assert released == "True"
    assert before - after > 100, (before, after)  # most of the ~200 MB freed goes back to the OS


def test_trim_memory_plugin_trims_only_workers_on_glibcs_allocator(monkeypatch):
    plugin = TrimMemory()
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    plugin.setup(worker=None)
    plugin.transition("k", "executing", "memory")
    assert plugin.trims == 0  # CPython's own allocator: nothing measurable to trim, no cost
    monkeypatch.setenv("PYTHONMALLOC", "malloc")
    plugin.setup(worker=None)
    plugin.transition("k", "ready", "executing")
    plugin.transition("k", "executing", "memory")
    plugin.transition("k", "executing", "error")
    assert plugin.trims == (2 if sys.platform.startswith("linux") else 0)


_KEYS = st.recursive(st.one_of(st.booleans(), st.integers(), st.floats(), st.text(max_size=3), st.binary(max_size=3),
                               st.none()), lambda inner: st.tuples(inner, inner), max_leaves=4)


@settings(max_examples=200, deadline=None)
@given(a=_KEYS, b=_KEYS)
def test_group_key_tells_keys_apart_as_beams_encoding_does(a, b):
    from apache_beam.coders import FastPrimitivesCoder

    from pipelines.runners.dask.combine import group_key

    coder = FastPrimitivesCoder().as_deterministic_coder("test")
    assert (group_key(a) == group_key(b)) == (coder.encode(a) == coder.encode(b))
