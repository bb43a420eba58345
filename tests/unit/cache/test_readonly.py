"""A pre-filled cache on a read-only folder: verified entries are served without any write,
``python -m cache status`` and ``verify`` work, and commands that must write say so in one line.

Tests run as root, which ignores permission bits, so the folder is made read-only for real: a
read-only bind mount (``mount -o bind,ro``), or, where mounting is not allowed, permission bits
plus running the commands as the unprivileged user ``nobody``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from tests.unit.cache.test_cli import publish

from cache import CacheConfig, ShardCache
from shards import shard_url
from tests.support.paths import REPO

ROOT = str(REPO)
NOBODY = 65534

READER = """
import hashlib, json, sys
from cache import CacheConfig, CacheReadOnlyError, ShardCache
cache = ShardCache(CacheConfig(dir=sys.argv[1], min_free_bytes=0, prefetch_shards=2), resolve=False)
items = json.loads(sys.argv[2])
cache.prefetch(items)
out = {"read_only": cache.read_only, "digests": []}
for url, sha, size in items[:2]:
    with cache.pinned(url, sha, size) as path:
        out["digests"].append(hashlib.sha256(open(path, "rb").read()).hexdigest())
try:
    cache.get(*items[2])
except CacheReadOnlyError as e:
    out["error"] = str(e)
out["metrics"] = cache.metrics()
cache.close()
print(json.dumps(out))
"""


def _snapshot(root: str) -> dict:
    """Every file and folder under ``root`` with its size and mtime (what a write would change)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            st = os.stat(os.path.join(d, n))
            out[os.path.relpath(os.path.join(d, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def read_only_cache(http_server):
    """``(folder, items, run)``: a cache holding the first 2 of 3 shards (verified), made read-only;
    ``run(argv)`` runs a command against it as a process that cannot write it."""
    server, base, served = http_server
    m = publish(served, n=3)
    items = [(shard_url(f"{base}/manifest.json", s.name), s.sha256, s.bytes) for s in m.shards]
    work = tempfile.mkdtemp(prefix="colaflow-ro-")
    os.chmod(work, 0o755)  # the fallback user must reach it
    rw, ro = os.path.join(work, "rw"), os.path.join(work, "ro")
    os.mkdir(ro)
    cache = ShardCache(CacheConfig(dir=rw, min_free_bytes=0), resolve=False)
    for it in items[:2]:
        cache.get(*it)
    cache.close()
    mounted = subprocess.run(["mount", "-o", "bind,ro", rw, ro], capture_output=True).returncode == 0
    user = None
    if not mounted:
        os.rmdir(ro)
        ro = rw
        subprocess.run(["chmod", "-R", "a-w", rw], check=True)
        user = NOBODY
    env = dict(os.environ, PYTHONPATH=ROOT, HOME=work, PYTHONDONTWRITEBYTECODE="1")

    def run(argv: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT,
                              user=user, timeout=120)

    try:
        if user is not None:
            try:
                run(["-c", "pass"])
            except PermissionError:
                pytest.skip("neither a read-only mount nor running this Python as user nobody is allowed here")
        yield ro, items, run, f"{base}/manifest.json"
    finally:
        if mounted:
            subprocess.run(["umount", ro], check=True)
        subprocess.run(["chmod", "-R", "u+w", rw], check=True)
        shutil.rmtree(work)


def test_reader_serves_verified_entries_without_writing(read_only_cache):
    ro, items, run, _ = read_only_cache
    before = _snapshot(ro)
    p = run(["-c", READER, ro, json.dumps(items)])
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["read_only"] is True and out["digests"] == [sha for _, sha, _ in items[:2]]
    assert "is not in the read-only cache" in out["error"] and "shard-000002.tar" in out["error"]
    assert out["metrics"]["hits"] == 2 and out["metrics"]["bytes_fetched"] == 0
    assert _snapshot(ro) == before


def test_commands_on_a_read_only_cache(read_only_cache):
    ro, _, run, manifest = read_only_cache
    before = _snapshot(ro)
    p = run(["-m", "cache", "status", "--dir", ro])
    assert p.returncode == 0 and "access         read-only" in p.stdout, p.stderr
    assert "entries        2 (2 verified, 0 pinned now)" in p.stdout
    p = run(["-m", "cache", "verify", "--dir", ro])
    assert p.returncode == 0 and "verified 2 entries: 0 corrupt" in p.stdout, p.stderr
    for argv in (["warm", manifest], ["evict", "--to", "0"], ["clear"]):
        p = run(["-m", "cache", "--dir", ro, *argv])
        assert p.returncode == 2 and p.stdout == "", (argv, p.stdout, p.stderr)
        assert p.stderr.count("\n") == 1 and f"is read-only and `{argv[0]}` must write there" in p.stderr
    assert _snapshot(ro) == before
