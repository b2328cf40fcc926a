"""Fixtures every test folder shares: a real server in the test's trio run (``server``), in a
thread of its own (``threaded_server``, ``mock_threaded_server``) and a jumpable clock.

Being in tests/ (a folder without ``__init__.py``), this file also puts tests/ on
``sys.path``, so test modules and folder conftests import the helpers as ``support``. A
folder whose servers need other defaults overrides ``server_config``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import settings
from support import TEST_CONFIG, ThreadedServer, start_server

from lockserver import RunningServer, ServerConfig
from lockserver._build import build

# Hypothesis's per-example deadline (200 ms by default) is an assertion on real elapsed time;
# with the suite on parallel workers on a 2-core machine an example can exceed it for no fault
# of the code under test. Time is not asserted in unit tests here: no deadline.
settings.register_profile("lockserver", deadline=None)
settings.load_profile("lockserver")

#: Set by scripts/test.py to the half it runs (``pure`` or ``compiled``); unset, every test runs.
HALF = "LOCKSERVER_TEST_HALF"

# Which build runs a test (issue 32). The rule, with the timings that justify it in
# scripts/test.py's header:
#
# - both builds: every test whose subject is code the compiled build compiles
#   (``lockserver._build.COMPILED_MODULES``: the protocol, the engine, the door, the shell's
#   request path) or the server answering on the wire through it: tests/protocol, engine,
#   core, server, fuzz, security, trust, faults and the top-level tests of the build and the
#   public surface. These are the tests that can tell the builds apart.
# - ``one_build`` (the pure half only): the folders of ``ONE_BUILD_FOLDERS``, whose subject is
#   code that is never compiled (the client and its recipes, lockctl, the HTTP face,
#   replication over etcd, tooz, the fault lab, the load harness); they reach the compiled
#   modules only through the protocol and server behaviour the both-builds tests pin equal.
#   A test there that can tell the builds apart (it compares them, or reports which one runs)
#   is marked ``both_builds`` and runs in both.
# - ``build_independent`` (the compiled half only: the install tests take its wheel): tests
#   that read only the sources or build and install their own wheels.
#
# A test missing from one half runs in the other: no test is dropped. Without the variable
# (a plain ``pytest`` run), every test runs.

#: Folders of tests/ whose tests are ``one_build`` (unless marked ``both_builds``): why.
ONE_BUILD_FOLDERS = {
    "bench": "the load harness and its oracles (lockbench, benchmarks/): never compiled",
    "client": "the client library: never compiled; the protocol it uses is pinned in both",
    "recipes": "the client's lock recipes: never compiled",
    "lockctl": "the operator CLI (on the client): never compiled",
    "httpd": "the HTTP face (lockserver.http): never compiled",
    "replication": "replicas over etcd (lockserver.replication): never compiled",
    "tooz": "the tooz driver (on the client): never compiled",
    "lab": "the fault lab: the replicated group under faults (netns, etcd, clocks)",
}
#: The half that deselects each marker: a ``one_build`` test runs in the pure half only, a
#: ``build_independent`` one in the compiled half only.
DESELECTED_IN = {"pure": "build_independent", "compiled": "one_build"}


#: Test files that share state of the host beyond ports and temporary files (network
#: namespaces, nftables tables, the addresses inside them, checked before and after): under
#: pytest-xdist (scripts/test.py) one worker runs all of a group's tests, one after the other.
#: (The lab's runs, tests/lab/test_lab_run.py, each build a lab of their own, under a fresh run
#: id, as labs of other processes on the machine do: they need no group; the rest of tests/lab
#: computes on histories.)
HOST_STATE_FILES = {"lab/test_lab_netns.py": "host-network"}

#: Test files whose tests are long and mostly wait on real time (the lab's runs: 45-67 s each,
#: ~0.6 of a CPU): moved to the front of the collection, so that the workers start them first
#: and they overlap the CPU-bound rest (and the compiled wheel's build) instead of trailing it.
START_FIRST = ("lab/test_lab_run.py",)


def _relative(item: pytest.Item) -> str:
    """The item's file, relative to tests/, with ``/`` separators."""
    return Path(str(item.path)).relative_to(Path(__file__).parent).as_posix()


def pytest_itemcollected(item: pytest.Item) -> None:
    """Group the tests of ``HOST_STATE_FILES`` on one xdist worker; mark the tests of
    ``ONE_BUILD_FOLDERS`` ``one_build`` unless they are ``both_builds``."""
    relative = _relative(item)
    if relative in HOST_STATE_FILES:
        item.add_marker(pytest.mark.xdist_group(HOST_STATE_FILES[relative]))
    folder = relative.split("/")[0] if "/" in relative else ""
    if folder in ONE_BUILD_FOLDERS and item.get_closest_marker("both_builds") is None:
        item.add_marker(pytest.mark.one_build(ONE_BUILD_FOLDERS[folder]))


def _half(item: pytest.Item) -> str:
    """The half of scripts/test.py that runs ``item``: ``pure``, ``compiled`` or ``both``."""
    if item.get_closest_marker("build_independent") is not None:
        return "compiled"
    if item.get_closest_marker("both_builds") is not None:
        return "both"
    if item.get_closest_marker("one_build") is not None:
        return "pure"
    return "both"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``START_FIRST`` tests first (a stable sort: the rest keep their order); with
    ``LOCKSERVER_TEST_HALF`` set to ``pure`` or ``compiled``, deselect the tests the other half
    runs (``_half``)."""
    items.sort(key=lambda item: _relative(item) not in START_FIRST)
    half = os.environ.get(HALF, "")
    if half not in DESELECTED_IN:
        return
    other = [item for item in items if _half(item) not in (half, "both")]
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = [item for item in items if _half(item) in (half, "both")]


#: The test module whose objects were last handed to ``gc.freeze()`` (``_freeze_between``).
_frozen_after: list[str] = [""]


def _freeze_between_modules(item: pytest.Item) -> None:
    """At the first test of each module, collect, then freeze what survives out of the cyclic
    collector's sight. Why: a worker's heap grows to millions of objects over the suite (every
    module imported, hypothesis's caches), and every full collection walks all of them -- a
    test that calls ``gc.collect()`` per example paid ~0.2 s a call (46 s for one test in the
    suite, 7 s alone). What a test allocates stays collectable; only what outlived the
    previous module is frozen (a test that unfreezes, as test_gc_policy.py does, hands it back
    and the next module freezes it again)."""
    module = item.nodeid.split("::", 1)[0]
    if module != _frozen_after[0]:
        _frozen_after[0] = module
        gc.collect()
        gc.freeze()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``pure_only`` tests run only where the hot modules are pure Python: they count calls
    by patching methods or functions of those modules, and a compiled module's calls to its
    own code do not go through the patched attribute (the same code runs in both builds;
    what they pin is its algorithm). Before that, ``_freeze_between_modules``."""
    _freeze_between_modules(item)
    marker = item.get_closest_marker("pure_only")
    if marker is not None and build() != "pure":
        pytest.skip(f"pure build only: {marker.args[0] if marker.args else 'patches calls'}")


@pytest.fixture
def server_config() -> ServerConfig:
    """The base config of this folder's ``server`` and ``threaded_server`` fixtures."""
    return TEST_CONFIG


@pytest.fixture
async def server(
    nursery: trio.Nursery, server_config: ServerConfig
) -> AsyncIterator[RunningServer]:
    """A real server with ``server_config``, in the test's trio run."""
    yield await start_server(nursery, config=server_config)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that runs at real speed (so socket I/O and fail_after behave) and can be
    jumped forward: ``clock.jump(61)`` skips a session's max age without sleeping. Tests that
    take this fixture run under it (pytest-trio picks up any Clock fixture)."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def threaded_server(server_config: ServerConfig) -> Iterator[ThreadedServer[RunningServer]]:
    """A real server in a thread of its own (port 0), stopped cleanly after the test."""
    ts: ThreadedServer[RunningServer] = ThreadedServer(config=server_config).start()
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture
def mock_threaded_server(server_config: ServerConfig) -> Iterator[ThreadedServer[RunningServer]]:
    """A threaded server whose trio run uses a MockClock(rate=1.0): ``ts.jump(61)``."""
    clock = trio.testing.MockClock(rate=1.0)
    ts: ThreadedServer[RunningServer] = ThreadedServer(clock=clock, config=server_config).start()
    try:
        yield ts
    finally:
        ts.stop()
