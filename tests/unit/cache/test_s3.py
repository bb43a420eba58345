"""The cache and the loader against a real S3 API (moto's server on 127.0.0.1, see ``s3_server``):
warm, read, resume a partial download with a ranged read, a connection dropped mid-object, a missing
object, wrong credentials (one clear error, not retried), and a text loader reading ``s3://``."""
from __future__ import annotations

import hashlib
import itertools
import os
import re
import socket
import socketserver
import threading
import urllib.request

import pytest
import torch
from tests.unit.cache.test_cli import publish
from tests.unit.loaders.test_loader import write_text_shards

from cache import CacheConfig, ShardCache, ShardFetchError
from cache.tools.cli import main
from loaders.config import DataConfig
from loaders.rank.loader import build_text_loader
from shards import Manifest, shard_url

KIB = 1024
_names = itertools.count()


@pytest.fixture
def bucket(s3_server):
    """``(fs, name)``: a fresh bucket on the local S3 server."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server[1])
    name = f"colaflow-{os.getpid()}-{next(_names)}"
    fs.mkdir(name)
    return fs, name


def _upload(fs, bucket: str, local: str, prefix: str = "ds") -> str:
    fs.put(f"{local}/", f"{bucket}/{prefix}/", recursive=True)
    return f"s3://{bucket}/{prefix}/manifest.json"


def _cache(tmp_path, **kw) -> ShardCache:
    base = dict(dir=str(tmp_path / "cache"), min_free_bytes=0, backoff_s=0.01, chunk_bytes="64KiB", retries=2)
    base.update(kw)
    return ShardCache(CacheConfig(**base), resolve=False)


def _items(manifest_url: str) -> list[tuple]:
    m = Manifest.load(manifest_url)
    return [(shard_url(manifest_url, s.name), s.sha256, s.bytes) for s in m.shards]


def test_warm_and_read_from_s3(tmp_path, bucket, capsys):
    fs, name = bucket
    (tmp_path / "src").mkdir()
    publish(tmp_path / "src", n=3)
    url = _upload(fs, name, str(tmp_path / "src"))
    argv = ["--dir", str(tmp_path / "cache"), "--set", "min_free_bytes=0", "warm", url]
    assert main(argv) == 0 and "warmed 3/3 shards" in capsys.readouterr().out
    assert main(argv) == 0 and "3 ready when asked" in capsys.readouterr().out
    cache = _cache(tmp_path)
    for shard, sha, size in _items(url):
        assert shard.startswith(f"s3://{name}/ds/shard-")
        path = cache.get(shard, sha, size)
        assert hashlib.sha256(open(path, "rb").read()).hexdigest() == sha
    assert cache.metrics()["bytes_fetched"] == 0 and cache.metrics()["hits"] == 3
    cache.close()


def test_partial_download_resumes_with_a_ranged_read(tmp_path, bucket):
    fs, name = bucket
    data = hashlib.shake_256(b"resume").digest(512 * KIB)
    fs.pipe(f"{name}/big.tar", data)
    url, sha = f"s3://{name}/big.tar", hashlib.sha256(data).hexdigest()
    cache = _cache(tmp_path)
    with open(cache.store.part_path(cache.key(url)), "wb") as f:
        f.write(data[:200 * KIB])  # left by a killed download
    path = cache.get(url, sha, len(data))
    assert open(path, "rb").read() == data
    assert cache.metrics()["bytes_fetched"] == len(data) - 200 * KIB
    cache.close()


class DroppingProxy(socketserver.ThreadingTCPServer):
    """TCP proxy on 127.0.0.1 to ``upstream`` that cuts the first connection whose responses pass
    ``drop_after`` bytes (a connection lost mid-object), and logs each request's Range header."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, upstream: tuple[str, int], drop_after: int):
        super().__init__(("127.0.0.1", 0), _Pipe)
        self.upstream, self.drop_after = upstream, drop_after
        self.dropped, self.ranges = 0, []
        self.lock = threading.Lock()


class _Pipe(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        proxy: DroppingProxy = self.server
        up = socket.create_connection(proxy.upstream)

        def requests() -> None:
            try:
                while chunk := self.request.recv(65536):
                    with proxy.lock:
                        proxy.ranges += re.findall(rb"[Rr]ange: (bytes=[0-9-]+)", chunk)
                    up.sendall(chunk)
            except OSError:
                pass
            finally:
                up.close()

        threading.Thread(target=requests, daemon=True).start()
        sent = 0
        try:
            while chunk := up.recv(65536):
                sent += len(chunk)
                with proxy.lock:
                    cut = not proxy.dropped and sent > proxy.drop_after
                    proxy.dropped += cut
                if cut:
                    self.request.sendall(chunk[: len(chunk) // 2])
                    break
                self.request.sendall(chunk)
        except OSError:
            pass
        finally:
            self.request.shutdown(socket.SHUT_RDWR)
            self.request.close()
            up.close()


def test_connection_dropped_mid_object_is_retried_with_a_range(tmp_path, bucket, s3_server, monkeypatch):
    import s3fs

    fs, name = bucket
    data = hashlib.shake_256(b"drop").digest(1024 * KIB)
    fs.pipe(f"{name}/drop.tar", data)
    host, port = s3_server[0].rsplit("//", 1)[1].split(":")
    proxy = DroppingProxy((host, int(port)), drop_after=300 * KIB)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{proxy.server_address[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # a cached instance would still talk to moto directly
    try:
        cache = _cache(tmp_path, chunk_bytes="256KiB")
        path = cache.get(f"s3://{name}/drop.tar", hashlib.sha256(data).hexdigest(), len(data))
        assert open(path, "rb").read() == data
        cache.close()
    finally:
        proxy.shutdown()
        proxy.server_close()
        s3fs.S3FileSystem.clear_instance_cache()
    assert proxy.dropped == 1
    # the lost bytes were asked for again with a Range request (by s3fs's own retry or by the cache's resume)
    starts = [int(r.split(b"=")[1].split(b"-")[0]) for r in proxy.ranges]
    assert len(starts) > len(set(starts)) or 0 < max(starts) <= 300 * KIB, proxy.ranges


def test_missing_object_is_one_clear_error(tmp_path, bucket):
    _, name = bucket
    cache = _cache(tmp_path)
    for size in (None, 1000):
        with pytest.raises(ShardFetchError, match="not found at the source") as e:
            cache.get(f"s3://{name}/nope.tar", None, size)
        assert e.value.attempts <= 1 and f"s3://{name}/nope.tar" in str(e.value)
    assert cache.metrics()["retries"] == 0
    cache.close()


def _enforce_auth(endpoint: str, count: str) -> None:
    """Make moto check credentials (``count`` unauthenticated requests allowed: "0" or "inf")."""
    req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                 headers={"Content-Type": "text/plain"})
    urllib.request.urlopen(req, timeout=10).read()


def test_wrong_credentials_are_one_clear_error(tmp_path, bucket, s3_server, capsys):
    fs, name = bucket
    (tmp_path / "src").mkdir()
    publish(tmp_path / "src", n=1)
    url = _upload(fs, name, str(tmp_path / "src"))
    shard = _items(url)[0]
    _enforce_auth(s3_server[0], "0")  # the key in AWS_ACCESS_KEY_ID is now unknown to the server
    try:
        cache = _cache(tmp_path)
        with pytest.raises(ShardFetchError, match="access denied by the source") as e:
            cache.get(*shard)
        assert e.value.attempts == 1 and cache.metrics()["retries"] == 0
        cache.close()
        rc = main(["--dir", str(tmp_path / "cache"), "warm", url])
        err = capsys.readouterr().err
        assert rc == 1 and err.count("\n") == 1 and f"access denied to {url}" in err
    finally:
        _enforce_auth(s3_server[0], "inf")


def test_text_loader_reads_s3_like_local(tmp_path, bucket):
    fs, name = bucket
    local = str(tmp_path / "text")
    write_text_shards(local)
    url = _upload(fs, name, local, "text")
    cfg = dict(seq_len=64, micro_batch_size=2, num_workers=0, pack_window=16, shuffle_block=8)
    cache = _cache(tmp_path, max_bytes="64KiB", prefetch_shards=2)  # smaller than the dataset

    def batches(loader, n=None):
        return [(b.keys, [b.input_ids.clone(), b.labels.clone()]) for b in itertools.islice(loader, n)]

    remote = build_text_loader(DataConfig(manifest=url, **cfg), cache, in_process=True)
    mine = build_text_loader(DataConfig(manifest=local, **cfg), None, in_process=True)
    head_r, head_l = batches(remote, 3), batches(mine, 3)
    state = remote.state_dict()
    resumed = build_text_loader(DataConfig(manifest=url, **cfg), cache, in_process=True)
    resumed.load_state_dict(state)
    rest_r, rest_l = batches(resumed), batches(mine)
    for got, want in zip(head_r + rest_r, head_l + rest_l):
        assert got[0] == want[0] and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert len(head_r + rest_r) == len(head_l + rest_l) > 3
    assert cache.metrics()["bytes_fetched"] > 0
    cache.close()
