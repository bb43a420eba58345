"""Several processes on one cache directory: each shard downloaded once; a killed downloader's lock
is released by the kernel and its partial file is resumed with a Range request."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import time

from cache import CacheConfig, ShardCache
from tests.support.paths import REPO

ROOT = str(REPO)
KIB = 1024

# one worker: fetch every shard (in its own order) and print the sha256 of what it got
WORKER = """
import hashlib, json, sys
from cache import CacheConfig, ShardCache
cfg = CacheConfig(**json.loads(sys.argv[1]))
items = json.loads(sys.argv[2])
cache = ShardCache(cfg, resolve=False)
print("ready", flush=True)
out = {}
for url, sha, size in items:
    with cache.pinned(url, sha, size) as path:
        out[url] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps({"digests": out, "metrics": cache.metrics()}), flush=True)
cache.close()
"""


def _put(root, name, size):
    data = hashlib.shake_256(name.encode()).digest(size)
    (root / name).write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _spawn(cfg: dict, items: list) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(cfg), json.dumps(items)],
                            stdout=subprocess.PIPE, text=True, env=env)


def _cfg(tmp_path, **kw) -> dict:
    base = dict(dir=str(tmp_path / "cache"), max_bytes="64MiB", min_free_bytes=0, backoff_s=0.01,
                chunk_bytes="32KiB", prefetch_shards=0, timeout_s=10)
    base.update(kw)
    return base


def test_four_processes_download_each_shard_once(tmp_path, http_server):
    server, base, root = http_server
    server.faults.rate_bytes_per_s = 8e6  # slow enough that the processes overlap on every shard
    items = [(f"{base}/s{i}.tar", _put(root, f"s{i}.tar", 256 * KIB), 256 * KIB) for i in range(6)]
    cfg = _cfg(tmp_path)
    procs = [_spawn(cfg, items[k:] + items[:k]) for k in (0, 0, 3, 5)]
    results = []
    for p in procs:
        lines = p.communicate(timeout=120)[0].splitlines()
        assert p.returncode == 0 and lines[0] == "ready"
        results.append(json.loads(lines[-1]))
    for r in results:
        assert r["digests"] == {url: sha for url, sha, _ in items}
    assert [len(server.gets(f"s{i}.tar")) for i in range(6)] == [1] * 6
    assert sum(r["metrics"]["bytes_fetched"] for r in results) == 6 * 256 * KIB


def test_killed_downloader_releases_lock_and_download_resumes(tmp_path, http_server):
    server, base, root = http_server
    size = 2 * 2**20
    sha = _put(root, "big.tar", size)
    server.faults.rate_bytes_per_s = 2e6  # ~1 s for the whole shard
    cfg = _cfg(tmp_path)
    url = f"{base}/big.tar"
    proc = _spawn(cfg, [(url, sha, size)])
    assert proc.stdout.readline().strip() == "ready"
    cache = ShardCache(CacheConfig(**cfg), resolve=False)
    part = cache.store.part_path(cache.key(url))
    deadline = time.monotonic() + 30
    while (not os.path.exists(part) or os.path.getsize(part) < 256 * KIB) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = os.path.getsize(part)
    assert 0 < written < size
    server.faults.rate_bytes_per_s = None
    path = cache.get(url, sha, size)  # would block forever if the dead process still held the fetch lock
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == sha
    gets = server.gets("big.tar")
    assert len(gets) == 2 and gets[1].status == 206
    resumed_from = int(gets[1].range.split("=")[1].rstrip("-"))
    assert resumed_from >= written - 32 * KIB and resumed_from > 0
    assert cache.metrics()["bytes_fetched"] == size - resumed_from
    cache.close()


def _forked_reader(cache: ShardCache, items: list, out) -> None:
    cache.prefetch(items)
    out.put([hashlib.sha256(open(cache.get(*it), "rb").read()).hexdigest() for it in items])


def test_cache_used_in_forked_worker(tmp_path, http_server):
    """A cache built in the parent keeps working (prefetch included) in a forked DataLoader-style worker."""
    _, base, root = http_server
    items = [(f"{base}/f{i}.tar", _put(root, f"f{i}.tar", 64 * KIB), 64 * KIB) for i in range(4)]
    cache = ShardCache(CacheConfig(**_cfg(tmp_path, prefetch_shards=2)), resolve=False)
    cache.get(*items[0])  # the parent has used fsspec and the pool before forking
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_forked_reader, args=(cache, items, out))
    proc.start()
    digests = out.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0 and digests == [sha for _, sha, _ in items]
    clone = pickle.loads(pickle.dumps(cache))  # what a spawned worker receives
    assert clone.config == cache.config and clone.get(*items[1]) == cache.get(*items[1])
    assert clone.metrics()["hits"] == 1
    clone.close()
    cache.close()


def test_a_frozen_fetch_lock_holder_is_named_not_waited_on_forever(tmp_path, http_server):
    """Issue 37: a process holding a shard's fetch lock while it is alive but makes no progress (here
    it only holds the lock) made every other process wait for ever; now the wait ends after
    cache.fetch_wait_s without progress, in an error naming the holder's pid."""
    import pytest

    from cache import CacheLockError

    server, base, root = http_server
    sha = _put(root, "s.tar", 64 * KIB)
    cache = ShardCache(CacheConfig(**_cfg(tmp_path, fetch_wait_s=0.3)), resolve=False)
    lock = cache.store.fetch_lock(cache.key(f"{base}/s.tar")).path
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from cache.storage.locks import FileLock; "
                               "lock = FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(120)", lock],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(CacheLockError, match=f"held by pid {holder.pid} .*no progress for 0.3 s"):
            cache.get(f"{base}/s.tar", sha, 64 * KIB)
    finally:
        holder.kill()
        holder.wait()
    assert open(cache.get(f"{base}/s.tar", sha, 64 * KIB), "rb").read() == (root / "s.tar").read_bytes()


def test_a_frozen_eviction_probe_is_named_not_waited_on_forever(tmp_path, http_server):
    """Issue 37: a reader pins its shard with a shared lock that an eviction probes exclusively for
    moments; a probing process frozen there (here it only holds the probe) made the reader wait for
    ever. Now that wait ends after cache.fetch_wait_s too, naming the holder's pid."""
    import pytest

    from cache import CacheLockError

    server, base, root = http_server
    sha = _put(root, "s.tar", 64 * KIB)
    cache = ShardCache(CacheConfig(**_cfg(tmp_path, fetch_wait_s=1.0)), resolve=False)
    lock = cache.store.pin_lock(cache.key(f"{base}/s.tar")).path
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from cache.storage.locks import FileLock; "
                               "lock = FileLock(sys.argv[1]); lock.acquire(); print('held', flush=True); time.sleep(120)", lock],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(CacheLockError, match=f"held by pid {holder.pid} "):
            with cache.pinned(f"{base}/s.tar", sha, 64 * KIB):
                pass
    finally:
        holder.kill()
        holder.wait()
    with cache.pinned(f"{base}/s.tar", sha, 64 * KIB) as path:
        assert open(path, "rb").read() == (root / "s.tar").read_bytes()
