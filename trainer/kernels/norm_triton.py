"""Triton fused RMSNorm and LayerNorm, forward and backward.

One kernel pair serves both norms (``IS_RMS`` constexpr). Forward: one program per row, the whole
row in registers (``D <= MAX_FUSED_D``), statistics in float32, the per-row ``rstd`` (and ``mean``
for LayerNorm) saved for backward. Backward: each program walks a contiguous block of rows, writes
``dx`` per row and accumulates its share of ``dweight``/``dbias`` in float32 registers; the partial
sums ``[programs, D]`` are reduced with one ``torch.sum``. Layout follows the Triton LayerNorm
tutorial and Liger Kernel (Hsu et al. 2024, arXiv:2410.10989). RMSNorm: Zhang & Sennrich 2019.

Import this module only after deciding on the Triton path: ``triton.jit`` reads
``TRITON_INTERPRET`` when the module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trainer.choices import NORM_EPS
from trainer.kernels.reference import acc_dtype, check_norm_params

MAX_FUSED_D = 65536  # one row must fit in one program's registers


@triton.jit
def _norm_fwd_kernel(X, W, B, Y, MEAN, RSTD, stride_x, stride_y, D, eps,
                     IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=0) / D
        xc = tl.where(mask, x - mean, 0.0)
        tl.store(MEAN + row, mean)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / D + eps)
    tl.store(RSTD + row, rstd)
    y = xc * rstd * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_kernel(X, W, DY, DX, MEAN, RSTD, DW_PART, DB_PART, stride_x, stride_dy, stride_dx,
                     M, D, rows_per_program,
                     IS_RMS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    mask = cols < D
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    for r in range(row_start, row_end):
        row = tl.cast(r, tl.int64)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        if IS_RMS:
            xhat = x * rstd
        else:
            xhat = tl.where(mask, (x - tl.load(MEAN + row)) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / D
        if IS_RMS:
            dx = (wdy - xhat * c1) * rstd
        else:
            dx = (wdy - xhat * c1 - tl.sum(wdy, axis=0) / D) * rstd
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw_acc += dy * xhat
        if HAS_BIAS:
            db_acc += dy
    tl.store(DW_PART + pid * D + cols, dw_acc, mask=mask)
    if HAS_BIAS:
        tl.store(DB_PART + pid * D + cols, db_acc, mask=mask)


def num_warps(block_d: int) -> int:
    """Warps per program for a row block of ``block_d`` columns (also what ``compile_check`` builds)."""
    return min(max(block_d // 256, 1), 16)


def _bwd_programs(x: torch.Tensor, rows: int) -> int:
    """Programs for the backward pass: a few per SM on CUDA, a handful in the interpreter."""
    if x.is_cuda:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        return max(1, min(rows, 2 * sms))
    return max(1, min(rows, 4))


class _FusedNorm(torch.autograd.Function):
    """Autograd wrapper; saves ``x`` (flattened to ``[M, D]``), ``rstd`` and ``mean``."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, is_rms):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        m, d = x2.shape
        block_d = triton.next_power_of_2(d)
        y = torch.empty_like(x2)
        rstd = torch.empty(m, dtype=torch.float32, device=x.device)
        mean = rstd if is_rms else torch.empty_like(rstd)
        has_bias = bias is not None
        if m > 0:
            _norm_fwd_kernel[(m,)](x2, weight, bias if has_bias else weight, y, mean, rstd,
                                   x2.stride(0), y.stride(0), d, eps, IS_RMS=is_rms,
                                   HAS_BIAS=has_bias, BLOCK_D=block_d,
                                   num_warps=num_warps(block_d))
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.is_rms, ctx.has_bias, ctx.shape = is_rms, has_bias, shape
        return y.reshape(shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        m, d = x2.shape
        dy2 = dy.reshape(-1, d).contiguous()
        dx = torch.empty_like(x2)
        programs = _bwd_programs(x2, m)
        dw_part = torch.zeros(programs, d, dtype=torch.float32, device=x2.device)
        db_part = torch.zeros_like(dw_part) if ctx.has_bias else dw_part
        block_d = triton.next_power_of_2(d)
        if m > 0:
            _norm_bwd_kernel[(programs,)](x2, weight, dy2, dx, mean, rstd, dw_part, db_part,
                                          x2.stride(0), dy2.stride(0), dx.stride(0), m, d,
                                          triton.cdiv(m, programs), IS_RMS=ctx.is_rms,
                                          HAS_BIAS=ctx.has_bias, BLOCK_D=block_d,
                                          num_warps=num_warps(block_d))
        dw = dw_part.sum(0).to(weight.dtype)
        db = db_part.sum(0).to(weight.dtype) if ctx.has_bias else None
        return dx.reshape(ctx.shape), dw, db, None, None


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_norm_params(x, weight, bias)
    if acc_dtype(x.dtype) != torch.float32:
        raise ValueError(f"the Triton norm computes in float32; got {x.dtype}, use backend='torch'")


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """Fused RMSNorm: ``[..., D]`` fp32/bf16/fp16 ``x``, ``[D]`` weight -> ``[..., D]`` x.dtype.

    Raises:
        ValueError: weight shape does not match ``D``, or float64 input.
    """
    _check(x, weight, None)
    return _FusedNorm.apply(x, weight.contiguous(), None, eps, True)


def layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      eps: float = NORM_EPS) -> torch.Tensor:
    """Fused LayerNorm: ``[..., D]`` x, ``[D]`` weight and bias (or None) -> ``[..., D]`` x.dtype.

    Raises:
        ValueError: weight/bias shape does not match ``D``, or float64 input.
    """
    _check(x, weight, bias)
    b = None if bias is None else bias.contiguous()
    return _FusedNorm.apply(x, weight.contiguous(), b, eps, False)
