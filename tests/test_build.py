"""Which build runs (lockserver/_build.py): the suite runs once pure and once compiled
(scripts/test.py), and says which it expects in ``LOCKSERVER_TEST_BUILD``; these tests make
sure the run tests what it says (CI cannot test pure twice) and that the server reports it."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import subprocess
import sys

from lockserver import RunningServer
from lockserver._build import COMPILED_MODULES, build, compiled_modules

EXPECTED = os.environ.get("LOCKSERVER_TEST_BUILD")


def test_the_run_tests_the_build_it_says() -> None:
    """With LOCKSERVER_TEST_BUILD=compiled every hot module was loaded from a compiled
    extension file (protocol._codec's ``__file__`` is a .so), with =pure every one from its
    .py file; without it the build is whole (pure or compiled), never a mix."""
    files = [importlib.import_module(name).__file__ or "" for name in COMPILED_MODULES]
    extension = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if EXPECTED == "compiled":
        assert all(f.endswith(extension) for f in files), files
        assert build() == "compiled"
    elif EXPECTED == "pure":
        assert all(f.endswith(".py") for f in files), files
        assert build() == "pure" and compiled_modules() == ()
    else:
        assert EXPECTED is None, f"LOCKSERVER_TEST_BUILD={EXPECTED!r}: pure or compiled"
        assert build() in ("pure", "compiled")


def test_the_command_says_which_build_runs() -> None:
    """``lockserver --version`` names the version and the build."""
    out = subprocess.run(
        [sys.executable, "-m", "lockserver", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("lockserver ") and out.rstrip().endswith(f"({build()} build)"), out


async def test_the_server_says_which_build_runs(server: RunningServer) -> None:
    """The statistics' ``server.build`` is the build this process loaded (the status page and
    /metrics repeat it: tests/httpd)."""
    assert server.statistics()["server"]["build"] == build()
