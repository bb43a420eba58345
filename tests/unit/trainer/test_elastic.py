"""Elastic training: ``torchrun --nnodes=1:2 --max-restarts=3 --rdzv-backend=c10d`` restarts the
workers after one rank is SIGKILLed at step 17; they resume from the step-15 checkpoint (model,
optimizer, RNG, loader) and the losses of steps 16-30 equal those of an uninterrupted run."""
import json
import os
import subprocess
import sys

import numpy as np

from shards import Manifest, ShardSequenceWriter, encode_text_sample
from trainer.distributed.parallel import free_port
from tests.support.faults import fault_hooks
from tests.support.paths import REPO

ROOT = str(REPO)
VOCAB = 64


def build_short_docs(directory: str, docs: int = 160, seq_len: int = 32) -> None:
    """Documents of 6..seq_len tokens counting up mod VOCAB: each fills one row on its own, so with
    ``pack_window=1`` a batch is one document and the stream after a resume is the uninterrupted one."""
    rng = np.random.default_rng(1)
    w = ShardSequenceWriter(directory, max_samples=40)
    for i in range(docs):
        n = int(rng.integers(6, seq_len + 1))
        toks = ((int(rng.integers(0, VOCAB)) + np.arange(n)) % VOCAB).astype(np.uint16)
        w.write(f"doc{i:04d}", encode_text_sample(toks, {"id": i}), tokens=n)
    Manifest(shards=w.close(), vocab_size=VOCAB).save(directory)


def torchrun(launcher: list[str], args: list[str], cwd: str) -> subprocess.CompletedProcess:
    # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the agent's shared store, restarted workers may read the
    # previous attempt's gloo/nccl addresses and fail to connect (pytorch/pytorch#135712)
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("TORCHELASTIC_RESTART_COUNT", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, "-m", "trainer", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def step_losses(run_dir: str) -> dict[int, float]:
    """Loss of each step from metrics.jsonl; a step logged again after a restart keeps the last value."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def test_killed_rank_restarts_from_checkpoint_and_matches_uninterrupted_run(tmp_path):
    shards = str(tmp_path / "shards")
    build_short_docs(shards)
    common = [f"data.manifest={shards}", "model.vocab_size=64", "model.d_model=32", "model.n_layers=1",
              "model.n_heads=2", "model.max_seq_len=32", "data.seq_len=32", "data.micro_batch_size=1",
              "data.pack_window=1", "data.num_workers=0", "steps=30", "log_every=1", "checkpoint.every=5",
              "checkpoint.keep_last=2", "checkpoint.resume=latest", "zero.stage=2", "precision=fp32",
              "device=cpu", "optim.warmup_steps=3", "metrics.progress=false"]
    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    torchrun(["--standalone", "--nproc_per_node=2"], common + [f"run_dir={ref_dir}"], str(tmp_path))
    elastic = ["--nnodes=1:2", "--nproc_per_node=2", "--max-restarts=3", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-conf=join_timeout=60,last_call_timeout=1",
               "--monitor-interval=0.5"]
    torchrun(elastic, common + [f"run_dir={run_dir}", fault_hooks(kill_at_step=17, rank=1)],
             str(tmp_path))

    with open(os.path.join(run_dir, "events.jsonl")) as f:
        events = [json.loads(line) for line in f]
    assert [(e["event"], e["step"], e["rank"]) for e in events if e["event"] == "injected_kill"] == [
        ("injected_kill", 17, 1)]
    resumes = [e for e in events if e["event"] == "resume"]
    assert sorted((e["rank"], e["step"], e["rng_restored"]) for e in resumes) == [(0, 15, True), (1, 15, True)]
    assert all(e["restart"] >= 1 for e in resumes)
    with open(os.path.join(run_dir, "train_summary.json")) as f:
        summary = json.load(f)
    assert summary["final_step"] == 30 and summary["train_steps"] == 15  # the restart resumed at step 15
    ref, got = step_losses(ref_dir), step_losses(run_dir)
    assert sorted(ref) == sorted(got) == list(range(1, 31))
    for step in range(16, 31):
        assert abs(got[step] - ref[step]) <= 1e-6, (step, got[step], ref[step])
    assert sorted(os.listdir(os.path.join(run_dir, "checkpoints"))) == ["step_000025", "step_000030"]
