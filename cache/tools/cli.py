"""``python -m cache``: inspect, fill, trim, check and tune a node's shard cache; serve a folder.

Every command reads the cache settings like a job does (``--config`` YAML — a training config
with a ``cache:`` section or the section alone —, node and ``COLAFLOW_CACHE_*`` environment
overrides, then ``--set key=value`` and ``--dir``); the options go before or after the command.
``status`` and ``verify`` only read, so they work on a read-only cache folder; the other
commands say in one line that they must write.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import time

from tqdm import tqdm

from cache.config import CacheConfig, format_size, load_cache_config, parse_size
from cache.errors import CacheError, CacheReadOnlyError
from cache.shard_cache import ShardCache
from cache.storage.fetch import hash_file
from cache.storage.locks import is_locked
from cache.storage.store import Entry, Store
from colaflow.config import ConfigError
from colaflow.errors import USAGE, exit_status, explain
from colaflow.network import set_network_timeout
from colaflow.wording import count, help_text


def _config(args) -> CacheConfig:
    """The command's cache config; its ``timeout_s`` becomes every network read's (:mod:`colaflow.network`)."""
    overrides = list(args.set or [])
    if args.dir:
        overrides.append(f"dir={args.dir}")
    cfg = load_cache_config(args.config, overrides)
    set_network_timeout(cfg.timeout_s)
    return cfg


def _open(args, writes: bool = True) -> ShardCache:
    """The cache of ``args``; ``writes``: the command must write, so a read-only folder is an error.

    Raises:
        CacheReadOnlyError: ``writes`` and the folder is read-only (one line naming the command).
    """
    cache = ShardCache(_config(args), resolve=False)
    if writes and cache.read_only:
        cache.close()
        raise CacheReadOnlyError(f"the cache folder {cache.config.path} is read-only and `{args.command}` must "
                                 f"write there; run it where the folder is mounted read-write, or pass --dir")
    return cache


def _by_dataset(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Entries grouped by dataset: the folder of their source URL (``?`` for entries without a sidecar)."""
    out: dict[str, list[Entry]] = {}
    for e in entries:
        out.setdefault(e.meta.url.rsplit("/", 1)[0] if e.meta else "?", []).append(e)
    return dict(sorted(out.items()))


def cmd_status(args) -> int:
    """``status``: the cache folder, its use against ``max_bytes`` and its entries per dataset.

    Never creates the folder and works on a read-only cache. Returns the exit code (0)."""
    cfg = _config(args)
    print(f"cache dir      {cfg.path}")
    if not os.path.isdir(cfg.path):
        print(f"entries        none: the folder does not exist yet (a job or `warm` creates it); "
              f"max_bytes {format_size(cfg.max_bytes_int)}")
        return 0
    st = Store(cfg.path, cfg.max_bytes_int, cfg.min_free_bytes_int, create=False)  # looks only
    entries, partials = st.entries(meta=True), st.partials()
    used = st.usage()
    pinned = sum(is_locked(st.pin_lock(e.key).path) for e in entries)
    verified = sum(1 for e in entries if e.meta and e.meta.verified)
    if st.read_only:
        print("access         read-only: verified entries are served; nothing can be downloaded or evicted")
    print(f"entries        {len(entries)} ({verified} verified, {pinned} pinned now)")
    for dataset, group in _by_dataset(entries).items():
        print(f"  {dataset}: {count(len(group), 'entry', 'entries')}, {format_size(sum(e.size for e in group))}, "
              f"{sum(1 for e in group if e.meta and e.meta.verified)} verified")
    print(f"used           {format_size(used)} of max_bytes {format_size(cfg.max_bytes_int)}"
          f" ({100 * used / max(cfg.max_bytes_int, 1):.1f}%)")
    print(f"partial        {len(partials)} downloads ({sum(1 for p in partials.values() if p[2])} running), "
          f"{format_size(sum(p[0] for p in partials.values()))} written")
    print(f"disk free      {format_size(shutil.disk_usage(cfg.path).free)} (min_free_bytes "
          f"{format_size(cfg.min_free_bytes_int)})")
    print(f"settings       prefetch_shards={cfg.prefetch_shards} verify={cfg.verify} retries={cfg.retries} "
          f"timeout_s={cfg.timeout_s}")
    return 0


def cmd_warm(args) -> int:
    """``warm MANIFEST``: download the manifest's shards in order until ``max_bytes`` is full.

    Returns 0 when every shard that fits was fetched, 2 when not even one shard fits the limit
    (nothing could ever be cached), 1 when a download failed."""
    from shards.format.manifest import Manifest, shard_url

    cache = _open(args)
    manifest = Manifest.load(args.manifest)
    items = [(shard_url(args.manifest, s.name), s.sha256, s.bytes) for s in manifest.shards]
    limit, fit = cache.config.max_bytes_int, 0
    while fit < len(items) and sum(size for _, _, size in items[:fit + 1]) <= limit:
        fit += 1
    skipped = len(items) - fit
    if items and not fit:
        cache.close()
        print(f"error: max_bytes={format_size(limit)} is smaller than the first shard ({format_size(items[0][2])}): "
              f"nothing can be cached; raise cache.max_bytes", file=sys.stderr)
        return 2
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
    """``evict``: remove unpinned entries (least recently used first) until usage is below the limit.

    Returns the exit code (0; 2 on a read-only cache)."""
    cache = _open(args)
    target = parse_size(args.to) if args.to is not None else cache.config.max_bytes_int
    n, freed = cache.store.evict_to(target)
    print(f"evicted {count(n, 'entry', 'entries')} ({format_size(freed)}); now {format_size(cache.store.usage())} used")
    cache.close()
    return 0


def cmd_clear(args) -> int:
    """``clear``: remove every unpinned entry and leftover partial download. Returns the exit code."""
    cache = _open(args)
    n, freed = cache.store.evict_to(0)
    removed = cache.store.cleanup(partial_ttl_s=0)
    left = len(cache.store.entries())
    print(f"cleared {count(n, 'entry', 'entries')} ({format_size(freed)}) and {count(removed, 'temp file')}"
          + (f"; {count(left, 'pinned entry', 'pinned entries')} kept" if left else ""))
    cache.close()
    return 0


def cmd_verify(args) -> int:
    """``verify``: re-hash every entry against its recorded sha256; corrupt entries are listed and
    removed (unless pinned or the folder is read-only). Returns 0 when all are good, 1 otherwise."""
    cache = _open(args, writes=False)
    st = cache.store
    bad = unknown = 0
    entries = st.entries(meta=True)
    for e in tqdm(entries, desc="verify", unit="shard"):
        if e.meta is None or not e.meta.sha256:
            unknown += 1
            continue
        if hash_file(e.path, cache.config.chunk_bytes_int) != e.meta.sha256.lower():
            bad += 1
            if cache.read_only:
                print(f"CORRUPT {e.meta.url} ({e.path}): read-only folder, not removed", file=sys.stderr)
                continue
            removed = st.try_evict(e.key)
            print(f"CORRUPT {e.meta.url} ({e.path}): " + ("removed" if removed else "pinned now, not removed"),
                  file=sys.stderr)
    print(f"verified {count(len(entries) - unknown, 'entry', 'entries')}: {bad:,} corrupt, {unknown:,} without a known "
          "sha256")
    cache.close()
    return 1 if bad else 0


def cmd_tune(args) -> int:
    """``tune MANIFEST``: measure this node's disk and fetch rate and print a ``cache:`` config snippet.

    Returns 0, or 1 when a downloaded shard does not match the manifest (a wrong URL was measured)."""
    from cache.tools.tune import (
        Measurements,
        check_fetched,
        describe_disk,
        measure_disk,
        measure_remote,
        recommend,
        render,
    )
    from shards.format.manifest import Manifest, shard_url

    if args.nodes < 1:
        print(f"error: --nodes {args.nodes}: give the training job's node count (>= 1)", file=sys.stderr)
        return 2
    if not args.consume_mbps > 0 or math.isinf(args.consume_mbps):  # NaN fails the first test
        print(f"error: --consume-mbps {args.consume_mbps:g}: give the trainer's read rate on this node in MB/s "
              f"(a number > 0)", file=sys.stderr)
        return 2
    cache = _open(args)
    cfg = cache.config
    manifest = Manifest.load(args.manifest)
    if not manifest.shards:
        cache.close()
        print(f"{args.manifest}: the manifest lists no shards", file=sys.stderr)
        return 1
    w, r = measure_disk(cfg.path, parse_size(args.disk_bytes))
    sample = manifest.shards[: args.sample_shards]
    urls = [shard_url(args.manifest, s.name) for s in sample]
    try:
        lat, rate, fetched = measure_remote(urls, cfg.timeout_s)
    except Exception as e:  # noqa: BLE001 - any transport error ends the measurement with one line
        cache.close()
        print(f"error: cannot read {urls[0]} ({type(e).__name__}: {e}); check the manifest URL, its "
              f"signature and credentials", file=sys.stderr)
        return 1
    wrong = [p for p in (check_fetched(f, s.bytes) for f, s in zip(fetched, sample)) if p]
    if wrong:
        cache.close()
        print(f"error: {wrong[0]}: the measured URL is not the manifest's shard, so the numbers mean nothing; "
              f"check the manifest URL and that the shards sit beside it", file=sys.stderr)
        return 1
    m = Measurements(w, r, rate, lat)
    free = shutil.disk_usage(cfg.path).free + cache.store.usage()
    snippet, notes = recommend(m, args.consume_mbps, manifest.total_bytes / len(manifest.shards),
                               manifest.total_bytes, free, cfg.min_free_bytes_int, num_shards=len(manifest.shards),
                               nodes=args.nodes)
    print(render(snippet, m, notes, describe_disk(cfg.path)), end="")
    cache.close()
    return 0


def cmd_serve(args) -> int:
    """``serve DIR``: serve a folder over HTTP with Range support on ``--host``/``--port`` until Ctrl-C."""
    from cache.tools.serve import serve_directory

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


def _common_options(parser: argparse.ArgumentParser, top: bool) -> None:
    """Options every command takes, before or after its name (after: only when given, so they do
    not reset a value given before)."""
    kw = {} if top else {"default": argparse.SUPPRESS}
    parser.add_argument("--config", help="YAML config (a training config with a cache: section, or the section)", **kw)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, e.g. max_bytes=200GiB", **kw)
    parser.add_argument("--dir", help="cache directory (same as --set dir=...)", **kw)
    parser.add_argument("-v", "--verbose", action="store_true", help="log retries and evictions", **kw)


def build_parser(prog: str = "python -m cache") -> argparse.ArgumentParser:
    """The argument parser; ``prog`` is the command line its usage shows (``colaflow cache`` when run as that)."""
    p = argparse.ArgumentParser(prog=prog, description=help_text(__doc__.split("\n")[0]))
    _common_options(p, top=True)
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, top=False)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, help_: str, fn) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, parents=[common])
        c.set_defaults(fn=fn)
        return c

    command("status", "entries per dataset, usage, partial downloads, free disk (read-only)", cmd_status)
    w = command("warm", "download every shard of a manifest into the cache", cmd_warm)
    w.add_argument("manifest", help="manifest URL or folder")
    e = command("evict", "evict LRU unpinned entries down to a size", cmd_evict)
    e.add_argument("--to", help="target usage (default: max_bytes), e.g. 50GiB")
    command("clear", "remove every unpinned entry and stale temp file", cmd_clear)
    command("verify", "hash every entry; remove corrupt ones (exit 1 if any)", cmd_verify)
    t = command("tune", "measure disk/remote speed; print a node config snippet", cmd_tune)
    t.add_argument("manifest", help="manifest URL or folder to measure against")
    t.add_argument("--consume-mbps", type=float, required=True, help="trainer read rate on this node, MB/s")
    t.add_argument("--sample-shards", type=int, default=2, help="shards to download for the fetch rate")
    t.add_argument("--disk-bytes", default="256MiB", help="bytes written/read for the disk test")
    t.add_argument("--nodes", type=int, default=1, help="nodes of the training job: size the cache for this node's share")
    s = command("serve", "serve a folder over HTTP with Range support", cmd_serve)
    s.add_argument("directory")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--host", default="127.0.0.1")
    return p


def main(argv: list[str] | None = None, prog: str = "python -m cache") -> int:
    """Entry point of ``python -m cache`` and ``colaflow cache`` (``prog``, shown in its usage); returns
    the exit code (2 usage/config, 1 runtime, 130 Ctrl-C)."""
    args = build_parser(prog).parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR, format="%(levelname)s %(message)s")
    try:
        return args.fn(args)
    except (ConfigError, CacheError, FileNotFoundError, ValueError) as e:
        print(f"error: {explain(e)}", file=sys.stderr)
        # a write command pointed at a read-only cache is a usage error: the command is wrong there
        return USAGE if isinstance(e, CacheReadOnlyError) else exit_status(e)
    except PermissionError as e:
        where = getattr(args, "manifest", None) or getattr(args, "dir", None) or ""
        print(f"error: access denied to {where} ({e}); check the storage credentials (AWS_* variables, ~/.aws) "
              f"or the signed URL's token", file=sys.stderr)
        return 1
