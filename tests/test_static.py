"""The house rules that tools check: ruff lint, ruff format, mypy --strict (STYLE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


#: Lint and types read the sources, never the compiled files: scripts/test.py runs them once.
once = pytest.mark.build_independent("reads the sources only")


@once
@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", ".")],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command: tuple[str, ...]) -> None:
    """The whole tree is lint-clean and formatted."""
    done = run(*command)
    assert done.returncode == 0, done.stdout + done.stderr


@once
def test_mypy_strict() -> None:
    """The library packages type-check under mypy --strict (config in pyproject.toml)."""
    done = run("mypy")
    assert done.returncode == 0, done.stdout + done.stderr


def test_quickstart_example_runs() -> None:
    """The README's quick start: the example starts a server and the MDS story holds."""
    done = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--once", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "lockserver listening on 127.0.0.1:" in done.stdout
    assert "user3 MDS review  -> ok=False failed at '1:/AssertOp/'" in done.stdout
    assert "user3 MDS review (entries done) -> ok=True" in done.stdout
