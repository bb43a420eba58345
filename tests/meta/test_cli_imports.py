"""Command lines import only what their path uses: ``python -m trainer`` on a config error or a fresh
run's ``--dry-run``, and ``python -m loaders`` on ``--help`` or missing data, load no torch (2-4 CPU-s
of imports per launch: torch, and torch.distributed.checkpoint with sympy)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.data import write_counting_shards
from tests.support.paths import REPO

# colaflow.config: every path below loads it, so seeing it shows that the probe sees the run's imports
WATCHED = ("colaflow.config", "torch", "torch.distributed.checkpoint")
# runs ``python -m MODULE ARGS...`` in this process, then names the watched modules it imported
PROBE = f"""
import atexit, runpy, sys
atexit.register(lambda: print("loaded:", *[m for m in {WATCHED!r} if m in sys.modules], file=sys.stderr))
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def loaded(module: str, *args: str) -> tuple[int, list[str]]:
    """``python -m MODULE ARGS`` run from the repository root; returns its exit code and the watched
    modules it imported."""
    p = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stderr.splitlines()[-1].split()[1:]


def test_a_trainer_config_error_imports_no_torch():
    assert loaded("trainer", "--config", "configs/demo.yaml", "zero.stagee=2") == (2, ["colaflow.config"])


def test_a_dry_run_of_a_fresh_run_imports_no_torch(tmp_path):
    write_counting_shards(str(tmp_path / "data"), 40, max_samples=20, vocab=64, max_len=20)
    assert loaded("trainer", "--config", "configs/demo.yaml", f"data.manifest={tmp_path / 'data'}",
                  f"run_dir={tmp_path / 'run'}", f"cache.dir={tmp_path / 'cache'}", "eval.enabled=false",
                  "--dry-run") == (0, ["colaflow.config"])


@pytest.mark.parametrize("args,code", [(["--help"], 0), (["bench", "--shards", "/nonexistent/shards"], 1)])
def test_loaders_help_and_missing_data_import_no_torch(args, code):
    assert loaded("loaders", *args) == (code, ["colaflow.config"])
