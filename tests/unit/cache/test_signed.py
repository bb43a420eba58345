"""Signed URLs (``.../manifest.json?token=abc``): shard URLs keep the query, the cache key does not
(a rotated token finds the cached shards), ``*.tar.zst?token=`` is still decompressed, and ``tune``
fails when what it measured is not the manifest's shard."""
from __future__ import annotations

import hashlib

import zstandard

from cache import CacheConfig, ShardCache
from cache.tools.cli import main
from shards import shard_url
from shards.format.manifest import Manifest, ShardInfo

KIB = 1024


def _publish(root, n=2, size=64 * KIB, zst=False) -> Manifest:
    shards = []
    for i in range(n):
        data = hashlib.shake_256(f"signed{i}".encode()).digest(size)
        name = f"shard-{i:06d}.tar" + (".zst" if zst else "")
        (root / name).write_bytes(zstandard.ZstdCompressor().compress(data) if zst else data)
        shards.append(ShardInfo(name, 1, 0, size, hashlib.sha256(data).hexdigest()))
    m = Manifest(shards=shards)
    m.save(str(root))
    return m


def _cli(capsys, tmp_path, *argv):
    rc = main(["--dir", str(tmp_path / "cache"), "--set", "min_free_bytes=0", "--set", "retries=0", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_shard_url_resolves_against_the_path_and_keeps_the_query():
    assert shard_url("http://h:1/ds/manifest.json?token=abc&exp=9", "shard-000000.tar") == \
        "http://h:1/ds/shard-000000.tar?token=abc&exp=9"
    assert shard_url("https://h/ds/?sig=x", "s.tar.zst") == "https://h/ds/s.tar.zst?sig=x"
    assert shard_url("https://h/ds/manifest.json", "s.tar") == "https://h/ds/s.tar"
    assert shard_url("/data/ds", "s.tar") == "/data/ds/s.tar"


def test_warm_with_signed_url_and_rotated_token(tmp_path, http_server, capsys):
    server, base, root = http_server
    _publish(root)
    server.faults.require_query = "token=abc"
    rc, out, err = _cli(capsys, tmp_path, "warm", f"{base}/manifest.json?token=abc")
    assert rc == 0 and "warmed 2/2" in out, err
    gets = server.gets("shard-000000.tar")
    assert [(g.status, g.query) for g in gets] == [(200, "token=abc")]
    server.faults.require_query = "token=rotated"  # the old signature expired
    rc, out, err = _cli(capsys, tmp_path, "warm", f"{base}/manifest.json?token=rotated")
    assert rc == 0 and "2 ready when asked" in out and "0B fetched" in out, (out, err)
    assert len(server.gets("shard-000000.tar")) == 1 and len(server.gets("shard-000001.tar")) == 1


def test_signed_zst_shard_is_decompressed(tmp_path, http_server):
    server, base, root = http_server
    m = _publish(root, n=1, zst=True)
    server.faults.require_query = "sig=1"
    cache = ShardCache(CacheConfig(dir=str(tmp_path / "cache"), min_free_bytes=0, retries=0), resolve=False)
    info = m.shards[0]
    url = shard_url(f"{base}/manifest.json?sig=1", info.name)
    path = cache.get(url, info.sha256, info.bytes)
    assert path.endswith("shard-000000.tar") and hashlib.sha256(open(path, "rb").read()).hexdigest() == info.sha256
    assert cache.key(url) == cache.key(f"{base}/{info.name}?sig=2")
    cache.close()


def test_tune_fails_when_the_url_is_not_the_shard(tmp_path, http_server, capsys):
    _, base, root = http_server
    _publish(root, n=1)
    (root / "shard-000000.tar").write_bytes(b"<html>not your shard</html>" * 13 + b"x" * 22)  # 373 bytes
    rc, out, err = _cli(capsys, tmp_path, "tune", f"{base}/manifest.json?token=abc", "--consume-mbps", "50",
                        "--disk-bytes", "1MiB")
    assert rc == 1 and out == ""
    assert "returned 373 bytes, the manifest says 65536" in err and len(err.strip().splitlines()) == 1
