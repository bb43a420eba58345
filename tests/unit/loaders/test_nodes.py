"""The deal over nodes (loaders.order.split): each node reads only its share of the shards, every
document exactly once, also across a resume at another node count."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.config import DataConfig
from loaders.order.sample_order import SampleOrder
from loaders.order.split import consumer_items, plan_nodes, shard_owners
from shards import Manifest
from tests.support.data import write_counting_shards
from tests.support.nodes import read_epoch, serve_nodes


def _node_reads(order, nodes, per_node, **kw):
    """``[node][consumer] -> [(position, shard, local), ...]``."""
    n = nodes * per_node
    plan = plan_nodes(order, nodes, n, kw.get("start", 0), kw.get("skip"), kw.get("remainder", "uneven"))
    return [[list(consumer_items(order, k * per_node + c, n, num_nodes=nodes, plan=plan, **kw))
             for c in range(per_node)] for k in range(nodes)]


def _shards_of(reads) -> set[int]:
    return {s for cons in reads for _, s, _ in cons}


@settings(max_examples=20, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), per_shard=st.integers(20, 40), per_node_shards=st.integers(7, 10),
       spare=st.integers(0, 7), jitter=st.lists(st.integers(0, 1), min_size=90, max_size=90),
       block=st.integers(16, 200), per_node=st.integers(1, 3), seed=st.integers(0, 1000))
def test_each_node_downloads_its_share(nodes, per_shard, per_node_shards, spare, jitter, block, per_node, seed):
    """Shards of about equal size (as preprocessing writes them), 7 or more per node: every document
    once, and a node reads documents of at most 1.15 x (dataset / nodes) + one shard's bytes (bytes ~
    documents here)."""
    k = nodes * per_node_shards + spare % nodes
    counts = [per_shard + j for j in jitter[:k]]
    order = SampleOrder(counts, seed, 1, block=block)
    reads = _node_reads(order, nodes, per_node)
    flat = sorted(p for node in reads for cons in node for p, _, _ in cons)
    assert flat == list(range(sum(counts)))
    for node_reads in reads:
        touched = _shards_of(node_reads)
        assert sum(counts[s] for s in touched) <= 1.15 * sum(counts) / nodes + max(counts)
        sizes = [len(c) for c in node_reads]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 30), min_size=1, max_size=16), nodes=st.sampled_from([2, 3, 4]),
       per_node=st.integers(1, 3), block=st.integers(1, 60), remainder=st.sampled_from(["uneven", "drop", "pad"]))
def test_prefetch_list_is_what_the_node_reads(counts, nodes, per_node, block, remainder):
    """The cache prefetches the shards its node reads and no other (``pad``'s few repeated documents
    are fetched when read), in the order the node first reads them (by shuffle block: a block's
    documents are read together)."""
    order = SampleOrder(counts, 4, 0, block=block)
    plan = plan_nodes(order, nodes, nodes * per_node, remainder=remainder)
    reads = _node_reads(order, nodes, per_node, remainder=remainder)
    for node, node_reads in enumerate(reads):
        listed, read = plan.shards(order, node), _shards_of(node_reads)
        assert set(listed) == read if remainder != "pad" else set(listed) <= read
        first_block = {s: min(p // block for cons in node_reads for p, t, _ in cons if t == s) for s in listed}
        assert [first_block[s] for s in listed] == sorted(first_block.values())


def test_equal_shards_divide_without_shared_shards():
    """16 shards of 10 documents on 4 nodes: every node reads exactly its 4 shards, none twice."""
    order = SampleOrder([10] * 16, 0, 3, block=25)
    reads = _node_reads(order, 4, 2)
    owned = [_shards_of(r) for r in reads]
    assert [len(o) for o in owned] == [4, 4, 4, 4] and len(set().union(*owned)) == 16


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=2, max_size=16), old=st.sampled_from([1, 2, 4]),
       new=st.sampled_from([1, 2, 3, 4, 8]), per_node=st.integers(1, 3), data=st.data())
def test_resume_at_another_node_count_reads_the_rest_once(counts, old, new, per_node, data):
    """A run on ``old`` nodes stops with each consumer part-way through its documents (as consumers run
    at different speeds); the rest, dealt over ``new`` nodes, is read exactly once."""
    order = SampleOrder(counts, 9, 2, block=data.draw(st.integers(1, 40)))
    before = [cons for node in _node_reads(order, old, per_node) for cons in node]
    done = sorted(p for cons in before for p, _, _ in cons[:data.draw(st.integers(0, len(cons)))])
    prefix = next((i for i, p in enumerate(done) if p != i), len(done))
    skip = np.array(done[prefix:], np.int64)
    after = _node_reads(order, new, per_node, start=prefix, skip=skip)
    rest = sorted(p for node in after for cons in node for p, _, _ in cons)
    assert rest == sorted(set(range(order.num_samples)) - set(done))


def test_two_nodes_download_their_share_over_http(tmp_path):
    """2 nodes x 2 ranks, a cache folder each, one HTTP origin: the nodes read disjoint documents,
    together all of them once, and each downloads about half the shard bytes (with one node's deal,
    each downloads nearly all of them)."""
    data = str(tmp_path / "data")
    write_counting_shards(data, 96, max_samples=8, vocab=50, max_len=30)
    total = sum(s.bytes for s in Manifest.load(data).shards)
    largest = max(s.bytes for s in Manifest.load(data).shards)
    cfg = DataConfig(manifest=data, seq_len=32, micro_batch_size=2, num_workers=0, pack_window=64, shuffle_block=16)
    origin = serve_nodes(data, str(tmp_path / "served"), 2)
    try:
        for apart in (True, False):
            dirs = [str(tmp_path / f"cache-{apart}-{k}") for k in range(2)]
            before = [origin.shard_bytes(k) for k in range(2)]
            reads = read_epoch(cfg, origin.urls, dirs, 1 << 30, ranks_per_node=2, workers=1, epoch=0,
                               nodes_apart=apart)
            fetched = [origin.shard_bytes(k) - before[k] for k in range(2)]
            records = [r for node in reads for r in node.records]
            assert len(records) == len(set(records)) and {p for p, _ in records} == set(range(96))
            if apart:
                assert not reads[0].positions & reads[1].positions
                assert all(f <= 1.15 * total / 2 + largest for f in fetched), (fetched, total)
            else:
                assert all(f >= 0.9 * total for f in fetched), (fetched, total)
    finally:
        origin.stop()


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=40), lanes=st.sampled_from([2, 4, 8]),
       seed=st.integers(0, 100))
def test_lanes_keep_each_node_on_its_shards_every_epoch(counts, lanes, seed):
    """With ``data.shard_lanes`` a multiple of the node count, the nodes own the same shards in every
    epoch (but the pool's last few); each epoch's order is still a permutation of every shard."""
    for nodes in [n for n in (1, 2, 4, 8) if lanes % n == 0]:
        owned = []
        for epoch in range(3):
            order = SampleOrder(counts, seed, epoch, block=5, lanes=lanes)
            assert sorted(order.shard_order.tolist()) == list(range(len(counts)))
            owner = shard_owners(order, nodes)
            full = [s for s in range(len(counts)) if counts[s]]
            owned.append({s: int(owner[s]) for s in full if owner[s] < nodes})
        common = set(owned[0]) & set(owned[1]) & set(owned[2])
        assert all(owned[0][s] == owned[1][s] == owned[2][s] for s in common)
        assert len(common) >= len(owned[0]) - 2 * nodes  # only the pool's shards change hands


def test_ranks_per_node_come_from_torchrun_or_the_config(monkeypatch):
    """torchrun's LOCAL_WORLD_SIZE when the environment's WORLD_SIZE is the job's; data.ranks_per_node
    wins; a count that does not divide the world size, or ranks not numbered node by node, is refused."""
    import pytest

    from loaders.rank.world import resolve_ranks_per_node
    assert resolve_ranks_per_node(0, 3, 4) == 4  # no torchrun: one node
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert resolve_ranks_per_node(0, 3, 4) == 2
    assert resolve_ranks_per_node(0, 3, 8) == 8  # a simulated world of another size: the env is not its
    assert resolve_ranks_per_node(4, 3, 4) == 4
    with pytest.raises(ValueError, match="data.ranks_per_node=3 does not divide the world size 4"):
        resolve_ranks_per_node(3, 0, 4)
    with pytest.raises(ValueError, match="rank 1 is on node GROUP_RANK=1, not 0"):
        resolve_ranks_per_node(0, 1, 4)
