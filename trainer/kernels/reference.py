"""Eager PyTorch reference implementations: the parity baseline for the fused kernels.

These are the plain formulas, differentiated by autograd. The norms compute in float32 (float64
for float64 input) and cast the result back to the input dtype, which is what the Triton kernels do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trainer.choices import NORM_EPS


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for ``dtype``: float32 for half types, float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def check_norm_params(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Raise ValueError unless ``weight`` (and ``bias`` if given) have shape ``[x.shape[-1]]``."""
    d = x.shape[-1]
    if weight.shape != (d,) or (bias is not None and bias.shape != (d,)):
        raise ValueError(f"norm weight/bias must have shape ({d},) to match x {tuple(x.shape)}; "
                         f"got weight {tuple(weight.shape)}"
                         + ("" if bias is None else f", bias {tuple(bias.shape)}"))


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019, "Root Mean Square Layer Normalization").

    ``y = x / sqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: ``[..., D]`` float tensor (fp32/bf16/fp16/fp64).
        weight: ``[D]`` gain.
        eps: added to the mean square before the square root.

    Returns:
        ``[..., D]`` tensor of ``x.dtype``.
    """
    acc = acc_dtype(x.dtype)
    xf = x.to(acc)
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.to(acc)).to(x.dtype)


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                         eps: float = NORM_EPS) -> torch.Tensor:
    """LayerNorm (Ba et al. 2016) over the last dim: ``(x - mean) / sqrt(var + eps) * w + b``.

    Args:
        x: ``[..., D]`` float tensor.
        weight: ``[D]`` gain.
        bias: ``[D]`` shift, or None.
        eps: added to the (biased) variance.

    Returns:
        ``[..., D]`` tensor of ``x.dtype``.
    """
    acc = acc_dtype(x.dtype)
    b = None if bias is None else bias.to(acc)
    return F.layer_norm(x.to(acc), (x.shape[-1],), weight.to(acc), b, eps).to(x.dtype)


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                   ignore_index: int = -100, reduction: str = "sum") -> torch.Tensor:
    """Unfused ``F.cross_entropy(hidden @ weight.T, labels)``: materialises the ``[N, V]`` logits.

    Args:
        hidden: ``[N, D]`` final hidden states.
        weight: ``[V, D]`` output projection (LM head).
        labels: ``[N]`` int64 class ids in ``[0, V)`` or ``ignore_index``.
        ignore_index: label value that contributes no loss and no gradient.
        reduction: ``"sum"``, ``"mean"`` (over non-ignored rows) or ``"none"``.

    Returns:
        Scalar (``sum``/``mean``) or ``[N]`` (``none``) loss in float32 (float64 for float64 input);
        the logits stay in the input dtype, as in an eager model.
    """
    logits = hidden @ weight.T
    return F.cross_entropy(logits.to(acc_dtype(logits.dtype)), labels,
                           ignore_index=ignore_index, reduction=reduction)
