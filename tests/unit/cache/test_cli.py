"""``python -m cache`` commands against a real HTTP server and a real manifest."""
from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys

import fsspec
import yaml

from cache.tools.cli import main
from shards.format.manifest import Manifest, ShardInfo
from tests.support.paths import REPO

ROOT = str(REPO)
KIB = 1024


def publish(root, n=3, size=64 * KIB) -> Manifest:
    shards = []
    for i in range(n):
        data = hashlib.shake_256(f"c{i}".encode()).digest(size)
        (root / f"shard-{i:06d}.tar").write_bytes(data)
        shards.append(ShardInfo(f"shard-{i:06d}.tar", 1, 0, size, hashlib.sha256(data).hexdigest()))
    m = Manifest(shards=shards)
    m.save(str(root))
    return m


def run(capsys, tmp_path, *argv) -> tuple[int, str, str]:
    rc = main(["--dir", str(tmp_path / "cache"), "--set", "min_free_bytes=0", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_warm_status_verify_evict_clear(tmp_path, http_server, capsys):
    server, base, root = http_server
    publish(root)
    rc, out, _ = run(capsys, tmp_path, "warm", f"{base}/manifest.json")
    assert rc == 0 and "warmed 3/3 shards" in out
    assert [len(server.gets(f"shard-{i:06d}.tar")) for i in range(3)] == [1, 1, 1]
    rc, out, _ = run(capsys, tmp_path, "warm", f"{base}/manifest.json")
    assert rc == 0 and "3 ready when asked" in out and "0B fetched" in out
    rc, out, _ = run(capsys, tmp_path, "status")
    assert rc == 0 and "entries        3 (3 verified, 0 pinned now)" in out and "192.0KiB" in out

    data_dir = tmp_path / "cache" / "data"
    victim = sorted(p for p in os.listdir(data_dir) if not p.endswith(".meta"))[0]
    with open(data_dir / victim, "r+b") as f:
        f.write(b"\0\0\0\0")
    rc, out, err = run(capsys, tmp_path, "verify")
    assert rc == 1 and "CORRUPT" in err and "removed" in err and "1 corrupt" in out
    rc, out, _ = run(capsys, tmp_path, "verify")
    assert rc == 0 and "verified 2 entries: 0 corrupt" in out

    rc, out, _ = run(capsys, tmp_path, "evict", "--to", "100KiB")
    assert rc == 0 and "evicted 1 entry " in out
    rc, out, _ = run(capsys, tmp_path, "clear")
    assert rc == 0 and "cleared 1 entry " in out
    assert [p for p in os.listdir(data_dir)] == []


def test_warm_reports_failed_shards(tmp_path, http_server, capsys):
    server, base, root = http_server
    publish(root, n=2)
    os.remove(root / "shard-000001.tar")
    rc, out, err = run(capsys, tmp_path, "--set", "retries=0", "warm", f"{base}/manifest.json")
    assert rc == 1 and "warmed 1/2" in out and "FAILED" in err and "shard-000001.tar" in err


def test_warm_fills_only_what_fits(tmp_path, http_server, capsys):
    """A dataset larger than max_bytes warms its first shards and leaves the rest on demand."""
    server, base, root = http_server
    publish(root, n=5)
    rc, out, err = run(capsys, tmp_path, "--set", "max_bytes=200KiB", "warm", f"{base}/manifest.json")
    assert rc == 0 and "warmed 3/3 shards" in out and "warmed the first 3 shards, 2 left" in out, (out, err)
    assert [len(server.gets(f"shard-{i:06d}.tar")) for i in range(5)] == [1, 1, 1, 0, 0]


def test_tune_prints_node_snippet(tmp_path, http_server, capsys):
    _, base, root = http_server
    publish(root, n=2, size=256 * KIB)
    rc, out, _ = run(capsys, tmp_path, "tune", f"{base}/manifest.json", "--consume-mbps", "50",
                     "--disk-bytes", "4MiB")
    assert rc == 0 and "# disk write" in out and "latency" in out
    node = yaml.safe_load(out)["cache"]["nodes"][socket.gethostname()]
    assert node["prefetch_shards"] >= 1 and node["max_bytes"].endswith("GiB")


def test_tune_nodes_sizes_for_the_nodes_share(tmp_path, http_server, capsys):
    """``tune --nodes N`` at the command line: the notes size the cache for one node's share."""
    _, base, root = http_server
    publish(root, n=8, size=256 * KIB)
    args = ["tune", f"{base}/manifest.json", "--consume-mbps", "50", "--disk-bytes", "4MiB"]
    rc, out, _ = run(capsys, tmp_path, *args, "--nodes", "4")
    assert rc == 0 and "this node reads 1/4 of the dataset (2.0MiB) plus about 2 shards: 1.0MiB" in out, out
    rc, _, err = run(capsys, tmp_path, *args, "--nodes", "0")
    assert rc == 2 and "error: --nodes 0: give the training job's node count (>= 1)" in err


def test_bad_setting_is_a_clear_error(tmp_path, capsys):
    rc, _, err = run(capsys, tmp_path, "--set", "verify=sometimes", "status")
    assert rc == 2 and "cache.verify='sometimes'" in err


def test_serve_command(tmp_path):
    (tmp_path / "hello.txt").write_bytes(b"hello world")
    proc = subprocess.Popen([sys.executable, "-m", "cache", "serve", str(tmp_path), "--port", "0"],
                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        line = proc.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        assert fsspec.filesystem("http").cat_file(f"{url}/hello.txt", start=6, end=11) == b"world"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0  # a hang guard only: on a loaded 2-core machine 10 s ran out
