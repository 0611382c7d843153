"""The layers import downwards only: no import circle through the engine, the providers or
the tools — none hidden behind ``TYPE_CHECKING`` or inside a function either, since every
``import`` statement of a module counts here, wherever it stands."""

from __future__ import annotations

import ast
from pathlib import Path

import tether

SRC = Path(tether.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Every tether module ``path`` imports, at any depth of its code (tether imports are
    absolute: a relative one fails here)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            # ``from package import module`` depends on that module, not on the package
            subs = {f"{node.module}.{alias.name}" for alias in node.names}
            names = sorted(subs & modules) if subs <= modules else [node.module or ""]
        else:
            continue
        found.update(name for name in names if name in modules)
    return found


def graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in SRC.rglob("*.py")}
    return {name: imports(path, set(paths)) - {name} for name, path in paths.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_circle_hidden_anywhere() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_tether_imports_in_a_circle() -> None:
    """Not the layers only: the environment, peers, A2A, the API and the page neither."""
    assert cycles(graph()) == []


def test_the_engine_imports_nothing_above_it() -> None:
    above = ("tether.providers", "tether.tools", "tether.peers", "tether.environment", "tether.api")
    reached = {
        (name, target)
        for name, targets in graph().items()
        if name.startswith("tether.engine")
        for target in targets
        if target.startswith(above)
    }
    assert reached == set()
