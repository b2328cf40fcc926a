"""Lock-lost (issue #5, client side): the async face cancels the protected block and raises
LockLostError at the ``async with``; the sync face raises at the next operation on the lock;
a crashed holder's locks go to the waiters once its session expires; events are matched to
the grant by fence (even when they arrive before the acquire's reply is digested).

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import socket
import time

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, ThreadedServer, waiters

from client import (
    AsyncMutex,
    LockClient,
    LockLost,
    LockLostError,
    LostReason,
    Mutex,
    Result,
    Status,
    open_lock_client,
)
from client.recipes import MUTEX_TABLE
from lockserver import RunningServer
from protocol import Cause, TransactionResult


@on_both_loops
async def test_trio_body_is_cancelled_when_the_session_is_ended(server: RunningServer) -> None:
    """Another connection ends the holder's session: the LockLost(ended) event cancels the
    ``async with`` body at its next checkpoint, and the block raises LockLostError."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as s,
        ):
            m = AsyncMutex(s, NS, "body")
            reached_the_end = False
            with pytest.raises(LockLostError) as info:
                async with m:
                    assert await admin.end_session(s.id)
                    await anyio.sleep_forever()
                    reached_the_end = True  # pragma: no cover
            assert not reached_the_end
            event = info.value.event
            assert event is not None and event.reason is LostReason.ENDED
            assert not m.held and m.lost


async def test_trio_body_is_cancelled_when_the_session_expires(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A holder whose session expires (no keepalive, a silent client) loses the lock: the
    body is cancelled, on_lost runs, and the lock goes to the next holder.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(60):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=5, keepalive=False) as s,
            c.session() as other,
        ):
            calls: list[LockLost] = []
            m = AsyncMutex(s, NS, "exp", on_lost=calls.append)
            with pytest.raises(LockLostError):
                async with m:
                    clock.jump(6)
                    await anyio.sleep_forever()
            assert [e.reason for e in calls] == [LostReason.EXPIRED]
            assert await AsyncMutex(other, NS, "exp").acquire(blocking=False)


@on_both_loops
async def test_a_body_that_finishes_after_a_loss_still_raises(server: RunningServer) -> None:
    """A loss during a body that never reaches a checkpoint afterwards is still reported at
    the ``async with`` (the body ran unprotected)."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as s,
        ):
            m = AsyncMutex(s, NS, "late")
            with pytest.raises(LockLostError):
                async with m:
                    await admin.end_session(s.id)
                    await m.wait_lost()  # the event is in; no checkpoint follows


@on_both_loops
async def test_the_bodys_own_error_is_not_masked(server: RunningServer) -> None:
    """An exception from the body propagates unchanged (the lock is released)."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            m = AsyncMutex(s, NS, "err")
            with pytest.raises(ZeroDivisionError):
                async with m:
                    1 / 0  # noqa: B018
            assert not m.held
            assert await AsyncMutex(s, NS, "err").acquire(blocking=False)


async def test_a_crashed_holder_frees_its_lock_for_a_waiter(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """The holder's connection dies (the process crashed: no release, no end); once its
    session expires, the waiter parked on the server gets the lock.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(60):
        async with open_lock_client(port=server.port) as c, c.session() as waiter_session:
            async with open_lock_client(port=server.port) as doomed:
                s = doomed.session(max_age=5)
                assert await AsyncMutex(s, NS, "crash").acquire()
                assert doomed._conn is not None
                doomed._conn.sock.shutdown(socket.SHUT_RDWR)  # the crash
            waiter = AsyncMutex(waiter_session, NS, "crash")
            got: list[bool] = []

            async def wait_for_it() -> None:
                got.append(await waiter.acquire())

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(wait_for_it)
                await until(lambda: on_server(waiters, server) == 1)
                clock.jump(6)
            assert got == [True] and waiter.held


def _result(fence: int) -> Result:
    return Result(
        TransactionResult(
            Status.TRANSACTION_OK,
            Cause.UNSPECIFIED,
            "",
            "host",
            1.0,
            1.0,
            data=(("grant", {"set_at": 1.0, "expires_at": None}),),
            fence=fence,
            valid_until=61.0,
        )
    )


@on_both_loops
async def test_an_event_before_the_reply_is_matched_by_fence(server: RunningServer) -> None:
    """The event of a very short grant can be dispatched before the acquiring caller digests
    its reply: events seen while acquiring are kept and matched once the fence is known. An
    event about an older grant (another fence) or another variable is not a loss."""
    async with open_lock_client(port=server.port) as c, c.session() as s:
        m = AsyncMutex(s, NS, "early")
        plan = m._start_acquire(True, None, 0.0)
        s._deliver(LockLost(s.id, LostReason.EXPIRED, ((NS, MUTEX_TABLE, "early", 41),)))
        s._deliver(LockLost(s.id, LostReason.TTL, ((NS, MUTEX_TABLE, "other", 42),)))
        assert m._attempt_done(plan, _result(42), 0.0, 0.0) is True
        assert not m.lost  # neither event was about fence 42 of this lock
        m._forget()

        plan = m._start_acquire(True, None, 0.0)
        early = LockLost(s.id, LostReason.TTL, ((NS, MUTEX_TABLE, "early", 43),))
        s._deliver(early)
        assert m._attempt_done(plan, _result(43), 0.0, 0.0) is True
        assert m.lost and m.lost_event_info is early and m.lost_event.is_set()
        with pytest.raises(LockLostError):
            m.check()
        with pytest.raises(LockLostError):  # acquiring over a lost grant reports it once
            await m.acquire(blocking=False)
        assert not m.held


def test_sync_loss_is_raised_at_the_next_operation(threaded_server: ThreadedServer) -> None:
    """Sync face: after another connection ends the holder's session, check() (which reads
    pending events first) raises LockLostError, and so does release(); the lost_event is
    set and on_lost ran in the reading thread."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c, LockClient(port=port, timeout=5) as admin:
        s = c.session(keepalive=False)
        calls: list[LockLost] = []
        m = Mutex(s, NS, "sync-lost", on_lost=calls.append)
        assert m.acquire()
        m.check()
        assert admin.end_session(s.id)
        raised = False
        deadline = time.monotonic() + 5
        while not raised and time.monotonic() < deadline:
            try:
                m.check()  # reads what has arrived, then checks
            except LockLostError:
                raised = True
        assert raised and m.lost and m.lost_event.is_set() and len(calls) == 1
        assert calls[0].reason is LostReason.ENDED
        with pytest.raises(LockLostError):
            m.release()
        assert not m.held and m.release() is False


def test_sync_with_block_raises_when_the_lock_was_lost(threaded_server: ThreadedServer) -> None:
    """Sync face: a ``with`` block whose lock was lost meanwhile raises LockLostError at its
    end (the release finds the entry gone, even before any event was read)."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c, LockClient(port=port, timeout=5) as admin:
        s = c.session(keepalive=False)
        m = Mutex(s, NS, "sync-with")
        with pytest.raises(LockLostError), m:
            assert admin.end_session(s.id)
        assert not m.held


def test_sync_ttl_loss_under_a_mock_clock(mock_threaded_server: ThreadedServer) -> None:
    """Sync face, server time jumped: a TTL that runs out is a loss; refresh() says so."""
    ts = mock_threaded_server
    with LockClient(port=ts.port, timeout=5) as c, c.session() as s:
        m = Mutex(s, NS, "sync-ttl", ttl=5)
        assert m.acquire()
        m.refresh()
        ts.jump(6)
        with pytest.raises(LockLostError):
            m.refresh()
        assert m.lost
        with pytest.raises(LockLostError):
            m.release()
