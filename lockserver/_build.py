"""Which build of the hot modules runs: pure Python, or compiled with mypyc (issue 19).

The modules in ``COMPILED_MODULES`` are the protocol's and the engine's hot path. By default
they are plain Python. ``python scripts/mypyc_build.py`` compiles them in place: a ``.so``
beside each ``.py``, which the import system prefers; ``--clean`` removes them again. Both
builds must behave identically (same wire bytes, same errors); the suite runs both ways
(``scripts/test.py``).

``build()`` says which one this process loaded, by where each module came from, so the
server can report it (``--version``, the startup line, statistics, ``/metrics``, the status
page) and a test can check that a compiled run really loaded compiled code.

This module imports nothing of the project: the build script loads it by path to read the
module list without importing (possibly stale) compiled modules.
"""

from __future__ import annotations

import importlib
import importlib.machinery
from typing import Final

__all__ = ["COMPILED_MODULES", "build", "compiled_modules"]

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
)


def compiled_modules() -> tuple[str, ...]:
    """The modules of ``COMPILED_MODULES`` that this process loaded from an extension
    (compiled) file, importing them if need be."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    found = []
    for name in COMPILED_MODULES:
        path = getattr(importlib.import_module(name), "__file__", None) or ""
        if path.endswith(suffixes):
            found.append(name)
    return tuple(found)


def build() -> str:
    """``"compiled"`` when every module of ``COMPILED_MODULES`` is compiled, ``"pure"`` when
    none is, ``"partial"`` otherwise (a stale or half-finished build: rebuild or clean)."""
    n = len(compiled_modules())
    if n == 0:
        return "pure"
    return "compiled" if n == len(COMPILED_MODULES) else "partial"
