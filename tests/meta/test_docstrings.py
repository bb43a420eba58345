"""Every public function, class and method of the five stages (and the benchmarks) has a docstring."""
import ast
import pathlib
from tests.support.paths import REPO

ROOT = REPO
PACKAGES = ("colaflow", "pipelines", "shards", "cache", "loaders", "trainer", "examples", "benchmarks")


def _missing(path: pathlib.Path) -> list[str]:
    out = []

    def walk(node, prefix: str) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not n.name.startswith("_"):
                if ast.get_docstring(n) is None:
                    out.append(f"{path.relative_to(ROOT)}:{n.lineno} {prefix}{n.name}")
                if isinstance(n, ast.ClassDef):
                    walk(n, f"{prefix}{n.name}.")
    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_public_functions_and_classes_have_docstrings():
    files = [ROOT / "beam_runner.py"] + [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    missing = [m for f in files for m in _missing(f)]
    assert not missing, "add a docstring (shapes, dtypes, units, errors) to:\n" + "\n".join(missing)
