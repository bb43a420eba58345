"""Every command line of the project answers ``--help`` with exit 0 and its usage.

The commands run in this process (``runpy`` with ``sys.argv`` patched), so the whole check takes
seconds; a benchmark whose help text breaks argparse (a bare ``%`` in it) fails here, not in a
new user's terminal. Subcommands are found in each parser's ``{a,b,c}`` usage line.
"""
from __future__ import annotations

import contextlib
import io
import logging
import re
import runpy
import sys
import warnings

import pytest
from tests.support.paths import REPO

ROOT = REPO
BENCHMARKS = ROOT / "benchmarks"

# ``python -m MODULE`` command lines; a package runs its __main__.py
MODULES = ["shards", "cache", "loaders", "trainer", "examples.demo.corpus", "pipelines.runners.worker_boot", "examples.demo.imageset",
           "examples.demo", "trainer.vision.train", "trainer.kernels.compile_check",
           "trainer.report.dashboard", "trainer.report.render"]
# subcommands the trainer dispatches by hand (its own parser has no subparsers to list them)
TRAINER_COMMANDS = ["verify", "export", "report", "replay"]
# files whose parsers are reached through another command line above
REACHED_THROUGH = {"shards/tools/cli.py": "shards", "cache/tools/cli.py": "cache", "loaders/tools/cli.py": "loaders",
                   "trainer/__main__.py": "trainer", "trainer/debug/replay.py": "trainer replay"}
REST_ROLE = re.compile(r":(func|mod|class|meth|data|attr|exc):`")
# files with an ArgumentParser that is no command line
NOT_COMMAND_LINES = {"pipelines/runners/selection.py"}  # reads the flags Beam's DaskOptions declares (a --dask_* flag hint)
SCRIPTS = ["beam_runner.py"] + sorted(p.relative_to(ROOT).as_posix() for p in BENCHMARKS.glob("*.py")
                                      if "def main(" in p.read_text(encoding="utf-8"))


def run_help(target: str, args: list[str]) -> tuple[object, str]:
    """Run ``TARGET ARGS --help`` in this process; returns ``(exit code, stdout)``.

    ``target`` is a script path relative to the repository root (``*.py``) or a module name.
    ``sys.argv``, ``sys.path`` and the root log level (beam_runner sets it on import) are restored."""
    saved_argv, saved_path, saved_level = sys.argv[:], sys.path[:], logging.getLogger().level
    out = io.StringIO()
    code: object = "returned without exiting: --help was not handled"
    sys.argv = [target, *args, "--help"]
    sys.path.insert(0, str(BENCHMARKS))  # bench_cache_limits imports its sibling bench_cache
    try:
        with contextlib.redirect_stdout(out), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is already imported
            if target.endswith(".py"):
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code or 0
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        logging.getLogger().setLevel(saved_level)
    return code, out.getvalue()


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
    assert "``" not in out and not REST_ROLE.search(out), f"{shown} shows reST markup: {REST_ROLE.search(out)}"
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


def test_every_argparse_command_line_is_listed():
    """A new script or module with an ArgumentParser must be added above (or reached through one)."""
    listed = set(SCRIPTS) | {m.replace(".", "/") + ".py" for m in MODULES} | set(REACHED_THROUGH)
    listed |= {m.replace(".", "/") + "/__main__.py" for m in MODULES}
    sources = list(ROOT.glob("*.py")) + [p for stage in ("pipelines", "shards", "cache", "loaders", "trainer",
                                                        "benchmarks") for p in (ROOT / stage).rglob("*.py")]
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
    assert "on the DirectRunner (the baseline) and on a Dask cluster" in flat
    assert "(default: direct,dask)" in flat and "(default: 1,4,16)" in flat
    assert "--out OUT work folder: " in flat
