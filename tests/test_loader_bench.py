"""``python -m loaders bench``: one pass through the real loader and the memmap floor, as JSON."""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np

from loaders.__main__ import main
from loaders.bench import write_flat
from shards import Manifest, TokenBlockWriter


def test_bench_reports_the_loader_and_the_memmap_floor(tmp_path):
    rng = np.random.default_rng(0)
    w = TokenBlockWriter(str(tmp_path), block_tokens=2000)
    lengths = rng.integers(1, 300, 400)
    for i, n in enumerate(lengths):
        w.add(f"d/{i}", "t", rng.integers(0, 4096, int(n)).astype(np.uint16))
    Manifest(shards=w.close(), layout="token_blocks", vocab_size=4096).save(str(tmp_path))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["bench", "--shards", str(tmp_path), "--seq-len", "64", "--batch-size", "4", "--workers", "1",
                     "--baseline", "memmap"]) == 0
    report = json.loads(out.getvalue())
    loader, floor = report["loader"], report["memmap"]
    assert loader["tokens"] == int(lengths.sum())  # one whole epoch, every document token once
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
