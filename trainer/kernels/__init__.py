"""Fused training kernels: RMSNorm, LayerNorm and linear + cross-entropy.

Each public function dispatches (see ``dispatch.py``): Triton kernels for CUDA tensors when triton
is installed, PyTorch otherwise; ``backend=`` or ``$COLAFLOW_KERNELS`` (``auto|triton|torch|
reference``) forces one. All are differentiable (custom ``torch.autograd.Function``s).
"""

from __future__ import annotations

import torch

from trainer.choices import NORM_EPS
from trainer.kernels.dispatch import BACKENDS, ENV_VAR, resolve_backend, triton_available
from trainer.kernels.linear_ce import REDUCTIONS, LinearCrossEntropyFunction, reduce_loss, run_chunks, torch_ce_chunk
from trainer.kernels.reference import (
    check_norm_params,
    layer_norm_reference,
    linear_cross_entropy_reference,
    rms_norm_reference,
)

__all__ = ["BACKENDS", "ENV_VAR", "NORM_EPS", "layer_norm", "linear_cross_entropy", "rms_norm",
           "resolve_backend", "triton_available"]

_MAX_FUSED_D = 65536  # mirrors norm_triton.MAX_FUSED_D without importing triton
_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _norm_triton_ok(x: torch.Tensor) -> bool:
    return x.shape[-1] <= _MAX_FUSED_D and x.dtype in _TRITON_DTYPES


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = NORM_EPS,
             backend: str | None = None) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    Args:
        x: ``[..., D]`` fp32/bf16/fp16 (fp64 on the PyTorch path) activations.
        weight: ``[D]`` gain.
        eps: added to the mean square.
        backend: ``auto|triton|torch|reference`` or None for ``$COLAFLOW_KERNELS``.

    Returns:
        ``[..., D]`` of ``x.dtype``; statistics computed in float32.

    Raises:
        ValueError: bad backend name or weight shape; RuntimeError: Triton forced but unusable.
    """
    check_norm_params(x, weight, None)
    if resolve_backend(backend, x, _norm_triton_ok(x)) == "triton":
        from trainer.kernels.norm_triton import rms_norm_triton
        return rms_norm_triton(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               eps: float = NORM_EPS, backend: str | None = None) -> torch.Tensor:
    """LayerNorm over the last dim (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * w + b``.

    Args:
        x: ``[..., D]`` fp32/bf16/fp16 (fp64 on the PyTorch path) activations.
        weight: ``[D]`` gain; bias: ``[D]`` shift or None.
        eps: added to the biased variance.
        backend: ``auto|triton|torch|reference`` or None for ``$COLAFLOW_KERNELS``.

    Returns:
        ``[..., D]`` of ``x.dtype``; statistics computed in float32.

    Raises:
        ValueError: bad backend name or weight/bias shape; RuntimeError: Triton forced but unusable.
    """
    check_norm_params(x, weight, bias)
    if resolve_backend(backend, x, _norm_triton_ok(x)) == "triton":
        from trainer.kernels.norm_triton import layer_norm_triton
        return layer_norm_triton(x, weight, bias, eps)
    return layer_norm_reference(x, weight, bias, eps)


def _check_ce(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int,
              reduction: str, chunk_size: int) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction={reduction!r}; use one of {REDUCTIONS}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 rows, got {chunk_size}")
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"need hidden [N, D] and weight [V, D]; got {tuple(hidden.shape)} and "
                         f"{tuple(weight.shape)} (flatten batch and sequence dims first)")
    if not hidden.device == weight.device == labels.device:
        raise ValueError(f"hidden, weight and labels must share a device; got {hidden.device}, "
                         f"{weight.device}, {labels.device}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden is {hidden.dtype} but weight is {weight.dtype}; cast one of them")
    if labels.shape != (hidden.shape[0],) or labels.dtype != torch.int64:
        raise ValueError(f"labels must be int64 [{hidden.shape[0]}], got {labels.dtype} "
                         f"{tuple(labels.shape)}")
    vocab = weight.shape[0]
    bad = ((labels < 0) | (labels >= vocab)) & (labels != ignore_index)
    if labels.device.type != "cpu":
        # an out-of-range label would read out of bounds; checked on the device so the training
        # step never waits for the host (the error surfaces at the next synchronisation)
        torch._assert_async(~bad.any(), f"labels outside [0, {vocab}) and != ignore_index={ignore_index}")
    elif bool(bad.any()):  # free on the CPU: no device to wait for
        rows = bad.nonzero().flatten()
        raise ValueError(f"{rows.numel()} labels outside [0, {vocab}) and != ignore_index="
                         f"{ignore_index}; first at row {int(rows[0])}: {int(labels[rows[0]])}")


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         ignore_index: int = -100, reduction: str = "sum", chunk_size: int = 4096,
                         backend: str | None = None) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T`` without materialising the ``[N, V]`` logits.

    Fused, chunked linear + cross-entropy (Liger Kernel, Hsu et al. 2024, arXiv:2410.10989); see
    ``linear_ce.py``. Equals ``F.cross_entropy(hidden @ weight.T, labels, ...)`` up to rounding.

    Args:
        hidden: ``[N, D]`` fp32/bf16/fp16 (fp64 on the PyTorch path) final hidden states.
        weight: ``[V, D]`` LM-head weight, same dtype as ``hidden``.
        labels: ``[N]`` int64 token ids in ``[0, V)`` or ``ignore_index`` (no loss, no gradient).
        ignore_index: label value to skip (-100, as in ``TokenBatch.labels``).
        reduction: ``"sum"``, ``"mean"`` (over non-ignored rows; NaN if none) or ``"none"``.
        chunk_size: rows per chunk; peak extra memory is about ``chunk_size * V`` logits plus a
            float32 ``[V, D]`` weight-gradient accumulator.
        backend: ``auto`` (Triton on CUDA, else chunked PyTorch), ``triton``, ``torch`` (chunked
            PyTorch) or ``reference`` (eager, full logits); None reads ``$COLAFLOW_KERNELS``.

    Returns:
        Scalar (``sum``/``mean``) or ``[N]`` (``none``) float32 loss (float64 for float64 input),
        accumulated in float32 even for bf16 inputs.

    Raises:
        ValueError: bad shapes, dtypes, reduction, chunk_size, or a label outside ``[0, V)``
            that is not ``ignore_index``; RuntimeError: Triton forced but unusable.
    """
    _check_ce(hidden, weight, labels, ignore_index, reduction, chunk_size)
    name = resolve_backend(backend, hidden, hidden.dtype in _TRITON_DTYPES)
    if name == "reference":
        return linear_cross_entropy_reference(hidden, weight, labels, ignore_index, reduction)
    if name == "triton":
        from trainer.kernels.ce_triton import ce_chunk_triton
        chunk_fn = ce_chunk_triton
    else:
        chunk_fn = torch_ce_chunk
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LinearCrossEntropyFunction.apply(hidden, weight, labels, ignore_index, reduction,
                                                chunk_size, chunk_fn)
    loss = run_chunks(hidden, weight, labels, ignore_index, chunk_size, chunk_fn, None, None, None)
    return reduce_loss(loss, labels, ignore_index, reduction)
