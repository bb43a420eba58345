"""Validation loss during training: 2 gloo ranks under torchrun evaluate every ``eval.every`` steps
and at the end; the value equals a direct single-process computation (logits + cross entropy) over
the same validation set from the saved checkpoint; it reaches metrics.jsonl, the summary and the
report."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F

from loaders import build_text_loader
from loaders.config import DataConfig
from tests.support.data import write_counting_shards
from tests.support.paths import REPO

ROOT = str(REPO)
VOCAB = 64


def _run(args: list[str], cwd: str, nproc: int) -> None:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, *launcher, "-m", "trainer", "--config",
                           os.path.join(ROOT, "configs", "demo.yaml"), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def direct_val_loss(checkpoint: str, val_dir: str, model_args: dict) -> tuple[float, int]:
    """Mean next-token cross entropy over every real token of the validation set, computed from the
    checkpoint's weights with plain ``logits`` + ``F.cross_entropy`` in one process."""
    from trainer.checkpointing import load_full_state
    from trainer.config import ModelConfig
    from trainer.model import GPT
    model = GPT(ModelConfig(vocab_size=VOCAB, **model_args))
    model.load_state_dict(load_full_state(checkpoint)["model"])
    loader = build_text_loader(DataConfig(manifest=val_dir, seq_len=32, micro_batch_size=3, num_workers=0,
                                          shuffle=False), in_process=True)
    total, count = 0.0, 0
    with torch.no_grad():
        for b in loader:
            logits = model.logits(b.input_ids, b.position_ids, b.document_ids).double()
            total += F.cross_entropy(logits.flatten(0, 1), b.labels.flatten(), ignore_index=-100,
                                     reduction="sum").item()
            count += int((b.labels != -100).sum())
    return total / count, count


def test_validation_loss_on_two_ranks_equals_direct_computation(tmp_path):
    train_dir, val_dir, run = str(tmp_path / "train"), str(tmp_path / "val"), str(tmp_path / "run")
    write_counting_shards(train_dir, 80, max_samples=40, vocab=VOCAB, max_len=60, seed=0)
    write_counting_shards(val_dir, 12, max_samples=6, vocab=VOCAB, max_len=60, seed=1)
    model_args = {"d_model": 32, "n_layers": 1, "n_heads": 2}
    _run([f"data.manifest={train_dir}", f"eval.manifest={val_dir}", "eval.every=4", "eval.tokens=100000",
          f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}", *(f"model.{k}={v}" for k, v in model_args.items()),
          "data.seq_len=32", "data.micro_batch_size=2", "data.num_workers=0", "optim.lr=0.01",
          "optim.warmup_steps=2", "zero.stage=2", "precision=fp32", "metrics.progress=false", "log_every=3",
          "steps=10"], str(tmp_path), nproc=2)
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    val = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in val] == [4, 8, 10]
    assert summary["evaluations"] == 3
    assert summary["val_loss_first"] == val[0]["val_loss"] and summary["val_loss_last"] == val[-1]["val_loss"]
    assert summary["val_loss_last"] < summary["val_loss_first"]  # the counting task is learnt
    assert math.isclose(val[-1]["val_perplexity"], math.exp(val[-1]["val_loss"]), rel_tol=1e-9)
    # the whole validation set was read (eval.tokens covers it), so the packing of 2 ranks does
    # not matter: each token's loss depends only on its own document
    expected, count = direct_val_loss(summary["checkpoint"], val_dir, model_args)
    assert {r["val_tokens"] for r in val} == {count}  # the same batches at every evaluation
    assert math.isclose(summary["val_loss_last"], expected, rel_tol=1e-5)

    from trainer.report.render import read_metrics
    merged = read_metrics(os.path.join(run, "metrics.jsonl"))
    steps, losses = merged.series("val_loss")
    assert steps == [4, 8, 10] and merged.series("loss")[0][-1] == 10  # step 10 keeps both records
