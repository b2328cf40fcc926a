"""Fixtures every test folder shares: a real server in the test's trio run (``server``), in a
thread of its own (``threaded_server``, ``mock_threaded_server``) and a jumpable clock.

Being in tests/ (a folder without ``__init__.py``), this file also puts tests/ on
``sys.path``, so test modules and folder conftests import the helpers as ``support``. A
folder whose servers need other defaults overrides ``server_config``.
"""

from __future__ import annotations

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

#: Set by scripts/test.py for the pure half of its run: the tests marked ``build_independent``
#: or ``one_build`` run in the compiled half only.
SKIP_ONCE = "LOCKSERVER_TEST_SKIP_BUILD_INDEPENDENT"
#: ``build_independent``: they read only the sources (lint, types) or build and install their
#: own wheels, so they cannot tell the builds apart. ``one_build``: long system tests whose
#: subject is the system around the server (etcd, the network, processes); the rest of the
#: suite pins both builds' behaviour equal, so running them twice would test the same thing.
ONCE_MARKERS = ("build_independent", "one_build")


#: Folders of tests/ whose tests share state of the host beyond ports and temporary files
#: (network namespaces, nftables tables, the addresses inside them): under pytest-xdist
#: (scripts/test.py) one worker runs all of a folder's tests, one after the other.
HOST_STATE_FOLDERS = {"lab": "host-network"}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Group the tests of ``HOST_STATE_FOLDERS`` on one xdist worker."""
    parts = Path(str(item.path)).relative_to(Path(__file__).parent).parts
    if len(parts) > 1 and parts[0] in HOST_STATE_FOLDERS:
        item.add_marker(pytest.mark.xdist_group(HOST_STATE_FOLDERS[parts[0]]))


def _once(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(name) for name in ONCE_MARKERS)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``LOCKSERVER_TEST_SKIP_BUILD_INDEPENDENT=1``, deselect the tests marked
    ``build_independent`` or ``one_build``: the other half of scripts/test.py runs them."""
    if os.environ.get(SKIP_ONCE) != "1":
        return
    once = [item for item in items if _once(item)]
    if once:
        config.hook.pytest_deselected(items=once)
        items[:] = [item for item in items if not _once(item)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``pure_only`` tests run only where the hot modules are pure Python: they count calls
    by patching methods or functions of those modules, and a compiled module's calls to its
    own code do not go through the patched attribute (the same code runs in both builds;
    what they pin is its algorithm)."""
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
