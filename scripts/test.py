"""Run the whole test suite twice: pure Python, then with the hot modules compiled (issue 19).

``python scripts/test.py [PYTEST ARGS...]`` is the README's test command (and CI's, .ci/run):

1. removes any compiled build, runs ``python -m pytest ARGS`` with
   ``LOCKSERVER_TEST_BUILD=pure``;
2. builds the compiled modules in place (``scripts/mypyc_build.py``) and runs the suite again
   with ``LOCKSERVER_TEST_BUILD=compiled`` (tests/test_build.py checks each run loaded what it
   says);
3. removes the compiled build again: the checkout is left pure, as it is by default.

Without a C compiler or the Python headers the compiled half is skipped with a message saying
what is missing (the exit status is then the pure run's). The exit status is non-zero when
either run fails or the build fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = [sys.executable, str(ROOT / "scripts" / "mypyc_build.py")]


def pytest(build: str, args: list[str]) -> int:
    """One run of the suite, saying which build it expects; its exit status."""
    print(f"=== the test suite, {build} build ===", flush=True)
    started = time.monotonic()
    env = {**os.environ, "LOCKSERVER_TEST_BUILD": build}
    code = subprocess.run(
        [sys.executable, "-m", "pytest", *args], cwd=ROOT, env=env, check=False
    ).returncode
    print(f"=== {build} build: exit {code} in {time.monotonic() - started:.0f} s ===", flush=True)
    return code


def main(args: list[str]) -> int:
    subprocess.run([*BUILD, "--clean"], cwd=ROOT, check=True)
    pure = pytest("pure", args)
    check = subprocess.run(
        [*BUILD, "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        print(f"=== compiled build SKIPPED: {check.stdout.strip()} ===", flush=True)
        return pure
    try:
        print("=== building the compiled modules ===", flush=True)
        if subprocess.run(BUILD, cwd=ROOT, check=False).returncode != 0:
            print("=== compiled build FAILED ===", flush=True)
            return 1
        compiled = pytest("compiled", args)
    finally:
        subprocess.run([*BUILD, "--clean"], cwd=ROOT, check=True)
    return pure or compiled


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
