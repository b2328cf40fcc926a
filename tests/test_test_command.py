"""The README's test command (scripts/test.py, issue 32): how it splits the suite.

Pinned down: each half runs on parallel workers with ``--dist loadgroup`` unless the caller
chose otherwise; the tests marked ``build_independent`` are the lint and type checks and the
tests of tests/install (which build their own wheels), and with
``LOCKSERVER_TEST_SKIP_BUILD_INDEPENDENT=1`` (the pure half) exactly those are deselected;
the install tests share one xdist group (one worker builds their wheels).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.build_independent("reads scripts/test.py and the markers only")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_test_command", ROOT / "scripts" / "test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workers_and_grouping_unless_the_caller_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker per CPU (or ``LOCKSERVER_TEST_WORKERS``) and ``--dist loadgroup``; a
    caller's ``-n`` or ``--dist`` wins, ``-p no:xdist`` turns both off."""
    parallel = _script()._parallel
    monkeypatch.delenv("LOCKSERVER_TEST_WORKERS", raising=False)
    cpus = str(max(1, os.cpu_count() or 1))
    assert parallel([]) == ["-n", cpus, "--dist", "loadgroup"]
    monkeypatch.setenv("LOCKSERVER_TEST_WORKERS", "3")
    assert parallel(["-x"]) == ["-n", "3", "--dist", "loadgroup"]
    assert parallel(["-n", "0"]) == ["--dist", "loadgroup"]
    assert parallel(["-n4"]) == ["--dist", "loadgroup"]
    assert parallel(["--dist=load"]) == ["-n", "3"]
    assert parallel(["-p", "no:xdist"]) == []


def _collected(*args: str, skip: bool) -> list[str]:
    env = {**os.environ, "LOCKSERVER_TEST_SKIP_BUILD_INDEPENDENT": "1" if skip else ""}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing selected
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_the_build_independent_tests_are_lint_types_and_install() -> None:
    """Selecting the marker gives the ruff and mypy tests and every install test, nothing
    else of those files (the quick start runs the server: it depends on the build)."""
    marked = _collected(
        "-m", "build_independent", "tests/test_static.py", "tests/install", skip=False
    )
    static = sorted(n for n in marked if n.startswith("tests/test_static.py"))
    assert static == [
        "tests/test_static.py::test_mypy_strict",
        "tests/test_static.py::test_ruff[ruff-check]",
        "tests/test_static.py::test_ruff[ruff-format]",
    ]
    everything = _collected("tests/install", skip=False)
    assert everything and {n for n in marked if n.startswith("tests/install")} == set(everything)


def test_the_pure_half_deselects_exactly_them() -> None:
    """With the variable set the marked tests are deselected and every other one stays."""
    files = ("tests/test_static.py", "tests/install")
    kept = _collected(*files, skip=True)
    assert kept == ["tests/test_static.py::test_quickstart_example_runs"]
    assert _collected("tests/test_test_command.py", skip=True) == []
