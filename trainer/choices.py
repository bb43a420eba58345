"""The trainer's named choices and shared defaults, torch-free: declared here once, so that
:mod:`trainer.config` validates a config without importing torch (``python -m trainer`` on a config
error or ``--dry-run``); the modules that act on them (:mod:`trainer.attention`, :mod:`trainer.memory`,
:mod:`trainer.kernels`) import them from here.
"""
from __future__ import annotations

ATTENTION_NAMES = ("auto", "flex", "dense")  # model.attention (trainer.attention.BACKENDS builds the masks)
CHECKPOINT_MODES = ("none", "full", "selective")  # activation_checkpointing
OFFLOAD_MODES = ("none", "blocks", "model")  # memory.offload_activations
NORM_EPS = 1e-5  # the one default epsilon of RMSNorm and LayerNorm (model config, kernels, reference)


def checkpoint_mode(value: bool | str) -> str:
    """The checkpointing mode of an ``activation_checkpointing`` value: one of
    :data:`CHECKPOINT_MODES`; ``true``/``false`` (configs written before ``selective``) mean
    ``full``/``none``.

    Raises:
        ValueError: any other value.
    """
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in CHECKPOINT_MODES:
        raise ValueError(f"activation_checkpointing={value!r}: use {', '.join(CHECKPOINT_MODES)} (true = full)")
    return value
