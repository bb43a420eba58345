"""Triton kernel for the softmax / cross-entropy gradient of one chunk of logits.

The matmuls around it (``hidden @ weight.T``, ``grad_logits @ weight``, ``grad_logits.T @ hidden``)
stay ``torch.matmul`` (cuBLAS); this kernel replaces the elementwise/reduction part, which in eager
PyTorch would allocate several ``[chunk, V]`` float32 temporaries. One program per row: an online
logsumexp pass over V in blocks (Milakov & Gimelshein 2018), then, when a gradient is wanted, a
second pass that overwrites the logits in place with ``(softmax - onehot(label)) * scale``.
Same scheme as Liger Kernel's cross-entropy (Hsu et al. 2024, arXiv:2410.10989).

Import this module only after deciding on the Triton path: ``triton.jit`` reads
``TRITON_INTERPRET`` when the module is imported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _ce_chunk_kernel(LOGITS, stride_l, LABELS, SCALE, LOSS, V, ignore_index,
                     COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_l
    label = tl.load(LABELS + row)
    valid = label != ignore_index
    m = float("-inf")
    s = 0.0
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    x_label = tl.load(base + label, mask=valid, other=0.0).to(tl.float32)
    tl.store(LOSS + row, tl.where(valid, lse - x_label, 0.0))
    if COMPUTE_GRAD:
        scale = tl.where(valid, tl.load(SCALE + row).to(tl.float32), 0.0)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = tl.exp(x - lse)
            g = tl.where(cols == label, g - 1.0, g) * scale
            tl.store(base + cols, g.to(LOGITS.dtype.element_ty), mask=cols < V)


def num_warps(block_v: int) -> int:
    """Warps per program for ``block_v`` vocabulary columns per step (also what ``compile_check`` builds)."""
    return 8 if block_v >= 2048 else 4


def ce_chunk_triton(logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor | None,
                    ignore_index: int, block_v: int = 4096) -> torch.Tensor:
    """Per-row cross-entropy of a chunk; with ``scale``, the logit gradient written in place.

    Args:
        logits: ``[C, V]`` fp32/bf16/fp16 with unit stride along V; overwritten with
            ``(softmax(logits) - onehot(labels)) * scale[:, None]`` (in ``logits.dtype``) when
            ``scale`` is given, left untouched otherwise.
        labels: ``[C]`` int64, each in ``[0, V)`` or ``ignore_index`` (checked by the caller).
        scale: ``[C]`` float32 per-row gradient scale, or None for loss only.
        ignore_index: label whose row gets loss 0 and gradient 0.
        block_v: columns per inner step (a power of two; the interpreter is faster with larger).

    Returns:
        ``[C]`` float32 loss per row (0 for ignored rows).
    """
    c, v = logits.shape
    loss = torch.empty(c, dtype=torch.float32, device=logits.device)
    if c == 0:
        return loss
    if logits.stride(1) != 1:
        raise ValueError("ce_chunk_triton needs logits with unit stride along V")
    block = min(block_v, triton.next_power_of_2(v))
    _ce_chunk_kernel[(c,)](logits, logits.stride(0), labels.contiguous(),
                           loss if scale is None else scale.contiguous(), loss, v, ignore_index,
                           COMPUTE_GRAD=scale is not None, BLOCK_V=block,
                           num_warps=num_warps(block))
    return loss
