"""Which build of the hot modules runs: pure Python, or compiled with mypyc (issue 19).

The modules in ``COMPILED_MODULES`` are the hot path: the protocol's, the engine's and the
shell's request handler (``lockserver.shell._requests``). By default they are plain Python.
``python scripts/mypyc_build.py`` compiles them in place: a ``.so`` beside each ``.py``,
which the import system prefers; ``--clean`` removes them again. Both builds must behave
identically (same wire bytes, same errors); the suite runs both ways (``scripts/test.py``).

``build()`` says which one this process loaded, by where each module came from, so the
server can report it (``--version``, the startup line, statistics, ``/metrics``, the status
page) and a test can check that a compiled run really loaded compiled code.

A compiled module does not follow its ``.py``: the import system loads the ``.so`` even after
the source was edited or checked out at another commit. So the build script records each
source's SHA-256 in ``SOURCES_MANIFEST`` beside the packages, and ``build_problem()`` says
when what runs is not what the checkout holds (a module compiled from other source, or a
build that is only partly there); the ``lockserver`` command refuses to start then, naming
the modules and the fix, rather than run code nobody can read (and, in a replicated group,
code its peers may not run).

An installed wheel is compiled when the machine that built it could compile
(``hatch_build.py``, the wheel's build hook); a wheel built pure says why in ``PURE_NOTE``,
and ``install_note()`` reads it for ``lockserver --version``.

This module imports nothing of the project: the build script loads it by path to read the
module list without importing (possibly stale) compiled modules.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Final

__all__ = [
    "COMPILED_MODULES",
    "DISTRIBUTION",
    "PURE_NOTE",
    "SOURCES_MANIFEST",
    "build",
    "build_problem",
    "compiled_modules",
    "install_note",
    "version_line",
    "source_digest",
    "stale_modules",
]

#: The modules the compiled build compiles, as importable names.
COMPILED_MODULES: Final = (
    "protocol._codec",
    "protocol._trees",
    "protocol._framing",
    "protocol._connection",
    "lockserver.engine._eval",
    "lockserver.engine._engine",
    "lockserver.engine._store",
    "lockserver.engine._waiting",
    "lockserver.engine._core",
    "lockserver.engine._sharded",
    "lockserver.engine._deadlines",
    "lockserver.shell._requests",
)

#: The file, at the top of the checkout (beside the packages), where the build script records
#: the SHA-256 of each compiled module's source: ``{"sources": {module: hex digest}}``.
SOURCES_MANIFEST: Final = "lockserver_compiled.sources.json"

#: The distribution's name on the package index (``lockserver`` there is another project).
DISTRIBUTION: Final = "skylock"

#: The file, beside this module, in which a wheel built pure records why (one line); absent
#: from a checkout and from a compiled wheel.
PURE_NOTE: Final = "_pure_wheel.txt"

#: Where the packages of this checkout live (the manifest's directory).
_TOP: Final = Path(__file__).resolve().parents[1]


def _compiled_sources() -> dict[str, Path]:
    """Each module of ``COMPILED_MODULES`` that this process loaded from an extension
    (compiled) file, importing them if need be, with the ``.py`` beside that file."""
    found = {}
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            if path.endswith(suffix):
                found[name] = Path(path[: -len(suffix)] + ".py")
                break
    return found


def compiled_modules() -> tuple[str, ...]:
    """The modules of ``COMPILED_MODULES`` that this process loaded from an extension
    (compiled) file, importing them if need be."""
    return tuple(_compiled_sources())


def build() -> str:
    """``"compiled"`` when every module of ``COMPILED_MODULES`` is compiled, ``"pure"`` when
    none is, ``"partial"`` otherwise (a stale or half-finished build: rebuild or clean)."""
    n = len(compiled_modules())
    if n == 0:
        return "pure"
    return "compiled" if n == len(COMPILED_MODULES) else "partial"


def install_note() -> str | None:
    """Why the installed wheel is pure Python (its build could not compile, or was told not
    to), as the wheel's build recorded it; None for a compiled wheel or a checkout."""
    try:
        return Path(__file__).with_name(PURE_NOTE).read_text().strip() or None
    except OSError:
        return None


def version_line(version: str) -> str:
    """What ``lockserver --version`` prints: the version and the build that runs, and for a
    wheel built pure, why (``lockserver 0.1.0 (pure build: wheel built without compiling: no
    C compiler ...)``)."""
    note = install_note() if build() == "pure" else None
    why = f": wheel built without compiling: {note}" if note else ""
    return f"lockserver {version} ({build()} build{why})"


def source_digest(path: Path) -> str:
    """The hex SHA-256 of a source file's bytes, as the manifest records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stale_modules(loaded: Iterable[tuple[str, Path]], manifest: Path) -> tuple[str, ...]:
    """Of the compiled modules ``loaded`` (name, the ``.py`` beside its extension file), those
    whose source is not the one they were compiled from: its digest differs from the
    manifest's, the manifest does not name it, the source is gone, or there is no readable
    manifest at all (a build made before manifests, or one whose manifest was removed)."""
    try:
        recorded = json.loads(manifest.read_text())["sources"]
        if not isinstance(recorded, dict):
            raise TypeError("sources is not an object")
    except (OSError, ValueError, KeyError, TypeError):
        recorded = {}
    stale = []
    for name, source in loaded:
        try:
            fresh = recorded.get(name) == source_digest(source)
        except OSError:
            fresh = False
        if not fresh:
            stale.append(name)
    return tuple(stale)


def build_problem() -> str | None:
    """Why this process should not serve with the modules it loaded, or None: some compiled
    modules were built from other sources than the checkout's (edited or checked out since),
    or only some of ``COMPILED_MODULES`` are compiled. The message names the modules and the
    fix."""
    loaded = _compiled_sources()
    if not loaded:
        return None
    fix = (
        "build again (python scripts/mypyc_build.py), or remove the compiled build to run "
        "pure Python (python scripts/mypyc_build.py --clean)"
    )
    stale = stale_modules(loaded.items(), _TOP / SOURCES_MANIFEST)
    if stale:
        if len(stale) == 1:
            which = f"module {stale[0]} was not built from the source beside it"
        else:
            which = f"modules {', '.join(stale)} were not built from the sources beside them"
        return f"the compiled {which} (edited or checked out since the build): {fix}"
    if len(loaded) != len(COMPILED_MODULES):
        missing = [m for m in COMPILED_MODULES if m not in loaded]
        return f"the compiled build is partial ({', '.join(missing)} not compiled): {fix}"
    return None
