"""Checkpoints with ``checkpoint.dir`` on ``s3://`` (a real S3 API: moto's server on 127.0.0.1),
through the same :class:`Checkpointer` as local folders: 2 gloo ranks with ZeRO-3 save (verified by
reading the stored bytes back from the bucket) and restore exactly; a folder without COMPLETE is
invisible and refused; a 2-rank training run prunes to ``keep_last`` in the bucket and its rerun
resumes from the newest checkpoint; a missing bucket is one line, exit 1."""
import json
import os
import subprocess
import sys

import pytest
import torch

from trainer.distributed import parallel
from trainer.checkpointing import Checkpointer, list_checkpoints, read_meta, restore
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.launch import run_local_workers
from tests.support.data import write_counting_shards
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train_step
from tests.support.paths import REPO

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
ROOT = str(REPO)
BUCKET = "colaflow-ckpt"


@pytest.fixture
def s3fs_bucket(s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server[1])
    fs.mkdir(BUCKET)
    yield fs
    fs.rm(BUCKET, recursive=True)


def _worker(root_url: str):
    info = parallel.init_distributed("cpu")
    cfg = TrainConfig(model=SMALL, zero=ZeroConfig(stage=3), optim=OptimConfig(lr=1e-2), device="cpu")
    model, wrapped, opt = build_model(cfg, info)
    batch = synthetic_batch([[20, 12]], 32, vocab=128, seed=info.rank)
    train_step(wrapped, opt, [batch], info, cfg)
    ckpts = Checkpointer(root_url, info.device, stage=3, vocab_size=128, seq_len=32, config={"model": {}})
    url = ckpts.save(1, wrapped, opt, {"epoch": 0, "marker": 7}, {"anomaly": None})
    ckpts.close()
    saved = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    train_step(wrapped, opt, [batch], info, cfg)  # move away from the saved state
    restored = restore(url, wrapped, opt)
    same = all(torch.equal(p.full_tensor(), saved[n]) for n, p in model.named_parameters())
    loss_a = float(train_step(wrapped, opt, [batch], info, cfg)[0])
    fresh, fresh_wrapped, fresh_opt = build_model(cfg, info)
    restore(url, fresh_wrapped, fresh_opt)
    loss_b = float(train_step(fresh_wrapped, fresh_opt, [batch], info, cfg)[0])
    return {"url": url, "step": restored.step, "loader": restored.loader_state, "same": same,
            "losses": (loss_a, loss_b)}


def test_checkpointer_saves_to_s3_verified_and_restores(s3fs_bucket):
    fs, root = s3fs_bucket, f"s3://{BUCKET}/run1/ckpt"
    results = run_local_workers(_worker, 2, root)
    for r in results:
        assert r["url"] == f"{root}/step_000001" and r["step"] == 1 and r["same"]
        assert r["loader"] == {"epoch": 0, "marker": 7}
    for r in results:  # the restored state takes the same next step as the state restored in place
        assert r["losses"][0] == r["losses"][1]
    assert list_checkpoints(root) == [f"{root}/step_000001"]
    meta = read_meta(f"{root}/step_000001")
    assert meta["world_size"] == 2 and meta["zero_stage"] == 3 and meta["checksums"]  # verified before COMPLETE
    assert any(p.endswith(".distcp") for p in fs.ls(f"{BUCKET}/run1/ckpt/step_000001"))
    assert not [p for p in fs.ls(f"{BUCKET}/run1/ckpt") if ".probe" in p]
    fs.rm(f"{BUCKET}/run1/ckpt/step_000001/COMPLETE")
    assert list_checkpoints(root) == []
    with pytest.raises(FileNotFoundError, match="no finished checkpoint"):
        restore(f"{root}/step_000001", None, None)


def _train(args, cwd, **env_changes):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)  # carries the fixture's AWS_* to the ranks
    env.update(env_changes)
    env = {k: v for k, v in env.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "trainer", *args], cwd=str(cwd), env=env,
                          capture_output=True, text=True, timeout=300)


def _args(tmp_path, ckpt_dir: str) -> list[str]:
    shards = str(tmp_path / "shards")
    if not os.path.exists(shards):
        write_counting_shards(shards, 60, max_samples=30, vocab=64, max_len=40, seed=0)
    return ["--config", os.path.join(ROOT, "configs", "demo.yaml"), f"data.manifest={shards}",
            f"cache.dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'run'}", "model.d_model=32",
            "model.n_layers=1", "model.n_heads=2", "data.seq_len=32", "data.micro_batch_size=2",
            "data.num_workers=0", "metrics.progress=false", "log_every=2", "checkpoint.every=2",
            "metrics.tensorboard_dir=''", "device=cpu", "eval.enabled=false", f"checkpoint.dir={ckpt_dir}"]


def test_two_rank_run_prunes_in_the_bucket_and_rerun_resumes(tmp_path, s3fs_bucket):
    fs, root = s3fs_bucket, f"s3://{BUCKET}/run/ckpt"
    args = _args(tmp_path, root) + ["checkpoint.keep_last=2"]
    two = ["--nproc-per-node", "2"]
    first = _train(args + ["steps=6"] + two, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]

    def names():
        fs.invalidate_cache()
        return sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{BUCKET}/run/ckpt"))

    assert names() == ["step_000004", "step_000006"]  # step 2 pruned in the bucket
    assert fs.exists(f"{BUCKET}/run/ckpt/step_000006/COMPLETE")
    assert json.loads(fs.cat(f"{BUCKET}/run/ckpt/step_000006/meta.json"))["world_size"] == 2
    assert not os.path.exists(tmp_path / "run" / root)  # nothing written locally under the URL's name
    again = _train(args + ["steps=8"] + two, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 6" in again.stdout, again.stdout[-3000:]
    assert names() == ["step_000006", "step_000008"]
    assert json.loads(fs.cat(f"{BUCKET}/run/ckpt/step_000008/meta.json"))["step"] == 8


NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_EC2_METADATA_DISABLED": "true",
                  "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}


@pytest.mark.parametrize("bucket,env", [("no-such-bucket", {}), (BUCKET, NO_CREDENTIALS)],
                         ids=["missing-bucket", "missing-credentials"])
def test_unusable_store_is_one_line_exit_1(tmp_path, s3fs_bucket, bucket, env):
    root = f"s3://{bucket}/run/ckpt"
    p = _train(_args(tmp_path, root) + ["steps=2"], tmp_path, **env)
    assert p.returncode == 1, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"checkpoint.dir={root}: cannot" in lines[0], p.stderr[-3000:]
