"""Resume at another world size (2 -> 1 and 2 -> 4) at ZeRO stages 1 and 3: identical parameters,
the restored optimizer continues identically, and the loader delivers every sample exactly once
over the two runs (real gloo processes, local shards)."""
import os

import numpy as np
import torch

from loaders import build_text_loader
from loaders.rank.batch import TokenBatch
from loaders.config import DataConfig
from shards import Manifest, ShardSequenceWriter, encode_text_sample
from trainer import checkpointing as ckpt
from trainer.distributed import parallel
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.launch import run_local_workers
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train_step

SMALL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=32)
DOCS = 48
STAGES = (1, 3)


def _cfg(stage: int, seed: int = 0) -> TrainConfig:
    return TrainConfig(model=SMALL, zero=ZeroConfig(stage=stage), optim=OptimConfig(lr=1e-2), device="cpu", seed=seed)


def _data(shards: str) -> DataConfig:
    return DataConfig(manifest=shards, seq_len=32, micro_batch_size=1, num_workers=0, pack_window=1)


def _global_batch_part(rank: int, world: int) -> TokenBatch:
    """This rank's rows of one fixed 4-row batch (the same global batch at any world size)."""
    b = synthetic_batch([[20, 9], [32], [12, 12], [30]], 32, vocab=64, seed=5)
    lo, hi = rank * 4 // world, (rank + 1) * 4 // world
    return TokenBatch(b.input_ids[lo:hi], b.labels[lo:hi], b.position_ids[lo:hi], b.document_ids[lo:hi], [])


def _full(model) -> dict:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in model.named_parameters()}


def _save_worker(tmp: str, shards: str):
    info = parallel.init_distributed("cpu")
    out = {}
    for stage in STAGES:
        cfg = _cfg(stage)
        model, wrapped, opt = build_model(cfg, info)
        loader = build_text_loader(_data(shards), None, info.rank, info.world_size)
        it, keys = iter(loader), []
        for _ in range(3):
            b = next(it)
            keys += b.keys
            train_step(wrapped, opt, [b], info, cfg)
        path = ckpt.save_checkpoint(os.path.join(tmp, f"stage{stage}"), wrapped, opt, 3, loader.global_state_dict())
        it.close()
        saved = _full(model)
        train_step(wrapped, opt, [_global_batch_part(info.rank, info.world_size)], info, cfg)
        out[stage] = (path, keys, saved, _full(model))
    return out


def _resume_worker(paths: dict, shards: str):
    info = parallel.init_distributed("cpu")
    out = {}
    for stage in STAGES:
        cfg = _cfg(stage, seed=99)  # a different init: everything must come from the checkpoint
        model, wrapped, opt = build_model(cfg, info)
        step, loader_state = ckpt.load_checkpoint(paths[stage], wrapped, opt)
        loaded = _full(model)
        train_step(wrapped, opt, [_global_batch_part(info.rank, info.world_size)], info, cfg)
        loader = build_text_loader(_data(shards), None, info.rank, info.world_size)
        loader.load_state_dict(loader_state)
        keys = [k for b in loader for k in b.keys]
        out[stage] = (step, loaded, _full(model), keys)
    return out


def test_resume_on_one_and_four_ranks_at_stage_1_and_3(tmp_path):
    shards = str(tmp_path / "shards")
    rng = np.random.default_rng(0)
    w = ShardSequenceWriter(shards, max_samples=16)
    for i in range(DOCS):
        n = int(rng.integers(6, 33))
        w.write(f"doc{i:04d}", encode_text_sample(rng.integers(1, 64, n).astype(np.uint16), {}), tokens=n)
    Manifest(shards=w.close(), vocab_size=64).save(shards)

    saved = run_local_workers(_save_worker, 2, str(tmp_path), shards)
    paths = {stage: saved[0][stage][0] for stage in STAGES}
    for world in (1, 4):
        resumed = run_local_workers(_resume_worker, world, paths, shards)
        for stage in STAGES:
            _, _, params, after = saved[0][stage]
            for r in resumed:
                step, loaded, stepped, _ = r[stage]
                assert step == 3
                for name in params:
                    assert torch.equal(loaded[name], params[name]), (world, stage, name)
                    torch.testing.assert_close(stepped[name], after[name], rtol=1e-5, atol=1e-6)
            seen = [k for s in saved for k in s[stage][1]] + [k for r in resumed for k in r[stage][3]]
            assert sorted(seen) == [f"doc{i:04d}" for i in range(DOCS)], (world, stage)
