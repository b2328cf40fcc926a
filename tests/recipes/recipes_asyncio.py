"""The recipe tests' way onto both event loops: the one helper of the client tests
(tests/client/asyncio_support.py: ``on_both_loops``, ``on_server``, ``until``), loaded by
path so that it is one module whichever test folders a run collects."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "client" / "asyncio_support.py"

if "asyncio_support" in sys.modules:
    _support = sys.modules["asyncio_support"]
else:
    _spec = importlib.util.spec_from_file_location("asyncio_support", _PATH)
    assert _spec is not None and _spec.loader is not None
    _support = importlib.util.module_from_spec(_spec)
    sys.modules["asyncio_support"] = _support
    _spec.loader.exec_module(_support)

on_both_loops = _support.on_both_loops
on_server = _support.on_server
until = _support.until

__all__ = ["on_both_loops", "on_server", "until"]
