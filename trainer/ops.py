"""The two hot operations behind one import point: fused kernels when present, PyTorch otherwise.

``trainer.kernels`` (fused Triton kernels, another package) provides ``rms_norm`` and
``linear_cross_entropy`` with the signatures below; when it cannot be imported (CPU-only
installs, no Triton) the plain PyTorch reference versions here are used. Model code calls only
these names so switching implementations never touches the model.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _rms_norm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * weight`` over the last dim.

    Shapes: ``x`` [..., D] any float dtype, ``weight`` [D]; returns ``x``'s shape and dtype.
    The statistics are computed in fp32 so bf16 inputs stay accurate.
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype)


def _linear_cross_entropy_torch(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                ignore_index: int = -100, reduction: str = "sum") -> torch.Tensor:
    """Cross entropy of ``hidden @ weight.T`` against ``labels``, logits in fp32.

    Shapes: ``hidden`` [N, D], ``weight`` [V, D], ``labels`` [N] int64 (``ignore_index`` = no loss).
    ``reduction`` is ``sum``, ``mean`` (over non-ignored tokens) or ``none`` ([N]).
    """
    logits = (hidden @ weight.t()).float()
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction)


try:
    from trainer.kernels import linear_cross_entropy, rms_norm  # noqa: F401
    FUSED = True
except ImportError:
    rms_norm = _rms_norm_torch
    linear_cross_entropy = _linear_cross_entropy_torch
    FUSED = False
