"""Fixtures of the client tests: a fake server with fault knobs (``fake_lockserver``), in the
test's trio run or in a thread of its own. The real server (``server``, ``threaded_server``)
and ``clock`` are the suite's fixtures (tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import trio
from client_support import ThreadedServer
from fake_lockserver import FakeServer


async def start_fake(nursery: trio.Nursery) -> FakeServer:
    """Start a FakeServer in ``nursery``."""
    fake = FakeServer()
    await nursery.start(fake.serve)
    return fake


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeServer]:
    """A fake server (real engine, fault knobs) in the test's trio run."""
    yield await start_fake(nursery)


@pytest.fixture
def threaded_fake() -> Iterator[ThreadedServer[FakeServer]]:
    """A fake server in a thread of its own, stopped after the test."""
    ts = ThreadedServer(start_fake).start()
    try:
        yield ts
    finally:
        ts.stop()
