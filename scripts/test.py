"""Run the whole test suite twice: pure Python, then with the hot modules compiled (issues 19
and 32).

``python scripts/test.py [PYTEST ARGS...]`` is the README's test command (and CI's, .ci/run):

1. removes any compiled build from the checkout; when this machine can compile (a C compiler,
   the Python headers), starts building the compiled wheel in the background, at a lower
   priority, as ``pip install .`` builds it (hatch_build.py, the wheel's build hook);
2. runs ``python -m pytest ARGS`` with ``LOCKSERVER_TEST_BUILD=pure`` and
   ``LOCKSERVER_TEST_HALF=pure``: every test but those marked ``build_independent``;
3. puts the wheel's compiled files into the checkout (the in-place compiled build:
   the same files ``scripts/mypyc_build.py`` writes) and runs ``LOCKSERVER_TEST_BUILD=compiled``
   and ``LOCKSERVER_TEST_HALF=compiled``: every test but those marked ``one_build``, handing the
   wheel to the install tests (``LOCKSERVER_TEST_COMPILED_WHEEL``) so that they do not compile
   it a second time;
4. removes the compiled build again: the checkout is left pure, as it is by default.

Which half runs a test (tests/conftest.py applies the rule; tests/test_test_command.py pins it):

- **both halves**: the tests that can tell the builds apart: those whose subject is code the
  compiled build compiles (``lockserver._build.COMPILED_MODULES``: the protocol, the engine and
  its door, the shell's request path) or the server answering through it on the wire --
  tests/protocol, engine, core, server, fuzz, security, trust, faults, the build and
  public-surface tests, the quick start -- and, elsewhere, the tests marked ``both_builds``
  (they compare the builds or report which one runs).
- **the pure half only** (``one_build``): the folders of ``ONE_BUILD_FOLDERS`` in
  tests/conftest.py, whose subject is never compiled: the client and its recipes, lockctl,
  the HTTP face, replication over etcd, tooz, the fault lab, the load harness. They reach the
  compiled modules only through the protocol and the server, whose behaviour the both-halves
  tests pin equal in the two builds. They run pure, the reference, while the wheel builds.
- **the compiled half only** (``build_independent``): the tests that read only the sources
  (ruff, mypy, the layering, this script's split) or build and install their own wheels
  (tests/install, which take this run's compiled wheel).

No test is dropped: each runs in at least one half (a plain ``pytest`` run, without
``LOCKSERVER_TEST_HALF``, runs all of them). Without a C compiler or the Python headers the
compiled half is skipped with a message saying what is missing, and the pure half runs every
test. The exit status is non-zero when either run fails or the build fails.

Each run spreads its tests over parallel workers (pytest-xdist, ``--dist loadgroup``: tests
that share an expensive fixture or the host's state name an ``xdist_group``) unless ``-n`` is
given (``-n 0`` or ``-p no:xdist``: one process; ``LOCKSERVER_TEST_WORKERS`` sets the
number): the pure half one per CPU and two more, the compiled half one per CPU and one more.
The extra workers are for the tests that wait on real time rather than compute (the lab's
runs, ~0.6 of a CPU for up to 67 s each; etcd clusters; replicas' clocks), which
tests/conftest.py starts first; all of them are in the pure half.

The second extra worker of the pure half, measured on the 2-core machine (2026-11-28, quiet,
at bac4926 and e0d2c3a, install not counted): with one extra worker the pure half took
267 s and the compiled half 74 s (341 s: the whole command's CPU 9 min 1 s user + 1 min 9 s
sys, so the two CPUs were ~90 % busy, idle mostly in the pure half); with two, 234-259 s and
69-79 s (306-338 s), in six runs of which one failed on a harness check the load exposed
(fixed: tests/bench/test_bench_bigtable.py's kernel stamps). The compiled half gains nothing
from a fourth worker: it computes.

Measured on the project's 2-core machine (2026-11-28), the whole README command in a fresh
clone (venv and install included), one quiet sitting (``/work/bin/quiet-run``), at 4ec2a03:
318 s (5 min 19 s): install 22, pure half 234 (3,251 tests; the wheel built meanwhile, waited
0 s for it), compiled half 63 (2,271 tests), exit 0; the run's CPU 465 s user + 57 s sys.
After the stop's merges (issue 31's regression tests, the gRPC transport's tests), on the
merged tree at b1913b9 in its worktree (install not counted), the machine otherwise idle:
317 s: pure half 253 (3,317 tests), compiled half 63 (2,273), exit 0; CPU 505 s user + 62 s
sys; about 5 min 40 s with the install.
What chose the rule, measured on the shared machine (other helpers' jobs running, so compare
duration sums, not wall), -n 2, every test in each build at the commit before (a78b4d3): the
sums of test durations were 1,016 s pure and 972 s compiled (3,558 tests each; wall 527 and
507 s, both runs at once). The tests the new rule keeps out of the compiled half summed 563 s
there (lab 221: its three runs 157 s of wall, ~0.6 of a CPU; replication 137; bench 95;
lockctl 39; client and recipes 50; tooz 19); those it keeps out of the pure half, 240 s
(the install tests 213, of which 178 in the two that build and install the compiled wheel:
this script hands them its own). One determinism test (tests/core, a ``gc.collect()`` per example)
took 46.8 s in the suite against 6.6 s alone: the worker's heap; after ``gc.freeze()`` between
modules (tests/conftest.py) it took 9.9 s in the suite. Before this split, the same command's
last CI run took 574 s (compiled half 314); an earlier quiet sitting, on a smaller suite:
612 s with one process per half, 354 s with 2 workers and every test in the compiled half.
"""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = [sys.executable, str(ROOT / "scripts" / "mypyc_build.py")]
MANIFEST = "lockserver_compiled.sources.json"
#: tests/conftest.py deselects the tests the other half runs when this names a half.
HALF = "LOCKSERVER_TEST_HALF"
#: tests/install/conftest.py takes the compiled wheel from here instead of building it.
WHEEL = "LOCKSERVER_TEST_COMPILED_WHEEL"
#: The workers beyond one per CPU of the pure half: it holds the tests that wait on real
#: time (the lab's runs, etcd clusters, replicas' clocks), and its CPUs were idle a tenth of
#: the time with one more (module docstring); the compiled half computes, with one more.
WAITING_EXTRA = 2


def _parallel(args: list[str], extra: int = 1) -> list[str]:
    """The workers (``-n``: ``LOCKSERVER_TEST_WORKERS``, else one per CPU and ``extra`` more)
    and ``--dist loadgroup``, each unless the caller chose it or disabled the plugin."""
    if "no:xdist" in args:
        return []
    added = []
    if not any(
        a in ("-n", "--numprocesses") or a.startswith(("-n", "--numprocesses=")) for a in args
    ):
        workers = os.environ.get("LOCKSERVER_TEST_WORKERS") or str((os.cpu_count() or 1) + extra)
        added += ["-n", workers]
    if not any(a == "--dist" or a.startswith("--dist=") for a in args):
        added += ["--dist", "loadgroup"]
    return added


def pytest(build: str, args: list[str], env: dict[str, str], *, extra: int = 1) -> int:
    """One run of the suite, saying which build it expects, on one worker per CPU and
    ``extra`` more; its exit status."""
    print(f"=== the test suite, {build} build ===", flush=True)
    started = time.monotonic()
    env = {**os.environ, "LOCKSERVER_TEST_BUILD": build, **env}
    command = [sys.executable, "-m", "pytest", *_parallel(args, extra), *args]
    code = subprocess.run(command, cwd=ROOT, env=env, check=False).returncode
    print(f"=== {build} build: exit {code} in {time.monotonic() - started:.0f} s ===", flush=True)
    return code


def start_wheel_build(out: Path) -> subprocess.Popen[str]:
    """Build the compiled wheel into ``out`` in the background, at a lower priority than the
    tests; its last line of output is the wheel's file name."""
    code = "import sys; from hatchling.build import build_wheel; print(build_wheel(sys.argv[1]))"
    env = {**os.environ, "SKYLOCK_PURE_PYTHON": ""}
    return subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-c", code, str(out)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_wheel_build(job: subprocess.Popen[str], out: Path) -> Path | None:
    """Wait for the wheel; its path, or None (saying why) when the build failed or fell back
    to a pure wheel."""
    started = time.monotonic()
    stdout, stderr = job.communicate()
    waited = time.monotonic() - started
    print(f"=== compiled wheel built (waited {waited:.0f} s for it) ===", flush=True)
    if job.returncode != 0 or "building a pure-Python wheel" in stderr:
        print(stderr, file=sys.stderr)
        return None
    return out / stdout.strip().splitlines()[-1]


def install_in_place(wheel: Path) -> int:
    """Put the wheel's extension files and source manifest into the checkout; how many."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(suffixes) or n == MANIFEST]
        for name in names:
            archive.extract(name, ROOT)
    return len(names)


def main(args: list[str]) -> int:
    subprocess.run([*BUILD, "--clean"], cwd=ROOT, check=True)
    check = subprocess.run(
        [*BUILD, "--check"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if check.returncode != 0:
        pure = pytest("pure", args, {}, extra=WAITING_EXTRA)
        print(f"=== compiled build SKIPPED: {check.stdout.strip()} ===", flush=True)
        return pure
    with tempfile.TemporaryDirectory(prefix="lockserver-test-wheel-") as tmp:
        print("=== building the compiled wheel in the background ===", flush=True)
        job = start_wheel_build(Path(tmp))
        try:
            pure = pytest("pure", args, {HALF: "pure"}, extra=WAITING_EXTRA)
        except BaseException:
            job.kill()
            raise
        wheel = finish_wheel_build(job, Path(tmp))
        if wheel is None:
            print("=== compiled build FAILED ===", flush=True)
            return 1
        try:
            print(f"=== {install_in_place(wheel)} compiled files in place ===", flush=True)
            compiled = pytest("compiled", args, {HALF: "compiled", WHEEL: str(wheel)})
        finally:
            subprocess.run([*BUILD, "--clean"], cwd=ROOT, check=True)
    return pure or compiled


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
