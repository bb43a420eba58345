"""Memory options: what selective checkpointing recomputes, how settings are validated. That each
option trains to plain DDP's losses (gloo, 2 ranks) is checked with the ZeRO stages, in one set of
processes: tests/unit/trainer/test_zero.py."""
import pytest
import torch

from trainer import memory
from trainer.choices import CHECKPOINT_MODES, checkpoint_mode
from trainer.config import ModelConfig, TrainConfig
from trainer.evaluation.synthetic import synthetic_batch

MODEL = ModelConfig(vocab_size=128, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2)


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
    for mode in CHECKPOINT_MODES:
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
    assert checkpoint_mode(True) == "full" and checkpoint_mode(False) == "none"
    assert memory.fragmentation_bytes(torch.device("cpu")) == 0


CUDA = torch.cuda.is_available()
# name -> (zero.stage, zero.cpu_offload, activation_checkpointing, memory.offload_activations)
CUDA_MODES = {"plain": (3, False, "none", "none"), "selective": (3, False, "selective", "none"),
              "offload blocks (pinned)": (3, False, "none", "blocks"), "cpu offload (nccl)": (3, True, "none", "none")}


def _cuda_worker():
    """One nccl rank on the GPU: each mode's first three (loss, gradient norm), the fragmentation
    bytes, and how many bytes stay on the device between steps."""
    from trainer.config import OptimConfig, ZeroConfig
    from trainer.distributed import parallel
    from trainer.train import build_model, train_step
    applied = memory.configure_cuda_allocator(True)
    info = parallel.init_distributed("cuda")
    batch = synthetic_batch([[300, 212], [512]], 512, vocab=128).to(info.device)
    out = {"allocator": applied}
    for name, (stage, cpu_offload, checkpointing, offload) in CUDA_MODES.items():
        cfg = TrainConfig(model=ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, max_seq_len=512),
                          zero=ZeroConfig(stage=stage, cpu_offload=cpu_offload), optim=OptimConfig(lr=1e-2),
                          device="cuda", activation_checkpointing=checkpointing)
        cfg.memory.offload_activations = offload
        _, wrapped, opt = build_model(cfg, info)
        steps = []
        for _ in range(3):
            loss, tokens, norm = train_step(wrapped, opt, [batch], info, cfg)
            steps.append([(loss / tokens).item(), norm.item()])
        out[name] = steps
        out[name, "norm_device"] = norm.device.type
    out["fragmentation"] = memory.fragmentation_bytes(info.device)
    torch.distributed.destroy_process_group()
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA (nccl, pinned host memory, the CUDA allocator)")
def test_cuda_memory_options_train_like_the_plain_run():
    """On the GPU: pinned activation offload, selective checkpointing and FSDP2's CPU offload over
    nccl (the gradient norm all-reduced on the device) train to the plain run's losses;
    expandable_segments is applied unless the environment sets it."""
    from tests.support.launch import run_local_workers
    res = run_local_workers(_cuda_worker, 1)[0]
    for name in CUDA_MODES:
        torch.testing.assert_close(res[name], res["plain"], rtol=1e-4, atol=1e-5, msg=name)
    assert res["cpu offload (nccl)", "norm_device"] == "cuda"
    assert res["fragmentation"] >= 0
    assert res["allocator"] in ("expandable_segments:True", None)
