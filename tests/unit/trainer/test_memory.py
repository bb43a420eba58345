"""Memory options (selective and full checkpointing, activation offload, ZeRO-3 CPU offload) train
exactly as the plain run does: real gloo process groups, 2 ranks."""
import pytest
import torch

from tests.support.launch import run_local_workers
from trainer import memory
from trainer.config import ModelConfig, OptimConfig, TrainConfig, ZeroConfig
from trainer.distributed import parallel
from trainer.evaluation.synthetic import synthetic_batch
from trainer.train import build_model, train_step

MODEL = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2)
# (zero.stage, zero.cpu_offload, activation_checkpointing, memory.offload_activations)
# (full checkpointing against DDP, at every ZeRO stage: test_zero.py)
MODES = {"plain": (0, False, "none", "none"), "selective": (0, False, "selective", "none"),
         "offload blocks": (0, False, "none", "blocks"), "offload model": (0, False, "full", "model"),
         "zero3 cpu offload": (3, True, "selective", "blocks")}


def _losses_worker():
    info = parallel.init_distributed("cpu")
    batches = [synthetic_batch([[20, 9], [32]], 32, vocab=128, seed=10 * info.rank + i) for i in range(2)]
    out = {}
    for name, (stage, cpu_offload, ckpt, offload) in MODES.items():
        cfg = TrainConfig(model=MODEL, zero=ZeroConfig(stage=stage, cpu_offload=cpu_offload),
                          optim=OptimConfig(lr=1e-2), activation_checkpointing=ckpt)
        cfg.memory.offload_activations = offload
        cfg.validate()
        _, wrapped, opt = build_model(cfg, info)
        losses = []
        for _ in range(2):
            loss_sum, tokens, grad_norm = train_step(wrapped, opt, batches, info, cfg)
            totals = torch.stack([loss_sum, tokens.float()])
            torch.distributed.all_reduce(totals)
            losses.append([(totals[0] / totals[1]).item(), grad_norm.item()])
        out[name] = losses
    return out


def test_memory_options_train_like_the_plain_run():
    """Every mode's per-step mean loss and gradient norm equal the plain DDP run's (2 steps: the
    second step's loss compares each mode's first update too)."""
    for res in run_local_workers(_losses_worker, 2):
        ref = res["plain"]
        assert ref[-1][0] < ref[0][0]
        for name in MODES:
            torch.testing.assert_close(res[name], ref, rtol=1e-5, atol=1e-6, msg=name)


def test_selective_checkpointing_keeps_matmul_outputs_and_recomputes_the_rest():
    """Under the selective policy backward recomputes norms and activations but no matrix multiply;
    full checkpointing recomputes the multiplies too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountMatmuls(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func in memory.SAVED_OPS
            return func(*args, **(kwargs or {}))

    from trainer.model import GPT
    b = synthetic_batch([[20, 12]], 32, vocab=128)
    counts = {}
    for mode in memory.CHECKPOINT_MODES:
        torch.manual_seed(0)
        model = GPT(MODEL)
        model.set_activation_checkpointing(mode)
        loss = model(b.input_ids, b.position_ids, b.document_ids, b.labels)
        with CountMatmuls() as counter:
            loss.backward()
        counts[mode] = counter.n
    assert counts["selective"] == counts["none"] < counts["full"]


@pytest.mark.parametrize("key,value,field", [("activation_checkpointing", "some", "activation_checkpointing"),
                                             ("memory.offload_activations", "disk", "memory.offload_activations"),
                                             ("zero.cpu_offload", True, "zero.cpu_offload")])
def test_bad_memory_settings_are_named(key, value, field):
    cfg = TrainConfig()
    section, _, name = key.rpartition(".")
    setattr(getattr(cfg, section) if section else cfg, name, value)
    with pytest.raises(ValueError, match=field):
        cfg.validate()


def test_checkpointing_true_and_false_of_older_configs_still_read():
    assert memory.checkpoint_mode(True) == "full" and memory.checkpoint_mode(False) == "none"
    assert memory.fragmentation_bytes(torch.device("cpu")) == 0
