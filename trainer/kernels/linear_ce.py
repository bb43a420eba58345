"""Fused linear + cross-entropy, chunked over tokens so the ``[N, V]`` logits never exist at once.

Scheme of Liger Kernel's FusedLinearCrossEntropy (Hsu et al. 2024, arXiv:2410.10989): for each chunk
of ``C`` rows the forward pass computes ``logits = hidden_c @ weight.T`` (``[C, V]``), the per-row
logsumexp and loss, turns the logits in place into ``d loss / d logits``, and immediately folds that
into ``grad_hidden_c = g @ weight`` and ``grad_weight += g.T @ hidden_c`` (float32 accumulator for
half-precision inputs). Backward then only scales the stored gradients by ``grad_output``. Peak extra
memory is ``O(C * V + V * D)`` instead of ``O(N * V)``; the stored gradients live until the graph is freed.

``reduction="none"`` cannot pre-scale (each row has its own ``grad_output``), so it saves the inputs
and recomputes the chunks in backward with the per-row scale (one extra matmul per chunk).

The per-chunk softmax/gradient step is pluggable: ``torch_ce_chunk`` (PyTorch, any device) or
``ce_triton.ce_chunk_triton`` (Triton); the matmuls are ``torch.matmul`` in both.
"""

from __future__ import annotations

from typing import Callable

import torch

from trainer.kernels.reference import acc_dtype

ChunkFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", int], torch.Tensor]
REDUCTIONS = ("sum", "mean", "none")


def torch_ce_chunk(logits: torch.Tensor, labels: torch.Tensor, scale: torch.Tensor | None,
                   ignore_index: int) -> torch.Tensor:
    """PyTorch twin of ``ce_chunk_triton``: per-row loss, gradient written into ``logits``.

    Args:
        logits: ``[C, V]`` float; overwritten with ``(softmax - onehot) * scale[:, None]`` when
            ``scale`` is given.
        labels: ``[C]`` int64 in ``[0, V)`` or ``ignore_index``.
        scale: ``[C]`` per-row gradient scale (float32/float64), or None for loss only.
        ignore_index: label whose row gets loss 0 and gradient 0.

    Returns:
        ``[C]`` loss per row in the accumulation dtype (float32, float64 for float64 logits).
    """
    x = logits.to(acc_dtype(logits.dtype))  # aliases logits when already fp32/fp64
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0).unsqueeze(1)
    lse = torch.logsumexp(x, dim=1)
    loss = torch.where(valid, lse - x.gather(1, safe).squeeze(1), 0.0)
    if scale is not None:
        g = x.sub_(lse.unsqueeze(1)).exp_()
        g.scatter_add_(1, safe, torch.full_like(safe, -1, dtype=g.dtype))
        g.mul_((scale.to(g.dtype) * valid).unsqueeze(1))
        if g.data_ptr() != logits.data_ptr():
            logits.copy_(g)
    return loss


def run_chunks(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, ignore_index: int,
               chunk_size: int, chunk_fn: ChunkFn, row_scale: torch.Tensor | None,
               grad_hidden: torch.Tensor | None, grad_weight: torch.Tensor | None) -> torch.Tensor:
    """Loop over row chunks: per-row loss, and (with ``row_scale``) gradients into the buffers.

    Args:
        hidden: ``[N, D]``; weight: ``[V, D]``; labels: ``[N]`` int64.
        chunk_size: rows per chunk ``C``; the ``[C, V]`` logits are the only large temporary.
        chunk_fn: ``torch_ce_chunk`` or ``ce_chunk_triton``.
        row_scale: ``[N]`` float gradient scale per row, or None for loss only.
        grad_hidden: ``[N, D]`` buffer (hidden dtype) filled with ``d loss / d hidden``, or None.
        grad_weight: ``[V, D]`` float32/64 accumulator, ``d loss / d weight`` added, or None.

    Returns:
        ``[N]`` per-row loss in the accumulation dtype.
    """
    loss = torch.empty(hidden.shape[0], dtype=acc_dtype(hidden.dtype), device=hidden.device)
    # autocast would recast the matmuls and break the out=/accumulator dtypes: inputs are final
    with torch.autocast(hidden.device.type, enabled=False):
        _chunk_loop(hidden, weight, labels, ignore_index, chunk_size, chunk_fn, row_scale,
                    grad_hidden, grad_weight, loss)
    return loss


def _chunk_loop(hidden, weight, labels, ignore_index, chunk_size, chunk_fn, row_scale,
                grad_hidden, grad_weight, loss) -> None:
    for start in range(0, hidden.shape[0], chunk_size):
        end = min(start + chunk_size, hidden.shape[0])
        h = hidden[start:end]
        logits = h @ weight.T
        scale = None if row_scale is None else row_scale[start:end]
        loss[start:end] = chunk_fn(logits, labels[start:end], scale, ignore_index)
        if scale is None:
            continue
        if grad_hidden is not None:
            torch.mm(logits, weight, out=grad_hidden[start:end])
        if grad_weight is not None:
            if grad_weight.dtype == logits.dtype:
                grad_weight.addmm_(logits.T, h)
            else:  # half inputs: product in input dtype, sum across chunks in float32
                grad_weight.add_(logits.T @ h)


def _new_grad_hidden(hidden: torch.Tensor) -> torch.Tensor:
    """Contiguous ``[N, D]`` buffer: its row slices are valid ``out=`` targets for ``torch.mm``."""
    return torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)


def _row_scale(labels: torch.Tensor, ignore_index: int, reduction: str, dtype) -> torch.Tensor:
    scale = torch.ones(labels.shape[0], dtype=dtype, device=labels.device)
    if reduction == "mean":
        scale /= (labels != ignore_index).sum().clamp(min=1)
    return scale


def reduce_loss(loss: torch.Tensor, labels: torch.Tensor, ignore_index: int,
                reduction: str) -> torch.Tensor:
    """Apply ``reduction`` to the per-row loss; ``mean`` divides by the non-ignored row count
    (NaN when every row is ignored, like ``F.cross_entropy``)."""
    if reduction == "none":
        return loss
    total = loss.sum()
    return total / (labels != ignore_index).sum() if reduction == "mean" else total


class LinearCrossEntropyFunction(torch.autograd.Function):
    """Autograd function; see the module docstring. Inputs must already be validated."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, ignore_index, reduction, chunk_size, chunk_fn):
        """Chunked ``hidden [N, D] @ weight.T [D, V]`` cross entropy against ``labels [N]``.

        With a reduction, gradients are computed during the forward chunks (the logits are never
        kept); returns the reduced fp32 loss (or per-row losses ``[N]`` for ``reduction='none'``)."""
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.meta = (ignore_index, reduction, chunk_size, chunk_fn, need_h, need_w)
        ctx.weight_dtype = weight.dtype
        acc = acc_dtype(hidden.dtype)
        if reduction == "none":
            ctx.save_for_backward(hidden, weight, labels)
            loss = run_chunks(hidden, weight, labels, ignore_index, chunk_size, chunk_fn,
                              None, None, None)
            return loss
        gh = _new_grad_hidden(hidden) if need_h else None
        gw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        scale = _row_scale(labels, ignore_index, reduction, acc)
        loss = run_chunks(hidden, weight, labels, ignore_index, chunk_size, chunk_fn, scale, gh, gw)
        ctx.grads = [gh, gw]
        return reduce_loss(loss, labels, ignore_index, reduction)

    @staticmethod
    def backward(ctx, grad_out):
        """Scale the gradients computed in forward by ``grad_out`` (or recompute them chunk by chunk
        for ``reduction='none'``); returns grads for ``hidden`` and ``weight`` only."""
        ignore_index, reduction, chunk_size, chunk_fn, need_h, need_w = ctx.meta
        if reduction == "none":
            hidden, weight, labels = ctx.saved_tensors
            gh = _new_grad_hidden(hidden) if need_h else None
            gw = torch.zeros(weight.shape, dtype=acc_dtype(hidden.dtype),
                             device=weight.device) if need_w else None
            run_chunks(hidden, weight, labels, ignore_index, chunk_size, chunk_fn,
                       grad_out.to(acc_dtype(hidden.dtype)), gh, gw)
            return gh, None if gw is None else gw.to(weight.dtype), None, None, None, None, None
        gh, gw = ctx.grads  # kept intact, so retain_graph=True / gradcheck work
        # always scale: testing grad_out == 1 to skip it would cost a host sync every step
        if gh is not None:
            gh = gh * grad_out
        if gw is not None:
            gw = (gw * grad_out).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None, None
