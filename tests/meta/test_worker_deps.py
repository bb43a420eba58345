"""Beam workers get a slim install: the base dependencies of pyproject.toml carry no training
stack, and every module a worker runs imports with that stack absent."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
import tomllib

import colaflow
import pipelines
import shards
from tests.support.paths import REPO

ROOT = REPO
HEAVY = ["torch", "nvidia-dali-cuda130", "tensorboard", "scikit-image", "scikit-learn", "triton", "webdataset",
         "wids", "aiohttp"]
# import names of the heavy stack, blocked in the probe below
BLOCKED = ["torch", "nvidia", "tensorboard", "skimage", "sklearn", "triton", "webdataset", "wids", "aiohttp", "dask",
           "distributed"]
# need colaflow[dask]; never on Beam workers (the lifted combine, ``combine``, runs there and needs Beam only)
OPTIONAL = {f"pipelines.runners.dask.{m}" for m in ("runner", "parts", "trim", "watch")}


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split("=")[0].split("<")[0].split(">")[0].strip().lower()


def test_base_dependencies_hold_no_training_stack():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    assert "apache-beam" in base and "sentencepiece" in base
    assert not base & set(HEAVY)
    extras = project["optional-dependencies"]
    assert set(HEAVY) <= {_name(r) for r in extras["train"]}
    assert {"train", "dask", "demo"} <= set(extras["all"][0].split("[")[1].rstrip("]").split(",")) \
        and "pipelines" in extras


def test_worker_modules_import_without_the_training_stack():
    modules = sorted({m.name for pkg in (pipelines, shards, colaflow) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
                      if not m.name.endswith("__main__") and m.name not in OPTIONAL} | {"beam_runner"})
    probe = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"blocked: {{name}} is not installed on a Beam worker")
sys.meta_path.insert(0, Block())
for m in {modules!r}:
    importlib.import_module(m)
print("ok", len({modules!r}))
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("ok") and "pipelines.job" in modules and "pipelines.runners.worker_boot" in modules \
        and "pipelines.runners.dask.combine" in modules and "shards.access.token_blocks" in modules


def test_worker_boot_imports_no_colaflow_package():
    """The external worker pool runs the boot before it installs the staged colaflow wheel: an import of
    colaflow's own packages there fails the boot, and the job waits for a worker that never comes."""
    import ast

    tree = ast.parse((ROOT / "pipelines" / "runners" / "worker_boot.py").read_text(encoding="utf-8"))
    own = {"colaflow", "pipelines", "shards", "cache", "loaders", "trainer", "beam_runner"}
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level]
    assert names and not {n.split(".")[0] for n in names} & own
