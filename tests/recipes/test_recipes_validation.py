"""Misuse is refused where the lock is built or called (TypeError/ValueError/RuntimeError),
before anything is sent; a failing on_lost callback is logged, never propagated.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest
from asyncio_support import on_both_loops
from recipes_support import NS

from client import (
    AsyncLockSet,
    AsyncMultiLock,
    AsyncMutex,
    AsyncSemaphore,
    AsyncStateLock,
    AsyncTimeWindowLock,
    LockLost,
    LostReason,
    get_permits,
    open_lock_client,
    set_permits,
)
from client.recipes import MUTEX_TABLE
from client.recipes._base import max_wait_of
from lockserver import RunningServer


@on_both_loops
async def test_constructor_arguments(server: RunningServer) -> None:
    """Names, TTLs, periods, permits, tickets, contracts and callbacks are validated."""
    async with open_lock_client(port=server.port) as c, c.session() as s:
        bad: list[tuple[type[Exception], Any]] = [
            (ValueError, lambda: AsyncMutex(s, " ", "x")),
            (TypeError, lambda: AsyncMutex(s, NS, 5)),
            (ValueError, lambda: AsyncMutex(s, NS, "x", ttl=float("inf"))),
            (ValueError, lambda: AsyncMutex(s, NS, "x", ticket="")),
            (TypeError, lambda: AsyncMutex(s, NS, "x", on_lost=42)),
            (TypeError, lambda: AsyncMutex(s, NS, "x", description=None)),
            (ValueError, lambda: AsyncMutex(s, NS, "x", min_trust=1.5)),
            (ValueError, lambda: AsyncMutex(s, NS, "x", min_uptime=-1)),
            (ValueError, lambda: AsyncSemaphore(s, NS, "x", permits=True)),
            (ValueError, lambda: AsyncTimeWindowLock(s, NS, "x", period=0)),
            (ValueError, lambda: AsyncLockSet(s, NS, [("a", "r"), ("a", "w")])),
            (ValueError, lambda: AsyncLockSet(s, NS, {"": "r"})),
            (ValueError, lambda: AsyncMultiLock(c, NS, " ")),
            (ValueError, lambda: set_permits(s, NS, "x", "rw", 1)),
            (ValueError, lambda: set_permits(s, NS, "x", "r", -1)),
            (TypeError, lambda: get_permits(object(), NS, "x", "r")),  # type: ignore[call-overload]
        ]
        for error, build in bad:
            with pytest.raises(error):
                build()


@on_both_loops
async def test_call_arguments(server: RunningServer) -> None:
    """acquire's blocking/timeout follow threading.Lock (timeout -1 = forever); a lock is
    not re-entered by a second ``async with``; the task's final state is checked."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            m = AsyncMutex(s, NS, "args")
            with pytest.raises(TypeError):
                await m.acquire(blocking=1)  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await m.acquire(timeout=-2)
            assert await m.acquire(timeout=-1)
            await m.release()
            async with m:
                with pytest.raises(RuntimeError):
                    async with m:
                        pass  # pragma: no cover
            with pytest.raises(ValueError):
                await AsyncStateLock(s, NS, "t").release("cancelled")
            assert max_wait_of({"max_wait": 12}) == 12.0
            assert max_wait_of({"max_wait": "x"}) == max_wait_of({}) == 300.0


@on_both_loops
async def test_a_raising_on_lost_callback_is_logged(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """An on_lost callback that raises is logged (logger client.recipes) and the loss is
    still recorded."""

    def boom(event: LockLost) -> None:
        raise RuntimeError("callback bug")

    async with open_lock_client(port=server.port) as c, c.session() as s:
        m = AsyncMutex(s, NS, "cb", on_lost=boom)
        assert await m.acquire()
        assert m.fence is not None
        with caplog.at_level(logging.ERROR, logger="client.recipes"):
            s._deliver(LockLost(s.id, LostReason.ENDED, ((NS, MUTEX_TABLE, "cb", m.fence),)))
        assert m.lost and "callback bug" in caplog.text
