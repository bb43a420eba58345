"""Per-phase step time without host syncs in the loop.

Phases: ``data_wait`` (host blocked in the loader), ``comm`` (the collectives the loop issues
itself: the step's token-count all-reduce, the gradient-norm all-reduce of clipping under FSDP and
the anomaly guard's all-reduce with its host read), ``forward_backward`` (which also holds the
gradient all-reduce / reduce-scatter that DDP and FSDP overlap with backward) and ``optimizer``.

On CPU the work is synchronous, so ``time.perf_counter`` between marks is the phase time. On CUDA
the compute phases are timed with CUDA events on the current stream (no sync), read only in
:meth:`StepTimer.collect` at log steps. ``data_wait`` is always host time.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch

HOST_PHASES = frozenset({"data_wait"})


class StepTimer:
    """Sums the seconds spent in named phases between :meth:`collect` calls.

    Use ``start()`` at the top of a step, then ``mark(name)`` at the end of each phase: the time
    since the previous mark (or start) is added to ``name``.
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self._totals: dict[str, float] = defaultdict(float)
        self._pending: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._t = time.perf_counter()
        self._event = None
        self.steps = 0  # start() calls since the last collect()

    def _record(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def start(self) -> None:
        """Begin a step (host clock now; a CUDA event on the current stream when on GPU)."""
        self.steps += 1
        self._t = time.perf_counter()
        if self.cuda:
            self._event = self._record()

    def mark(self, name: str) -> None:
        """End phase ``name`` here. Host-timed for ``data_wait`` and on CPU, CUDA-event-timed otherwise."""
        now = time.perf_counter()
        if self.cuda:
            event = self._record()
            if name not in HOST_PHASES:
                self._pending.append((name, self._event, event))
            self._event = event
        if not self.cuda or name in HOST_PHASES:
            self._totals[name] += now - self._t
        self._t = now

    def collect(self) -> dict[str, float]:
        """Seconds per phase since the previous call (waits for the pending CUDA events), then reset
        (``steps`` too: read it before calling)."""
        for name, begin, end in self._pending:
            end.synchronize()
            self._totals[name] += begin.elapsed_time(end) / 1000.0
        out = dict(self._totals)
        self._totals.clear()
        self._pending.clear()
        self.steps = 0
        return out
