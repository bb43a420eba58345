"""``python -m cache`` and ``python -m loaders keys --cache-dir`` fixes: options after the command,
status of a training config's cache without creating it, entries per dataset, warm below one
shard, tune naming its disk and capping downloads at the shard count, keys pinning one shard."""
from __future__ import annotations

import contextlib
import io
import os
import socket

import yaml
from tests.unit.cache.test_cli import publish
from tests.unit.loaders.test_loader import write_text_shards

from cache.tools.cli import main
from loaders.tools.cli import main as loaders_cli

KIB = 1024


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_status_options_after_command_and_missing_folder(tmp_path, capsys):
    d = tmp_path / "never-made"
    rc, out, _ = _run(capsys, "status", "--dir", str(d))
    assert rc == 0 and f"cache dir      {d}" in out and "does not exist yet" in out
    assert not d.exists()
    conf = tmp_path / "train.yaml"
    conf.write_text(yaml.safe_dump({"model": {"dim": 8}, "cache": {"dir": str(tmp_path / "c2"), "max_bytes": "3MiB"}}))
    rc, out, _ = _run(capsys, "status", "--config", str(conf))
    assert rc == 0 and f"cache dir      {tmp_path / 'c2'}" in out and "max_bytes 3.0MiB" in out
    assert not (tmp_path / "c2").exists()


def test_status_lists_entries_per_dataset(tmp_path, http_server, capsys):
    _, base, root = http_server
    (root / "a").mkdir()
    (root / "b").mkdir()
    publish(root / "a", n=2)
    publish(root / "b", n=1, size=32 * KIB)
    common = ["--dir", str(tmp_path / "cache"), "--set", "min_free_bytes=0"]
    for ds in ("a", "b"):
        assert _run(capsys, "warm", f"{base}/{ds}/manifest.json", *common)[0] == 0
    rc, out, _ = _run(capsys, "status", *common)
    assert rc == 0 and "entries        3 (3 verified, 0 pinned now)" in out
    assert f"  {base}/a: 2 entries, 128.0KiB, 2 verified" in out
    assert f"  {base}/b: 1 entry, 32.0KiB, 1 verified" in out


def test_warm_below_one_shard_fails(tmp_path, http_server, capsys):
    server, base, root = http_server
    publish(root, n=2)
    rc, out, err = _run(capsys, "--dir", str(tmp_path / "cache"), "warm", f"{base}/manifest.json",
                        "--set", "max_bytes=10KiB")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "max_bytes=10.0KiB is smaller than the first shard (64.0KiB)" in err
    assert [g.name for g in server.gets()] == ["manifest.json"]


def test_tune_names_its_disk_and_caps_in_flight_by_shards(tmp_path, http_server, capsys):
    _, base, root = http_server
    publish(root, n=1, size=256 * KIB)
    rc, out, err = _run(capsys, "tune", f"{base}/manifest.json", "--consume-mbps", "100000", "--disk-bytes", "1MiB",
                        "--dir", str(tmp_path / "cache"), "--set", "min_free_bytes=0")
    assert rc == 0, err
    assert f"# disk measured: {tmp_path / 'cache'} (mount " in out
    assert "capped at the dataset's 1 shards" in out
    assert yaml.safe_load(out)["cache"]["nodes"][socket.gethostname()]["prefetch_shards"] == 1


def test_loaders_keys_with_a_cache_smaller_than_the_data(tmp_path, monkeypatch):
    d = str(tmp_path / "text")
    docs = write_text_shards(d)
    sizes = [os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".tar")]
    assert len(sizes) > 3
    monkeypatch.setenv("COLAFLOW_CACHE_MAX_BYTES", str(2 * max(sizes)))  # the data is far larger
    monkeypatch.setenv("COLAFLOW_CACHE_MIN_FREE_BYTES", "0")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = loaders_cli(["keys", "--shards", d, "--world-size", "2", "--cache-dir", str(tmp_path / "cache")])
    rows = [line.split() for line in out.getvalue().splitlines() if not line.startswith("#")]
    assert rc == 0 and sorted(r[-1].split("/")[-1] for r in rows) == sorted(docs)
    with contextlib.redirect_stdout(io.StringIO()):
        rc = loaders_cli(["keys", "--shards", d, "--world-size", "2", "--cache-dir", str(tmp_path / "cache"),
                          "--resume-at", "2", "data.seq_len=64", "data.micro_batch_size=2"])
    assert rc == 0


def test_tune_sizes_the_cache_for_the_nodes_share():
    """On 4 nodes a node reads a quarter of the dataset plus about 2 shards: that is what it caches."""
    from cache.tools.tune import Measurements, recommend
    m = Measurements(disk_write_mbps=2000, disk_read_mbps=2000, fetch_mbps=200, latency_s=0.01)
    mb = 10**6
    one, notes1 = recommend(m, 100, 1 * mb, 100 * mb, 10**12, 0, hostname="h", num_shards=100)
    four, notes4 = recommend(m, 100, 1 * mb, 100 * mb, 10**12, 0, hostname="h", num_shards=100, nodes=4)
    assert one["cache"]["nodes"]["h"]["max_bytes"] == "1GiB"  # 105 MB rounded up to whole GiB
    assert any("the whole dataset (95.4MiB) fits" in n for n in notes1)
    assert any("this node reads 1/4 of the dataset (95.4MiB) plus about 2 shards: 25.7MiB" in n for n in notes4)
    assert any("the node's share (25.7MiB) fits" in n for n in notes4)
    tight = recommend(m, 100, 1 * mb, 100 * mb, 40 * mb, 0, hostname="h", num_shards=100, nodes=4)[1]
    assert any("the node's share (25.7MiB) fits" in n for n in tight)  # fits on 40 MB where the dataset would not
