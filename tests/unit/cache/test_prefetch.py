"""Prefetch near the byte limit: a prefetched shard the reader has not read yet is held until it
is read (no other prefetch evicts it), and the depth is capped so that the shards ahead plus the one in hand fit —
so every shard is fetched once per pass even when ``max_bytes`` is close to the working set."""
from __future__ import annotations

import hashlib
import os
import time

import pytest
from tests.unit.cache.test_store import make_shard

from cache import CacheConfig, CacheFullError, ShardCache

KIB = 1024


def _cfg(tmp_path, **kw) -> CacheConfig:
    base = dict(dir=str(tmp_path / "cache"), min_free_bytes=0, backoff_s=0.0, chunk_bytes="16KiB")
    base.update(kw)
    return CacheConfig(**base)


def _wait_held(cache: ShardCache, n: int) -> None:
    deadline = time.monotonic() + 30
    while cache._prefetcher.held != n and time.monotonic() < deadline:
        time.sleep(0.01)
    assert cache._prefetcher.held == n


def test_limit_of_two_shards_fetches_each_shard_once(tmp_path):
    (tmp_path / "src").mkdir()
    shards = [make_shard(tmp_path / "src", f"p{i}.tar", 100 * KIB) for i in range(8)]
    cache = ShardCache(_cfg(tmp_path, max_bytes=2 * 100 * KIB + 10 * KIB, prefetch_shards=3), resolve=False)
    cache.prefetch(shards)
    for url, sha, size in shards:
        with cache.pinned(url, sha, size) as path:
            assert hashlib.sha256(open(path, "rb").read()).hexdigest() == sha
    assert cache.metrics()["bytes_fetched"] == 8 * 100 * KIB
    assert cache.prefetch_depth(shards) == 1  # 2 shards fit: one in hand, one ahead
    cache.close()


def test_prefetched_unread_shard_survives_eviction(tmp_path):
    (tmp_path / "src").mkdir()
    shards = [make_shard(tmp_path / "src", f"q{i}.tar", 64 * KIB) for i in range(4)]
    cache = ShardCache(_cfg(tmp_path, max_bytes="1MiB", prefetch_shards=1), resolve=False)
    other = ShardCache(_cfg(tmp_path, max_bytes="1MiB", prefetch_shards=0), resolve=False)  # another process
    cache.prefetch(shards)
    cache.get(*shards[0])
    _wait_held(cache, 1)
    assert other.store.evict_to(0) == (1, 64 * KIB)  # shard 0 goes, shard 1 (prefetched, unread) stays
    assert cache.path_of(shards[1][0]) is not None and cache.path_of(shards[0][0]) is None
    hits = cache.metrics()["hits"]  # shard 0's read is a hit too when the prefetcher fetched it first (a slow start)
    with cache.pinned(*shards[1]) as path:
        assert os.path.getsize(path) == 64 * KIB
    _wait_held(cache, 1)  # now shard 2
    assert cache.metrics()["hits"] == hits + 1 and cache.metrics()["bytes_fetched"] == 3 * 64 * KIB  # 0, 1 and 2 once
    cache.close()
    assert cache._prefetcher.held == 0
    other.close()


def test_a_reader_may_evict_a_held_shard_a_prefetch_may_not(tmp_path):
    """Holds protect prefetched shards from other prefetches only: a reader that finds no other
    room evicts a held shard rather than fail."""
    (tmp_path / "src").mkdir()
    shards = [make_shard(tmp_path / "src", f"r{i}.tar", 64 * KIB) for i in range(4)]
    limit = 2 * 64 * KIB
    a = ShardCache(_cfg(tmp_path, max_bytes=limit, prefetch_shards=1), resolve=False)
    b = ShardCache(_cfg(tmp_path, max_bytes=limit, prefetch_shards=0), resolve=False)  # another process
    a.prefetch(shards[:2])
    a.get(*shards[0])
    _wait_held(a, 1)  # shard 1: downloaded for a, not read yet
    b.get(*shards[2])  # evicts shard 0, the only entry nobody holds
    assert a.path_of(shards[0][0]) is None and a.path_of(shards[1][0]) is not None
    with b.pinned(*shards[2]):
        with pytest.raises(CacheFullError):
            b._prefetch_one(*shards[3])  # a prefetch may not push out a's held shard
        path = b.get(*shards[3])  # a reader may
    assert open(path, "rb").read() == open(shards[3][0], "rb").read()
    assert a.path_of(shards[1][0]) is None
    a.close()
    b.close()
