"""Memory options: what selective checkpointing recomputes, how settings are validated. That each
option trains to plain DDP's losses (gloo, 2 ranks) is checked with the ZeRO stages, in one set of
processes: tests/unit/trainer/test_zero.py."""
import pytest
import torch

from trainer import memory
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
