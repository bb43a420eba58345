"""The command lines work from any folder, also one holding the user's own ``shards/``, ``cache/``,
``trainer/``, ``pipelines/`` and ``loaders/`` folders (natural names for output folders).

Python puts the current folder first on ``sys.path`` for ``python -m``; an empty ``shards/`` there is
found as a namespace package before a default editable install's import hook (a meta-path finder,
asked last) is asked, and ``from shards import Manifest`` fails. The Makefile therefore installs the checkout
in editable *compat* mode: a ``.pth`` file puts the checkout on ``sys.path``, where its regular
packages win over a namespace portion. The commands run here as a user runs them: the venv's python
(``sys.executable``) and its ``colaflow`` console script, no ``PYTHONPATH``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.data import write_counting_shards
from tests.support.paths import REPO

PYTHON = sys.executable
COLAFLOW = str(Path(sys.executable).parent / "colaflow")  # the console script pip writes beside python
REINSTALL = ("reinstall the checkout in editable compat mode: rm .venv/.colaflow-installed && make install "
             "(pip install -e '.[all,test]' --config-settings editable_mode=compat)")
# (command, what its output starts with); python -m loaders keys imports ``from shards import ...``,
# which fails when an empty shards/ folder shadows the package (it passes --help alone either way)
COMMANDS = [
    ([COLAFLOW, "--help"], "usage: colaflow "),
    ([COLAFLOW, "shards", "--help"], "usage: colaflow shards "),
    ([COLAFLOW, "train", "--help"], "usage: colaflow train "),
    ([PYTHON, "-m", "trainer", "--help"], "usage: python -m trainer "),
    ([COLAFLOW, "shards", "verify", "shards", "-q"], "verified 2 shards (strict): 2 ok, 0 failed"),
    ([PYTHON, "-m", "loaders", "keys", "--shards", "shards"], "# epoch 0: 40 samples, 0 consumed before;"),
    ([PYTHON, "-m", "colaflow", "loaders", "keys", "--shards", "shards"], "# epoch 0: 40 samples, 0 consumed before;"),
]


def _user_env() -> dict[str, str]:
    """The environment without what would put the checkout on ``sys.path`` (or keep the current
    folder off it) other than the install itself."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory) -> Path:
    """A folder with the user's own shards/ (a manifest.json and 2 .tar shards) and empty cache/,
    trainer/, pipelines/, loaders/; skips when the venv installs another checkout than this one
    (a worktree sharing the venv of its main checkout: the commands would run that checkout's code)."""
    neutral = tmp_path_factory.mktemp("neutral")
    p = subprocess.run([PYTHON, "-c", "import colaflow, os; print(os.path.dirname(os.path.dirname(colaflow.__file__)))"],
                       cwd=neutral, env=_user_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"colaflow is not importable from the venv: {p.stderr[-500:]}; {REINSTALL}"
    installed = Path(p.stdout.strip())
    if installed.resolve() != REPO.resolve():
        pytest.skip(f"the venv ({PYTHON}) installs the checkout {installed}, not this one ({REPO})")
    folder = tmp_path_factory.mktemp("user")
    write_counting_shards(str(folder / "shards"), 40, max_samples=20, vocab=64, max_len=20)
    assert sorted(os.listdir(folder / "shards")) == ["manifest.json", "shard-000000.tar", "shard-000001.tar"]
    for name in ("cache", "trainer", "pipelines", "loaders"):
        (folder / name).mkdir()
    return folder


@pytest.mark.parametrize("command,starts", COMMANDS,
                         ids=[" ".join(["python" if c[0] == PYTHON else "colaflow", *c[1:]]) for c, _ in COMMANDS])
def test_command_works_from_a_folder_with_the_packages_names(user_folder, command, starts):
    assert os.path.exists(command[0]), f"no console script {command[0]}: the install predates [project.scripts]; {REINSTALL}"
    p = subprocess.run(command, cwd=user_folder, env=_user_env(), capture_output=True, text=True, timeout=120)
    shown = " ".join(["python" if command[0] == PYTHON else "colaflow", *command[1:]])
    assert p.returncode == 0 and p.stdout.startswith(starts), (
        f"{shown}, run in a folder holding shards/ cache/ trainer/ pipelines/ loaders/: exit {p.returncode}, "
        f"stdout {p.stdout[:200]!r}, stderr {p.stderr[-800:]!r}. If it is an ImportError or 'No module named', "
        f"that folder shadows colaflow's packages: {REINSTALL}")
