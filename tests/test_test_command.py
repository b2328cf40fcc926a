"""The README's test command (scripts/test.py, issue 32): how it splits the suite.

Pinned down: each half runs on parallel workers with ``--dist loadgroup`` unless the caller
chose otherwise; the tests marked ``build_independent`` are the lint and type checks and the
tests of tests/install (which build their own wheels); with ``LOCKSERVER_TEST_HALF=pure``
they are deselected, with ``compiled`` the ``one_build`` tests (tests/conftest.py's
``ONE_BUILD_FOLDERS``, less those marked ``both_builds``) are; every test runs in at least one
half, and the tests that can tell the builds apart run in both.
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
    """One worker per CPU and one more, or as many more as asked (the pure half: two), or
    ``LOCKSERVER_TEST_WORKERS``; and ``--dist loadgroup``; a caller's ``-n`` or ``--dist``
    wins, ``-p no:xdist`` turns both off."""
    script = _script()
    parallel = script._parallel
    monkeypatch.delenv("LOCKSERVER_TEST_WORKERS", raising=False)
    cpus = os.cpu_count() or 1
    assert parallel([]) == ["-n", str(cpus + 1), "--dist", "loadgroup"]
    assert script.WAITING_EXTRA == 2
    assert parallel([], script.WAITING_EXTRA) == ["-n", str(cpus + 2), "--dist", "loadgroup"]
    monkeypatch.setenv("LOCKSERVER_TEST_WORKERS", "3")
    assert parallel(["-x"]) == ["-n", "3", "--dist", "loadgroup"]
    assert parallel(["-x"], 2) == ["-n", "3", "--dist", "loadgroup"]
    assert parallel(["-n", "0"]) == ["--dist", "loadgroup"]
    assert parallel(["-n4"]) == ["--dist", "loadgroup"]
    assert parallel(["--dist=load"]) == ["-n", "3"]
    assert parallel(["-p", "no:xdist"]) == []


def _collected(*args: str, half: str = "") -> list[str]:
    """The node ids pytest selects from ARGS with ``LOCKSERVER_TEST_HALF=half``."""
    env = {**os.environ, "LOCKSERVER_TEST_HALF": half}
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
    marked = _collected("-m", "build_independent", "tests/test_static.py", "tests/install")
    static = sorted(n for n in marked if n.startswith("tests/test_static.py"))
    assert static == [
        "tests/test_static.py::test_mypy_strict",
        "tests/test_static.py::test_ruff[ruff-check]",
        "tests/test_static.py::test_ruff[ruff-format]",
    ]
    everything = _collected("tests/install")
    assert everything and {n for n in marked if n.startswith("tests/install")} == set(everything)


def test_the_pure_half_deselects_exactly_them() -> None:
    """With ``LOCKSERVER_TEST_HALF=pure`` the marked tests are deselected and every other
    one stays."""
    files = ("tests/test_static.py", "tests/install")
    kept = _collected(*files, half="pure")
    assert kept == ["tests/test_static.py::test_quickstart_example_runs"]
    assert _collected("tests/test_test_command.py", half="pure") == []


# One folder of each kind: both builds (engine), one_build with a both_builds test (httpd,
# replication's snapshot across the builds), build_independent (install, the static checks).
SAMPLE = (
    "tests/engine/test_api.py",
    "tests/httpd",
    "tests/replication/test_snapshot_builds.py",
    "tests/replication/test_entry_format.py",
    "tests/install",
    "tests/test_static.py",
)


def test_each_test_runs_in_a_half_and_the_telling_ones_in_both() -> None:
    """The halves together select every test; the compiled half deselects the one_build
    folders' tests but keeps their ``both_builds`` ones; what both halves run is the engine's
    tests, the build-reporting and build-comparing tests, and the quick start."""
    everything = set(_collected(*SAMPLE))
    pure = set(_collected(*SAMPLE, half="pure"))
    compiled = set(_collected(*SAMPLE, half="compiled"))
    assert pure | compiled == everything
    both = pure & compiled
    engine = {n for n in everything if n.startswith("tests/engine/")}
    assert engine and engine <= both
    assert {n for n in both if not n.startswith("tests/engine/")} == {
        "tests/httpd/test_endpoints.py::test_status_shows_live_figures",
        "tests/httpd/test_metrics.py::test_every_family_is_there_and_moves_with_the_traffic",
        "tests/replication/test_snapshot_builds.py::test_a_snapshot_loads_in_the_other_build_and_goes_on_the_same",
        "tests/test_static.py::test_quickstart_example_runs",
    }
    assert {n for n in compiled - pure if not n.startswith("tests/install/")} == {
        "tests/test_static.py::test_mypy_strict",
        "tests/test_static.py::test_ruff[ruff-check]",
        "tests/test_static.py::test_ruff[ruff-format]",
    }
    assert any(n.startswith("tests/replication/test_entry_format.py") for n in pure - compiled)
