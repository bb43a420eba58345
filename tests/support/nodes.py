"""Simulated nodes on one machine, for tests and ``benchmarks/bench_egress.py``: one HTTP origin that
counts the bytes it serves to each node, a cache folder per node, and every rank x worker of every
node reading an epoch in lockstep (one batch each in turn, as a trainer's steps would pace them).

Node ``k`` reads the dataset through its own URL prefix (``BASE/node{k}/``, a link to the one
dataset folder), so the origin's request log tells the nodes apart.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from cache import CacheConfig, ShardCache
from loaders.config import DataConfig
from loaders.order.progress import Progress
from loaders.sources import OneDataset
from loaders.worker.stream import TextStream
from shards import Manifest
from tests.support.http_server import FaultServer, serve_directory


@dataclass
class Origin:
    """The HTTP origin of :func:`serve_nodes`: the server and each node's manifest URL."""

    server: FaultServer
    urls: list[str]

    def shard_bytes(self, node: int) -> int:
        """Shard bytes (``*.tar``) served to node ``node`` so far."""
        prefix = f"node{node}/"
        return sum(r.sent for r in self.server.gets() if r.name.startswith(prefix) and r.name.endswith(".tar"))

    def stop(self) -> None:
        """Stop the server."""
        self.server.stop()


def serve_nodes(dataset: str, root: str, num_nodes: int) -> Origin:
    """Serve folder ``dataset`` to ``num_nodes`` nodes from ``root`` (created; one link per node)."""
    os.makedirs(root, exist_ok=True)
    for k in range(num_nodes):
        link = os.path.join(root, f"node{k}")
        if not os.path.islink(link):
            os.symlink(os.path.abspath(dataset), link)
    server, base = serve_directory(root)
    return Origin(server, [f"{base}/node{k}/manifest.json" for k in range(num_nodes)])


@dataclass
class NodeReads:
    """What one node read in an epoch: the ``(position, chunk)`` records its consumers delivered and
    its caches' counters summed."""

    records: list[tuple[int, int]] = field(default_factory=list)
    cache: dict = field(default_factory=dict)

    @property
    def positions(self) -> set[int]:
        """Documents (positions of the epoch's order) the node delivered."""
        return {p for p, _ in self.records}


def read_epoch(cfg: DataConfig, urls: list[str], cache_dirs: list[str], max_bytes: int, ranks_per_node: int,
               workers: int, epoch: int, nodes_apart: bool = True) -> list[NodeReads]:
    """Read epoch ``epoch`` from its start on ``len(urls)`` nodes of ``ranks_per_node`` ranks of
    ``workers`` workers; every consumer has its own :class:`cache.ShardCache` on its node's folder
    (as a worker process would), with ``max_bytes``.

    ``nodes_apart=False`` deals as if all ranks were on one node (each node downloads what its ranks
    read of the whole dataset: the behaviour before the deal over nodes).
    """
    num_nodes = len(urls)
    world = num_nodes * ranks_per_node
    reads = [NodeReads() for _ in range(num_nodes)]
    iters, caches = [], []
    for k, url in enumerate(urls):
        sources = OneDataset(Manifest.load(url), url)
        for r in range(k * ranks_per_node, (k + 1) * ranks_per_node):
            for w in range(workers):
                cache = ShardCache(CacheConfig(dir=cache_dirs[k], max_bytes=max_bytes, min_free_bytes=0,
                                               prefetch_shards=2), resolve=False)
                caches.append((k, cache))
                stream = TextStream(cfg, sources, cache, r, world, ranks_per_node if nodes_apart else world)
                stream.start(Progress(epoch, {}, sources.manifest.total_documents, world))
                iters.append((k, stream, stream.consumer_batches(w, workers)))
    while iters:
        for item in list(iters):
            k, stream, it = item
            batch = next(it, None)
            if batch is None:
                iters.remove(item)
                continue
            reads[k].records += [(p, c) for p, c, _ in batch.consumed.tolist()]
    for k, cache in caches:
        for name, value in cache.metrics().items():
            reads[k].cache[name] = reads[k].cache.get(name, 0) + value
        cache.close()
    return reads


def touched_shards(cfg: DataConfig, url: str, reads: NodeReads, epoch: int) -> set[int]:
    """Shards (manifest indices) holding the documents of ``reads`` in epoch ``epoch``'s order."""
    sources = OneDataset(Manifest.load(url), url)
    order = sources.order(epoch, cfg.seed, cfg.shuffle, cfg.shuffle_block, cfg.shard_lanes)
    wanted = np.array(sorted(reads.positions), np.int64)
    out: set[int] = set()
    for b in range(order.num_blocks):
        pos, shard, _ = order.block_items(b)
        out |= set(shard[np.isin(pos, wanted)].tolist())
    return out
