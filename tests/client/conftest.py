"""Fixtures of the client tests: a real server (in the test's trio run, or in a thread of its
own for the sync face) and a fake one with fault knobs (``fake_lockserver``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

import pytest
import trio
import trio.testing
from client_support import ThreadedServer, start_server
from fake_lockserver import FakeServer

from lockserver import RunningServer

T = TypeVar("T")


async def start_fake(nursery: trio.Nursery) -> FakeServer:
    """Start a FakeServer in ``nursery``."""
    fake = FakeServer()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A real server with the test settings, in the test's trio run."""
    yield await start_server(nursery)


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeServer]:
    """A fake server (real engine, fault knobs) in the test's trio run."""
    yield await start_fake(nursery)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time at real speed that tests can jump forward (``clock.jump(61)``); tests
    taking this fixture run under it (pytest-trio picks up any Clock fixture)."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
def threaded_server() -> Iterator[ThreadedServer[RunningServer]]:
    """A real server in a thread of its own (port 0), stopped cleanly after the test."""
    ts = ThreadedServer(start_server).start()
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture
def threaded_fake() -> Iterator[ThreadedServer[FakeServer]]:
    """A fake server in a thread of its own, stopped after the test."""
    ts = ThreadedServer(start_fake).start()
    try:
        yield ts
    finally:
        ts.stop()
