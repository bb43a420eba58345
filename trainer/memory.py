"""Activation memory and the CUDA allocator: what a training step keeps for backward, and where.

- **Checkpointing** (``activation_checkpointing``): ``none`` keeps every activation; ``full``
  keeps only each block's input and recomputes the block in backward (about one extra forward);
  ``selective`` keeps the outputs of the expensive ops (matrix multiplies, attention kernels) and
  recomputes the cheap rest (norms, RoPE, SiLU, residual adds, dtype casts), through torch's
  ``create_selective_checkpoint_contexts`` (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models").
- **Offload** (``memory.offload_activations``): the tensors saved for backward are copied to host
  memory as they are saved and back when backward needs them (``torch.autograd.graph.save_on_cpu``,
  pinned on CUDA so the copies are asynchronous): ``blocks`` inside each transformer block,
  ``model`` around the whole forward (embedding and loss too).
- **Allocator** (``memory.expandable_segments``): on CUDA the caching allocator grows segments in
  place instead of leaving unusable gaps between fixed-size ones (less fragmentation, reported as
  ``hw_cuda_fragmentation_bytes`` = reserved - allocated).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

log = logging.getLogger(__name__)

_aten = torch.ops.aten
# ops whose outputs selective checkpointing keeps: the FLOP-heavy ones, slow to recompute (as the
# dispatcher sees them: nn.Linear arrives as mm/addmm, attention as SDPA's kernels or FlexAttention)
SAVED_OPS = frozenset({
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default,
    _aten._scaled_dot_product_flash_attention.default, _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default, _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.higher_order.flex_attention,
})


def _keep_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def run_block(fn, *args, mode: str):
    """``fn(*args)`` with activation checkpointing ``mode`` (see :data:`trainer.choices.CHECKPOINT_MODES`); without
    autograd recording (evaluation) it runs plainly."""
    if mode == "none" or not torch.is_grad_enabled():
        return fn(*args)
    context = functools.partial(create_selective_checkpoint_contexts, _keep_matmuls) if mode == "selective" else None
    kwargs = {"context_fn": context} if context is not None else {}
    return checkpoint(fn, *args, use_reentrant=False, **kwargs)


def offload(enabled: bool, device: torch.device):
    """Context manager: tensors saved for backward inside it live in host memory until backward
    (pinned when ``device`` is CUDA); a null context when not ``enabled``."""
    if not enabled:
        return contextlib.nullcontext()
    return torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")


ALLOC_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def configure_cuda_allocator(expandable_segments: bool) -> str | None:
    """Turn on the CUDA caching allocator's ``expandable_segments`` before the first CUDA allocation
    (called before the process group and the model exist). A setting already in
    ``$PYTORCH_CUDA_ALLOC_CONF`` (or ``$PYTORCH_ALLOC_CONF``) wins. Returns the setting applied, or
    ``None`` (off, no CUDA, or left to the environment)."""
    if not expandable_segments or not torch.cuda.is_available():
        return None
    if any("expandable_segments" in os.environ.get(k, "") for k in (ALLOC_ENV, "PYTORCH_ALLOC_CONF")):
        return None
    setting = "expandable_segments:True"
    torch.cuda.memory._set_allocator_settings(setting)  # applies to segments allocated from now on
    return setting


def fragmentation_bytes(device: torch.device) -> int:
    """Bytes the CUDA caching allocator holds but no tensor uses (reserved - allocated) on
    ``device``; 0 elsewhere."""
    if device.type != "cuda":
        return 0
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
