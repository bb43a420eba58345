"""``python -m cache``: inspect, fill, trim, check and tune a node's shard cache; serve a folder.

Every command reads the cache settings like a job does (``--config`` YAML, node and
``COLAFLOW_CACHE_*`` environment overrides, then ``--set key=value``).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time

from tqdm import tqdm

from shards.config import ConfigError
from shards.errors import exit_status, explain

from cache.config import format_size, load_cache_config, parse_size
from cache.errors import CacheError
from cache.fetch import hash_file
from cache.locks import is_locked
from cache.shard_cache import ShardCache


def _open(args) -> ShardCache:
    overrides = list(args.set or [])
    if args.dir:
        overrides.append(f"dir={args.dir}")
    return ShardCache(load_cache_config(args.config, overrides), resolve=False)


def cmd_status(args) -> int:
    cache = _open(args)
    st, cfg = cache.store, cache.config
    entries, partials = st.entries(meta=True), st.partials()
    used = st.usage()
    pinned = sum(is_locked(st.pin_lock(e.key).path) for e in entries)
    verified = sum(1 for e in entries if e.meta and e.meta.verified)
    print(f"cache dir      {cfg.path}")
    print(f"entries        {len(entries)} ({verified} verified, {pinned} pinned now)")
    print(f"used           {format_size(used)} of max_bytes {format_size(cfg.max_bytes_int)}"
          f" ({100 * used / max(cfg.max_bytes_int, 1):.1f}%)")
    print(f"partial        {len(partials)} downloads ({sum(1 for p in partials.values() if p[2])} running), "
          f"{format_size(sum(p[0] for p in partials.values()))} written")
    print(f"disk free      {format_size(shutil.disk_usage(cfg.path).free)} (min_free_bytes "
          f"{format_size(cfg.min_free_bytes_int)})")
    print(f"settings       prefetch_shards={cfg.prefetch_shards} verify={cfg.verify} retries={cfg.retries} "
          f"timeout_s={cfg.timeout_s}")
    cache.close()
    return 0


def cmd_warm(args) -> int:
    from shards.manifest import Manifest, shard_url

    cache = _open(args)
    manifest = Manifest.load(args.manifest)
    items = [(shard_url(args.manifest, s.name), s.sha256, s.bytes) for s in manifest.shards]
    limit, fit = cache.config.max_bytes_int, 0
    while fit < len(items) and sum(size for _, _, size in items[:fit + 1]) <= limit:
        fit += 1
    skipped = len(items) - fit
    items = items[:fit]  # warming more than fits would only evict what was just fetched
    t0 = time.monotonic()
    cache.prefetch(items)
    failed = []
    for url, sha, size in tqdm(items, desc="warm", unit="shard"):
        try:
            cache.get(url, sha, size)
        except Exception as e:  # noqa: BLE001 - report every failed shard, then exit non-zero
            failed.append((url, e))
    m = cache.metrics()
    cache.close()
    dt = time.monotonic() - t0
    print(f"warmed {len(items) - len(failed)}/{len(items)} shards in {dt:.1f}s: {m['hits']} ready when asked (cached or prefetched), "
          f"{format_size(m['bytes_fetched'])} fetched ({m['bytes_fetched'] / 1e6 / max(dt, 1e-9):.1f} MB/s), "
          f"{m['evictions']} evicted, {m['retries']} retries")
    for url, e in failed:
        print(f"FAILED {url}: {e}", file=sys.stderr)
    if skipped:
        print(f"note: the dataset ({format_size(manifest.total_bytes)}) exceeds max_bytes "
              f"({format_size(limit)}): warmed the first {fit} shards, {skipped} left to fetch on demand")
    return 1 if failed else 0


def cmd_evict(args) -> int:
    cache = _open(args)
    target = parse_size(args.to) if args.to is not None else cache.config.max_bytes_int
    n, freed = cache.store.evict_to(target)
    print(f"evicted {n} entries ({format_size(freed)}); now {format_size(cache.store.usage())} used")
    cache.close()
    return 0


def cmd_clear(args) -> int:
    cache = _open(args)
    n, freed = cache.store.evict_to(0)
    removed = cache.store.cleanup(partial_ttl_s=0)
    left = len(cache.store.entries())
    print(f"cleared {n} entries ({format_size(freed)}) and {removed} temp files"
          + (f"; {left} pinned entries kept" if left else ""))
    cache.close()
    return 0


def cmd_verify(args) -> int:
    cache = _open(args)
    st = cache.store
    bad = unknown = 0
    entries = st.entries(meta=True)
    for e in tqdm(entries, desc="verify", unit="shard"):
        if e.meta is None or not e.meta.sha256:
            unknown += 1
            continue
        if hash_file(e.path, cache.config.chunk_bytes_int) != e.meta.sha256.lower():
            bad += 1
            removed = st.try_evict(e.key)
            print(f"CORRUPT {e.meta.url} ({e.path}): " + ("removed" if removed else "pinned now, not removed"),
                  file=sys.stderr)
    print(f"verified {len(entries) - unknown} entries: {bad} corrupt, {unknown} without a known sha256")
    cache.close()
    return 1 if bad else 0


def cmd_tune(args) -> int:
    from shards.manifest import Manifest, shard_url

    from cache.tune import Measurements, measure_disk, measure_remote, recommend, render

    cache = _open(args)
    cfg = cache.config
    manifest = Manifest.load(args.manifest)
    if not manifest.shards:
        print(f"{args.manifest}: the manifest lists no shards", file=sys.stderr)
        return 1
    w, r = measure_disk(cfg.path, parse_size(args.disk_bytes))
    sample = manifest.shards[: args.sample_shards]
    lat, rate = measure_remote([shard_url(args.manifest, s.name) for s in sample], cfg.timeout_s)
    m = Measurements(w, r, rate, lat)
    free = shutil.disk_usage(cfg.path).free + cache.store.usage()
    snippet, notes = recommend(m, args.consume_mbps, manifest.total_bytes / len(manifest.shards),
                               manifest.total_bytes, free, cfg.min_free_bytes_int)
    print(render(snippet, m, notes), end="")
    cache.close()
    return 0


def cmd_serve(args) -> int:
    from cache.http_server import serve_directory

    if not os.path.isdir(args.directory):
        print(f"error: {args.directory} is not a folder; give the shard folder to serve", file=sys.stderr)
        return 2
    try:
        server, url = serve_directory(args.directory, host=args.host, port=args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port} ({e.strerror}); pick another --port",
              file=sys.stderr)
        return 2
    print(f"serving {args.directory} at {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cache", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="YAML config (a colaflow config with a cache: section, or the section)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. max_bytes=200GiB")
    p.add_argument("--dir", help="cache directory (same as --set dir=...)")
    p.add_argument("-v", "--verbose", action="store_true", help="log retries and evictions")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="entries, usage, partial downloads, free disk").set_defaults(fn=cmd_status)
    w = sub.add_parser("warm", help="download every shard of a manifest into the cache")
    w.add_argument("manifest", help="manifest URL or folder")
    w.set_defaults(fn=cmd_warm)
    e = sub.add_parser("evict", help="evict LRU unpinned entries down to a size")
    e.add_argument("--to", help="target usage (default: max_bytes), e.g. 50GiB")
    e.set_defaults(fn=cmd_evict)
    sub.add_parser("clear", help="remove every unpinned entry and stale temp file").set_defaults(fn=cmd_clear)
    sub.add_parser("verify", help="hash every entry; remove corrupt ones (exit 1 if any)").set_defaults(fn=cmd_verify)
    t = sub.add_parser("tune", help="measure disk/remote speed; print a node config snippet")
    t.add_argument("manifest", help="manifest URL or folder to measure against")
    t.add_argument("--consume-mbps", type=float, required=True, help="trainer read rate on this node, MB/s")
    t.add_argument("--sample-shards", type=int, default=2, help="shards to download for the fetch rate")
    t.add_argument("--disk-bytes", default="256MiB", help="bytes written/read for the disk test")
    t.set_defaults(fn=cmd_tune)
    s = sub.add_parser("serve", help="serve a folder over HTTP with Range support")
    s.add_argument("directory")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--host", default="127.0.0.1")
    s.set_defaults(fn=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s")
    try:
        return args.fn(args)
    except (ConfigError, CacheError, FileNotFoundError, ValueError) as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        return exit_status(e)
