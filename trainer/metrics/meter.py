"""One log interval's metrics from all ranks (loss, throughput, MFU, step-time split, memory, cache,
padding), gathered with one ``all_gather`` at the log step: the interval's only metrics collective
and host sync.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from loaders.protocols import RankLoader, ShardSource
from trainer.metrics.hardware import rss_bytes
from trainer.metrics.timing import StepTimer

# Per-rank values gathered at a log step; "sum" columns are added over ranks, "max" ones maxed.
SUM_FIELDS = ("loss_sum", "tokens", "cache_hits", "cache_misses", "cache_stall_s", "doc_tokens", "slots")
MAX_FIELDS = ("data_wait_s", "comm_s", "forward_backward_s", "optimizer_s", "memory_bytes", "queue_depth")
PHASES = ("data_wait", "comm", "forward_backward", "optimizer")


def memory_bytes(device: torch.device) -> tuple[int, str]:
    """``(bytes, kind)``: the CUDA caching allocator's peak allocated bytes since the last call
    (``kind="cuda_max_allocated"``; the peak is reset) on GPU, else this process's resident set size
    (:func:`trainer.metrics.hardware.rss_bytes`)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return int(peak), "cuda_max_allocated"
    return rss_bytes()


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _cache_counts(cache: ShardSource) -> tuple[float, float, float]:
    m = cache.metrics()
    return float(m.get("hits", 0)), float(m.get("misses", 0)), float(m.get("stall_seconds", 0.0))


def _loader_counts(loader: RankLoader) -> tuple[float, float, float, float]:
    totals = loader.totals
    return (float(totals.get("doc_tokens", 0)), float(totals.get("slots", 0)),
            float(totals.get("queue_depth_sum", 0)), float(totals.get("queue_samples", 0)))


class IntervalMeter:
    """Builds the record of each log interval (see :meth:`collect` for its fields).

    Args:
        device: this rank's device (CUDA events and memory there; host clock and RSS on CPU).
        world_size: ranks in the job.
        flops_per_token: training FLOPs per token (:func:`trainer.metrics.mfu.flops_per_token`).
        peak_flops: peak FLOP/s of one device, or ``None`` (then ``mfu`` is ``None``).
        cache: this rank's shard source; its ``metrics()`` give ``hits``/``misses``/``stall_seconds``
            (missing counters count 0: local shards have none).
        loader: this rank's loader; its ``totals`` give ``doc_tokens``/``slots``/``queue_depth_*``.
        layer_stats: a :class:`~trainer.metrics.model_stats.LayerStats` whose values ride
            along in the same all-gather (record field ``layers``), or ``None``.
        hardware: a :class:`~trainer.metrics.hardware.HardwareMonitor` sampled at each
            collect (its ``hw_*`` fields; this rank's), or ``None``.
    """

    def __init__(self, device: torch.device, world_size: int, flops_per_token: float,
                 peak_flops: float | None, cache: ShardSource, loader: RankLoader, layer_stats=None, hardware=None):
        self.device, self.world_size = device, world_size
        self.layer_stats = layer_stats if layer_stats is not None and layer_stats.enabled else None
        self.hardware = hardware
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.cache, self.loader = cache, loader
        self.timer = StepTimer(device)
        self.memory_kind = "rss"
        self._steps = 0
        self._t = time.perf_counter()
        self._cache_prev = _cache_counts(cache)
        self._loader_prev = _loader_counts(loader)

    def _local_vector(self, loss_sum: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self._steps = self.timer.steps
        phases = self.timer.collect()
        cache_now, loader_now = _cache_counts(self.cache), _loader_counts(self.loader)
        cache_d = [a - b for a, b in zip(cache_now, self._cache_prev)]
        loader_d = [a - b for a, b in zip(loader_now, self._loader_prev)]
        self._cache_prev, self._loader_prev = cache_now, loader_now
        mem, self.memory_kind = memory_bytes(self.device)
        times = [phases.get(name, 0.0) for name in PHASES]
        depth = loader_d[2] / loader_d[3] if loader_d[3] else -1.0  # -1: not measured (worker processes)
        host = cache_d + loader_d[:2] + times + [float(mem), depth]
        return torch.cat([loss_sum.detach().reshape(1).double(), tokens.detach().reshape(1).double(),
                          torch.tensor(host, dtype=torch.float64, device=loss_sum.device)])

    def collect(self, step: int, epoch: int, lr: float, loss_sum: torch.Tensor, tokens: torch.Tensor,
                grad_norm: torch.Tensor | float, skipped_steps: int = 0) -> dict:
        """Gather the interval ending at optimizer step ``step`` from all ranks (a collective).

        Args:
            loss_sum: 0-d device tensor, this rank's summed token loss (nats) of the interval.
            tokens: 0-d device tensor, this rank's real (labelled) tokens of the interval.
            grad_norm: pre-clip global gradient norm of the last step.
            skipped_steps: optimizer steps skipped so far (anomalies), reported as is.

        Returns a dict of JSON values: ``step``, ``epoch``, ``lr``, ``world_size``; ``loss``
        (nats/token of the steps applied; ``None`` when every step of the interval was skipped);
        ``grad_norm`` (last step's; ``None`` when not finite: the anomaly guard's events.jsonl has
        the details); ``steps`` (optimizer steps run in the interval, skipped and rolled-back ones
        included), ``tokens`` (all ranks), ``interval_s``, ``step_time_s`` (wall s per step),
        ``tokens_per_second`` (all ranks); ``flops_per_token``, ``model_flops_per_second`` (per
        device), ``mfu`` (fraction; ``None`` when the peak is unknown); ``data_wait_s``,
        ``comm_s``, ``forward_backward_s``, ``optimizer_s`` (rank 0, summed over the interval's
        steps; :mod:`trainer.metrics.timing` says what each phase holds) and their ``*_max_s``
        over ranks, ``data_wait_share`` (rank 0's ``data_wait_s / interval_s``);
        ``data_queue_depth`` (rank 0's mean count of batches ready in the loader's prefetch queue
        when the trainer asked for one; 0 = the trainer waited; ``None`` with
        ``data.num_workers > 0``, whose queue is inside ``DataLoader``);
        ``memory_bytes`` (rank 0), ``memory_max_bytes`` (all ranks), ``memory_kind``;
        ``cache_hits``/``cache_misses`` (interval, all ranks), ``cache_hit_rate`` (``None``
        without lookups), ``cache_stall_s`` (interval, all ranks); ``padding_efficiency``
        (document tokens / slots of the interval's batches, all ranks; ``None`` without batches);
        ``skipped_steps`` (cumulative); ``layers`` (with ``layer_stats``: per-block statistics of
        the interval's last step, all ranks) and ``hw_*`` (with ``hardware``: this rank's).
        """
        local = self._local_vector(loss_sum, tokens)
        width = local.numel()
        if self.layer_stats is not None:
            local = torch.cat([local, self.layer_stats.local_vector().to(local.device)])
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            parts = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(parts, local)
            gathered = torch.stack(parts).cpu()
        else:
            gathered = local[None].cpu()
        ranks = gathered[:, :width].tolist()
        extra = {}
        if self.layer_stats is not None:
            extra["layers"] = self.layer_stats.reduce(gathered[:, width:])
        if self.hardware is not None:
            extra.update(self.hardware.sample())
        now = time.perf_counter()
        interval, self._t = max(now - self._t, 1e-9), now
        steps = self._steps
        n = len(SUM_FIELDS)
        total = {k: sum(r[i] for r in ranks) for i, k in enumerate(SUM_FIELDS)}
        rank0 = dict(zip(MAX_FIELDS, ranks[0][n:]))
        worst = {k: max(r[n + i] for r in ranks) for i, k in enumerate(MAX_FIELDS)}
        tok = int(total["tokens"])
        flops_per_s = tok * self.flops_per_token / interval / self.world_size
        lookups = total["cache_hits"] + total["cache_misses"]
        return {
            "step": step, "epoch": epoch, "lr": lr, "world_size": self.world_size,
            "loss": total["loss_sum"] / total["tokens"] if total["tokens"] else None,
            "grad_norm": _finite_or_none(float(grad_norm)),
            "steps": steps, "tokens": tok, "interval_s": interval, "step_time_s": interval / max(steps, 1),
            "tokens_per_second": tok / interval,
            "flops_per_token": self.flops_per_token, "model_flops_per_second": flops_per_s,
            "mfu": flops_per_s / self.peak_flops if self.peak_flops else None,
            "data_wait_s": rank0["data_wait_s"], "forward_backward_s": rank0["forward_backward_s"],
            "optimizer_s": rank0["optimizer_s"], "comm_s": rank0["comm_s"], "comm_max_s": worst["comm_s"],
            "data_queue_depth": rank0["queue_depth"] if rank0["queue_depth"] >= 0 else None,
            "data_wait_max_s": worst["data_wait_s"],
            "forward_backward_max_s": worst["forward_backward_s"], "optimizer_max_s": worst["optimizer_s"],
            "data_wait_share": min(rank0["data_wait_s"] / interval, 1.0),
            "memory_bytes": int(rank0["memory_bytes"]), "memory_max_bytes": int(worst["memory_bytes"]),
            "memory_kind": self.memory_kind,
            "cache_hits": int(total["cache_hits"]), "cache_misses": int(total["cache_misses"]),
            "cache_hit_rate": total["cache_hits"] / lookups if lookups else None,
            "cache_stall_s": total["cache_stall_s"],
            "padding_efficiency": total["doc_tokens"] / total["slots"] if total["slots"] else None,
            "skipped_steps": int(skipped_steps),
            **extra,
        }
