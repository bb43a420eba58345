"""The `make demo` path on a small slice of the real corpus: JSONL → Beam → shards served over HTTP
on 127.0.0.1 → cache → loader → torchrun (2 gloo ranks, ZeRO) → runs/demo/summary.json."""
import json
import os
import subprocess
import sys

import pytest

from tests.support.http_server import serve_directory
from examples.demo import run as demo
from tests.support.paths import REPO

ROOT = str(REPO)
OVERRIDES = ["steps=30", "log_every=5", "optim.warmup_steps=5", "metrics.progress=false", "model.d_model=64",
             "model.n_layers=2", "data.seq_len=128", "model.max_seq_len=128", "eval.every=10"]
# records per source: 200 Bible chapters alone are ~170k words, more tokens than 30 steps of 2 ranks x 8 rows
# x 128 read (61k); 200 Shakespeare paragraphs repeat stage directions, which dedup drops
PER_SOURCE = 200


@pytest.mark.slow
def test_demo_on_real_slice(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # where make demo runs it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    run_dir = tmp_path / "demo"
    summary = demo.run_demo(["--run-dir", str(run_dir), "--limit-per-source", str(PER_SOURCE), *OVERRIDES])
    with open(run_dir / "summary.json") as f:
        written = json.load(f)
    assert written == summary
    assert summary["input_records"] == 2 * PER_SOURCE  # Shakespeare paragraphs + Bible chapters
    assert 0 < summary["kept_records"] < summary["input_records"]  # stage directions repeat: dedup drops some
    stats = json.load(open(run_dir / "shards" / "stats.json"))
    total = stats.get("total", stats)
    assert total["kept"] == summary["kept_records"]
    manifest = json.load(open(run_dir / "shards" / "manifest.json"))
    assert summary["shards"] == len(manifest["shards"]) >= 1
    assert summary["tokens"] == sum(s["tokens"] for s in manifest["shards"]) > 10_000
    assert summary["world_size"] == 2 and summary["train_steps"] == 30
    assert summary["loss_last"] < summary["loss_first"] - 1.0
    assert summary["tokens_per_second"] > 0
    assert os.path.exists(summary["report"])
    assert os.path.isdir(summary["checkpoint"]) or os.path.isdir(os.path.join(str(run_dir / "train"), summary["checkpoint"]))
    # held-out validation loss from the val split, falling as the model learns
    assert summary["val_tokens"] == stats["splits"]["val"]["tokens"] > 0
    assert summary["val_loss_last"] < summary["val_loss_first"]
    # the exported ONNX models were verified on that split
    assert summary["export"]["passed"] and set(summary["export"]["models"]) == {"model.fp32.onnx", "model.int8.onnx"}
    assert os.path.exists(run_dir / "export" / "model.int8.onnx") and os.path.exists(summary["export"]["report"])
    # and as a Hugging Face folder that transformers loads and that generates what colaflow generates
    hf = summary["export_hf"]
    assert hf["passed"] and hf["greedy_generation_matches"] and hf["max_abs_diff"] <= 1e-4
    assert os.path.exists(os.path.join(hf["folder"], "config.json")) and os.path.exists(hf["report"])
    # the cache fetched the shards from the HTTP remote
    assert any(name.endswith(".tar") for _, _, files in os.walk(run_dir / "cache") for name in files)

    # up-arrow, Enter: the demo's train command again into the finished run folder resumes at
    # step 30 and has nothing left to train; it never starts over
    server, url = serve_directory(str(run_dir / "shards"))
    try:
        again = subprocess.run(
            [sys.executable, "-m", "trainer", "--nproc-per-node=2", "--config", "configs/demo.yaml",
             f"data.manifest={url}/manifest.json", f"cache.dir={run_dir / 'cache'}", f"run_dir={run_dir / 'train'}",
             *OVERRIDES], cwd=ROOT, capture_output=True, text=True, timeout=600)
    finally:
        server.shutdown()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 30" in again.stdout and "nothing to train" in again.stdout, again.stdout
    records = [json.loads(line) for line in open(run_dir / "train" / "metrics.jsonl")]
    for kind in ("loss", "val_loss"):  # training and validation records: each step logged once
        steps = [r["step"] for r in records if kind in r]
        assert steps == sorted(set(steps)) and steps[-1] == 30, (kind, steps)
