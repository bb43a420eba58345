"""Per-layer statistics (gradient norm, update/weight ratio, activation RMS/max) on 2 gloo ranks fed
the same batch, under DDP (ZeRO 0: replicated tensors) and FSDP2 (ZeRO 3: DTensor shards summed
over ranks), match a direct computation on the unwrapped model in this process."""
import math

import pytest
import torch

from trainer.distributed import parallel
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.launch import run_local_workers
from trainer.metrics.model_stats import LayerStats, sample_blocks
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train_step

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=3, n_heads=4)


def _worker(stages):
    info = parallel.init_distributed("cpu")
    batch = synthetic_batch([[20, 12], [30]], 32, vocab=128, seed=7)  # the same batch on every rank
    out = {}
    for stage in stages:
        cfg = TrainConfig(model=SMALL, zero=ZeroConfig(stage=stage), optim=OptimConfig(lr=1e-2, grad_clip=0.0))
        model, wrapped, opt = build_model(cfg, info)
        stats = LayerStats(model, -1, info.device, info.world_size)
        stats.arm()
        train_step(wrapped, opt, [batch], info, cfg, step=1, stats=stats)
        out[stage] = stats.collect()
        assert stats._hooks == [] and not stats.armed
        out[f"{stage}-again"] = stats.collect()  # nothing armed since: not measured
    return out


def _reference() -> dict:
    """Grad norms, first-step AdamW update ratios and activation RMS/max of the bare model, by hand."""
    torch.manual_seed(0)
    from trainer.model import GPT
    model = GPT(SMALL)
    batch = synthetic_batch([[20, 12], [30]], 32, vocab=128, seed=7)
    acts = {}
    for i, block in enumerate(model.blocks):
        block.register_forward_hook(lambda _m, _i, o, i=i: acts.__setitem__(i, o.detach()))
    tokens = (batch.labels != -100).sum()
    (model(batch.input_ids, batch.position_ids, batch.document_ids, batch.labels) / tokens).backward()
    before = [[p.detach().clone() for p in block.parameters()] for block in model.blocks]
    grads = [[p.grad.detach().clone() for p in block.parameters()] for block in model.blocks]
    parallel.build_optimizer(model, 0, 1e-2, (0.9, 0.95), 0.1).step()  # the trainer's AdamW groups, unwrapped
    ref = {}
    for i, block in enumerate(model.blocks):
        g = math.sqrt(sum(float(t.double().square().sum()) for t in grads[i]))
        w = math.sqrt(sum(float(t.double().square().sum()) for t in before[i]))
        dw = math.sqrt(sum(float((p.detach() - b).double().square().sum()) for p, b in zip(block.parameters(), before[i])))
        a = acts[i].double()
        ref[f"blocks.{i}"] = {"grad_norm": g, "update_ratio": dw / w, "act_rms": float(a.square().mean().sqrt()),
                              "act_max": float(a.abs().max())}
    return ref


def test_layer_stats_agree_across_wrappings_and_with_a_direct_computation():
    two = run_local_workers(_worker, 2, [0, 3])
    ref = _reference()
    assert set(two[0][0]) == set(ref) == {"blocks.0", "blocks.1", "blocks.2"}
    for name, values in ref.items():
        for stat, want in values.items():
            for rank in (0, 1):
                for stage in (0, 3):
                    assert two[rank][stage][name][stat] == pytest.approx(want, rel=1e-4), (rank, stage, name, stat)
    assert all(v is None for layer in two[0]["3-again"].values() for v in layer.values())


def test_sample_blocks_spreads_from_first_to_last():
    assert sample_blocks(12, 2) == [0, 11] and sample_blocks(12, 3) == [0, 6, 11] and sample_blocks(12, 1) == [11]
    assert sample_blocks(4, -1) == sample_blocks(4, 9) == [0, 1, 2, 3] and sample_blocks(4, 0) == []
