"""Checkpoints: atomic, verified DCP saves (2 gloo ranks, ZeRO-3), metadata beside them, keep_last,
weights-only and async saves; offline ``python -m trainer verify`` / ``export``; a corrupted
``.distcp`` fails verification online and offline with a message naming the file and tensor."""
import json
import os
import shutil

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from colaflow.config import load_config, to_dict
from trainer.distributed import parallel
from trainer.__main__ import main
from trainer import checkpointing as ckpt
from trainer.checkpointing import COMPLETE, Checkpointer
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.launch import run_local_workers
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train_step
from trainer.checkpointing.verify import CheckpointVerifyError

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
TENSOR = "model.blocks.0.attn.qkv.weight"


def _cfg() -> TrainConfig:
    return TrainConfig(model=SMALL, zero=ZeroConfig(stage=3), optim=OptimConfig(lr=1e-2), device="cpu")


def flip_bytes(path: str, key: str, where: str = "middle") -> str:
    """Invert 4 bytes of ``key``'s first stored chunk (in its data, or near its end where the zip
    directory of the serialised tensor lives). Returns the file changed."""
    index, info = next((i, s) for i, s in FileSystemReader(path).read_metadata().storage_data.items() if i.fqn == key)
    file = os.path.join(path, info.relative_path)
    data = bytearray(open(file, "rb").read())
    at = info.offset + (info.length // 2 if where == "middle" else info.length - 200)
    data[at:at + 4] = bytes(b ^ 0xFF for b in data[at:at + 4])
    with open(file, "wb") as f:
        f.write(data)
    return file


def _worker(tmp: str):
    info = parallel.init_distributed("cpu")
    cfg = _cfg()
    model, wrapped, opt = build_model(cfg, info)
    batch = synthetic_batch([[20, 12]], 32, vocab=128, seed=info.rank)
    ck = Checkpointer(os.path.join(tmp, "ckpt"), info.device, cfg.precision, 3, 128, 32, to_dict(cfg),
                      keep_last=1)
    out = {}
    for step in (1, 2):
        train_step(wrapped, opt, [batch], info, cfg)
        out[step] = ck.save(step, wrapped, opt, {"epoch": 0, "marker": step}, {"anomaly": {"lr_scale": 1.0}})
    out["weights"] = ck.save(2, wrapped, None, kind="weights")
    out["params"] = {n: p.full_tensor().clone() for n, p in model.named_parameters()}
    ck_async = Checkpointer(os.path.join(tmp, "async"), info.device, cfg.precision, 3, 128, 32, to_dict(cfg),
                            async_save=True)
    out["async"] = ck_async.save(2, wrapped, opt, {"epoch": 0})
    out["async_visible_before_wait"] = os.path.exists(out["async"])
    ck_async.wait()
    out["async_visible_after_wait"] = os.path.exists(os.path.join(out["async"], COMPLETE))
    # online verification of a checkpoint corrupted after it was written
    if info.rank == 0:
        flip_bytes(out["async"], TENSOR)
    torch.distributed.barrier()
    with pytest.raises(CheckpointVerifyError) as err:
        ck_async.verify(out["async"])
    out["online_error"] = str(err.value)
    ck_async.close()
    return out


def _other_world_worker(path: str, root: str):
    """At world size 1 and ZeRO stage 1: the production Checkpointer verifies a checkpoint written by
    2 ranks at stage 3, restore() reshards it, and the next save verifies at the new world size."""
    info = parallel.init_distributed("cpu")
    cfg = _cfg()
    cfg.zero.stage, cfg.seed = 1, 7
    model, wrapped, opt = build_model(cfg, info)
    ck = Checkpointer(root, info.device, cfg.precision, 1, 128, 32, to_dict(cfg))
    ck.verify(path)
    restored = ckpt.restore(path, wrapped, opt)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(wrapped, opt, [synthetic_batch([[20, 12]], 32, vocab=128, seed=0)], info, cfg)
    saved = ck.save(restored.step + 1, wrapped, opt, restored.loader_state, restored.trainer_state)
    ck.verify(saved)
    return restored.step, restored.loader_state, params, saved


def test_verified_atomic_checkpoints_then_offline_verify_export_and_corruption(tmp_path, capsys):
    results = run_local_workers(_worker, 2, str(tmp_path))
    res = results[0]
    step, loader_state, params, saved = run_local_workers(_other_world_worker, 1, res[2], str(tmp_path / "w1"))[0]
    assert step == 2 and loader_state == {"epoch": 0, "marker": 2}
    for name, p in res["params"].items():
        assert torch.equal(params[name], p), name
    meta = json.load(open(os.path.join(saved, "meta.json")))
    assert meta["world_size"] == 1 and meta["zero_stage"] == 1 and meta["step"] == 3
    root = tmp_path / "ckpt"
    assert sorted(os.listdir(root)) == ["step_000002", "weights_000002"]  # keep_last=1, no .partial left
    full = res[2]
    assert sorted(os.listdir(full))[:2] == [".metadata", COMPLETE]
    meta = json.load(open(os.path.join(full, "meta.json")))
    assert meta["step"] == 2 and meta["kind"] == "full" and meta["world_size"] == 2 and meta["zero_stage"] == 3
    assert meta["git_commit"] and {"python", "torch", "numpy"} <= meta["versions"].keys()
    assert TENSOR in meta["checksums"] and any(k.startswith("optim.state.") for k in meta["checksums"])
    assert load_config(TrainConfig, os.path.join(full, "config.yaml")).model == SMALL
    assert not res["async_visible_before_wait"] and res["async_visible_after_wait"]
    for r in results:  # every rank raised, naming the tensor and the file holding it
        assert TENSOR in r["online_error"] and ".distcp" in r["online_error"]

    assert main(["verify", full]) == 0 and main(["verify", res["weights"]]) == 0
    out = str(tmp_path / "export" / "model.pt")
    assert main(["export", full, out]) == 0
    exported = torch.load(out, weights_only=False)
    assert exported["step"] == 2
    for name, p in res["params"].items():
        assert torch.equal(exported["model"][name], p), name

    for where in ("middle", "end"):
        bad = str(tmp_path / f"bad_{where}")
        shutil.copytree(full, bad)
        file = flip_bytes(bad, TENSOR, where)
        capsys.readouterr()
        assert main(["verify", bad]) == 1
        err = capsys.readouterr().err
        assert "FAILED" in err and TENSOR in err and os.path.basename(file) in err, err
