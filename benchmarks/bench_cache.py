"""Shard cache benchmark: colaflow's ``ShardCache`` against baselines on the same shards, one run.

1. Warm reads: MB/s reading every cached shard through ``cache.pinned`` vs a raw sequential
   read of the same bytes from the source folder (the cache's per-read overhead).
2. Cold epoch over HTTP with a simulated trainer consuming ``--consume-mbps``: epoch time and
   stall fraction (seconds blocked in ``get`` / epoch seconds) with ``prefetch_shards=0`` vs
   ``--depth``. The server adds ``--latency-ms`` per request and caps each connection at
   ``--remote-mbps`` to stand in for a remote object store.
3. Sample iteration, cold then warm epoch: colaflow (cache + prefetch + ``shards.io.reader.iter_raw``)
   vs ``webdataset.WebDataset(urls, cache_dir=...)`` (curl download into its cache dir).

Run: ``.venv/bin/python benchmarks/bench_cache.py [--shards 16 --shard-mib 8 ...]``; prints ratios.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from cache import CacheConfig, ShardCache  # noqa: E402
from tests.support.http_server import Faults, serve_directory  # noqa: E402
from shards.format.manifest import Manifest  # noqa: E402
from shards.io.reader import iter_raw  # noqa: E402
from colaflow.wording import help_text  # noqa: E402
from shards.io.writer import ShardSequenceWriter  # noqa: E402

MB = 1e6


def make_dataset(directory: str, shards: int, shard_mib: int, sample_kib: int = 256) -> Manifest:
    """Write ``shards`` tar shards of ~``shard_mib`` MiB of random samples plus ``manifest.json``."""
    per_shard = shard_mib * 1024 // sample_kib
    w = ShardSequenceWriter(directory, max_samples=per_shard)
    for i in range(shards * per_shard):
        w.write(f"s{i:08d}", {"bin": os.urandom(sample_kib * 1024)})
    m = Manifest(shards=w.close())
    m.save(directory)
    return m


def new_cache(root: str, name: str, depth: int) -> ShardCache:
    """A fresh :class:`ShardCache` under ``root/name`` (64 GiB limit) with prefetch depth ``depth``."""
    cfg = CacheConfig(dir=os.path.join(root, name), max_bytes="64GiB", min_free_bytes="1GiB",
                      prefetch_shards=depth, verify="first")
    return ShardCache(cfg, resolve=False)


def read_all(path: str, block: int = 4 << 20) -> int:
    """Read ``path`` to the end in ``block``-byte chunks; returns the bytes read."""
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(block):
            n += len(chunk)
    return n


def bench_warm_reads(m: Manifest, src: str, base: str, root: str) -> tuple[float, float]:
    """(cached MB/s, raw MB/s): three page-cache-warm passes through the cache vs plain file reads."""
    items = [(f"{base}/{s.name}", s.sha256, s.bytes) for s in m.shards]
    cache = new_cache(root, "warm", 0)
    for it in items:
        cache.get(*it)
    for it in items:  # page cache warm for both sides
        read_all(cache.get(*it))
        read_all(os.path.join(src, it[0].rsplit("/", 1)[1]))
    rounds = 3
    t0 = time.perf_counter()
    for _ in range(rounds):
        n = 0
        for it in items:
            with cache.pinned(*it) as p:
                n += read_all(p)
    cached = rounds * n / MB / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(rounds):
        n = sum(read_all(os.path.join(src, s.name)) for s in m.shards)
    raw = rounds * n / MB / (time.perf_counter() - t0)
    cache.close()
    return cached, raw


def cold_epoch(m: Manifest, base: str, root: str, name: str, depth: int, consume_mbps: float) -> tuple[float, float]:
    """(epoch seconds, stall seconds) for one pass reading every shard with a simulated consumer."""
    items = [(f"{base}/{s.name}", s.sha256, s.bytes) for s in m.shards]
    cache = new_cache(root, name, depth)
    t0 = time.perf_counter()
    cache.prefetch(items)
    for it in items:
        with cache.pinned(*it) as p:
            n = read_all(p)
        time.sleep(n / MB / consume_mbps)  # the trainer's compute on this shard
    epoch = time.perf_counter() - t0
    stall = cache.metrics()["stall_seconds"]
    cache.close()
    return epoch, stall


def colaflow_samples(m: Manifest, base: str, cache: ShardCache) -> tuple[float, int]:
    """(seconds, samples) to prefetch and iterate every shard's samples through ``cache``."""
    items = [(f"{base}/{s.name}", s.sha256, s.bytes) for s in m.shards]
    t0 = time.perf_counter()
    cache.prefetch(items)
    count = 0
    for it in items:
        with cache.pinned(*it) as p:
            count += sum(1 for _ in iter_raw(p))
    return time.perf_counter() - t0, count


def wds_samples(m: Manifest, base: str, cache_dir: str) -> tuple[float, int]:
    """(seconds, samples) for webdataset's own URL cache over the same shards (the baseline)."""
    import webdataset as wds

    urls = [f"{base}/{s.name}" for s in m.shards]
    t0 = time.perf_counter()
    ds = wds.WebDataset(urls, cache_dir=cache_dir, shardshuffle=False, empty_check=False)
    count = sum(1 for _ in ds)
    return time.perf_counter() - t0, count


def main(argv=None) -> None:
    """Run every cache benchmark and print colaflow vs baseline with the ratio."""
    ap = argparse.ArgumentParser(description=help_text(__doc__.split("\n")[0]))
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard-mib", type=int, default=8)
    ap.add_argument("--remote-mbps", type=float, default=100.0, help="per-connection cap of the test server")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="added per request by the test server")
    ap.add_argument("--consume-mbps", type=float, default=100.0, help="simulated trainer read rate")
    ap.add_argument("--depth", type=int, default=3, help="prefetch_shards for the prefetch run")
    ap.add_argument("--workdir", help="scratch folder (default: a temp dir, removed afterwards)")
    a = ap.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="bench_cache-")
    src, root = os.path.join(work, "src"), os.path.join(work, "caches")
    os.makedirs(src, exist_ok=True)
    try:
        m = make_dataset(src, a.shards, a.shard_mib)
        total = m.total_bytes / MB
        print(f"dataset: {len(m.shards)} shards, {total:.0f} MB; server {a.remote_mbps:.0f} MB/s per "
              f"connection + {a.latency_ms:.0f} ms; consumer {a.consume_mbps:.0f} MB/s; cpus {os.cpu_count()}")
        faults = Faults(latency_s=a.latency_ms / 1000, rate_bytes_per_s=a.remote_mbps * MB)
        server, base = serve_directory(src, faults=faults)

        cached, raw = bench_warm_reads(m, src, base, root)
        print(f"[warm read]   cache.pinned {cached:8.0f} MB/s | raw read {raw:8.0f} MB/s | ratio {cached / raw:.2f}")

        e0, s0 = cold_epoch(m, base, root, "cold0", 0, a.consume_mbps)
        e1, s1 = cold_epoch(m, base, root, "cold1", a.depth, a.consume_mbps)
        print(f"[cold epoch]  no prefetch {e0:6.2f}s (stall {s0 / e0:5.1%}) | prefetch_shards={a.depth} "
              f"{e1:6.2f}s (stall {s1 / e1:5.1%}) | speed-up {e0 / e1:.2f}x")

        wds_dir = os.path.join(root, "wds")
        os.makedirs(wds_dir)
        cache = new_cache(root, "samples", a.depth)
        c_cold, n1 = colaflow_samples(m, base, cache)
        w_cold, n2 = wds_samples(m, base, wds_dir)
        c_warm = min(colaflow_samples(m, base, cache)[0] for _ in range(3))  # best of 3: short runs
        w_warm = min(wds_samples(m, base, wds_dir)[0] for _ in range(3))
        cache.close()
        assert n1 == n2, f"sample counts differ: colaflow {n1}, webdataset {n2}"
        print(f"[vs wds]      cold: colaflow {c_cold:6.2f}s, webdataset cache_dir {w_cold:6.2f}s, ratio "
              f"{w_cold / c_cold:.2f}x | warm: colaflow {c_warm:6.2f}s, webdataset {w_warm:6.2f}s, "
              f"ratio {w_warm / c_warm:.2f}x  ({n1} samples)")
        server.stop()
    finally:
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
