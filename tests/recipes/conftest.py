"""Fixtures of the recipe tests: a real server on 127.0.0.1, port 0 — in the test's trio run
(``server``), or in a thread of its own for the sync face (``threaded_server``,
``mock_threaded_server`` under a MockClock)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import trio
import trio.testing
from recipes_support import ThreadedServer, start_server

from lockserver import RunningServer


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A real server with the test settings, in the test's trio run."""
    yield await start_server(nursery)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time at real speed that tests jump forward (``clock.jump(61)``); tests taking
    this fixture run under it (pytest-trio picks up any Clock fixture)."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def threaded_server() -> Iterator[ThreadedServer]:
    """A real server in a thread of its own (port 0), stopped after the test."""
    ts = ThreadedServer().start()
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture
def mock_threaded_server() -> Iterator[ThreadedServer]:
    """A threaded server whose trio run uses a MockClock(rate=1.0): ``ts.jump(61)``."""
    ts = ThreadedServer(trio.testing.MockClock(rate=1.0)).start()
    try:
        yield ts
    finally:
        ts.stop()
