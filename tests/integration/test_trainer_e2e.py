"""End to end: shards → cache → loader → ``torchrun -m trainer`` (2 gloo ranks, ZeRO-3, gradient
accumulation) → metrics, summary, DCP checkpoint → resume in one process (DCP reshards 2 → 1)."""
import json
import os
import subprocess
import sys


from tests.support.data import write_counting_shards
from tests.support.paths import REPO

ROOT = str(REPO)
VOCAB = 64


def build_shards(directory: str, docs: int = 120) -> None:
    """Documents counting up mod VOCAB from a random start: easy to learn, so the loss falls fast."""
    write_counting_shards(directory, docs, max_samples=40, vocab=VOCAB, max_len=60, seed=0)


def run_trainer(args: list[str], nproc: int, cwd: str, config: str = os.path.join(ROOT, "configs", "demo.yaml")) -> None:
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc > 1 else []
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, *launcher, "-m", "trainer", "--config", config, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def test_torchrun_two_ranks_then_resume_single_process(tmp_path):
    shards, run = str(tmp_path / "shards"), str(tmp_path / "run")
    build_shards(shards)
    common = [f"data.manifest={shards}", f"cache.dir={tmp_path / 'cache'}", f"run_dir={run}",
              "model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.seq_len=32",
              "data.micro_batch_size=2", "data.num_workers=0", "optim.lr=0.01", "optim.warmup_steps=2",
              "optim.grad_accum_steps=2", "zero.stage=3", "precision=fp32", "metrics.progress=false",
              "log_every=3"]
    run_trainer(common + ["steps=9"], nproc=2, cwd=str(tmp_path))
    with open(os.path.join(run, "train_summary.json")) as f:
        summary = json.load(f)
    assert summary["train_steps"] == 9 and summary["world_size"] == 2
    assert summary["loss_first"] > 3.5 and summary["loss_last"] < summary["loss_first"] - 0.3
    assert summary["tokens_seen"] > 0 and summary["tokens_per_second"] > 0
    assert summary["checkpoint"].endswith("step_000009")
    assert os.path.exists(os.path.join(summary["checkpoint"], ".metadata"))
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    assert [r["step"] for r in records] == [1, 3, 6, 9]
    assert sum(r["tokens"] for r in records) == summary["tokens_seen"]
    assert all({"loss", "lr", "tokens_per_second", "data_wait_s"} <= r.keys() for r in records)

    run_trainer(common + ["steps=11", "checkpoint.resume=latest"], nproc=1, cwd=str(tmp_path))
    with open(os.path.join(run, "train_summary.json")) as f:
        resumed = json.load(f)
    assert resumed["train_steps"] == 2 and resumed["final_step"] == 11 and resumed["world_size"] == 1
    assert resumed["loss_first"] < summary["loss_first"] - 0.3  # weights and optimizer came back
