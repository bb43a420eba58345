"""The loaders' numpy/torch boundary (``loaders/README.md``): what a loader worker process runs never
imports torch; only ``loaders.rank``, ``loaders.images`` and the command line do."""
from __future__ import annotations

import pkgutil
import subprocess
import sys

import loaders
from tests.support.paths import REPO

TORCH_SIDE = ("loaders.rank", "loaders.images", "loaders.tools", "loaders.__main__")


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(loaders.__path__, "loaders."))


def _numpy_only() -> list[str]:
    return [m for m in _modules() if not m.startswith(TORCH_SIDE)]


def _import_without_torch(modules: list[str]) -> subprocess.CompletedProcess:
    probe = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError(f"blocked: {{name}} imported by a module loader workers run")
sys.meta_path.insert(0, Block())
for m in {modules!r}:
    importlib.import_module(m)
print("ok", len({modules!r}))
"""
    return subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True)


def test_worker_side_modules_import_without_torch():
    modules = _numpy_only()
    assert {"loaders.worker.stream", "loaders.worker.pool", "loaders.pack.packer", "loaders.sources",
            "loaders.mixture.mixture", "loaders.read.shard_reader", "loaders.order.progress"} <= set(modules)
    out = _import_without_torch(modules)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", str(len(modules))]


def test_the_probe_sees_a_torch_import():
    out = _import_without_torch(["loaders.rank.batch"])
    assert out.returncode != 0 and "blocked: torch" in out.stderr
