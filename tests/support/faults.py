"""Faults injected into a training run through its step hooks (``hooks:``, :mod:`trainer.run.hooks`):
a NaN or a loss spike in the forward pass, a SIGKILL before a step; and a hook that records its calls.

``fault_hooks(nan_at_steps=[3], rank=1, layer="blocks.1.mlp")`` is the ``hooks=...`` override that
installs :class:`FaultInjector`; ``python -m trainer replay`` re-creates it from the run's config.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainer.run.hooks import BaseStepHook, HookContext

FAULT_INJECTOR = "tests.support.faults:FaultInjector"
CALL_RECORDER = "tests.support.faults:CallRecorder"


@contextlib.contextmanager
def injected(model: torch.nn.Module, layer: str, value: float | None):
    """While inside, multiply the forward output of module ``layer`` of ``model`` by ``value``
    (``layer=""``: the model itself, whose output is the loss; a DDP wrapper is looked through).
    Nothing happens when ``value`` is ``None``.

    Raises:
        ValueError: ``model`` has no module named ``layer``.
    """
    if value is None:
        yield
        return
    base = model.module if isinstance(model, DistributedDataParallel) else model
    try:
        module = base.get_submodule(layer)
    except AttributeError as e:
        raise ValueError(f"fault layer={layer!r}: no such module ({e}); use a name from model.named_modules(), "
                         "e.g. blocks.0.mlp") from None
    handle = module.register_forward_hook(lambda _m, _inputs, out: out * value)
    try:
        yield
    finally:
        handle.remove()


class FaultInjector(BaseStepHook):
    """Multiplies the forward output of ``layer`` (``""``: the loss) of the first micro-batch by NaN
    at ``nan_at_steps`` or by ``spike_factor`` at ``spike_at_steps`` (each step once per process, so
    steps re-trained after a rollback run clean), and SIGKILLs the process before ``kill_at_step``
    on the first attempt only (``TORCHELASTIC_RESTART_COUNT`` unset or 0; logs ``injected_kill``
    in ``events.jsonl`` first). Only on ``rank`` (-1: every rank); steps are 1-based.
    """

    def __init__(self, context: HookContext, nan_at_steps: list = (), spike_at_steps: list = (),
                 spike_factor: float = 1000.0, kill_at_step: int = 0, rank: int = -1, layer: str = ""):
        super().__init__(context)
        self.nan_at_steps, self.spike_at_steps = set(nan_at_steps), set(spike_at_steps)
        self.spike_factor, self.kill_at_step, self.rank, self.layer = spike_factor, kill_at_step, rank, layer
        self.done: dict[tuple[int, int], str] = {}  # (step, rank) -> what was injected

    def _mine(self, rank: int) -> bool:
        return self.rank in (-1, rank)

    def before_step(self, step: int, rank: int) -> None:
        """SIGKILL before ``kill_at_step`` (first attempt only)."""
        if (step == self.kill_at_step and self._mine(rank)
                and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"):
            self.context.events.write({"event": "injected_kill", "step": step, "rank": rank, "time": time.time()})
            os.kill(os.getpid(), signal.SIGKILL)

    def forward(self, model: torch.nn.Module, step: int, micro_batch: int, rank: int):
        """Multiply ``layer``'s output of micro-batch 0 at a NaN or spike step, once per step."""
        value, what = None, None
        if micro_batch == 0 and self._mine(rank) and (step, rank) not in self.done:
            where = self.layer or "the loss"
            if step in self.nan_at_steps:
                value, what = float("nan"), f"NaN x output of {where} (nan_at_steps)"
            elif step in self.spike_at_steps:
                value, what = self.spike_factor, f"{self.spike_factor:g} x output of {where} (spike_at_steps)"
        if what is not None:
            self.done[step, rank] = what
        return injected(model, self.layer, value)

    def describe(self, step: int, rank: int) -> str | None:
        """What :meth:`forward` injected at ``step`` on ``rank``, or ``None``."""
        return self.done.get((step, rank))


def _process_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


class CallRecorder(BaseStepHook):
    """Logs every call to ``events.jsonl``: ``hook_before_step`` (``step``, ``rank``) and
    ``hook_forward`` (``step``, ``micro_batch``, ``rank``, ``model``: the model's class name,
    ``forward_calls``: how many times the model's forward ran inside the context); each with
    ``process_rank``, the rank of the process that made the call."""

    def before_step(self, step: int, rank: int) -> None:
        """Log ``hook_before_step``."""
        self.context.events.write({"event": "hook_before_step", "step": step, "rank": rank,
                                   "process_rank": _process_rank()})

    @contextlib.contextmanager
    def forward(self, model: torch.nn.Module, step: int, micro_batch: int, rank: int):
        """Count the model's forward calls inside; log ``hook_forward`` on leaving."""
        calls = [0]
        handle = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        try:
            yield
        finally:
            handle.remove()
        self.context.events.write({"event": "hook_forward", "step": step, "micro_batch": micro_batch, "rank": rank,
                                   "process_rank": _process_rank(), "model": type(model).__name__,
                                   "forward_calls": calls[0]})


def fault_hooks(**args) -> str:
    """The ``hooks=[...]`` override installing :class:`FaultInjector` with ``args``."""
    return "hooks=" + json.dumps([{"target": FAULT_INJECTOR, "args": args}])


def fault_hook(**args) -> dict:
    """A ``hooks`` entry of :class:`FaultInjector` with ``args`` (for a ``TrainConfig(hooks=[...])``)."""
    return {"target": FAULT_INJECTOR, "args": args}
