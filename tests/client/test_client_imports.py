"""No import circles in ``client`` (recipes included), checked on the AST of every module.

Every import counts, also those inside functions and ``if TYPE_CHECKING:`` blocks: a session
names its client only through the port (``client._port``), so nothing needs a circle, not even
for type checking. ``from . import x`` is an edge to the module ``x`` when ``x`` is one; an
import of a package is an edge to its ``__init__``. The implicit import of a module's parent
packages is not an edge (it is how Python imports any submodule).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "client"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules of ``package`` it imports (dotted names)."""
    files = sorted((root / package).rglob("*.py"))
    modules = {module_name(p, root): p for p in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    target = ".".join(parts + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # "from X import y": y is a submodule of X, or a name defined in X.
                targets = [
                    f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                    for alias in node.names
                ]
            for imported in targets:
                module = imported
                while module and module not in modules:  # a name inside a module
                    module = module.rpartition(".")[0]
                if module and module != name:
                    graph[name].add(module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_client_has_no_import_circle() -> None:
    """No two modules of ``client`` (recipes included) import each other, directly or
    through others; the graph covers every module."""
    graph = import_graph()
    assert {"client", "client._port", "client._sync_session", "client.recipes._base"} <= set(graph)
    assert cycles(graph) == []


def test_sessions_reach_their_client_only_through_the_port() -> None:
    """The session modules import the port, never the client modules."""
    graph = import_graph()
    for session, face in (
        ("client._sync_session", "client._sync"),
        ("client._async_session", "client._async"),
    ):
        assert "client._port" in graph[session]
        assert face not in graph[session]
        assert session in graph[face]


def test_the_checker_finds_a_circle(tmp_path: Path) -> None:
    """The checker itself: a circle through a TYPE_CHECKING import and a relative
    ``from . import`` is found, a one-way import is not."""
    pkg = tmp_path / "client"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a as a\n")
    (pkg / "a.py").write_text("from .b import thing\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from client.a import x\n"
    )
    (pkg / "c.py").write_text("from . import b\n")
    graph = import_graph(tmp_path)
    assert graph["client.c"] == {"client.b"}
    assert cycles(graph) == [["client.a", "client.b"]]
