"""Semaphore, TimeWindowLock (seed 004 "Timeout") and StateLock (seed 004 "State
transition") on the async face; time windows under a MockClock.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, entries, waiters

from client import (
    AsyncSemaphore,
    AsyncSession,
    AsyncStateLock,
    AsyncTimeWindowLock,
    LockLostError,
    open_lock_client,
)
from client.recipes import DONE, FAILED, IN_PROGRESS, SEMAPHORE_TABLE, STATE_TABLE, WINDOW_TABLE
from lockserver import RunningServer

# --- Semaphore --------------------------------------------------------------------------------


@on_both_loops
async def test_semaphore_admits_at_most_n(server: RunningServer) -> None:
    """permits=3: three sessions hold at once, the fourth waits (on the server) until one
    releases; a non-holder's release answers False."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            sessions = [c.session() for _ in range(4)]
            sems = [AsyncSemaphore(s, NS, "pool", permits=3) for s in sessions]
            for sem in sems[:3]:
                assert await sem.acquire(blocking=False)
            assert not await sems[3].acquire(blocking=False)
            assert sems[3].last_result is not None
            assert sems[3].last_result.failed_statement == "1:/AssertOp/"
            assert len(await entries(sessions[0], SEMAPHORE_TABLE, "pool")) == 3
            assert await sems[3].release() is False
            got: list[bool] = []

            async def wait_for_a_permit() -> None:
                got.append(await sems[3].acquire())

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(wait_for_a_permit)
                await until(lambda: on_server(waiters, server) == 1)
                assert await sems[1].release() is True
            assert got == [True]
            holders = {e["session"] for e in await entries(sessions[0], SEMAPHORE_TABLE, "pool")}
            assert holders == {sessions[i].id for i in (0, 2, 3)}
            for s in sessions:
                await s.end()


@on_both_loops
async def test_semaphore_one_permit_per_session(server: RunningServer) -> None:
    """The data model allows one entry per session and variable: a second acquire in the
    same session is not granted while the first permit is held."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            first = AsyncSemaphore(s, NS, "sem1", permits=5)
            second = AsyncSemaphore(s, NS, "sem1", permits=5)
            assert await first.acquire(blocking=False)
            assert not await second.acquire(blocking=False)
            assert second.last_result is not None
            assert second.last_result.failed_statement == "0:/IfOp/AbortOp/"
            await first.release()
            assert await second.acquire(blocking=False)
            with pytest.raises(ValueError):
                AsyncSemaphore(s, NS, "bad", permits=0)


# --- TimeWindowLock ---------------------------------------------------------------------------


async def start_of_a_window(s: AsyncSession, period: float, clock: trio.testing.MockClock) -> None:
    """Jump (virtual time) to the start of a fresh window, so that no window boundary of the
    wall clock falls between the test's steps."""
    probe = AsyncTimeWindowLock(s, NS, "probe", period=period)
    assert await probe.acquire(blocking=False)
    assert probe.window_ends_at is not None and probe.last_result is not None
    clock.jump(probe.window_ends_at - probe.last_result.server_uptime + 0.001)


async def test_time_window_once_per_period(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """The first acquire of a window wins; others fail until the next window, which frees it
    by itself (no release). The window's end is not a loss.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(60):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            await start_of_a_window(a, 10, clock)
            wa = AsyncTimeWindowLock(a, NS, "hourly", period=10)
            wb = AsyncTimeWindowLock(b, NS, "hourly", period=10)
            assert await wa.acquire(blocking=False)
            assert wa.window_ends_at is not None and wa.last_result is not None
            left = wa.window_ends_at - wa.last_result.server_uptime
            assert 9 < left <= 10
            assert 0 < wa.valid_for() <= left
            assert not await wb.acquire(blocking=False)
            assert not await AsyncTimeWindowLock(a, NS, "hourly", period=10).acquire(blocking=False)
            [record] = await entries(a, WINDOW_TABLE, "hourly")
            assert record["expires_at"] == pytest.approx(wa.window_ends_at)
            clock.jump(left)
            assert await wb.acquire(blocking=False)
            assert not wa.lost  # the end of a window is not a loss
            assert await wa.acquire(blocking=False) is False  # b has this window
            assert wb.fence is not None and wa.fence is None


async def test_time_window_blocking_waits_for_the_next_window(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A blocking acquire of a taken window is parked until the window ends; ``async with``
    keeps the window when the block ends; release() gives it back early.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(60):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            await start_of_a_window(a, 30, clock)
            wa = AsyncTimeWindowLock(a, NS, "nightly", period=30)
            async with wa:
                assert wa.held
            assert not wa.held  # forgotten locally, kept on the server
            wb = AsyncTimeWindowLock(b, NS, "nightly", period=30)
            assert not await wb.acquire(blocking=False)
            got: list[bool] = []

            async def next_window() -> None:
                got.append(await wb.acquire())

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(next_window)
                await until(lambda: on_server(waiters, server) == 1)
                clock.jump(30)
            assert got == [True]
            assert await wb.release() is True  # given back early
            assert await wa.acquire(blocking=False)


# --- StateLock --------------------------------------------------------------------------------


@on_both_loops
async def test_task_state_transitions(server: RunningServer) -> None:
    """done (initial) -> in_progress (exclusive claim) -> failed -> in_progress -> done; the
    newest final state wins; a claimed task cannot be claimed again."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as w1,
            c.session() as w2,
        ):
            t1, t2 = AsyncStateLock(w1, NS, "task-7"), AsyncStateLock(w2, NS, "task-7")
            assert await t2.state() == DONE
            assert await t1.acquire(blocking=False)
            assert t1.previous_state == DONE and t1.task == "task-7"
            assert await t2.state() == IN_PROGRESS
            assert not await t2.acquire(blocking=False)
            assert await t1.release(FAILED) is True
            assert t1.previous_state is None
            assert await t2.state() == FAILED
            assert await t2.acquire(blocking=False)
            assert t2.previous_state == FAILED
            assert await t2.release(DONE)
            assert await t1.state() == DONE
            records = await entries(w1, STATE_TABLE, "task-7")
            assert sorted(r["value"] for r in records) == [DONE, FAILED]
            with pytest.raises(ValueError):
                await t1.release("in_progress")
            assert await t1.release() is False  # not held


@on_both_loops
async def test_task_with_block_records_done_or_failed(server: RunningServer) -> None:
    """``async with task:`` records done, or failed when the block raised."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as w:
            task = AsyncStateLock(w, NS, "job")
            async with task:
                assert await task.state() == IN_PROGRESS
            assert await task.state() == DONE
            with pytest.raises(KeyError):
                async with task:
                    raise KeyError("boom")
            assert await task.state() == FAILED


@on_both_loops
async def test_a_dead_worker_loses_its_claim(server: RunningServer) -> None:
    """A worker whose session ends (crash, expiry) loses its claim instead of leaving the
    task stuck in_progress: the task shows its last final state and can be claimed again.
    Limit (documented): a state record lives as long as the session that wrote it."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as watcher,
            c.session() as w1,
        ):
            first = AsyncStateLock(w1, NS, "etl")
            assert await first.acquire()
            assert await first.release(FAILED)
            w2 = c.session()
            dying = AsyncStateLock(w2, NS, "etl")
            assert await dying.acquire()
            assert await AsyncStateLock(watcher, NS, "etl").state() == IN_PROGRESS
            assert await admin.end_session(w2.id)  # the worker is gone
            assert await AsyncStateLock(watcher, NS, "etl").state() == FAILED
            with pytest.raises(LockLostError):
                await dying.release(DONE)
            again = AsyncStateLock(watcher, NS, "etl")
            assert await again.acquire(blocking=False)
            assert again.previous_state == FAILED
            await again.release(DONE)
            await w1.end()  # its "failed" record goes with it; watcher's "done" remains
            assert await again.state() == DONE
