"""The one command line of colaflow: ``colaflow COMMAND [ARGS ...]``; ``colaflow COMMAND --help`` shows
a command's own options (and its sub-commands, e.g. ``colaflow shards verify --help``).

Exit codes: 0 done, 1 runtime/data error, 2 usage/config error, 130 interrupted (Ctrl-C), 143
terminated (SIGTERM; preprocess). The python -m forms are aliases, with the same options, output and
exit codes: ``python beam_runner.py`` (preprocess), ``python -m shards|cache|loaders``,
``python -m trainer [verify|export|report|replay]`` (what ``torchrun ... -m trainer`` starts on each
rank), ``python -m trainer.report.dashboard`` and ``python -m examples.demo``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Protocol

from colaflow.errors import RUNTIME, guard
from colaflow.wording import help_text

PROG = "colaflow"


class ToolMain(Protocol):
    """The ``main`` of a tool's module, which a command runs."""

    def __call__(self, argv: list[str] | None = None, prog: str = ...) -> int:
        """Run the tool on ``argv`` (the words after the command name) with ``prog`` as the command
        line its usage and errors show; returns the exit code."""


@dataclass(frozen=True)
class Command:
    """One ``colaflow`` command: a tool's ``main``, imported only when the command runs (``colaflow
    --help`` imports neither torch nor Beam).

    Attributes:
        name: the word after ``colaflow``.
        summary: its line in ``colaflow --help``.
        module: the module whose ``main`` (a :class:`ToolMain`) runs it.
        by_name: the tool dispatches on its first word, which is this command's name (the trainer's
            ``verify``, ``export``, ``report``, ``replay``): ``argv`` starts with ``name`` and ``prog``
            is ``colaflow``, to which the tool adds the name.
    """

    name: str
    summary: str
    module: str
    by_name: bool = False

    def run(self, argv: list[str]) -> int:
        """Run the command on ``argv`` (the words after its name); returns its exit code, or 1 after
        one line when this install lacks the command's package (``examples/`` outside a source checkout)."""
        try:
            tool = importlib.import_module(self.module)
        except ModuleNotFoundError as e:
            if e.name != self.module.split(".")[0]:
                raise
            print(f"error: {PROG} {self.name} runs from a source checkout of colaflow ({e.name}/ is not "
                  "installed here): clone the repository and run make install there", file=sys.stderr)
            return RUNTIME
        main: ToolMain = tool.main
        if self.by_name:
            return main([self.name, *argv], prog=PROG)
        return main(argv, prog=f"{PROG} {self.name}")


COMMANDS = {c.name: c for c in (  # each summary fits one line of an 80-column --help
    Command("preprocess", "text/JSONL/Parquet/WARC -> tokenised shards (Beam)", "beam_runner"),
    Command("shards", "list, inspect, verify, index, reshard, extract shards", "shards.tools.cli"),
    Command("cache", "the node cache: status, warm, evict, verify, tune...", "cache.tools.cli"),
    Command("loaders", "sample keys per rank (keys), loader speed (bench)", "loaders.tools.cli"),
    Command("train", "train on shards (--nproc-per-node N: local ranks)", "trainer.__main__"),
    Command("verify", "verify a checkpoint offline (checksums, forward pass)", "trainer.__main__", True),
    Command("export", "export a checkpoint as verified ONNX, .pt or HF models", "trainer.__main__", True),
    Command("report", "HTML report with plots of a training run", "trainer.__main__", True),
    Command("replay", "re-run a bad step, name the first module gone bad", "trainer.__main__", True),
    Command("dashboard", "Grafana dashboard JSON, or a preview of run metrics", "trainer.report.dashboard"),
    Command("demo", "the make demo run, end to end (a source checkout)", "examples.demo.run"),
)}


def build_parser() -> argparse.ArgumentParser:
    """The ``colaflow`` parser, whose ``--help`` lists :data:`COMMANDS` one line each. It reads only
    the command name; the words after it are the command's own."""
    parser = argparse.ArgumentParser(prog=PROG, description=help_text(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, title="commands")
    for command in COMMANDS.values():
        sub.add_parser(command.name, help=command.summary, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``colaflow ARGV`` (``sys.argv[1:]`` when ``None``; the console script): run the command named
    first through :func:`colaflow.errors.guard` (Ctrl-C 130, a closed pipe quiet); returns its exit code.

    Raises:
        SystemExit: 0 after ``--help``; 2 (argparse's usage error) when no known command comes first.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in COMMANDS:
        name, rest = argv[0], argv[1:]
    else:
        name, rest = build_parser().parse_args(argv).command, []  # only ``colaflow -- NAME`` gets here
    return guard(lambda: COMMANDS[name].run(rest))
