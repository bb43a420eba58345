"""Bytes fetched per epoch against the dataset size, at cache limits of 0.25x, 0.5x, 1x and 2x the
dataset: colaflow's cache with prefetch (``--depth``) vs the same cache without prefetch (the
least any LRU cache must fetch), on the same shards over HTTP, in one run.

Each epoch reads every shard once in a new shuffled order (like the loader's shard order), with
the order handed to ``ShardCache.prefetch``. Goal: prefetching fetches no more than not prefetching
(ratio 1.00), i.e. 1.0x the dataset per epoch whenever the limit holds prefetch depth + 1 shards
and the dataset does not fit, and nothing after the first epoch when it does.

Run: ``.venv/bin/python benchmarks/bench_cache_limits.py [--shards 16 --shard-mib 2 --depth 3 --epochs 2]``
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench_cache import make_dataset  # noqa: E402

from cache import CacheConfig, ShardCache  # noqa: E402
from tests.support.http_server import serve_directory  # noqa: E402

FRACTIONS = (0.25, 0.5, 1.0, 2.0)


def epochs_fetched(items: list[tuple], base_dir: str, max_bytes: int, depth: int, epochs: int,
                   seed: int) -> list[int]:
    """Bytes fetched from the source in each epoch through a fresh cache of ``max_bytes`` bytes."""
    cache = ShardCache(CacheConfig(dir=base_dir, max_bytes=max_bytes, min_free_bytes=0,
                                   prefetch_shards=depth), resolve=False)
    out, before = [], 0
    for epoch in range(epochs):
        order = list(items)
        random.Random(seed + epoch).shuffle(order)
        cache.prefetch(order)
        for url, sha, size in order:
            with cache.pinned(url, sha, size) as path, open(path, "rb") as f:
                while f.read(4 << 20):
                    pass
        now = cache.metrics()["bytes_fetched"]
        out.append(now - before)
        before = now
    cache.close()
    return out


def main(argv=None) -> None:
    """Print one row per (limit, epoch): fetched / dataset with and without prefetch, and their ratio."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-mib", type=int, default=2)
    ap.add_argument("--depth", type=int, default=3, help="prefetch_shards of the colaflow run")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cache-limits-") as work:
        src = os.path.join(work, "src")
        os.makedirs(src)
        m = make_dataset(src, args.shards, args.shard_mib)
        server, base = serve_directory(src)
        try:
            items = [(f"{base}/{s.name}", s.sha256, s.bytes) for s in m.shards]
            total = m.total_bytes
            print(f"dataset: {len(items)} shards, {total / 2**20:.1f} MiB; prefetch depth {args.depth}")
            print("| limit | epoch | fetched / dataset, prefetch | fetched / dataset, no prefetch | ratio |")
            print("|---|---|---|---|---|")
            for frac in FRACTIONS:
                limit = int(frac * total)
                runs = [epochs_fetched(items, os.path.join(work, f"c-{frac}-{d}"), limit, d, args.epochs, args.seed)
                        for d in (args.depth, 0)]
                for epoch, (got, base_bytes) in enumerate(zip(*runs)):
                    ratio = got / base_bytes if base_bytes else (1.0 if not got else float("inf"))
                    print(f"| {frac}x ({limit / 2**20:.1f} MiB) | {epoch} | {got / total:.2f}x | "
                          f"{base_bytes / total:.2f}x | {ratio:.2f} |")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
