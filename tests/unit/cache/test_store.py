"""Shard cache on local-path sources: limits, LRU, pins, verification policies, restart, full disk."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cache import CacheConfig, CacheFullError, ShardCache, ShardFetchError, ShardVerifyError

KIB = 1024


def make_shard(root, name: str, size: int, seed: int = 0) -> tuple[str, str, int]:
    """Write a file of ``size`` pseudo-random bytes; returns (path, sha256, size)."""
    data = hashlib.shake_256(f"{name}-{seed}".encode()).digest(size)
    path = os.path.join(str(root), name)
    with open(path, "wb") as f:
        f.write(data)
    return path, hashlib.sha256(data).hexdigest(), size


def cfg(tmp_path, **kw) -> CacheConfig:
    base = dict(dir=str(tmp_path / "cache"), max_bytes="1MiB", min_free_bytes=0, backoff_s=0.0,
                chunk_bytes="16KiB", prefetch_shards=0)
    base.update(kw)
    return CacheConfig(**base)


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "src"
    d.mkdir()
    return d


def test_get_copies_verifies_and_hits(tmp_path, src):
    url, sha, size = make_shard(src, "a.tar", 100 * KIB)
    cache = ShardCache(cfg(tmp_path), resolve=False)
    path = cache.get(url, sha, size)
    assert path.startswith(str(tmp_path / "cache")) and open(path, "rb").read() == open(url, "rb").read()
    assert cache.get(url, sha, size) == path
    m = cache.metrics()
    assert (m["hits"], m["misses"], m["bytes_fetched"], m["bytes_served"]) == (1, 1, size, 2 * size)
    assert os.listdir(tmp_path / "cache" / "tmp") == []
    assert 'colaflow_cache_hits_total 1.0' in cache._metrics.text()
    cache.close()


def test_lru_eviction_respects_limit_and_order(tmp_path, src):
    shards = [make_shard(src, f"s{i}.tar", 300 * KIB) for i in range(5)]
    cache = ShardCache(cfg(tmp_path, max_bytes="1MiB"), resolve=False)
    for s in shards[:3]:
        cache.get(*s)
    cache.get(*shards[0])  # s0 is now most recent; s1 is LRU
    cache.get(*shards[3])
    assert cache.path_of(shards[1][0]) is None
    assert all(cache.path_of(shards[i][0]) for i in (0, 2, 3))
    assert cache.store.usage() <= 2**20 and cache.metrics()["evictions"] == 1
    cache.close()


def test_pinned_entry_is_never_evicted(tmp_path, src):
    a, b, c = (make_shard(src, f"{n}.tar", 400 * KIB) for n in "abc")
    cache = ShardCache(cfg(tmp_path, max_bytes="900KiB"), resolve=False)
    with cache.pinned(*a) as pa:
        cache.get(*b)
        cache.get(*c)  # must evict b, not the older but pinned a
        assert os.path.exists(pa) and cache.path_of(b[0]) is None
        with cache.pinned(*c):
            with pytest.raises(CacheFullError, match="b.tar"):
                cache.get(*b)
    assert os.listdir(tmp_path / "cache" / "tmp") == []
    cache.get(*b)  # after unpinning there is room again
    cache.close()


def test_pin_held_by_another_process_blocks_eviction(tmp_path, src):
    a, b = (make_shard(src, f"{n}.tar", 600 * KIB) for n in "ab")
    cache = ShardCache(cfg(tmp_path), resolve=False)
    cache.get(*a)
    pin = cache.store.pin_lock(cache.key(a[0])).path
    code = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.flock(fd, fcntl.LOCK_SH); print('pinned', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, pin], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "pinned"
        with pytest.raises(CacheFullError):
            cache.get(*b)
    finally:
        holder.kill()
        holder.wait()
    assert cache.get(*b) and cache.path_of(a[0]) is None
    cache.close()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=25))
def test_usage_never_exceeds_limit(tmp_path_factory, ops):
    root = tmp_path_factory.mktemp("inv")
    shards = [make_shard(root, f"s{i}.tar", (i + 1) * 70 * KIB) for i in range(6)]
    cache = ShardCache(cfg(root, max_bytes="700KiB"), resolve=False)
    pinned_paths = []
    with_pins = []
    for i, pin in ops:
        if pin and sum(shards[j][2] for j in with_pins) + shards[i][2] <= 280 * KIB:  # plus the largest shard fits in the limit
            ctx = cache.pinned(*shards[i])
            pinned_paths.append((ctx, ctx.__enter__()))
            with_pins.append(i)
        else:
            cache.get(*shards[i])
        assert cache.store.usage() <= 700 * KIB
        for _, p in pinned_paths:
            assert os.path.exists(p)
    for ctx, _ in pinned_paths:
        ctx.__exit__(None, None, None)
    cache.close()


def test_min_free_bytes_is_kept(tmp_path, src):
    a = make_shard(src, "a.tar", 10 * KIB)
    free = os.statvfs(str(tmp_path)).f_bavail * os.statvfs(str(tmp_path)).f_frsize
    cache = ShardCache(cfg(tmp_path, max_bytes="1TiB", min_free_bytes=free + 2**30), resolve=False)
    with pytest.raises(CacheFullError, match="min_free_bytes"):
        cache.get(*a)
    assert os.listdir(tmp_path / "cache" / "data") == []
    cache.close()


def test_full_disk_gives_clear_error_and_no_corrupt_entry(tmp_path, src):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); min_free_bytes test covers the limit path")
    try:
        big = make_shard(src, "big.tar", 2 * 2**20)
        small = make_shard(src, "small.tar", 100 * KIB)
        cache = ShardCache(cfg(tmp_path, dir=str(mnt / "c"), max_bytes="100MiB"), resolve=False)
        with pytest.raises(CacheFullError, match="big.tar"):
            cache.get(*big)  # the free-space check sees the 1 MiB tmpfs
        cache.config.min_free_bytes = 0
        cache.store.min_free_bytes = -2**30  # pretend there is room: the write itself hits ENOSPC
        with pytest.raises(CacheFullError, match="big.tar"):
            cache.get(*big)
        assert os.listdir(mnt / "c" / "data") == [] and os.listdir(mnt / "c" / "tmp") == []
        assert open(cache.get(*small), "rb").read() == open(small[0], "rb").read()
        cache.close()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_restart_reuses_verified_files_and_cleans_temp(tmp_path, src):
    a = make_shard(src, "a.tar", 64 * KIB)
    c1 = ShardCache(cfg(tmp_path), resolve=False)
    path = c1.get(*a)
    c1.close()
    tmp = tmp_path / "cache" / "tmp"
    (tmp / "dead.resv").write_text("999999999")  # reservation of a process that died
    old_part = tmp / "old.part"
    old_part.write_bytes(b"x" * 10)
    os.utime(old_part, (1, 1))
    os.remove(a[0])  # the source is gone: a restart must not need it
    c2 = ShardCache(cfg(tmp_path, partial_ttl_s=3600), resolve=False)
    assert c2.get(a[0], a[1], a[2]) == path
    assert c2.metrics()["hits"] == 1 and sorted(os.listdir(tmp)) == []
    c2.close()


@pytest.mark.parametrize("keep_mtime", [True, False])
def test_bit_flip_detected_and_refetched(tmp_path, src, keep_mtime):
    a = make_shard(src, "a.tar", 64 * KIB)
    first = ShardCache(cfg(tmp_path, verify="first"), resolve=False)
    path = first.get(*a)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0x10]))
    if keep_mtime:  # bit rot: contents change, mtime does not -> only `always` notices
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert first.get(*a) == path and first.metrics()["corrupt"] == 0
        cache = ShardCache(cfg(tmp_path, verify="always"), resolve=False)
    else:  # an in-place write changes mtime -> even `first` re-hashes
        cache = first
    fixed = cache.get(*a)
    assert open(fixed, "rb").read() == open(a[0], "rb").read()
    assert cache.metrics()["corrupt"] == 1
    first.close()
    cache.close()


def test_verify_never_skips_hash_but_checks_size(tmp_path, src):
    a = make_shard(src, "a.tar", 32 * KIB)
    cache = ShardCache(cfg(tmp_path, verify="never", retries=0), resolve=False)
    assert cache.get(a[0], "0" * 64, a[2])  # wrong digest is not looked at
    with pytest.raises(ShardVerifyError, match="b.tar.*got 10 bytes, manifest says 11"):
        cache.get(make_shard(src, "b.tar", 10)[0], None, 11)
    cache.close()


def test_wrong_sha256_is_reported_after_retries(tmp_path, src):
    a = make_shard(src, "a.tar", 32 * KIB)
    cache = ShardCache(cfg(tmp_path, retries=2), resolve=False)
    with pytest.raises(ShardVerifyError, match=r"a\.tar.*3 attempt.*sha256"):
        cache.get(a[0], "f" * 64, a[2])
    assert cache.metrics()["retries"] == 3 and cache.path_of(a[0]) is None
    assert os.listdir(tmp_path / "cache" / "tmp") == []
    cache.close()


def test_missing_source_fails_fast(tmp_path, src):
    cache = ShardCache(cfg(tmp_path, retries=5, backoff_s=10), resolve=False)
    with pytest.raises(ShardFetchError, match="nope.tar.*not found"):
        cache.get(str(src / "nope.tar"), None, 10)
    cache.close()


def test_decompress_tar_zst(tmp_path, src):
    raw = hashlib.shake_256(b"z").digest(200 * KIB)
    # two frames: the stream reader must continue across frame boundaries
    blob = zstandard.ZstdCompressor().compress(raw[:50000]) + zstandard.ZstdCompressor().compress(raw[50000:])
    (src / "d.tar.zst").write_bytes(blob)
    url, sha = str(src / "d.tar.zst"), hashlib.sha256(raw).hexdigest()
    for size in (len(raw), None):
        cache = ShardCache(cfg(tmp_path / str(size)), resolve=False)
        path = cache.get(url, sha, size)
        assert path.endswith("d.tar") and open(path, "rb").read() == raw
        cache.close()
    (src / "t.tar.zst").write_bytes(blob[:-100])
    cache = ShardCache(cfg(tmp_path / "t", retries=0), resolve=False)
    with pytest.raises(ShardFetchError, match="t.tar.zst.*truncated"):
        cache.get(str(src / "t.tar.zst"), None, None)
    cache.close()
