"""``max_bytes`` holds when processes share a cache: a commit (rename ``tmp/`` -> ``data/``) can no
longer fall between the two listings of an accounting pass, and 3 processes reading more data than
the limit never push the cache's files above it."""
from __future__ import annotations

import hashlib
import json
import os
import threading

from cache import CacheConfig, ShardCache
from cache.storage.store import Store
from tests.support.paths import REPO

MIB = 2**20


def _write(path: str, size: int) -> None:
    with open(path, "wb") as f:
        f.write(b"\x07" * size)


def _disk_use(store: Store) -> int:
    """Bytes of the cache's shard files now: complete entries + partial downloads (sidecars excluded)."""
    names = [os.path.join(store.root, "data", n) for n in os.listdir(os.path.join(store.root, "data"))
             if not n.endswith(".meta")]
    names += [os.path.join(store.root, "tmp", n) for n in os.listdir(os.path.join(store.root, "tmp"))
              if n.endswith(".part")]
    total = 0
    for p in names:
        try:
            total += os.path.getsize(p)
        except FileNotFoundError:
            pass
    return total


def test_download_committed_between_listings_is_counted(tmp_path):
    """Deterministic replay of the race: process B commits shard X while process A's reservation
    has listed data/ but not yet tmp/. Before the fix A counted X nowhere: 6 MiB held, limit 4 MiB."""
    root = str(tmp_path / "cache")
    a, b = Store(root, 4 * MIB, 0), Store(root, 4 * MIB, 0)  # two processes' views of one folder
    _write(a.part_path("y"), 2 * MIB)
    a.commit("y", "src/y.tar", None, False)  # Y: complete, unpinned, least recently used
    fetch_x = b.fetch_lock("x")
    fetch_x.acquire()
    b.reserve("x", 2 * MIB, "src/x.tar")
    _write(b.part_path("x"), 2 * MIB)  # B's download of X is complete, about to commit

    committed = threading.Event()

    def b_commits() -> None:
        b.commit("x", "src/x.tar", None, False)
        b.release("x")
        committed.set()

    listed_tmp = a.partials
    other = threading.Thread(target=b_commits)

    def partials_after_b_commits():
        other.start()
        committed.wait(1.0)  # a correct store makes B's commit wait for A's global lock instead
        return listed_tmp()

    a.partials = partials_after_b_commits
    fetch_z = a.fetch_lock("z")
    fetch_z.acquire()
    a.reserve("z", 2 * MIB, "src/z.tar")
    a.partials = listed_tmp
    _write(a.part_path("z"), 2 * MIB)
    other.join(10)
    fetch_x.release()
    assert committed.is_set()
    assert not os.path.exists(a.data_path("y"))  # Y had to make room for Z
    assert _disk_use(a) == 4 * MIB and a.usage() == 4 * MIB
    fetch_z.release()


WORKER = """
import hashlib, json, sys
from cache import CacheConfig, ShardCache
cache = ShardCache(CacheConfig(**json.loads(sys.argv[1])), resolve=False)
items = json.loads(sys.argv[2])
cache.prefetch(items)
ok = 0
for url, sha, size in items:
    with cache.pinned(url, sha, size) as path:
        ok += hashlib.sha256(open(path, "rb").read()).hexdigest() == sha
print(json.dumps({"ok": ok, "metrics": cache.metrics()}), flush=True)
cache.close()
"""


def test_three_processes_never_exceed_max_bytes(tmp_path, http_server):
    """3 processes read 12 shards (3 MiB) through one cache limited to 7 shards, each in its own order
    with prefetch; a sampler counts the cache's files under the accounting lock all along."""
    import subprocess
    import sys

    server, base, root = http_server
    server.faults.rate_bytes_per_s = 16e6  # downloads overlap across the processes
    size, n = 256 * 1024, 12
    items = []
    for i in range(n):
        data = hashlib.shake_256(f"m{i}".encode()).digest(size)
        (root / f"m{i}.tar").write_bytes(data)
        items.append((f"{base}/m{i}.tar", hashlib.sha256(data).hexdigest(), size))
    limit = 7 * size
    cfg = dict(dir=str(tmp_path / "cache"), max_bytes=limit, min_free_bytes=0, backoff_s=0.01,
               chunk_bytes="32KiB", prefetch_shards=1, timeout_s=10)
    store = ShardCache(CacheConfig(**cfg), resolve=False).store
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(cfg), json.dumps(items[k:] + items[:k])],
                              stdout=subprocess.PIPE, text=True, env=env) for k in (0, 4, 8)]
    peak, samples = 0, 0
    while any(p.poll() is None for p in procs):
        with store.global_lock():
            peak = max(peak, _disk_use(store))
        samples += 1
    results = [json.loads(p.communicate(timeout=60)[0].splitlines()[-1]) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert [r["ok"] for r in results] == [n, n, n]
    assert samples > 20 and 0 < peak <= limit, (samples, peak)
    assert sum(r["metrics"]["bytes_fetched"] for r in results) >= n * size  # more data than fits
