"""``colaflow COMMAND``: which tool runs, with which arguments and ``prog``, and how it ends."""
from __future__ import annotations

import sys

import pytest

from colaflow import cli
from colaflow.cli import Command

# a tool module, as the commands' modules are: main(argv, prog) -> int
TOOL = '''
CALLS = []


def main(argv=None, prog="python -m tool"):
    CALLS.append((argv, prog))
    if argv and argv[-1] == "stop":
        raise KeyboardInterrupt
    return 7
'''


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """A module ``tool_for_cli_test`` on ``sys.path`` and two commands running it."""
    (tmp_path / "tool_for_cli_test.py").write_text(TOOL)
    (tmp_path / "tool_needing_a_missing_module.py").write_text("import module_nobody_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "plain", Command("plain", "a tool", "tool_for_cli_test"))
    monkeypatch.setitem(cli.COMMANDS, "named", Command("named", "a tool that dispatches", "tool_for_cli_test", True))
    import tool_for_cli_test
    yield tool_for_cli_test
    for name in ("tool_for_cli_test", "tool_needing_a_missing_module"):
        sys.modules.pop(name, None)


def test_a_command_runs_its_tool_with_the_words_after_it_and_its_colaflow_name(tool):
    assert cli.main(["plain", "--flag", "x=1"]) == 7
    assert cli.main(["named", "CKPT"]) == 7
    assert tool.CALLS == [(["--flag", "x=1"], "colaflow plain"), (["named", "CKPT"], "colaflow")]


def test_ctrl_c_in_a_command_ends_with_130_and_one_line(tool, capsys):
    assert cli.main(["plain", "stop"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_unknown_or_missing_command_is_a_usage_error(capsys):
    for argv in (["trian", "--config", "x.yaml"], []):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'trian'" in err and "the following arguments are required: command" in err


def test_a_command_whose_package_is_not_installed_says_so_in_one_line(tool, monkeypatch, capsys):
    """``colaflow demo`` outside a source checkout (no ``examples/``) ends in one line; a module that
    is missing inside a tool is a bug and keeps its traceback."""
    monkeypatch.setitem(cli.COMMANDS, "demo", Command("demo", "the demo", "examples_not_installed.run"))
    assert cli.main(["demo", "--nproc", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: colaflow demo runs from a source checkout of colaflow "
                                                   "(examples_not_installed/ is not installed here)")
    monkeypatch.setitem(cli.COMMANDS, "broken", Command("broken", "x", "tool_needing_a_missing_module"))
    with pytest.raises(ModuleNotFoundError, match="module_nobody_installed"):
        cli.main(["broken"])

