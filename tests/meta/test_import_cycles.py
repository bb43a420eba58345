"""No import cycles between colaflow's modules (module-level imports; lazy imports inside functions
are how a module reaches a heavier one on demand and are not counted)."""
import ast
from tests.support.paths import REPO

ROOT = REPO
PACKAGES = ("colaflow", "pipelines", "shards", "cache", "loaders", "trainer")


def _module_graph() -> dict[str, set[str]]:
    files = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {m: set() for m in files}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            graph[mod] |= {t for t in targets if t in files and t != mod}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan 1972)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_sees_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_no_import_cycles():
    assert _cycles(_module_graph()) == []


def test_colaflow_imports_stages_only_lazily_and_no_stage_imports_its_command_line():
    """``colaflow.config``, ``.errors`` and ``.wording`` sit below every stage and import none;
    ``colaflow.cli`` reaches the stages only inside functions (``colaflow --help`` stays light), and
    no stage imports it back."""
    graph = _module_graph()
    own = {m for m in graph if m == "colaflow" or m.startswith("colaflow.")}
    assert {"colaflow.config", "colaflow.errors", "colaflow.wording", "colaflow.cli"} <= own
    assert {m: sorted(graph[m] - own) for m in own} == {m: [] for m in own}
    assert sorted(m for m in graph if m not in own and "colaflow.cli" in graph[m]) == []
