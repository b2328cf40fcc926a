"""Fixtures of the fault tests: a real server on 127.0.0.1, port 0, in the test's trio run,
and a MockClock that runs at real speed but can be jumped (for timeouts and expiry)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from lockserver import RunningServer, ServerConfig, serve


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time at real speed; ``clock.jump(s)`` skips ``s`` seconds. A test that takes
    this fixture runs under it (pytest-trio picks up a Clock fixture)."""
    return trio.testing.MockClock(rate=1.0)


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A server with the default settings on an ephemeral loopback port."""
    running: RunningServer = await nursery.start(serve, ServerConfig(host="127.0.0.1", port=0))
    yield running
