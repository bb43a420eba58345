"""``torch.profiler`` trace of a window of optimizer steps (the ``profile`` config section).

The window follows ``torch.profiler.schedule(wait, warmup, active, repeat=1)`` (skip ``skip_first``
steps first): nothing is recorded for ``wait`` steps, the profiler runs but discards ``warmup``
steps, then records ``active`` steps and writes one Chrome trace JSON per rank with
``torch.profiler.tensorboard_trace_handler`` into ``run_dir/<profile.dir>`` as
``rank<R>.<timestamp>.pt.trace.json``. Open it in ``chrome://tracing`` / https://ui.perfetto.dev, or
in TensorBoard with the ``torch-tb-profiler`` plugin.
"""
from __future__ import annotations

import os

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


class StepProfiler:
    """Start/step/stop wrapper that does nothing when profiling is off.

    Args:
        cfg: a :class:`trainer.config.ProfileConfig`.
        run_dir: the run folder; traces go to ``run_dir/cfg.dir`` (or ``cfg.dir`` if absolute).
        rank: this process's rank (names the trace file).
        device: CUDA activity is recorded too when it is a CUDA device.
    """

    def __init__(self, cfg, run_dir: str, rank: int, device: torch.device):
        self.enabled = cfg.enabled
        self.dir = os.path.join(run_dir, cfg.dir)
        self._prof = None
        if not self.enabled:
            return
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        self._prof = profile(
            activities=activities,
            schedule=schedule(skip_first=cfg.skip_first, wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                              repeat=1),
            on_trace_ready=tensorboard_trace_handler(self.dir, worker_name=f"rank{rank}"),
            record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory, with_stack=cfg.with_stack)

    def start(self) -> None:
        """Start the profiler (no-op when ``profile.enabled`` is false)."""
        if self._prof is not None:
            self._prof.start()

    def step(self) -> None:
        """Call once after each optimizer step (moves the profiler's schedule on)."""
        if self._prof is not None:
            self._prof.step()

    def stop(self) -> None:
        """Stop; a window cut short by the end of the run is still written."""
        if self._prof is not None:
            self._prof.stop()
            self._prof = None

    def traces(self) -> list[str]:
        """Paths of the trace files written so far."""
        if not os.path.isdir(self.dir):
            return []
        return sorted(os.path.join(self.dir, n) for n in os.listdir(self.dir) if n.endswith(".pt.trace.json"))
