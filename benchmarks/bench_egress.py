"""Egress per node: the bytes each node downloads per epoch, with the deal over nodes vs one node's deal.

An HTTP origin on 127.0.0.1 counts the shard bytes it serves to each simulated node (a URL prefix
and a cache folder per node, :mod:`tests.support.nodes`). N nodes x ``--ranks`` ranks x
``--workers`` workers read one epoch in lockstep with caches that hold the dataset, then a second
epoch with each node's cache shrunk to half its share (dataset / N / 2: its least recently used
shards evicted first).
Printed per N = 1, 2, 4, 8, with ``data.shard_lanes`` = 8 (each node keeps its shards from epoch
to epoch) and 1: the largest node's bytes / (dataset / N) in each epoch, the second
epoch's hit rate (of the bytes of the shards each node read, the part its cache held when the epoch
began, over all nodes), and the
same for the deal of colaflow before the deal over nodes (``nodes_apart=False``: every node's ranks
read by random access into every shard). The goal: at most 1.15 x (dataset / N) + one shard.

Run: ``.venv/bin/python benchmarks/bench_egress.py [--docs 6000 --shard-kib 24 --ranks 2 --workers 2]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cache.storage.store import Store  # noqa: E402
from loaders.config import DataConfig  # noqa: E402
from shards import Manifest, TokenBlockWriter  # noqa: E402
from tests.support.nodes import read_epoch, serve_nodes, touched_shards  # noqa: E402


def make_dataset(directory: str, docs: int, shard_kib: int, seed: int = 0) -> Manifest:
    """``docs`` documents of 50-400 ``uint16`` tokens as token-block shards of about ``shard_kib`` KiB."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(50, 400, docs)
    w = TokenBlockWriter(directory, max_bytes=shard_kib * 1024, block_tokens=2048)
    for i, n in enumerate(lengths):
        w.add(f"doc{i:06d}", "bench", rng.integers(0, 32000, int(n)).astype(np.uint16))
    m = Manifest(shards=w.close(), vocab_size=32000, layout="token_blocks")
    m.save(directory)
    return m


def run(data: str, work: str, nodes: int, apart: bool, cfg: DataConfig, ranks: int, workers: int,
        total: int) -> dict:
    """Two epochs on ``nodes`` nodes: the largest node's bytes / share per epoch and the second epoch's
    hit rate (bytes of the shards read that the node's cache held when the epoch began / bytes of the
    shards read)."""
    share = total / nodes
    origin = serve_nodes(data, os.path.join(work, "served"), nodes)
    dirs = [os.path.join(work, f"cache{k}") for k in range(nodes)]
    shards = Manifest.load(data).shards
    out = {}
    try:
        for epoch, limit in ((0, 4 * total), (1, int(share / 2))):
            held = []
            for d in dirs:  # the cache shrunk to half the share: its least recently used shards go
                store = Store(d, limit, 0)
                store.evict_to(limit)
                held.append({e.key.split("-", 1)[1] for e in store.entries()})
            before = [origin.shard_bytes(k) for k in range(nodes)]
            reads = read_epoch(cfg, origin.urls, dirs, limit, ranks, workers, epoch, nodes_apart=apart)
            fetched = [origin.shard_bytes(k) - b for k, b in zip(range(nodes), before)]
            out[f"epoch{epoch + 1}"] = max(fetched) / share
            read = [[shards[s] for s in touched_shards(cfg, origin.urls[k], reads[k], epoch)] for k in range(nodes)]
            out["hit_rate"] = (sum(s.bytes for k in range(nodes) for s in read[k] if s.name in held[k])
                               / sum(s.bytes for k in range(nodes) for s in read[k]))
    finally:
        origin.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the dataset, run every node count with lanes, without lanes and the one-node deal, and
    print the table (markdown). Returns 0."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=6000, help="documents (about 450 bytes each)")
    ap.add_argument("--shard-kib", type=int, default=24, help="shard size")
    ap.add_argument("--ranks", type=int, default=2, help="ranks per node")
    ap.add_argument("--workers", type=int, default=2, help="loader workers per rank")
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--lanes", type=int, default=8, help="data.shard_lanes of the first columns (a multiple of --nodes)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # a cache at half a node's share turns prefetches away: expected here
    root = tempfile.mkdtemp(prefix="bench-egress-")
    try:
        data = os.path.join(root, "data")
        m = make_dataset(data, args.docs, args.shard_kib)
        total, largest = sum(s.bytes for s in m.shards), max(s.bytes for s in m.shards)
        print(f"dataset: {len(m.shards)} shards, {m.total_documents} documents, {total / 1e6:.2f} MB; "
              f"{args.ranks} ranks x {args.workers} workers per node")
        base = DataConfig(manifest=data, seq_len=512, micro_batch_size=4, num_workers=args.workers,
                          pack_window=8192, shuffle_block=256)
        laned = dataclasses.replace(base, shard_lanes=args.lanes)
        print(f"| nodes | shard_lanes={args.lanes}: epoch 1 | epoch 2 | hit rate | shard_lanes=1: epoch 1 | epoch 2 "
              "| hit rate | before: epoch 1 | epoch 2 | hit rate | goal: 1.15 + one shard |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for n in [int(x) for x in args.nodes.split(",")]:
            res = []
            for i, (cfg, apart) in enumerate([(laned, True), (base, True), (base, False)]):  # one run, same data
                work = os.path.join(root, f"n{n}-{i}")
                res.append(run(data, work, n, apart, cfg, args.ranks, args.workers, total))
                shutil.rmtree(work)
            goal = 1.15 + largest / (total / n)
            met = ["met" if max(r[e] for r in res[:2]) <= goal else "MISSED" for e in ("epoch1", "epoch2")]
            cells = " | ".join(f"{r['epoch1']:.3f} | {r['epoch2']:.3f} | {r['hit_rate']:.0%}" for r in res)
            print(f"| {n} | {cells} | <= {goal:.3f}: epoch 1 {met[0]}, epoch 2 {met[1]} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
