"""The core's modules import in layers: no import cycle, function-level imports included.

Each module of the ``qformat`` package is a node; an edge is any import of another module of
the package, wherever it is written (module level or inside a function: a deferred import still
ties the two modules together).  ``from .pkg import name`` counts as an import of
``pkg.name`` when that is a module, else of ``pkg``.  Packages' ``__init__`` modules are nodes
too, so a submodule that imports its own package's ``__init__`` (or the ``qformat`` facade)
closes a cycle and fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "qformat"


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom | ast.Import, known: set[str]) -> set[str]:
    out: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
        return out
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not (target == "qformat" or target.startswith("qformat.")):
        return out
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in known:
            out.add(sub)
        else:
            name = target
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (anywhere in its source)."""
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _resolve(name, path.name == "__init__.py", node, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_sees_function_level_imports():
    """The checker itself: a deferred import is an edge, and a two-module loop is a cycle."""
    g = import_graph()
    assert "qformat.regions" in g["qformat.decode"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    tree = ast.parse("def f():\n    from .layouts import canonical_view\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _resolve("qformat.decode", False, node, {"qformat.layouts", "qformat.decode"}) == {"qformat.layouts"}


def test_no_import_cycles_in_the_core():
    found = cycles(import_graph())
    assert not found, "import cycles (each a set of modules that import each other): " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("lower,upper", [
    ("qformat.descriptor", "qformat.layouts"),
    ("qformat.regions", "qformat.layouts"),
    ("qformat.regions", "qformat.decode"),
    ("qformat.layouts", "qformat.validate"),
    ("qformat.layouts", "qformat.decode"),
])
def test_layers_import_only_downward(lower, upper):
    """The documented layering (regions below layouts below validation and decode)."""
    g = import_graph()
    seen, todo = set(), [lower]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(g.get(m, ()))
    assert upper not in seen, f"{lower} reaches {upper}"


def bench_import_graph() -> dict[str, set[str]]:
    """bench/'s modules -> the bench modules each imports (anywhere in its source)."""
    folder = ROOT.parent / "bench"
    mods = {p.stem: p for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 or (node.level == 0 and (node.module or "").split(".")[0] == "bench"):
                    mod = (node.module or "").removeprefix("bench").lstrip(".") if node.level == 0 else (node.module or "")
                    edges |= {mod.split(".")[0]} if mod else {a.name for a in node.names}
            elif isinstance(node, ast.Import):
                edges |= {a.name.split(".")[1] for a in node.names if a.name.startswith("bench.")}
        graph[name] = {e for e in edges if e in mods and e != name}
    return graph


def test_no_import_cycles_in_bench():
    """The benchmark's sections share bench/common.py and do not import each other back
    (harness imports the sections it runs; a section imports only common)."""
    g = bench_import_graph()
    assert "common" in g["llama"] and "generate" in g["harness"]  # the checker sees the imports
    found = cycles(g)
    assert not found, "import cycles in bench/: " + "; ".join(" <-> ".join(c) for c in found)
