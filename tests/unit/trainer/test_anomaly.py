"""Bad steps with 2 gloo ranks: a NaN injected on one rank and a loss spike are skipped and
counted on every rank with the parameters and optimizer state untouched, each logged with step,
rank and batch keys; repeated bad steps roll the trainer back to the last checkpoint with a lower
learning rate."""
import json
import os

import pytest
import torch

from colaflow.config import load_config
from trainer.distributed import parallel
from trainer.run.anomaly import AnomalyGuard
from trainer.run.events import EventLog
from trainer.run.hooks import HookContext, StepHooks
from trainer.config import AnomalyConfig, ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from tests.support.faults import fault_hook, fault_hooks
from tests.support.launch import run_local_workers
from trainer.optim import lr_at
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train, train_step

from tests.integration.test_trainer_e2e import build_shards

SMALL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4)


def _state(model, opt) -> list[torch.Tensor]:
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    inner = opt.optim if hasattr(opt, "optim") else opt
    return ([full(p).detach().clone() for p in model.parameters()]
            + [full(v).clone() for s in inner.state.values() for v in s.values()])


def _skip_worker(run_dir: str):
    info = parallel.init_distributed("cpu")
    out = {}
    for stage in (0, 3):
        anomaly = AnomalyConfig(spike_warmup=1, spike_ratio=3.0)
        cfg = TrainConfig(model=SMALL, zero=ZeroConfig(stage=stage), optim=OptimConfig(lr=1e-2), anomaly=anomaly,
                          hooks=[fault_hook(nan_at_steps=[2], spike_at_steps=[4], rank=1)])
        model, wrapped, opt = build_model(cfg, info)
        stage_dir = os.path.join(run_dir, f"stage{stage}")
        guard = AnomalyGuard(anomaly, stage_dir, info.rank, info.device)
        hooks = StepHooks.build(cfg.hooks, HookContext(stage_dir, EventLog.of_run(stage_dir)))
        batch = synthetic_batch([[20, 12]], 32, vocab=128, seed=info.rank)
        applied, unchanged = [], []
        for step in range(1, 6):
            before = _state(model, opt)
            train_step(wrapped, opt, [batch], info, cfg, guard=guard, step=step, hooks=hooks)
            after = _state(model, opt)
            applied.append(guard.applied)
            unchanged.append(all(torch.equal(a, b) for a, b in zip(before, after)))
        out[stage] = (applied, unchanged, guard.summary(), batch.keys)
    return out


def test_nan_and_spike_skipped_on_all_ranks_with_state_unchanged(tmp_path):
    results = run_local_workers(_skip_worker, 2, str(tmp_path))
    for stage in (0, 3):
        for rank, res in enumerate(results):
            applied, unchanged, summary, keys = res[stage]
            assert applied == [True, False, True, False, True], (stage, rank)
            assert unchanged == [False, True, False, True, False], (stage, rank)
            assert summary["skipped_nonfinite"] == 1 and summary["skipped_spikes"] == 1
        with open(tmp_path / f"stage{stage}" / "events.jsonl") as f:
            events = sorted((e["step"], e["rank"], e["event"], tuple(e["keys"])) for e in map(json.loads, f))
        assert events == [(2, r, "nonfinite", tuple(results[r][stage][3])) for r in (0, 1)] + \
                         [(4, r, "loss_spike", tuple(results[r][stage][3])) for r in (0, 1)]


def _train_worker(cfg: TrainConfig):
    return train(cfg)


def test_repeated_bad_steps_roll_back_with_lower_lr(tmp_path):
    shards, run = str(tmp_path / "shards"), tmp_path / "run"
    build_shards(shards)
    cfg = load_config(TrainConfig, None, [
        f"data.manifest={shards}", f"run_dir={run}", f"cache.dir={tmp_path / 'cache'}", "model.d_model=32",
        "model.n_layers=1", "model.n_heads=2", "model.max_seq_len=64", "data.seq_len=64", "data.micro_batch_size=1",
        "data.num_workers=0", "steps=10", "log_every=3", "checkpoint.every=5", "zero.stage=1", "device=cpu",
        "metrics.progress=false", fault_hooks(nan_at_steps=[7, 8], rank=0),
        "anomaly.max_consecutive=2", "anomaly.rollback_lr_factor=0.25"])
    results = run_local_workers(_train_worker, 2, cfg)
    for res in results:
        assert res["final_step"] == 10
        # step 6 was good and trained after the step-5 checkpoint: the rollback undid it (1 step x 2 ranks)
        assert res["anomalies"] == {"skipped_nonfinite": 2, "skipped_spikes": 0, "rollbacks": 1, "lr_scale": 0.25,
                                    "good_steps_lost": 1, "good_micro_batches_lost": 2}
    with open(run / "events.jsonl") as f:
        events = [json.loads(line) for line in f]
    rollbacks = sorted((e["rank"], e["step"], e["to_step"], e["lr_scale"], e["good_steps_lost"],
                        e["good_micro_batches_lost"]) for e in events if e["event"] == "rollback")
    assert rollbacks == [(0, 8, 5, 0.25, 1, 2), (1, 8, 5, 0.25, 1, 2)]
    assert rollbacks and all(e["checkpoint"].endswith("step_000005") for e in events if e["event"] == "rollback")
    nonfinite = sorted((e["step"], e["rank"]) for e in events if e["event"] == "nonfinite")
    assert nonfinite == [(7, 0), (7, 1), (8, 0), (8, 1)]
    with open(run / "metrics.jsonl") as f:  # issue 37: step 6, logged, undone and retrained, is logged once
        assert [json.loads(line)["step"] for line in f] == [1, 3, 6, 9, 10]
    assert (run / "checkpoints" / "step_000010" / "COMPLETE").exists()
    with open(run / "metrics.jsonl") as f:
        last = [r for r in map(json.loads, f) if r["step"] == 10][-1]
    assert last["lr"] == pytest.approx(0.25 * lr_at(9, cfg.optim, 10))  # the lowered rate after the rollback
