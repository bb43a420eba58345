"""Per-layer model statistics on logged steps: gradient norm, update-to-weight ratio, activation RMS/max.

Only a sample of transformer blocks is watched (``metrics.layer_stats``: first and last by
default), and only on logged steps (:meth:`LayerStats.arm` puts forward hooks on them for that one
step); every statistic stays in a device tensor until the log step's all-gather.

Sharding: under FSDP2 (ZeRO 2/3) parameters and gradients are ``DTensor`` shards, so each rank
sums the squares of its local shard and the ranks' sums are added. Under DDP (ZeRO 0/1) every
rank holds the full, identical tensors, so each rank contributes ``1/world_size`` of its sum and
the total is the same exact value. Activations differ per rank (different data): their squared
sums and element counts are added and their maxima maxed over ranks.

The update-to-weight ratio ``||W_after - W_before|| / ||W_before||`` per block is the quantity
Karpathy's "A Recipe for Training Neural Networks" (2019) suggests watching (about 1e-3 is healthy).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from trainer.model import GPT

STATS = ("grad_norm", "update_ratio", "act_rms", "act_max")


def _local(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``(local tensor, sharded)``: the local shard of a ``DTensor``, or the tensor itself."""
    return (t.to_local(), True) if isinstance(t, DTensor) else (t, False)


def sample_blocks(n_blocks: int, n: int) -> list[int]:
    """Indices of ``n`` blocks spread evenly from the first to the last (all for ``n`` = -1 or ``>= n_blocks``)."""
    if n < 0 or n >= n_blocks:
        return list(range(n_blocks))
    if n == 0:
        return []
    if n == 1:
        return [n_blocks - 1]
    return sorted({round(i * (n_blocks - 1) / (n - 1)) for i in range(n)})


class LayerStats:
    """Statistics of the sampled blocks of ``model.blocks`` for one step per log interval.

    Args:
        model: the bare model (``GPT``; the same module objects the wrapped model runs).
        n_layers: blocks to watch (``metrics.layer_stats``: 0 off, -1 all).
        device: where the accumulators live.
        world_size: ranks in the job.

    Call :meth:`arm` before the step to be measured, :meth:`before_step` after backward (before
    clipping: the gradient norms are pre-clip), :meth:`after_step` after ``optimizer.step()``, and
    :meth:`collect` (or the meter's collect) at the log step on every rank (collective).
    """

    def __init__(self, model: GPT, n_layers: int, device: torch.device, world_size: int = 1):
        self.names = [f"blocks.{i}" for i in sample_blocks(len(model.blocks), n_layers)]
        self.modules = [model.get_submodule(n) for n in self.names]
        self.device, self.world_size = device, world_size
        k = len(self.names)
        # per layer: [grad_sumsq, dw_sumsq, w_sumsq, act_sumsq, act_count] (added over ranks), act_max (maxed)
        self._sums = torch.zeros(k, 5, dtype=torch.float64, device=device)
        self._max = torch.zeros(k, dtype=torch.float64, device=device)
        self._hooks: list = []
        self._before: list[list[torch.Tensor]] | None = None
        self.armed = False

    @property
    def enabled(self) -> bool:
        """Whether any block is watched (``metrics.layer_stats`` != 0 and the model has blocks)."""
        return bool(self.names)

    def arm(self) -> None:
        """Measure the next step: forward hooks on the sampled blocks (removed by :meth:`collect`)."""
        if not self.enabled or self.armed:
            return
        self.armed = True
        for i, module in enumerate(self.modules):
            self._hooks.append(module.register_forward_hook(self._activation_hook(i)))

    def _activation_hook(self, i: int):
        def hook(_module, _inputs, output):
            out = output.detach()
            out = out.to_local() if isinstance(out, DTensor) else out
            self._sums[i, 3] += out.double().square().sum()
            self._sums[i, 4] += out.numel()
            self._max[i] = torch.maximum(self._max[i], out.abs().max().double())
        return hook

    def _sumsq(self, tensors) -> torch.Tensor:
        """Squared L2 norm of ``tensors`` on this rank's share: a DTensor's local shard counts fully
        (the shards are added over ranks), a replicated tensor by ``1/world_size``."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for t in tensors:
            local, sharded = _local(t.detach())
            part = local.double().square().sum()
            total += part if sharded else part / self.world_size
        return total

    def before_step(self) -> None:
        """Record the sampled blocks' gradient and weight squared norms and keep a copy of their
        weights (armed steps only)."""
        if not self.armed:
            return
        self._before = []
        for i, module in enumerate(self.modules):
            params = list(module.parameters())
            self._sums[i, 0] += self._sumsq(p.grad for p in params if p.grad is not None)
            self._sums[i, 2] += self._sumsq(params)
            self._before.append([_local(p.detach())[0].clone() for p in params])

    def after_step(self) -> None:
        """Squared norm of the update (armed steps only; 0 for a skipped step)."""
        if not self.armed or self._before is None:
            return
        for i, module in enumerate(self.modules):
            dw = torch.zeros((), dtype=torch.float64, device=self.device)
            for p, old in zip(module.parameters(), self._before[i]):
                local, sharded = _local(p.detach())
                part = (local - old).double().square().sum()
                dw += part if sharded else part / self.world_size
            self._sums[i, 1] += dw
        self._before = None

    def local_vector(self) -> torch.Tensor:
        """This rank's accumulators as one float64 device vector (``6 x layers`` values) for the log
        step's all-gather; removes the hooks. :meth:`reduce` turns all ranks' vectors into values."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        return torch.cat([self._sums.flatten(), self._max])

    def reduce(self, ranks: torch.Tensor) -> dict[str, dict[str, float | None]]:
        """``{block name: {grad_norm, update_ratio, act_rms, act_max}}`` from all ranks'
        :meth:`local_vector` s (``ranks``: [world_size, 6 x layers]); resets and disarms. Values are
        ``None`` when not measured (no armed step since the last call) or not finite (the anomaly
        guard has the details)."""
        k = len(self.names)
        measured, self.armed = self.armed, False
        sums = ranks[:, :5 * k].sum(0).view(k, 5).tolist()
        maxes = ranks[:, 5 * k:].max(0).values.tolist()
        self._sums.zero_()
        self._max.zero_()
        out = {}
        for name, (g2, dw2, w2, a2, n), amax in zip(self.names, sums, maxes):
            values = {"grad_norm": math.sqrt(g2) if measured else None,
                      "update_ratio": math.sqrt(dw2 / w2) if measured and w2 > 0 else None,
                      "act_rms": math.sqrt(a2 / n) if measured and n > 0 else None,
                      "act_max": amax if measured and n > 0 else None}
            out[name] = {key: (v if v is None or math.isfinite(v) else None) for key, v in values.items()}
        return out

    def collect(self) -> dict[str, dict[str, float | None]]:
        """:meth:`local_vector` of every rank (an ``all_gather`` when distributed), :meth:`reduce` d.
        The trainer does not call this: :class:`trainer.metrics.meter.IntervalMeter` folds
        the vector into its own all-gather."""
        if not self.enabled:
            return {}
        local = self.local_vector()
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            parts = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(parts, local)
            return self.reduce(torch.stack(parts).cpu())
        return self.reduce(local[None].cpu())
