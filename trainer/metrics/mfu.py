"""Model FLOPs per token and model FLOPs utilisation (MFU).

Formula (Chowdhery et al. 2022, "PaLM", appendix B; the 6N rule as in Hoffmann et al. 2022,
"Chinchilla", appendix F, and Kaplan et al. 2020): one training token costs

    6 * N  +  12 * L * H * Q * T   FLOPs

where ``N`` is the number of parameters taking part in matrix multiplies (2 FLOPs per multiply-add
forward, twice that backward), ``L`` layers, ``H`` heads, ``Q`` head dim and ``T`` the sequence
length (the attention scores ``Q K^T`` and ``A V``: ``2 * 2 * T * Q`` FLOPs per head and token
forward, times 3 for forward + backward). Like PaLM we count the full ``T x T`` attention of a
``seq_len`` row, not the smaller block-diagonal one document masking computes, and we do not
count recomputation (activation checkpointing): MFU is *model* FLOPs, not hardware FLOPs.

``N`` here is every weight matrix except an untied input embedding (a lookup, no FLOPs); a tied
embedding is counted once, as the output projection; norm gains (elementwise) are left out.
MFU = achieved model FLOP/s per device / peak FLOP/s per device.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from trainer.config import ModelConfig

if TYPE_CHECKING:
    from trainer.model import GPT

# Dense (no 2:4 sparsity) bf16 tensor-core peaks from the vendors' data sheets, FLOP/s per device.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "L4": 121e12,
    "V100": 125e12,
}


def matmul_parameters(model: GPT) -> int:
    """Parameters that take part in matrix multiplies: the distinct weight matrices (``dim >= 2``;
    norm gains are elementwise) minus an untied input embedding (``model.tok_emb`` when
    ``model.lm_head`` is a separate matrix)."""
    total = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    if model.lm_head is not None:
        total -= model.tok_emb.weight.numel()
    return total


def flops_per_token(n_matmul_params: int, cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token: ``6 N + 12 L H Q T`` (PaLM appendix B).

    Args:
        n_matmul_params: ``N`` (see :func:`matmul_parameters`).
        cfg: the model sizes (``n_layers``, ``n_heads``, ``d_model``).
        seq_len: ``T``, tokens per row.
    """
    head_dim = cfg.d_model // cfg.n_heads
    return 6.0 * n_matmul_params + 12.0 * cfg.n_layers * cfg.n_heads * head_dim * seq_len


def peak_flops(configured: float, device: torch.device) -> float | None:
    """Peak FLOP/s of one device: ``configured`` when > 0, else the bf16 data-sheet figure of a
    known CUDA GPU (matched by name, see ``PEAK_BF16_FLOPS``), else ``None`` (MFU not reported:
    CPUs have no reliable figure; set ``metrics.peak_flops``)."""
    if configured > 0:
        return float(configured)
    if device.type == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(device)
        for key, value in PEAK_BF16_FLOPS.items():
            if key in name:
                return value
    return None
