"""Support code for the client tests that test modules import by name (a uniquely named
module: every test folder has its own conftest.py, so ``from conftest import`` is ambiguous)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import attrs
import trio

from lockserver import RunningServer, ServerConfig, serve

T = TypeVar("T")

#: Settings every test server gets unless a test overrides them.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING")


async def start_server(nursery: trio.Nursery, **overrides: Any) -> RunningServer:
    """Start the real ``serve`` in ``nursery`` with TEST_CONFIG plus ``overrides`` (e.g.
    ``port=`` a port a stopped server used: a restart)."""
    running: RunningServer = await nursery.start(serve, attrs.evolve(TEST_CONFIG, **overrides))
    return running


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


class ThreadedServer(Generic[T]):
    """A server running in a thread with its own ``trio.run``, for the sync face's tests.

    ``start(nursery)`` starts the server in that run and returns it (``.server``); ``call``
    runs a sync function inside the server's run; ``stop`` cancels it and joins the thread.
    """

    def __init__(self, start: Callable[[trio.Nursery], Awaitable[T]]) -> None:
        self._start = start
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-server", daemon=True)
        self.server: T

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._token = trio.lowlevel.current_trio_token()
                self.server = await self._start(nursery)
                self._ready.set()

        try:
            trio.run(main)
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> ThreadedServer[T]:
        self._thread.start()
        assert self._ready.wait(10), "the test server did not start"
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port  # type: ignore[attr-defined, no-any-return]

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` inside the server's trio run and return its result."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def acall(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``await afn(*args)`` inside the server's trio run and return its result."""
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def stop(self) -> None:
        """Shut the server down gracefully when it can (``aclose``), then end its run."""
        if self._thread.is_alive():
            assert self._scope is not None
            aclose = getattr(self.server, "aclose", None)
            if aclose is not None:
                self.acall(aclose)  # bounded by the server's own shutdown grace
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
            self._thread.join(10)
            assert not self._thread.is_alive(), "the test server did not stop"
        if self._error is not None:
            raise self._error
