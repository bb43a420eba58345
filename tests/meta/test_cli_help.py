"""Every command line of the project answers ``--help`` with exit 0 and its usage: each ``colaflow
COMMAND`` (and each of its own sub-commands), and the ``python -m`` aliases and scripts.

The commands run in this process (``colaflow.cli.main``, or ``runpy`` with ``sys.argv`` patched), so
the whole check takes seconds; a benchmark whose help text breaks argparse (a bare ``%`` in it) fails
here, not in a new user's terminal. Subcommands are found in each parser's ``{a,b,c}`` usage line.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import os
import runpy
import subprocess
import sys
import warnings

import pytest
from colaflow.cli import COMMANDS, main as colaflow_main
from tests.support.paths import REPO

ROOT = REPO
BENCHMARKS = ROOT / "benchmarks"

# ``python -m MODULE`` command lines; a package runs its __main__.py
MODULES = ["shards", "cache", "loaders", "trainer", "examples.demo.corpus", "pipelines.runners.worker_boot", "examples.demo.imageset",
           "examples.demo", "trainer.vision.train", "trainer.kernels.compile_check",
           "trainer.report.dashboard", "trainer.report.render",
           "examples.plain_loop", "examples.hf_trainer", "examples.lightning_fit", "examples.titan_loop"]
# subcommands the trainer dispatches by hand (its own parser has no subparsers to list them)
TRAINER_COMMANDS = ["verify", "export", "report", "replay"]
# files whose parsers are reached through another command line above
REACHED_THROUGH = {"shards/tools/cli.py": "shards", "cache/tools/cli.py": "cache", "loaders/tools/cli.py": "loaders",
                   "trainer/run/cli.py": "trainer", "trainer/checkpointing/verify.py": "trainer verify",
                   "trainer/export/cli.py": "trainer export", "trainer/debug/replay.py": "trainer replay",
                   "colaflow/cli.py": "colaflow", "examples/demo/run.py": "examples.demo"}
# colaflow commands that are groups of their own sub-commands (colaflow shards verify ...)
GROUPS = {"shards", "cache", "loaders", "dashboard"}
REST_ROLE = re.compile(r":(func|mod|class|meth|data|attr|exc):`")
# files with an ArgumentParser that is no command line
NOT_COMMAND_LINES = {"pipelines/runners/selection.py"}  # reads the flags Beam's DaskOptions declares (a --dask_* flag hint)
SCRIPTS = ["beam_runner.py"] + sorted(p.relative_to(ROOT).as_posix() for p in BENCHMARKS.glob("*.py")
                                      if "def main(" in p.read_text(encoding="utf-8"))


def _run_in_process(call, argv: list[str]) -> tuple[object, str]:
    """Run ``call()`` with ``sys.argv`` set to ``argv``; returns ``(exit code, stdout)``.
    ``sys.argv``, ``sys.path`` and the root log level (beam_runner sets it on import) are restored."""
    saved_argv, saved_path, saved_level = sys.argv[:], sys.path[:], logging.getLogger().level
    out = io.StringIO()
    code: object = "returned without exiting: --help was not handled"
    sys.argv = argv
    sys.path.insert(0, str(BENCHMARKS))  # bench_cache_limits imports its sibling bench_cache
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
            call()
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        logging.getLogger().setLevel(saved_level)
    return code, out.getvalue()


def run_help(target: str, args: list[str]) -> tuple[object, str]:
    """Run ``TARGET ARGS --help`` in this process; returns ``(exit code, stdout)``.

    ``target`` is a script path relative to the repository root (``*.py``) or a module name."""
    def call() -> None:
        if target.endswith(".py"):
            runpy.run_path(str(ROOT / target), run_name="__main__")
        else:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    return _run_in_process(call, [target, *args, "--help"])


def run_colaflow_help(args: list[str]) -> tuple[object, str]:
    """Run ``colaflow ARGS --help`` in this process (:func:`colaflow.cli.main`, which the console
    script calls); returns ``(exit code, stdout)``."""
    return _run_in_process(lambda: colaflow_main([*args, "--help"]), ["colaflow", *args, "--help"])


def _plain(shown: str, out: str) -> None:
    assert "``" not in out and not REST_ROLE.search(out), f"{shown} shows reST markup: {REST_ROLE.search(out)}"


def _check(target: str, args: list[str]) -> str:
    """Run ``--help``; check exit 0, a usage naming the command as typed (``python -m trainer report``,
    not ``report.py`` or another module's name) and plain text (no reST ````x```` or ``:func:`x```)."""
    code, out = run_help(target, args)
    shown = " ".join([target, *args, "--help"])
    assert code == 0, f"{shown}: exit {code}"
    assert out.startswith("usage:") and len(out.splitlines()) > 2, f"{shown} printed no usage: {out!r}"
    if not target.endswith(".py"):
        typed = " ".join(["python -m", target, *args])
        assert out.startswith(f"usage: {typed} ") or out.startswith(f"usage: {typed}\n"), f"{shown}: {out[:80]!r}"
    _plain(shown, out)
    return out


def _check_colaflow(args: list[str]) -> str:
    """Run ``colaflow ARGS --help``; check exit 0 and a usage naming the command as typed
    (``colaflow shards verify``, not ``python -m shards verify``), in plain text."""
    code, out = run_colaflow_help(args)
    typed = " ".join(["colaflow", *args])
    assert code == 0, f"{typed} --help: exit {code}"
    assert len(out.splitlines()) > 2 and (out.startswith(f"usage: {typed} ") or out.startswith(f"usage: {typed}\n")), \
        f"{typed} --help printed no usage of {typed}: {out[:120]!r}"
    _plain(f"{typed} --help", out)
    return out


def _subcommands(usage: str) -> list[str]:
    """The ``{a,b,c}`` choices of a parser's usage line (empty when it has no subparsers)."""
    head = usage.split("\n\n")[0]
    found = re.search(r"(?:^|[^\w-] )\{([\w,-]+)\}", head, re.MULTILINE)  # not an option's choices: --x {a,b}
    return found.group(1).split(",") if found else []


@pytest.mark.parametrize("target", SCRIPTS + MODULES)
def test_help_exits_zero_with_usage(target):
    out = _check(target, [])
    subs = TRAINER_COMMANDS if target == "trainer" else _subcommands(out)
    if target in ("shards", "cache", "loaders", "trainer"):
        assert subs, f"{target}: no subcommands found in its usage line"
    for sub in subs:
        _check(target, [sub])


def test_colaflow_help_lists_every_command_on_one_line(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width
    out = _check_colaflow([])
    assert _subcommands(out) == list(COMMANDS)
    assert {"preprocess", "shards", "cache", "loaders", "train", "export", "report", "replay", "verify",
            "demo"} <= set(COMMANDS)
    for c in COMMANDS.values():
        assert re.search(rf"^    {c.name} +{re.escape(c.summary)}$", out, re.MULTILINE), f"{c.name}'s line in {out}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_colaflow_command_help_exits_zero_with_usage(command):
    subs = _subcommands(_check_colaflow([command]))
    assert bool(subs) == (command in GROUPS), f"colaflow {command}: sub-commands {subs}"
    for sub in subs:
        _check_colaflow([command, sub])


def test_colaflow_help_imports_neither_torch_nor_beam():
    probe = ("import contextlib, io, sys\nfrom colaflow.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n        main(['--help'])\n"
             "    except SystemExit as e:\n        code = e.code\n"
             "print(code, sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'apache_beam'}))")
    p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["0", "[]"], p.stdout


def test_every_argparse_command_line_is_listed():
    """A new script or module with an ArgumentParser must be added above (or reached through one)."""
    listed = set(SCRIPTS) | {m.replace(".", "/") + ".py" for m in MODULES} | set(REACHED_THROUGH)
    listed |= {m.replace(".", "/") + "/__main__.py" for m in MODULES}
    sources = list(ROOT.glob("*.py")) + [p for stage in ("colaflow", "pipelines", "shards", "cache", "loaders", "trainer",
                                                        "benchmarks", "examples") for p in (ROOT / stage).rglob("*.py")]
    parsers = {p.relative_to(ROOT).as_posix() for p in sources if "ArgumentParser(" in p.read_text(encoding="utf-8")}
    assert parsers - listed - NOT_COMMAND_LINES == set()


def test_beam_runner_help_says_how_overrides_beam_options_and_exit_codes_work():
    out = _check("beam_runner.py", [])
    flat = " ".join(out.split())
    assert "A section.key=value argument overrides one value of the config" in flat
    assert "--runner=DaskRunner --dask_client_address=HOST:PORT" in flat and "Quote the --input glob" in flat
    assert "Exit codes: 0 done, 1 runtime/data error, 2 usage/config error, 130 interrupted" in flat


def test_bench_scale_help_names_both_default_runners_and_shows_defaults():
    flat = " ".join(_check("benchmarks/bench_scale.py", []).split())
    assert "on the DirectRunner (the baseline; in memory, or multi for its multi_processing mode), on a Dask cluster" in flat
    assert "(default: direct,dask)" in flat and "(default: 1,4,16)" in flat
    assert "--out OUT work folder: " in flat
