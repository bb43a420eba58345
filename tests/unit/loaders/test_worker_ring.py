"""Loader workers' shared-memory rings (:mod:`loaders.worker.pool`): batches through a ring, even a
ring so small that a worker waits for credit on nearly every batch, equal the in-process ones
(ids, resume records, keys, the worker that packed them); no ring outlives its pool, whether the
epoch ends, the consumer raises or a worker is killed; a resume mid-epoch stays exact."""
from __future__ import annotations

import os
import signal
import tempfile

import numpy as np
import pytest

from loaders.pack.packed import BatchKeys, EncodedKeys, GroupKeys, KeyLookup, PackedBatch, PackingKeys, RefKeys
from loaders.rank.loader import build_text_loader
from loaders.worker.pool import WorkerError, WorkerPool
from tests.unit.loaders.test_loader import _cfg, write_text_shards

SMALL_RING = 8 * 1024  # about a dozen batches of _cfg's shape: the worker waits for credit again and again


def _ring_handles() -> list[str]:
    """This process's mappings and descriptors of worker rings, and the ring-like entries in /dev/shm."""
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        maps = [line.strip() for line in f if "colaflow-batches" in line]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if "colaflow-batches" in target:
            fds.append(target)
    shm = [n for n in os.listdir("/dev/shm") if "colaflow" in n] if os.path.isdir("/dev/shm") else []
    return maps + fds + shm


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ring_shards"))
    write_text_shards(d, n_docs=400, seed=3)
    return d


def _same(got, want) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.input_ids.equal(b.input_ids) and a.consumed.tolist() == b.consumed.tolist()
        assert list(a.keys) == list(b.keys) and a.worker == b.worker


@pytest.mark.parametrize("start", ["fork", "spawn"])
@pytest.mark.parametrize("ring", [None, SMALL_RING])
def test_batches_through_the_rings_equal_the_in_process_batches_and_no_ring_is_left(shards, start, ring,
                                                                                    monkeypatch):
    """Two workers, the default ring and one of 8 KiB (credit waits and wrap-arounds): the in-process
    batches, keys and worker numbers included; after the epoch no ring is mapped, open or named."""
    import loaders.worker.pool as pool

    if ring:
        monkeypatch.setattr(pool, "ring_bytes", lambda tokens: ring)
    before = _ring_handles()
    loader = build_text_loader(_cfg(shards, num_workers=2, worker_start=start))
    got = list(loader)
    _same(got, list(build_text_loader(_cfg(shards, num_workers=2), in_process=True)))
    assert not loader.pool.procs and _ring_handles() == before


def test_no_ring_is_left_when_the_consumer_raises(shards):
    """An exception in the training loop mid-epoch stops the workers and unmaps their rings."""
    before = _ring_handles()
    loader = build_text_loader(_cfg(shards, num_workers=2))

    def train():
        for i, _ in enumerate(loader):
            assert _ring_handles() != before  # the rings exist while the epoch runs
            if i == 3:
                raise RuntimeError("loss is nan")

    with pytest.raises(RuntimeError, match="loss is nan"):
        train()
    assert not loader.pool.procs and _ring_handles() == before


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_no_ring_is_left_when_a_worker_is_killed(shards, start):
    """A worker killed mid-epoch: a WorkerError, and neither its ring nor the other worker's stays."""
    before = _ring_handles()
    loader = build_text_loader(_cfg(shards, num_workers=2, micro_batch_size=1))
    loader.stream.start(loader.progress)
    pool = WorkerPool(loader.stream, 2, start, ring_size=SMALL_RING)
    batches = iter(pool)
    next(batches)
    os.kill(pool.procs[1].pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"loader worker 1 \(pid \d+\) exited with status -9"):
        for _ in batches:
            pass
    assert not pool.procs and _ring_handles() == before


def test_a_batch_larger_than_the_ring_is_a_worker_error(shards):
    """A record that cannot fit the ring fails the epoch with its size and the ring's, not a hang."""
    loader = build_text_loader(_cfg(shards, num_workers=1, micro_batch_size=64))
    loader.stream.start(loader.progress)
    pool = WorkerPool(loader.stream, 1, "fork", ring_size=4096)
    with pytest.raises(WorkerError, match=r"batch record of \d+ bytes is larger than the worker's ring \(4096 bytes\)"):
        list(pool)
    assert _ring_handles() == []


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_resume_mid_epoch_with_workers_and_small_rings_repeats_the_batches(shards, start, monkeypatch):
    """A state saved after 9 batches of 2 workers with 8 KiB rings resumes into exactly the rest of the epoch."""
    import loaders.worker.pool as pool

    monkeypatch.setattr(pool, "ring_bytes", lambda tokens: SMALL_RING)
    cfg = _cfg(shards, num_workers=2, micro_batch_size=1, worker_start=start)
    whole = list(build_text_loader(cfg))
    ld = build_text_loader(cfg)
    it = iter(ld)
    before = [next(it) for _ in range(9)]
    state = ld.state_dict()
    it.close()
    again = build_text_loader(cfg)
    again.load_state_dict(state)
    _same(before + list(again), whole)


class _Handle:
    """A shard handle with raw ids (``id_bytes_of``) and keys (their escaped form)."""

    has_ids = True

    def __init__(self, ids):
        self.ids = ids

    def id_bytes_of(self, index):
        from loaders.pack.packed import encode_strings
        return encode_strings([self.ids[i] for i in index.tolist()])

    def key_list(self):
        from shards.format.keys import escape_keys
        return escape_keys(self.ids)


class _Reader:
    """A reader of ``_Handle`` s by shard number that counts the shards it opens and keeps open."""

    def __init__(self, handles: dict):
        self.handles, self.opened, self.open = handles, [], set()

    def handle(self, shard):
        self.opened.append(shard)
        self.open.add(shard)
        return self.handles[shard]

    def retain(self, shards):
        self.open &= shards


def _two_shard_packing():
    """Two groups over shards 10 and 11, runs split at batch bounds; and the keys looked up in process."""
    a, b = _Handle(["a/0", "a.1", "ä 2"]), _Handle(["b/0", "b/1"])
    tables = {0: GroupKeys([a, b], np.array([10, 11]), np.array([0, 1, 0, 1, 0]), np.array([0, 0, 1, 1, 2])),
              7: GroupKeys([b], np.array([11]), np.array([0]), np.array([1]))}
    group = np.array([0, 0, 7, 0, 0, 0, 7, 0], np.int64)  # chunks in row order; doc 2 of group 0 crosses a batch
    index = np.array([0, 0, 0, 2, 2, 4, 0, 1], np.int64)
    return tables, group, index, {10: a, 11: b}


def test_keys_go_as_shard_references_and_read_as_the_looked_up_keys():
    """A worker's keys leave as (shard, document) references, one per run of a document's chunks
    (no id read); looked up in the parent they read as the keys looked up in process, batch by
    batch, also after a pickle; the lookup keeps no shard open."""
    import pickle

    tables, group, index, handles = _two_shard_packing()
    looked_up = [list(BatchKeys(PackingKeys(tables, group, index, [0, 4, 8]), i)) for i in range(2)]
    assert looked_up == [["a%2F0", "b%2F1", "a%2E1"], ["a%2E1", "%C3%A4%202", "b%2F1", "b%2F0"]]
    packing = PackingKeys(tables, group, index, [0, 4, 8])
    refs = [BatchKeys(packing, i).refs() for i in range(2)]
    assert [(s.tolist(), d.tolist()) for s, d in refs] == [([10, 11, 10], [0, 1, 1]), ([10, 10, 11, 11], [1, 2, 1, 0])]
    reader = _Reader(handles)
    lookup = KeyLookup(lambda: reader)
    sent = [RefKeys(s, d, lookup) for s, d in refs]
    assert reader.opened == []  # nothing is looked up until a batch's keys are read
    assert [list(k) for k in sent] == looked_up
    assert [list(pickle.loads(pickle.dumps(RefKeys(s, d, lookup)))) for s, d in refs] == looked_up
    assert reader.open == set()


def test_keys_pickled_from_a_packing_read_as_the_looked_up_keys():
    """Pickled (a batch crossing to another process without a ring), keys go as their raw ids, gathered
    once per packing, and read (after escaping) as the keys looked up in process."""
    import pickle

    tables, group, index, _ = _two_shard_packing()
    packing = PackingKeys(tables, group, index, [0, 4, 8])
    looked_up = [list(BatchKeys(PackingKeys(tables, group, index, [0, 4, 8]), i)) for i in range(2)]
    sent = [BatchKeys(packing, i).encoded() for i in range(2)]
    assert all(isinstance(k, EncodedKeys) and k.raw_ids for k in sent)
    assert [list(pickle.loads(pickle.dumps(k))) for k in sent] == looked_up
    batch = PackedBatch(np.zeros((1, 4), np.uint16), np.array([4], np.int32), np.array([1], np.int32),
                        BatchKeys(PackingKeys(tables, group, index, [0, 4, 8]), 1))
    assert list(pickle.loads(pickle.dumps(batch)).keys) == looked_up[1]


def test_keys_of_groups_that_all_read_one_shard_are_gathered_at_once():
    """Groups that all read the same shard (the usual case) take the one-gather path: the same keys."""
    a, b = _Handle(["x/0", "x/1", "x/2", "x/3"]), _Handle(["y/0"])
    tables = {0: GroupKeys([a], np.array([3]), np.zeros(2, np.int64), np.array([3, 1])),
              5: GroupKeys([a], np.array([3]), np.zeros(3, np.int64), np.array([0, 2, 1]))}
    group, index = np.array([5, 0, 0, 5, 5], np.int64), np.array([2, 0, 1, 0, 0], np.int64)
    assert tables[0].one_shard() is not None and GroupKeys([a, b], np.array([3, 4]), np.zeros(1, np.int64),
                                                           np.zeros(1, np.int64)).one_shard() is None
    sent = [list(BatchKeys(PackingKeys(tables, group, index, [0, 2, 5]), i).encoded()) for i in range(2)]
    assert sent == [list(BatchKeys(PackingKeys(tables, group, index, [0, 2, 5]), i)) for i in range(2)]
    assert sent == [["x%2F1", "x%2F3"], ["x%2F1", "x%2F0"]]


def test_a_worker_never_reads_ids_and_the_parent_looks_keys_up_only_when_read(shards, monkeypatch):
    """Forked workers with id gathering made to fail: the epoch runs, its batches carry key references,
    the parent opens no shard for keys until one batch's are read, and every batch's keys equal the
    in-process ones."""
    from loaders.pack import packed

    def no_ids(*args):
        raise AssertionError("a worker gathered raw ids")

    want = [list(b.keys) for b in build_text_loader(_cfg(shards, num_workers=2), in_process=True)]
    monkeypatch.setattr(packed.PackingKeys, "encoded", no_ids)  # inherited by the forked workers
    loader = build_text_loader(_cfg(shards, num_workers=2, worker_start="fork"))
    got = list(loader)
    assert all(isinstance(b.keys, RefKeys) for b in got)
    lookup = got[0].keys._lookup
    assert lookup._reader is None
    assert [list(b.keys) for b in got] == want
    assert not lookup._reader._open  # no shard stays open (or pinned) for keys


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_without_memfd_the_rings_are_unlinked_temporary_files(shards, start, monkeypatch):
    """Where ``os.memfd_create`` is missing (macOS), a ring is a temporary file without a name: the
    same batches, and nothing left once the epoch ends."""
    monkeypatch.delattr(os, "memfd_create")
    before = _ring_handles()
    loader = build_text_loader(_cfg(shards, num_workers=2, worker_start=start))
    got = list(loader)
    _same(got, list(build_text_loader(_cfg(shards, num_workers=2), in_process=True)))
    assert not loader.pool.procs and _ring_handles() == before
    assert not [n for n in os.listdir(tempfile.gettempdir()) if n.startswith("colaflow-batches-")]


def test_a_run_goes_through_the_ring_as_few_records_and_comes_back_equal():
    """A run is written as one record per stretch of one ids dtype within half the ring (here: 4
    records for 6 batches), and read back as the same batches: ids, shapes, lengths, rows, records,
    keys (looked up from their references)."""
    import io
    import pickle

    from loaders.pack.packed import records_only
    from loaders.worker.pool import BatchRing, _read_record, _RingWriter

    handle = _Handle([f"k{v}" for v in range(70002)])
    lookup = KeyLookup(lambda: _Reader({4: handle}))

    def batch(dtype, rows, width, v, worker=1):
        table = GroupKeys([handle], np.array([4]), np.zeros(2, np.int64), np.array([v, v - 1]))
        keys = BatchKeys(PackingKeys({0: table}, np.zeros(2, np.int64), np.arange(2), [0, 2]), 0)
        return PackedBatch(np.full((rows, width), v, dtype), np.full(rows, width, np.int32), np.ones(rows, np.int32),
                           keys, np.array([[v, 0, 1]] * rows), worker,
                           *((rows * width, True) if v % 2 else (None, None)))  # counted by the packer, or not

    ring = BatchRing(4096)
    read, write = os.pipe()
    out = io.BytesIO()
    run = [batch(np.uint16, 2, 8, 1), batch(np.uint16, 3, 8, 2), batch(np.int32, 2, 8, 70000),
           batch(np.int32, 30, 8, 70001), records_only([(9, -1, 0)], 8), batch(np.uint16, 1, 4, 3)]
    try:
        writer = _RingWriter(ring.view, read, out)
        writer.write_run(run)
        writer.send()
        out.seek(0)
        _, end, specs = pickle.load(out)
        assert [len(s[2]) for s in specs] == [2, 1, 1, 2]  # dtype changes; 30 int32 rows take half the ring
        got = [b for s in specs for b in _read_record(ring.view, s, lookup)]
        head = writer.head
    finally:
        writer = None  # its view of the ring must go before the ring unmaps
        os.close(read)
        os.close(write)
        ring.close()
    assert end == head and len(got) == len(run)
    for a, b in zip(got, run):
        assert a.ids.dtype == b.ids.dtype and a.ids.shape == b.ids.shape and np.array_equal(a.ids, b.ids)
        assert a.lens.tolist() == b.lens.tolist() and a.row_chunks.tolist() == b.row_chunks.tolist()
        assert a.consumed.tolist() == b.consumed.tolist() and list(a.keys) == list(b.keys) and a.worker == b.worker
        assert (a.doc_tokens, a.one_document) == (b.doc_tokens, b.one_document)
        assert a.ids.flags.writeable
