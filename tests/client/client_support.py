"""Support code for the client tests that test modules import by name (a uniquely named
module: every test folder has its own conftest.py, so ``from conftest import`` is ambiguous).
The servers are the suite's (tests/support.py): ``start_server`` and ``ThreadedServer`` are
re-exported from there."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import trio
from support import TEST_CONFIG, ThreadedServer, start_server

from lockserver import RunningServer

#: The servers are re-exported from tests/support.py, so test modules import them from here.
__all__ = ["TEST_CONFIG", "ThreadedServer", "server_on", "start_server", "wait_until"]


def server_on(port: int) -> Callable[[trio.Nursery], Awaitable[RunningServer]]:
    """For ThreadedServer: start the real server on ``port`` (a restart on the same port)."""

    async def start(nursery: trio.Nursery) -> RunningServer:
        return await start_server(nursery, port=port)

    return start


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Test-side setup for the sync face: poll ``predicate`` until true, bounded by
    ``timeout`` (a bound on the wait, not an assertion about elapsed time)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)
