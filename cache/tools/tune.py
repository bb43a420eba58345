"""Measure a node's disk and remote throughput and recommend cache settings (``python -m cache tune``).

Prefetch depth model: one shard takes ``latency + shard_bytes / fetch_rate`` seconds to
download on one stream and ``shard_bytes / consume_rate`` seconds to read; with ``d``
downloads in flight the reader never waits if ``d >= ceil(fetch_time / consume_time)``,
plus one in hand (standard read-ahead sizing, Little's law: in-flight = rate x latency),
and never more than the dataset's shard count.
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time
from dataclasses import dataclass

import fsspec
import psutil
import yaml

from cache.config import format_size
from colaflow.network import storage_options
from shards.format.urls import url_name

MB = 1e6
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"  # RFC 8878 §3.1.1: first 4 bytes of every zstd frame


@dataclass
class Measurements:
    """Measured rates (MB/s, 1 MB = 1e6 bytes) and latency (seconds)."""

    disk_write_mbps: float
    disk_read_mbps: float
    fetch_mbps: float
    latency_s: float


def measure_disk(directory: str, nbytes: int = 256 << 20, block: int = 4 << 20) -> tuple[float, float]:
    """Sequential write (with fsync) then read of ``nbytes`` in ``directory``; returns (write, read) MB/s.

    The page cache is dropped for the file (``posix_fadvise DONTNEED``) before the read so it
    measures the device where the kernel allows it.
    """
    path = os.path.join(directory, f".tune-{os.getpid()}")
    buf = os.urandom(block)
    try:
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for _ in range(max(1, nbytes // block)):
                f.write(buf)
            f.flush()
            os.fsync(f.fileno())
        write_s = time.perf_counter() - t0
        total = os.path.getsize(path)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, block):
                pass
            read_s = time.perf_counter() - t0
        finally:
            os.close(fd)
    finally:
        if os.path.exists(path):
            os.remove(path)
    return total / MB / max(write_s, 1e-9), total / MB / max(read_s, 1e-9)


def describe_disk(path: str) -> str:
    """Which disk ``path`` is on, for humans: ``PATH (mount M, device D, FSTYPE)`` (via psutil)."""
    mount = os.path.abspath(path)
    while not os.path.ismount(mount):
        mount = os.path.dirname(mount)
    for part in psutil.disk_partitions(all=True):
        if part.mountpoint == mount:
            return f"{path} (mount {mount}, device {part.device}, {part.fstype})"
    return f"{path} (mount {mount})"


@dataclass
class Fetched:
    """What one measured URL returned: its ``url``, byte count ``nbytes`` and first bytes ``head``."""

    url: str
    nbytes: int
    head: bytes


def check_fetched(got: Fetched, manifest_bytes: int) -> str | None:
    """Why ``got`` is not the shard the manifest lists (``None`` if it plausibly is): a ``*.zst`` shard
    must start with the zstd magic number, any other must have the manifest's size in bytes."""
    if url_name(got.url).endswith(".zst"):
        if got.head[:4] != ZSTD_MAGIC:
            return f"{got.url}: returned {got.nbytes} bytes that are not a zstd stream"
    elif got.nbytes != manifest_bytes:
        return f"{got.url}: returned {got.nbytes} bytes, the manifest says {manifest_bytes}"
    return None


def measure_remote(urls: list[str], timeout_s: float = 60.0, probes: int = 5,
                   block: int = 4 << 20) -> tuple[float, float, list[Fetched]]:
    """Median latency of 1-byte reads (seconds), streaming fetch rate of ``urls`` (MB/s, one stream)
    and what each URL returned (to check it against the manifest)."""
    fs, _ = fsspec.core.url_to_fs(urls[0], **storage_options(urls[0], timeout_s))
    lat = []
    for i in range(probes):
        t0 = time.perf_counter()
        fs.cat_file(urls[i % len(urls)], start=0, end=1)
        lat.append(time.perf_counter() - t0)
    fetched, t0 = [], time.perf_counter()
    for url in urls:
        kw = {"block_size": 0} if url.startswith(("http://", "https://")) else {}
        got = Fetched(url, 0, b"")
        with fs.open(url, "rb", **kw) as f:
            while True:
                b = f.read(block)
                if not b:
                    break
                if not got.nbytes:
                    got.head = b[:16]
                got.nbytes += len(b)
        fetched.append(got)
    nbytes = sum(f.nbytes for f in fetched)
    return statistics.median(lat), nbytes / MB / max(time.perf_counter() - t0, 1e-9), fetched


def node_share(dataset_bytes: int, shard_bytes: float, num_shards: int | None, nodes: int) -> tuple[int, int | None]:
    """``(bytes, shards)`` one of ``nodes`` nodes reads per epoch: ``1/nodes`` of the dataset plus the
    shard or two it receives documents of, counted as 2 (the loader's deal over nodes,
    :mod:`loaders.order.split`), never more than the dataset."""
    if nodes <= 1:
        return dataset_bytes, num_shards
    share = min(dataset_bytes, int(dataset_bytes / nodes + 2 * shard_bytes))
    return share, None if num_shards is None else min(num_shards, -(-num_shards // nodes) + 2)


def recommend(m: Measurements, consume_mbps: float, shard_bytes: float, dataset_bytes: int,
              disk_free_bytes: int, min_free_bytes: int, hostname: str | None = None,
              num_shards: int | None = None, nodes: int = 1) -> tuple[dict, list[str]]:
    """Recommended ``{prefetch_shards, max_bytes}`` for a node and the notes explaining them.

    Args:
        m: measurements.
        consume_mbps: the trainer's read rate on this node, MB/s.
        shard_bytes: mean shard size, bytes.
        dataset_bytes: whole dataset size, bytes.
        disk_free_bytes: free bytes on the cache's file system (plus what the cache holds now).
        min_free_bytes: free space to keep, bytes.
        hostname: node name for the snippet (default this host).
        num_shards: shards in the dataset; downloads in flight never exceed the node's (``None``: no cap).
        nodes: nodes of the training job: each reads its share of the dataset (:func:`node_share`),
            which is what the cache has to hold.

    Returns:
        ``(snippet dict, notes)``; the snippet is the ``cache:`` YAML section with a ``nodes`` entry.
    """
    notes = []
    whole = dataset_bytes
    dataset_bytes, num_shards = node_share(dataset_bytes, shard_bytes, num_shards, nodes)
    if nodes > 1:
        notes.append(f"this node reads 1/{nodes} of the dataset ({format_size(whole)}) plus about 2 shards: "
                     f"{format_size(dataset_bytes)} per epoch (the same shards every epoch with data.shard_lanes "
                     f"a multiple of {nodes})")
    fetch_s = m.latency_s + shard_bytes / MB / max(m.fetch_mbps, 1e-9)
    consume_s = shard_bytes / MB / max(consume_mbps, 1e-9)
    depth = max(1, min(64, math.ceil(fetch_s / max(consume_s, 1e-9)) + 1))
    capped = num_shards is not None and depth > num_shards
    depth = max(1, min(depth, num_shards)) if capped else depth
    notes.append(f"one shard: {fetch_s:.2f}s to fetch on one stream, {consume_s:.2f}s to consume "
                 f"-> {depth} downloads in flight" + (f" (capped at the {'node' if nodes > 1 else 'dataset'}'s {num_shards} shards)" if capped else ""))
    if depth * m.fetch_mbps < consume_mbps:
        notes.append(f"WARNING: {depth} streams of {m.fetch_mbps:.0f} MB/s cannot match the consumption rate; "
                     f"expect stalls")
    if min(m.disk_write_mbps, m.disk_read_mbps) < consume_mbps:
        notes.append(f"WARNING: the disk ({m.disk_write_mbps:.0f}/{m.disk_read_mbps:.0f} MB/s write/read) is "
                     f"slower than consumption ({consume_mbps:.0f} MB/s)")
    room = max(0, disk_free_bytes - min_free_bytes)
    floor = int((depth + 2) * shard_bytes)
    if dataset_bytes * 1.05 <= room:
        max_bytes = int(dataset_bytes * 1.05)
        what = "the node's share" if nodes > 1 else "the whole dataset"
        notes.append(f"{what} ({format_size(dataset_bytes)}) fits: epochs after the first read from disk")
    else:
        max_bytes = max(floor, room)
        what = "the node's share" if nodes > 1 else "the dataset"
        notes.append(f"{what} ({format_size(dataset_bytes)}) does not fit in {format_size(room)}: "
                     f"every epoch streams from the source")
    gib = math.ceil(max_bytes / 2**30)
    snippet = {"cache": {"nodes": {hostname or socket.gethostname(): {
        "prefetch_shards": depth, "max_bytes": f"{gib}GiB"}}}}
    return snippet, notes


def render(snippet: dict, m: Measurements, notes: list[str], disk: str = "") -> str:
    """YAML snippet with the measurements and notes as comments; ``disk`` names the measured disk."""
    head = [f"# disk measured: {disk}"] if disk else []
    head += [f"# disk write {m.disk_write_mbps:.0f} MB/s, read {m.disk_read_mbps:.0f} MB/s; remote "
            f"{m.fetch_mbps:.0f} MB/s per stream, latency {m.latency_s * 1000:.1f} ms"]
    head += [f"# {n}" for n in notes]
    return "\n".join(head) + "\n" + yaml.safe_dump(snippet, sort_keys=False)
