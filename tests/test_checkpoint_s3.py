"""Checkpoints to ``s3://`` (a real S3 API: moto's server on 127.0.0.1) from 2 gloo ranks with
ZeRO-3, restored into a fresh model: parameters, step and loader state come back exactly; an
unfinished folder (no COMPLETE) is refused."""

import pytest
import torch

from trainer import parallel
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from trainer.launch import run_local_workers
from trainer.checkpointing.remote import list_url_checkpoints, restore_from_url, save_to_url
from trainer.synthetic import synthetic_batch
from trainer.train import build_model, train_step

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)


def _worker(root_url: str):
    info = parallel.init_distributed("cpu")
    cfg = TrainConfig(model=SMALL, zero=ZeroConfig(stage=3), optim=OptimConfig(lr=1e-2), device="cpu")
    model, wrapped, opt = build_model(cfg, info)
    batch = synthetic_batch([[20, 12]], 32, vocab=128, seed=info.rank)
    train_step(wrapped, opt, [batch], info, cfg)
    url = save_to_url(root_url, 1, wrapped, opt, {"epoch": 0, "marker": 7}, {"anomaly": None})
    saved = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    train_step(wrapped, opt, [batch], info, cfg)  # move away from the saved state
    restored = restore_from_url(url, wrapped, opt)
    same = all(torch.equal(p.full_tensor(), saved[n]) for n, p in model.named_parameters())
    loss_a = float(train_step(wrapped, opt, [batch], info, cfg)[0])
    fresh, fresh_wrapped, fresh_opt = build_model(cfg, info)
    restore_from_url(url, fresh_wrapped, fresh_opt)
    loss_b = float(train_step(fresh_wrapped, fresh_opt, [batch], info, cfg)[0])
    return {"url": url, "step": restored.step, "loader": restored.loader_state, "same": same,
            "losses": (loss_a, loss_b)}


def test_checkpoint_to_s3_and_back(s3_server):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server[1])
    fs.mkdir("colaflow-ckpt")
    root = "s3://colaflow-ckpt/run1/ckpt"
    results = run_local_workers(_worker, 2, root)
    for r in results:
        assert r["url"] == f"{root}/step_000001" and r["step"] == 1 and r["same"]
        assert r["loader"] == {"epoch": 0, "marker": 7}
    for r in results:  # the restored state takes the same next step as the state restored in place
        assert r["losses"][0] == r["losses"][1]
    assert list_url_checkpoints(root) == [f"{root}/step_000001"]
    assert any(p.endswith(".distcp") for p in fs.ls("colaflow-ckpt/run1/ckpt/step_000001"))
    fs.rm("colaflow-ckpt/run1/ckpt/step_000001/COMPLETE")
    assert list_url_checkpoints(root) == []
    with pytest.raises(FileNotFoundError, match="no finished checkpoint"):
        restore_from_url(f"{root}/step_000001", None, None)
