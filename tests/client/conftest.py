"""Fixtures of the client tests: a real server (in the test's trio run, or in a thread of its
own for the sync face) and a fake one with fault knobs (``fake_lockserver``)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, Generic, TypeVar

import attrs
import pytest
import trio
import trio.testing
from fake_lockserver import FakeServer

from lockserver import RunningServer, ServerConfig, serve

#: Settings every test server gets unless a test overrides them.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING")

T = TypeVar("T")


async def start_server(nursery: trio.Nursery, **overrides: Any) -> RunningServer:
    """Start the real ``serve`` in ``nursery`` with TEST_CONFIG plus ``overrides``."""
    running: RunningServer = await nursery.start(serve, attrs.evolve(TEST_CONFIG, **overrides))
    return running


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
