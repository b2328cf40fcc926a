"""Support code for the client tests that test modules import by name (a uniquely named
module: every test folder has its own conftest.py, so ``from conftest import`` is ambiguous).
The servers are the suite's (tests/support.py): ``start_server`` and ``ThreadedServer`` are
re-exported from there."""

from __future__ import annotations

import socket
import time
from collections.abc import Awaitable, Callable

import attrs
import trio
from support import TEST_CONFIG, ThreadedServer, start_server

from lockserver import RunningServer, serve
from lockserver.shell._server import GroupIdentity

#: The servers are re-exported from tests/support.py, so test modules import them from here.
__all__ = [
    "TEST_CONFIG",
    "GroupIdentity",
    "Replica",
    "ThreadedServer",
    "free_port",
    "server_on",
    "start_replica",
    "start_server",
    "wait_until",
]


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


def free_port() -> int:
    """A loopback port that was free a moment ago (for servers that must know each other's
    address before they start: the replicas of a test group)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.define
class Replica:
    """A real server started as one replica of a test group (``start_replica``): standalone
    servers that do not share state, but whose welcome may say one group's name, instance
    and replicas (``GroupIdentity``, the server's internal hook), which is all a client sees
    of a group. ``crash()`` cancels the server: every connection closes at once with nothing
    said (as a killed process looks to its clients); ``running.aclose()`` is a graceful
    stop."""

    running: RunningServer
    scope: trio.CancelScope

    @property
    def id(self) -> str:
        return f"127.0.0.1:{self.running.port}"

    def crash(self) -> None:
        self.scope.cancel()


async def start_replica(
    nursery: trio.Nursery, *, port: int = 0, group: GroupIdentity | None = None
) -> Replica:
    """Start the real ``serve`` on 127.0.0.1:``port`` in its own cancel scope, with the
    welcome identity ``group`` (None: a standalone server's)."""
    scope = trio.CancelScope()

    async def run(task_status: trio.TaskStatus[RunningServer]) -> None:
        with scope:
            config = attrs.evolve(TEST_CONFIG, port=port)
            await serve(config, task_status=task_status, group=group)

    running: RunningServer = await nursery.start(run)
    return Replica(running, scope)
