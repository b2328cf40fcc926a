"""Helpers of the recipe tests: a real server in a thread of its own (for the sync face),
optionally under a MockClock that the test jumps from outside."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio.testing

from lockserver import RunningServer, ServerConfig, serve

#: Settings every recipe test server gets unless a test overrides them.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING")
NS = "recipes-test"


async def start_server(nursery: trio.Nursery, **overrides: Any) -> RunningServer:
    """Start the real ``serve`` in ``nursery`` with TEST_CONFIG plus ``overrides``."""
    running: RunningServer = await nursery.start(serve, attrs.evolve(TEST_CONFIG, **overrides))
    return running


class ThreadedServer:
    """A real server in a thread with its own ``trio.run`` (the sync face's tests need one),
    under ``clock`` when given, so a test can ``jump`` the server's time with :meth:`jump`."""

    def __init__(self, clock: trio.testing.MockClock | None = None, **overrides: Any) -> None:
        self.clock = clock
        self._overrides = overrides
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="recipes-server", daemon=True)
        self.server: RunningServer

    def _run(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                self._token = trio.lowlevel.current_trio_token()
                self.server = await start_server(nursery, **self._overrides)
                self._ready.set()

        try:
            trio.run(main, clock=self.clock)
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc
        finally:
            self._ready.set()

    def start(self) -> ThreadedServer:
        self._thread.start()
        assert self._ready.wait(10), "the test server did not start"
        if self._error is not None:
            raise self._error
        return self

    @property
    def port(self) -> int:
        return self.server.port

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` inside the server's trio run."""
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    def acall(self, afn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def jump(self, seconds: float) -> None:
        """Move the server's (mock) clock forward and let its timers run."""
        assert self.clock is not None, "start the server with a MockClock to jump"
        self.call(self.clock.jump, seconds)

    def stop(self) -> None:
        if self._thread.is_alive():
            assert self._scope is not None
            with contextlib.suppress(trio.RunFinishedError):
                self.acall(self.server.aclose)
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
            self._thread.join(10)
            assert not self._thread.is_alive(), "the test server did not stop"
        if self._error is not None:
            raise self._error


async def entries(session: Any, table: str, var: str, namespace: str = NS) -> list[dict[str, Any]]:
    """Every entry record of ``table``/``var`` (read through ``session``, an AsyncSession)."""
    from client import SelectVarValue

    r = await session.execute(
        namespace,
        [SelectVarValue("all", table, var, ignore_this_session=False, select_many=True)],
    )
    return list(r["all"] or [])


def sync_entries(session: Any, table: str, var: str, namespace: str = NS) -> list[dict[str, Any]]:
    """Every entry record of ``table``/``var`` (read through ``session``, a sync Session)."""
    from client import SelectVarValue

    r = session.execute(
        namespace,
        [SelectVarValue("all", table, var, ignore_this_session=False, select_many=True)],
    )
    return list(r["all"] or [])


async def until(predicate: Callable[[], bool], interval: float = 0.005) -> None:
    """Test-side setup only: wait (bounded by the caller's fail_after) until ``predicate()``,
    e.g. until the server has parked a request."""
    while not predicate():
        await trio.sleep(interval)


def waiters(server: RunningServer) -> int:
    """Parked transactions on the server (call from the server's trio run)."""
    return int(server.statistics()["waiting"]["waiters"])
