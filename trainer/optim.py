"""Learning-rate schedule and gradient clipping (DTensor-aware for FSDP2)."""
from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor

from trainer.config import OptimConfig


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup to ``cfg.lr`` over
    ``warmup_steps``, then cosine decay to ``cfg.min_lr`` at ``total_steps`` (Loshchilov & Hutter
    2017, "SGDR"; GPT-3 schedule)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every param group's learning rate (a plain float; no scheduler state to checkpoint)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """Clip the global gradient L2 norm to ``max_norm``; returns the pre-clip norm (0-d tensor).

    Under FSDP2 the gradients are DTensor shards, so the norm of the local shards is a partial
    value; ``full_tensor()`` all-reduces it to the true global norm before clipping. No host sync.
    With FSDP2's CPU offload the shards live in host memory while the mesh's collectives run on
    the device, so the partial norm moves to the mesh's device first (the norm comes back there).
    """
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    if isinstance(norm, DTensor):
        mesh = norm.device_mesh
        if norm.to_local().device.type != mesh.device_type:
            norm = DTensor.from_local(norm.to_local().to(mesh.device_type), mesh, norm.placements)
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_([p for p in parameters if p.grad is not None], max_norm, norm,
                                             foreach=True)
    return norm
