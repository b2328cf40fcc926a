"""The import direction of STYLE.md, checked by walking the AST of every module.

- ``protocol`` imports only the standard library, attrs, msgpack and itself.
- ``lockserver.engine`` and ``lockserver._trust`` import only the standard library, attrs and
  ``protocol``'s public names (``from protocol import ...``), and none of trio, socket, time,
  asyncio, threading, random or os: they are pure and take ``now`` as data. (The engine may
  also import ``mypy_extensions``: ``mypyc_attr``, how a class compiles in the optional
  compiled build, lockserver/_build.py; it does nothing at run time.)
- ``client`` never imports ``lockserver``; ``lockctl`` (the operator's command) builds on
  ``client`` alone: it imports neither ``lockserver`` nor ``protocol``.
- Across packages, imports go through the target package's ``__init__`` re-exports (never
  ``protocol._codec`` from outside ``protocol``, never a private name).
- Every package ``__init__.py`` only re-exports (no function or class definitions) and lists
  ``__all__``.

Missing packages (e.g. ``client`` before it exists) are skipped; every ``.py`` present is checked.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.build_independent("reads the sources only (their imports)")
TOP_PACKAGES = ("protocol", "lockserver", "client", "lockctl")
FORBIDDEN_IN_PURE = frozenset({"trio", "socket", "time", "asyncio", "threading", "random", "os"})


@attrs.frozen
class Import:
    """One imported module (absolute dotted name) and the names taken from it."""

    importer: str  # dotted module name of the importing file
    module: str
    names: tuple[str, ...]
    line: int

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        what = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.importer}:{self.line} imports {self.module}{what}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def source_files() -> list[Path]:
    files: list[Path] = []
    for top in TOP_PACKAGES:
        directory = ROOT / top
        if directory.is_dir():
            files.extend(sorted(directory.rglob("*.py")))
    return files


def packages() -> set[str]:
    """Dotted names of every package (directory with an __init__.py) under the top packages."""
    return {module_name(p) for p in source_files() if is_package(p)}


def imports_of(path: Path) -> Iterator[Import]:
    """Every import in a file (also inside functions and TYPE_CHECKING blocks), with relative
    imports resolved to absolute names."""
    return imports_in(path.read_text(encoding="utf-8"), module_name(path), is_package(path))


def imports_in(source: str, name: str, package_init: bool) -> Iterator[Import]:
    """The imports of module ``name``'s source (``package_init``: it is a package __init__)."""
    package = name if package_init else name.rpartition(".")[0]
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(name, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                assert node.module is not None
                target = node.module
            names = tuple(alias.name for alias in node.names)
            if node.module is None:  # "from . import x": each x is a module or a name
                for alias in node.names:
                    yield Import(name, f"{target}.{alias.name}", (), node.lineno)
            else:
                yield Import(name, target, names, node.lineno)


def owning_package(module: str, known: set[str]) -> str:
    """The deepest known package that ``module`` is (or lies in)."""
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in known:
            return candidate
    return parts[0]


def is_stdlib(module: str) -> bool:
    return module.split(".", maxsplit=1)[0] in sys.stdlib_module_names


FILES = source_files()
IDS = [str(p.relative_to(ROOT)) for p in FILES]


def test_the_packages_exist() -> None:
    """At least protocol and lockserver are present, so the checks below check something."""
    assert (ROOT / "protocol" / "__init__.py").is_file()
    assert (ROOT / "lockserver" / "engine" / "__init__.py").is_file()


KNOWN = {"protocol", "lockserver", "lockserver.engine", "client"}


def test_the_checker_resolves_relative_imports() -> None:
    """Relative imports are resolved against the importing module's package."""
    assert module_name(ROOT / "lockserver" / "engine" / "__init__.py") == "lockserver.engine"
    assert owning_package("lockserver.engine._eval", KNOWN) == "lockserver.engine"
    found = list(
        imports_in("from ._eval import x\nfrom .. import _trust", "lockserver.engine._e", False)
    )
    assert [i.module for i in found] == ["lockserver.engine._eval", "lockserver._trust"]
    found = list(imports_in("from ._ops import Node", "protocol", True))
    assert [i.module for i in found] == ["protocol._ops"]


@pytest.mark.parametrize(
    ("source", "importer", "expected"),
    [
        ("from protocol._codec import pack", "client._core", 1),
        ("from protocol import _codec", "client._core", 1),
        ("import protocol._codec", "lockserver.shell._server", 1),
        ("from lockserver.engine._engine import Engine", "lockserver.shell._server", 1),
        ("from ..engine import Engine", "lockserver.shell._server", 0),
        ("from ._eval import Entry", "lockserver.engine._engine", 0),
        ("from protocol import Transaction", "client._core", 0),
        ("import trio", "client._async", 0),
    ],
)
def test_the_checker_finds_cross_package_violations(
    source: str, importer: str, expected: int
) -> None:
    """The cross-package rule flags private modules and names of another package only."""
    found = imports_in(source, importer, False)
    assert len(cross_package_violations(found, importer, KNOWN)) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time", 1),
        ("from os import path", 1),
        ("import trio", 1),
        ("def f():\n    import random", 1),
        ("from protocol._ops import SetVar", 1),
        ("from protocol import _ops", 1),
        ("import msgpack", 1),
        ("from lockserver import _server", 1),
        ("import heapq\nfrom collections import deque\nimport attrs", 0),
        ("from protocol import SetVar\nfrom ._eval import Entry", 0),
    ],
)
def test_the_checker_finds_impure_imports(source: str, expected: int) -> None:
    """The purity rule flags clocks, I/O, randomness, concurrency, private protocol names and
    anything outside stdlib / attrs / protocol."""
    importer = "lockserver.engine._engine"
    assert len(pure_violations(imports_in(source, importer, False), importer)) == expected


@pytest.mark.parametrize("path", [p for p in FILES if module_name(p).startswith("protocol")])
def test_protocol_imports_only_stdlib_attrs_msgpack(path: Path) -> None:
    """protocol depends on nothing but the standard library, attrs, msgpack and itself."""
    bad = [
        str(i)
        for i in imports_of(path)
        if not (is_stdlib(i.module) or i.top in {"attrs", "msgpack", "protocol"})
    ]
    assert bad == []


def pure_files() -> list[Path]:
    return [
        p
        for p in FILES
        if module_name(p) == "lockserver._trust" or module_name(p).startswith("lockserver.engine")
    ]


@pytest.mark.parametrize("path", pure_files(), ids=[module_name(p) for p in pure_files()])
def test_engine_and_trust_are_pure(path: Path) -> None:
    """lockserver.engine and lockserver._trust import only the standard library (minus I/O,
    clocks, randomness and concurrency), attrs, protocol's public names, and their own
    package (the engine its own modules)."""
    assert pure_violations(imports_of(path), module_name(path)) == []


# The engine's one import beyond the rules: how a class compiles (nothing at run time).
_COMPILE_HINT = ("mypy_extensions", ("mypyc_attr",))


def pure_violations(found: Iterable[Import], own: str) -> list[str]:
    bad = []
    for i in found:
        if i.top in FORBIDDEN_IN_PURE:
            bad.append(f"{i}: pure code must not use {i.top}")
        elif is_stdlib(i.module) or i.top == "attrs" or (i.top, i.names) == _COMPILE_HINT:
            continue
        elif i.top == "protocol":
            if i.module != "protocol" or any(n.startswith("_") for n in i.names):
                bad.append(f"{i}: only `from protocol import <public name>`")
        elif own.startswith("lockserver.engine") and i.module.startswith("lockserver.engine"):
            continue
        else:
            bad.append(f"{i}: not allowed in pure code")
    return bad


@pytest.mark.parametrize("path", [p for p in FILES if module_name(p).startswith("client")])
def test_client_never_imports_lockserver(path: Path) -> None:
    """The client talks to the server over the protocol only."""
    assert [str(i) for i in imports_of(path) if i.top == "lockserver"] == []


@pytest.mark.parametrize("path", [p for p in FILES if module_name(p).startswith("lockctl")])
def test_lockctl_builds_on_the_client_alone(path: Path) -> None:
    """lockctl is an application of the client: no server internals, no wire codec."""
    assert [str(i) for i in imports_of(path) if i.top in ("lockserver", "protocol")] == []


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_cross_package_imports_go_through_init(path: Path) -> None:
    """An import of another package (one that does not contain the importer) names the
    package itself, never one of its modules, and takes only public names."""
    assert cross_package_violations(imports_of(path), module_name(path), packages()) == []


def cross_package_violations(found: Iterable[Import], importer: str, known: set[str]) -> list[str]:
    bad = []
    for i in found:
        if i.top not in TOP_PACKAGES:
            continue
        target_pkg = owning_package(i.module, known)
        inside = importer == target_pkg or importer.startswith(target_pkg + ".")
        if inside:
            continue
        if i.module != target_pkg:
            bad.append(f"{i}: import from {target_pkg} (its __init__), not {i.module}")
        elif any(n.startswith("_") for n in i.names):
            bad.append(f"{i}: private name from another package")
    return bad


INITS = [p for p in FILES if is_package(p)]


@pytest.mark.parametrize("path", INITS, ids=[str(p.relative_to(ROOT)) for p in INITS])
def test_package_init_only_reexports(path: Path) -> None:
    """A package __init__.py defines no functions or classes and lists __all__; every name in
    __all__ is imported (re-exported) there."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    definitions = [
        f"line {n.lineno}: {n.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    ]
    assert definitions == []
    all_nodes = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
    ]
    assert len(all_nodes) == 1, "__all__ must be assigned exactly once"
    exported = ast.literal_eval(all_nodes[0].value)
    imported = {
        alias.asname or alias.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom)
        for alias in n.names
    }
    assert sorted(set(exported) - imported) == []
    assert len(exported) == len(set(exported)), "__all__ lists a name twice"


# --- the seams between lockserver's subpackages ------------------------------------------------

#: Which of lockserver's subpackages each one may import (each subpackage's __init__ docstring
#: says the same). The top-level modules of lockserver (settings, auth, trust, the peer, build)
#: are the foundations under all of them; the shell composes the rest.
SEAMS: dict[str, frozenset[str]] = {
    "lockserver.engine": frozenset(),
    "lockserver.replication": frozenset({"lockserver.engine"}),
    "lockserver.http": frozenset(),
    "lockserver.shell": frozenset(
        {"lockserver.engine", "lockserver.replication", "lockserver.http"}
    ),
}
#: What the foundations at the top of lockserver may import of the subpackages (the settings
#: parse etcd's endpoints with replication's parser; GC pauses freeze the engine's tables).
FOUNDATIONS_MAY_IMPORT = frozenset({"lockserver.engine", "lockserver.replication"})


def subpackage_of(module: str) -> str | None:
    """The lockserver subpackage ``module`` is or lies in, None for anything else."""
    for sub in SEAMS:
        if module == sub or module.startswith(sub + "."):
            return sub
    return None


def seam_violations(found: Iterable[Import], importer: str) -> list[str]:
    own = subpackage_of(importer)
    if own is None and importer.startswith("lockserver."):  # a foundation (or __main__)
        allowed = FOUNDATIONS_MAY_IMPORT | (
            {*SEAMS} if importer == "lockserver.__main__" else set()
        )
    elif own is None:
        return []
    else:
        allowed = SEAMS[own] | {own}
    bad = []
    for i in found:
        whole = subpackage_of(i.module)
        # "from lockserver import shell" names the subpackage among the names
        targets = {whole} if whole else {subpackage_of(f"{i.module}.{n}") for n in i.names}
        bad.extend(
            f"{i}: {own or importer} may not import {target}"
            for target in sorted(t for t in targets if t is not None)
            if target not in allowed
        )
    return bad


@pytest.mark.parametrize(
    ("source", "importer", "expected"),
    [
        ("from lockserver.replication import Replica", "lockserver.http._endpoints", 1),
        ("from lockserver.shell import serve", "lockserver.http._endpoints", 1),
        ("from lockserver.http import is_http", "lockserver.replication._replica", 1),
        ("from lockserver import shell", "lockserver.replication._replica", 1),
        ("from lockserver import _auth, http", "lockserver.replication._replica", 1),
        ("from lockserver.engine import Door", "lockserver.replication._replica", 0),
        ("from lockserver.http import is_http", "lockserver.shell._reading", 0),
        ("from lockserver._peer import Peer", "lockserver.http._http", 0),
        ("from lockserver.shell import serve", "lockserver._config", 1),
        ("from lockserver.replication import etcd_endpoints", "lockserver._config", 0),
        ("from lockserver.shell import serve", "lockserver.__main__", 0),
        ("from ._eval import Entry", "lockserver.engine._engine", 0),
    ],
)
def test_the_checker_finds_seam_violations(source: str, importer: str, expected: int) -> None:
    """The seam rule flags an import of a subpackage that the importer's row of SEAMS (or the
    foundations' row) does not list, also when written as ``from lockserver import sub``."""
    assert len(seam_violations(imports_in(source, importer, False), importer)) == expected


def test_every_subpackage_declares_its_seams() -> None:
    """Each subpackage of lockserver has a row in SEAMS, so a new one says what it may import."""
    subpackages = {p for p in packages() if p.count(".") == 1 and p.startswith("lockserver.")}
    assert subpackages == set(SEAMS)


LOCKSERVER_FILES = [p for p in FILES if module_name(p).startswith("lockserver")]


@pytest.mark.parametrize("path", LOCKSERVER_FILES, ids=[module_name(p) for p in LOCKSERVER_FILES])
def test_lockserver_subpackages_keep_their_seams(path: Path) -> None:
    """The HTTP face imports neither replication nor the shell (nor the engine); replication
    imports neither the HTTP face nor the shell; the engine imports none of them; the
    foundations at the top import neither the shell nor the HTTP face."""
    assert seam_violations(imports_of(path), module_name(path)) == []


# --- no import circles ---------------------------------------------------------------------------


def import_graph(files: Iterable[Path]) -> dict[str, set[str]]:
    """Module -> the modules of ``files`` it imports (also inside functions and TYPE_CHECKING
    blocks: a circle there is still a circle of the design). ``from P import n`` is an edge
    to ``P.n`` when that is a module, else to ``P``. The implicit import of a module's parent
    packages is not an edge: every submodule would otherwise depend on its package's
    ``__init__``, which re-exports it."""
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for found in imports_of(path):
            targets = [
                f"{found.module}.{n}" for n in found.names if f"{found.module}.{n}" in modules
            ]
            if not targets and found.module in modules:
                targets = [found.module]
            graph[name].update(t for t in targets if t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
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


def test_the_circle_finder_finds_a_circle_and_only_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set(), "f": {"g"}, "g": {"f"}}
    assert circles(graph) == [["a", "b", "c"], ["f", "g"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_the_edges_of_the_source() -> None:
    """Relative, absolute and package imports become edges (else no circle could be seen)."""
    graph = import_graph(FILES)
    server = graph["lockserver.shell._server"]
    assert "lockserver.shell._requests" in server  # from ._requests import
    assert "lockserver.engine" in server  # from ..engine import
    assert "lockserver.engine._core" in graph["lockserver.engine"]  # __init__ re-exports
    assert "protocol" in graph["lockserver.engine._core"]  # from protocol import


@pytest.mark.parametrize("top", TOP_PACKAGES)
def test_no_import_circles(top: str) -> None:
    """No module of ``protocol``, ``lockserver`` or ``client`` imports (directly or through
    others) a module that imports it back."""
    files = [p for p in FILES if module_name(p).split(".")[0] == top]
    assert files, top
    assert circles(import_graph(files)) == []
