"""Global order and split logic, directly (no shards): exactly once, world-size independence, resume."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.order.sample_order import SampleOrder, permutation
from loaders.order.split import consumer_items, plan_nodes, plan_split
from loaders.order.progress import Progress, merge_states

shard_counts = st.lists(st.integers(0, 40), min_size=1, max_size=12)
KEY = {"seed": 0}


def _all_items(order, n_consumers, num_nodes=1, **kw):
    """Every consumer's items (the node plan made once, as each consumer would make it)."""
    plan = plan_nodes(order, num_nodes, n_consumers, kw.get("start", 0), kw.get("skip"), kw.get("remainder", "uneven"))
    return [list(consumer_items(order, c, n_consumers, num_nodes=num_nodes, plan=plan, **kw)) for c in range(n_consumers)]


def test_permutation_is_fixed_and_valid():
    p = permutation(1000, 7, 3)
    assert sorted(p.tolist()) == list(range(1000))
    assert p.tolist() == permutation(1000, 7, 3).tolist()
    assert p.tolist() != permutation(1000, 7, 4).tolist()
    # pinned values: the order must never change between numpy versions (checkpoints depend on it)
    assert permutation(8, 0, 0).tolist() == [0, 7, 2, 5, 4, 6, 3, 1]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 5000), seed=st.integers(0, 2**32), epoch=st.integers(0, 5))
def test_permutation_equals_the_stable_sort_it_was_defined_by(n, seed, epoch):
    """``permutation`` sorts its keys with numpy's default sort, not the stable sort it was written with:
    the keys are distinct, so checkpoints taken before see the same order."""
    from loaders.order.sample_order import _GOLDEN, _stream_seed, splitmix64

    with np.errstate(over="ignore"):
        keys = splitmix64(np.arange(n, dtype=np.uint64) * _GOLDEN + _stream_seed(seed, epoch, 1))
    assert len(np.unique(keys)) == n
    assert permutation(n, seed, epoch, 1).tolist() == np.argsort(keys, kind="stable").tolist()


@settings(max_examples=50, deadline=None)
@given(parts=st.lists(st.integers(-2**63, 2**64 - 1), max_size=5))
def test_stream_seed_in_python_ints_is_the_numpy_chain(parts):
    """The stream seed computed with Python ints is SplitMix64 chained over ``uint64`` arrays (as written first)."""
    from loaders.order.sample_order import _stream_seed, splitmix64

    h = np.uint64(0)
    for p in parts:
        h = splitmix64(np.array([h ^ np.uint64(p & 0xFFFFFFFFFFFFFFFF)], dtype=np.uint64))[0]
    assert _stream_seed(*parts) == h


def test_argsort_distinct_with_and_without_shared_high_bits():
    """The tagged sort gives argsort's order; keys sharing their high bits (only the low ones differ)
    take the argsort path and are still ordered by their low bits."""
    from loaders.order.sample_order import argsort_distinct

    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**63, 4096, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    assert argsort_distinct(keys).tolist() == np.argsort(keys, kind="stable").tolist()
    close = np.array([5 << 40 | 3, 5 << 40 | 1, 5 << 40 | 2, 1], np.uint64)  # 2 index bits: the first three collide
    assert argsort_distinct(close).tolist() == [3, 1, 2, 0]
    assert argsort_distinct(np.zeros(0, np.uint64)).tolist() == []


@settings(max_examples=60, deadline=None)
@given(counts=shard_counts, seed=st.integers(0, 2**32), epoch=st.integers(0, 5), block=st.integers(1, 50),
       world=st.integers(1, 8), workers=st.integers(0, 4), nodes=st.sampled_from([1, 2, 4]))
def test_every_sample_exactly_once(counts, seed, epoch, block, world, workers, nodes):
    """Also when the consumers are on several nodes (each node reading its own shards)."""
    order = SampleOrder(counts, seed, epoch, block=block)
    nodes = nodes if world % nodes == 0 else 1
    n = world * max(workers, 1)
    items = _all_items(order, n, num_nodes=nodes)
    flat = [it for cons in items for it in cons]
    assert sorted(p for p, _, _ in flat) == list(range(sum(counts)))
    assert sorted((s, i) for _, s, i in flat) == sorted((s, i) for s, c in enumerate(counts) for i in range(c))
    sizes = [len(c) for c in items]
    assert max(sizes) - min(sizes) <= 1
    for cons in items:  # each consumer reads in global-position order
        assert [p for p, _, _ in cons] == sorted(p for p, _, _ in cons)


@settings(max_examples=40, deadline=None)
@given(counts=shard_counts, seed=st.integers(0, 100), block=st.integers(1, 50),
       world=st.integers(1, 8), workers=st.integers(0, 4))
def test_order_independent_of_world_size(counts, seed, block, world, workers):
    order = SampleOrder(counts, seed, 1, block=block)
    by_pos = {p: (s, i) for cons in _all_items(order, world * max(workers, 1)) for p, s, i in cons}
    single = {p: (s, i) for p, s, i in consumer_items(order, 0, 1)}
    assert by_pos == single


@settings(max_examples=40, deadline=None)
@given(counts=shard_counts, n=st.integers(1, 10), nodes=st.sampled_from([1, 2, 3]))
def test_drop_and_pad_policies(counts, n, nodes):
    order = SampleOrder(counts, 3, 0, block=7)
    total = sum(counts)
    n *= nodes
    drop = _all_items(order, n, remainder="drop", num_nodes=nodes)
    assert len({len(c) for c in drop}) == 1
    kept = [p for c in drop for p, _, _ in c]
    assert len(kept) == len(set(kept)) == total - total % n == plan_split(total, n, "drop").assigned
    pad = _all_items(order, n, remainder="pad", num_nodes=nodes)
    if total:
        assert len({len(c) for c in pad}) == 1
        read = [p for c in pad for p, _, _ in c]
        assert set(read) == set(range(total))
        assert len(read) - total == plan_split(total, n, "pad").padded


@settings(max_examples=50, deadline=None)
@given(counts=shard_counts, data=st.data(), new_world=st.integers(1, 8), new_workers=st.integers(0, 4),
       nodes=st.sampled_from([1, 2, 4]))
def test_resume_reads_exactly_the_rest(counts, data, new_world, new_workers, nodes):
    """Consumed = a prefix plus scattered positions (as workers run ahead): the rest, split over
    any new world size and node count, is read exactly once."""
    order = SampleOrder(counts, 5, 2, block=9)
    total = order.num_samples
    prefix = data.draw(st.integers(0, total))
    done = sorted(data.draw(st.sets(st.integers(prefix, max(prefix, total - 1)), max_size=20)) - {total})
    done = [d for d in done if d < total]
    nodes = nodes if new_world % nodes == 0 else 1
    n = new_world * max(new_workers, 1)
    rest = [p for c in _all_items(order, n, start=prefix, skip=np.array(done, np.int64), num_nodes=nodes)
            for p, _, _ in c]
    assert sorted(rest) == sorted(set(range(prefix, total)) - set(done))


def test_progress_chunks_and_merge():
    a = Progress(0, KEY, 10, world_size=2)
    b = Progress(0, KEY, 10, world_size=2)
    for p in (0, 2, 4):
        a.record(p, 0, 1)
    a.record(6, 0, 2)  # half of document 6
    for p in (1, 3):
        b.record(p, 0, 1)
    b.record(6, 1, 2)  # the other half, on another rank
    b.record(5, -2, 0)  # unreadable document, counted
    merged = Progress.from_state(merge_states([a.state_dict(), b.state_dict()]))
    assert merged.prefix == 7 and merged.consumed == 7 and merged.bad == 1 and not merged.partial
    again = Progress.from_state(merged.state_dict())
    assert again.state_dict() == merged.state_dict()
    half = Progress.from_state(a.state_dict())
    assert half.partial == {6: (2, {0})} and half.consumed == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sets(st.integers(0, 29)), min_size=1, max_size=5))
def test_merge_is_the_union_of_rank_states(per_rank):
    states = []
    for done in per_rank:
        p = Progress(0, KEY, 30, world_size=len(per_rank))
        for pos in sorted(done):
            p.record(pos, 0, 1)
        states.append(p.state_dict())
    merged = Progress.from_state(merge_states(states))
    union = set().union(*per_rank)
    assert set(merged.done.positions().tolist()) == union
    assert merged.consumed == len(union) and set(range(merged.prefix)) <= union and merged.prefix not in union


@settings(max_examples=60, deadline=None)
@given(docs=st.lists(st.integers(0, 3), min_size=1, max_size=40), seed=st.integers(0, 1000),
       batch=st.integers(1, 12), prefix=st.integers(0, 5))
def test_record_many_equals_record_one_by_one(docs, seed, batch, prefix):
    """A batch's resume records applied at once leave the state record() would, chunk by chunk."""
    records = []
    for pos, n in enumerate(docs):  # n chunks; 0: an empty (or, odd positions, bad) document
        records += [(pos, c, n) for c in range(n)] if n else [(pos, -2 if pos % 2 else -1, 0)]
    records = [records[i] for i in np.random.default_rng(seed).permutation(len(records))]
    records += records[:3]  # repeats are ignored
    one, many = (Progress(0, {}, len(docs), prefix=min(prefix, len(docs))) for _ in range(2))
    for i in range(0, len(records), batch):
        for r in records[i:i + batch]:
            one.record(*r)
        many.record_many(records[i:i + batch])
        assert many.state_dict() == one.state_dict()
    assert many.consumed == len(docs)


@settings(max_examples=60, deadline=None)
@given(counts=shard_counts, seed=st.integers(0, 2**32), block=st.integers(1, 50), consumers=st.integers(1, 6),
       data=st.data(), remainder=st.sampled_from(["uneven", "drop", "pad"]))
def test_a_consumer_locating_only_its_share_reads_what_the_whole_block_deal_gives_it(counts, seed, block, consumers,
                                                                                      data, remainder):
    """With one node a consumer locates only its own positions in the shards: its items equal those of
    the deal over whole located blocks (the ``j``-th remaining position to consumer ``j mod C``, those
    past the quota dropped), and ``block_items`` of offsets equals the whole block's items there."""
    order = SampleOrder(counts, seed, 1, block=block)
    n = order.num_samples
    start = data.draw(st.integers(0, n))
    skip = np.array(sorted(data.draw(st.sets(st.integers(start, n - 1), max_size=n // 3)) if n > start else []),
                    np.int64)
    items = [(p, s, l) for b in range(order.num_blocks) for p, s, l in zip(*(a.tolist() for a in order.block_items(b)))
             if p >= start and p not in set(skip.tolist())]
    quota = plan_split(len(items), consumers, remainder).assigned
    for c in range(consumers):
        got = list(consumer_items(order, c, consumers, start, skip, remainder))
        want = [it for j, it in enumerate(items[:quota]) if j % consumers == c]
        assert got[:len(want)] == want
    for b in range(order.num_blocks):
        whole = order.block_items(b)
        at = np.flatnonzero(np.arange(len(whole[0])) % 3 == 1)
        assert [a.tolist() for a in order.block_items(b, at)] == [a[at].tolist() for a in whole]
