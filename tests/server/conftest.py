"""Fixtures of the server tests: a real server on 127.0.0.1, port 0, in the test's trio run."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from lockserver import RunningServer, ServerConfig, serve

#: Settings every test server gets unless a test overrides them.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0)


async def start_server(nursery: trio.Nursery, **overrides: Any) -> RunningServer:
    """Start ``serve`` in ``nursery`` with TEST_CONFIG plus ``overrides``."""
    config = attrs.evolve(TEST_CONFIG, **overrides)
    running: RunningServer = await nursery.start(serve, config)
    return running


@pytest.fixture
async def server(nursery: trio.Nursery) -> AsyncIterator[RunningServer]:
    """A server with the default settings."""
    yield await start_server(nursery)


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that runs at real speed (so socket I/O and fail_after behave) and can
    be jumped forward: ``clock.jump(61)`` skips a session's max age without sleeping. Tests
    that take this fixture run under it (pytest-trio picks up any Clock fixture)."""
    return trio.testing.MockClock(rate=1.0)
