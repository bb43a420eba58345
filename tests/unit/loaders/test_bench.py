"""``python -m loaders bench``: one pass through the real loader and the memmap floor, as JSON."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from loaders.tools.cli import main
from loaders.tools.bench import run_pass, write_flat
from shards import Manifest, TokenBlockWriter


def _shards(path, n_docs=400):
    rng = np.random.default_rng(0)
    w = TokenBlockWriter(str(path), block_tokens=2000)
    lengths = rng.integers(1, 300, n_docs)
    for i, n in enumerate(lengths):
        w.add(f"d/{i}", "t", rng.integers(0, 4096, int(n)).astype(np.uint16))
    Manifest(shards=w.close(), layout="token_blocks", vocab_size=4096).save(str(path))
    return lengths


def test_bench_reports_the_loader_and_the_memmap_floor(tmp_path):
    lengths = _shards(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--shards", str(tmp_path), "--seq-len", "64", "--batch-size", "4", "--workers", "1",
                     "--baseline", "memmap"]) == 0
    report = json.loads(out.getvalue())
    loader, floor = report["loader"], report["memmap"]
    assert loader["tokens"] == int(lengths.sum())  # one whole epoch, every document token once
    assert (loader["documents"], loader["bad_documents"], loader["empty_documents"]) == (len(lengths), 0, 0)
    assert 0.9 < loader["real_token_fraction"] <= 1.0 and loader["first_batch_s"] > 0
    assert loader["transfer_vs_uint16"] <= 2.0 and loader["workers_peak_rss_mb"] > 0 and loader["peak_rss_mb"] > 0
    assert floor["tokens"] == (int(lengths.sum()) // 65) * 64 and floor["real_token_fraction"] == 1.0
    assert report["loader_vs_memmap"] == loader["tokens_per_s"] / floor["tokens_per_s"]


def test_flat_copy_holds_every_document_in_manifest_order(tmp_path):
    w = TokenBlockWriter(str(tmp_path / "s"), block_tokens=10)
    docs = [np.arange(n, dtype=np.uint16) + n for n in (3, 9, 1, 12)]
    for i, d in enumerate(docs):
        w.add(f"d{i}", "t", d)
    Manifest(shards=w.close(), layout="token_blocks").save(str(tmp_path / "s"))
    dtype, n = write_flat(str(tmp_path / "s"), str(tmp_path / "flat.bin"))
    assert dtype == "uint16" and n == 25
    assert np.fromfile(tmp_path / "flat.bin", np.uint16).tolist() == np.concatenate(docs).tolist()
    assert np.fromfile(tmp_path / "flat.bin.idx", np.int64).tolist() == [0, 3, 12, 13, 25]


def test_bench_takes_data_overrides_and_names_a_bad_one(tmp_path, capsys):
    """``data.KEY=VALUE`` settings reach the timed loader (here token-budget batches) and the floor."""
    lengths = _shards(tmp_path, 120)
    assert main(["bench", "--shards", str(tmp_path), "--seq-len", "64", "data.batching=token_budget",
                 "data.max_tokens=512", "data.micro_batch_size=2", "--baseline", "memmap"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["overrides"] == ["data.batching=token_budget", "data.max_tokens=512",
                                              "data.micro_batch_size=2"]
    assert report["loader"]["tokens"] == int(lengths.sum()) and report["settings"]["batch_size"] == 2
    windows = int(lengths.sum()) // 65
    assert report["memmap"]["tokens"] == windows * 64 and report["memmap"]["batches"] == -(-windows // 2)
    assert report["loader"]["batches"] < -(-int(lengths.sum()) // 128)  # budget batches hold more than 2 x 64
    assert 0.5 < report["loader"]["transfer_vs_uint16"] <= 2.0  # against the batches' own rows, not 2 x 65
    assert main(["bench", "--shards", str(tmp_path), "data.pack_window=0"]) == 2
    assert "data.pack_window=0: use a number >= 1" in capsys.readouterr().err
    assert main(["bench", "--shards", str(tmp_path), "cache.max_bytes=1"]) == 2
    assert "data.KEY=VALUE overrides only" in capsys.readouterr().err


def test_bench_refuses_a_data_override_and_reports_unreadable_shards(tmp_path, capsys):
    """``data.manifest=`` used to reach the timed pass only (the floor read --shards) and failed with the
    pass's traceback; unreadable shards gave 0 tokens/s with the loader's log thrown away."""
    _shards(tmp_path / "s", 50)
    assert main(["bench", "--shards", str(tmp_path / "s"), "data.manifest=/nope"]) == 2
    assert "bench reads the shards given by --shards" in capsys.readouterr().err
    (tmp_path / "s" / "shard-000000.tar").unlink()
    assert main(["bench", "--shards", str(tmp_path / "s"), "--seq-len", "64"]) == 0
    out = capsys.readouterr()
    loader = json.loads(out.out)["loader"]
    assert (loader["bad_documents"], loader["documents"]) == (50, 0) and "shard-000000.tar cannot be read" in out.err
    with pytest.raises(RuntimeError, match=r"^bench pass loader failed: FileNotFoundError: not found[^\n]*$"):
        run_pass({"kind": "loader", "shards": str(tmp_path / "none"), "seq_len": 64, "batch_size": 2, "workers": 0})
