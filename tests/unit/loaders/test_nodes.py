"""The deal over nodes (loaders.order.split): each node reads only its share of the shards, every
document exactly once, also across a resume at another node count."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.order.sample_order import SampleOrder
from loaders.order.split import consumer_items, plan_nodes, shard_owners


def _node_reads(order, nodes, per_node, **kw):
    """``[node][consumer] -> [(position, shard, local), ...]``."""
    n = nodes * per_node
    return [[list(consumer_items(order, k * per_node + c, n, num_nodes=nodes, **kw)) for c in range(per_node)]
            for k in range(nodes)]


def _shards_of(reads) -> set[int]:
    return {s for cons in reads for _, s, _ in cons}


@settings(max_examples=30, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4, 8]), per_shard=st.integers(5, 20), per_node_shards=st.integers(1, 9),
       spare=st.integers(0, 7), jitter=st.lists(st.integers(0, 2), min_size=80, max_size=80),
       block=st.integers(1, 100), per_node=st.integers(1, 3), seed=st.integers(0, 1000))
def test_each_node_downloads_its_share(nodes, per_shard, per_node_shards, spare, jitter, block, per_node, seed):
    """Shards of about equal size (as preprocessing writes them): every document once, and a node reads
    its own shards and at most 2 others (the surplus it receives), so with 7 or more shards per node at
    most 1.15 x (dataset / nodes) + one shard's bytes (bytes ~ documents here)."""
    k = nodes * per_node_shards + spare % nodes
    counts = [per_shard + j for j in jitter[:k]]
    order = SampleOrder(counts, seed, 1, block=block)
    reads = _node_reads(order, nodes, per_node)
    flat = sorted(p for node in reads for cons in node for p, _, _ in cons)
    assert flat == list(range(sum(counts)))
    owner = shard_owners(order, nodes)
    for node, node_reads in enumerate(reads):
        touched = _shards_of(node_reads)
        assert len(touched - set(np.flatnonzero(owner == node).tolist())) <= 2  # received surplus
        if per_node_shards >= 7:
            assert sum(counts[s] for s in touched) <= 1.15 * sum(counts) / nodes + max(counts)
        sizes = [len(c) for c in node_reads]
        assert max(sizes) - min(sizes) <= 1


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 30), min_size=1, max_size=16), nodes=st.sampled_from([2, 3, 4]),
       per_node=st.integers(1, 3), block=st.integers(1, 60), remainder=st.sampled_from(["uneven", "drop", "pad"]))
def test_prefetch_list_is_what_the_node_reads(counts, nodes, per_node, block, remainder):
    """The cache prefetches the shards its node reads and no other (``pad``'s few repeated documents
    are fetched when read)."""
    order = SampleOrder(counts, 4, 0, block=block)
    plan = plan_nodes(order, nodes, nodes * per_node, remainder=remainder)
    reads = _node_reads(order, nodes, per_node, remainder=remainder)
    for node, node_reads in enumerate(reads):
        listed, read = set(plan.shards(order, node)), _shards_of(node_reads)
        assert listed == read if remainder != "pad" else listed <= read


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
