"""Step hooks: code named in the config (``hooks:``) that the training step calls on every rank."""
from __future__ import annotations

import contextlib
import importlib
import inspect
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from colaflow.config import ConfigError, from_dict
from trainer.run.events import EventLog

if TYPE_CHECKING:
    import torch


@runtime_checkable
class StepHook(Protocol):
    """What the training step calls; every method is called on every rank."""

    def before_step(self, step: int, rank: int) -> None:
        """Before optimizer step ``step`` (1-based) runs on ``rank``, its micro-batches already loaded."""

    def forward(self, model: "torch.nn.Module", step: int, micro_batch: int, rank: int) -> AbstractContextManager:
        """A context manager entered around the forward pass of micro-batch ``micro_batch`` (0-based)
        of step ``step`` on ``rank``. ``model`` is the model as it trains (DDP-wrapped at ZeRO
        stages 0/1, the FSDP2-sharded GPT at 2/3; the bare GPT under ``python -m trainer replay``)."""

    def describe(self, step: int, rank: int) -> str | None:
        """One line on what the hook did to the model at ``step`` on ``rank``, or ``None``
        (``python -m trainer replay`` prints it)."""


@dataclass
class HookContext:
    """What a hook is built with: the run it belongs to.

    Attributes:
        run_dir: the run folder.
        events: the run's ``events.jsonl`` (a hook may log what it did there).
    """

    run_dir: str
    events: EventLog


class BaseStepHook:
    """A :class:`StepHook` that does nothing: subclass it and override what the hook needs.

    Args:
        context: the run the hook belongs to (kept as ``self.context``).
    """

    def __init__(self, context: HookContext):
        self.context = context

    def before_step(self, step: int, rank: int) -> None:
        """Nothing."""

    def forward(self, model: "torch.nn.Module", step: int, micro_batch: int, rank: int) -> AbstractContextManager:
        """An empty context."""
        return contextlib.nullcontext()

    def describe(self, step: int, rank: int) -> str | None:
        """``None``: nothing done."""
        return None


@dataclass
class HookSpec:
    """One entry of ``hooks:``.

    Attributes:
        target: ``package.module:Class``, a class implementing :class:`StepHook`, built as
            ``Class(context, **args)`` with a :class:`HookContext`.
        args: keyword arguments of the class.
    """

    target: str = ""
    args: Any = field(default_factory=dict)  # a mapping: _resolve says so naming the class (not from_dict)


class ResolvedHook(NamedTuple):
    """A checked ``hooks:`` entry: its spec and the class it names."""

    spec: HookSpec
    cls: type


def _resolve(entry, index: int) -> ResolvedHook:
    where = f"hooks[{index}]"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: expected a mapping {{target: 'package.module:Class', args: {{...}}}}, "
                          f"got {entry!r}")
    spec = from_dict(HookSpec, entry, f"{where}.")
    module_name, _, name = spec.target.partition(":")
    if not module_name or not name:
        raise ConfigError(f"{where}: target={spec.target!r}: use 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - importing user code may fail in any way; the entry is named
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise ConfigError(f"{where}: target={spec.target!r}: cannot import {module_name} ({reason})") from None
    cls = vars(module).get(name)
    if cls is None:
        raise ConfigError(f"{where}: target={spec.target!r}: module {module_name} has no {name!r}")
    if not (inspect.isclass(cls) and issubclass(cls, StepHook)):
        raise ConfigError(f"{where}: target={spec.target!r} is not a step hook class (needs before_step, forward "
                          "and describe; subclass trainer.run.hooks.BaseStepHook)")
    if not isinstance(spec.args, dict):
        raise ConfigError(f"{where}.args: expected a mapping of {name}'s keyword arguments, got {spec.args!r}")
    try:
        inspect.signature(cls).bind(None, **spec.args)
    except TypeError as e:
        raise ConfigError(f"{where}: target={spec.target!r} does not take args {spec.args}: {e}") from None
    return ResolvedHook(spec, cls)


def parse_hooks(entries: list) -> list[ResolvedHook]:
    """``hooks:`` (a list of ``{"target": "package.module:Class", "args": {...}}``) checked: each
    class imported, implementing :class:`StepHook`, accepting its ``args``.

    Raises:
        ConfigError: one line naming the entry (``hooks[i]``) and what is wrong with it.
    """
    if not isinstance(entries, list):
        raise ConfigError(f"hooks: expected a list of mappings {{target: 'package.module:Class', args: {{...}}}}, "
                          f"got {entries!r}")
    return [_resolve(entry, i) for i, entry in enumerate(entries)]


class StepHooks:
    """The run's hooks, called in config order.

    Args:
        hooks: ``(target, hook)`` pairs.
    """

    def __init__(self, hooks: list[tuple[str, StepHook]]):
        self.hooks = hooks

    @classmethod
    def build(cls, entries: list, context: HookContext) -> "StepHooks":
        """Build every entry of ``hooks:`` with ``context``.

        Raises:
            ConfigError: a bad entry (see :func:`parse_hooks`).
        """
        return cls([(r.spec.target, r.cls(context, **r.spec.args)) for r in parse_hooks(entries)])

    def before_step(self, step: int, rank: int) -> None:
        """Each hook's :meth:`StepHook.before_step`."""
        for _, hook in self.hooks:
            hook.before_step(step, rank)

    def forward(self, model: "torch.nn.Module", step: int, micro_batch: int, rank: int) -> AbstractContextManager:
        """Each hook's :meth:`StepHook.forward` context, entered in config order."""
        if not self.hooks:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        with stack:
            for _, hook in self.hooks:
                stack.enter_context(hook.forward(model, step, micro_batch, rank))
            return stack.pop_all()

    def describe(self, step: int, rank: int) -> str | None:
        """``target: what it did`` of every hook that reports something at ``step`` on ``rank``
        (``"; "``-separated), or ``None``."""
        said = [f"{target}: {text}" for target, hook in self.hooks if (text := hook.describe(step, rank))]
        return "; ".join(said) or None


NO_HOOKS = StepHooks([])
