"""Mutex (seeds 000, 001) on the async face: exclusivity, tickets, who may release, TTL,
acquired_at, fences, waiting on the server (no polling), timeouts and cancellation.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import logging
import re

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, entries, waiters

from client import (
    AsyncMutex,
    Cause,
    LockLostError,
    LostReason,
    NotAcquired,
    open_lock_client,
)
from client.recipes import MUTEX_TABLE
from lockserver import RunningServer


@on_both_loops
async def test_exclusive_with_a_random_ticket_per_grant(server: RunningServer) -> None:
    """One holder at a time; the entry's value is the holder's ticket (uuid4 hex, fresh per
    grant); a second holder fails at the SetVar; after the release the next one gets a larger
    fence."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            ma, mb = AsyncMutex(a, NS, "printer"), AsyncMutex(b, NS, "printer")
            assert await ma.acquire(blocking=False)
            assert ma.held and ma.fence is not None and ma.ticket is not None
            assert len(ma.ticket) == 32 and int(ma.ticket, 16) >= 0
            [record] = await entries(a, MUTEX_TABLE, "printer")
            assert record["value"] == ma.ticket and record["session"] == a.id
            assert record["fence"] == ma.fence
            assert not await mb.acquire(blocking=False)
            assert mb.last_result is not None
            assert mb.last_result.failed_statement == "0:/AssertOp/"
            assert not mb.held and mb.fence is None
            first_ticket, first_fence = ma.ticket, ma.fence
            assert await ma.release() is True
            assert not ma.held and ma.ticket is None
            assert await entries(a, MUTEX_TABLE, "printer") == []
            assert await mb.acquire(blocking=False)
            assert mb.fence is not None and mb.fence > first_fence
            assert mb.ticket != first_ticket
            await mb.release()
            assert await ma.acquire(blocking=False)
            assert ma.ticket != first_ticket  # a fresh ticket per grant


@on_both_loops
async def test_nobody_releases_another_holders_mutex(server: RunningServer) -> None:
    """A release by an object that does not hold answers False without a call; another
    session with the holder's very ticket cannot release it either (DeleteVar touches only
    the caller's own entries); a wrong ticket in the holder's session is refused too."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            holder = AsyncMutex(a, NS, "m")
            assert await holder.acquire()
            sent = c.local_statistics().requests_sent
            assert await AsyncMutex(b, NS, "m").release() is False
            assert c.local_statistics().requests_sent == sent  # no call
            assert holder.ticket is not None
            assert await AsyncMutex(b, NS, "m", ticket=holder.ticket).release() is False
            assert await AsyncMutex(a, NS, "m", ticket="someone-else").release() is False
            assert [e["value"] for e in await entries(a, MUTEX_TABLE, "m")] == [holder.ticket]
            assert await holder.release() is True


async def test_seed_001_acquire_and_release_by_uid(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """Seed 001's ``acquire(key, timeout, uid)`` / ``release(key, uid)``: a caller-chosen
    ticket, a TTL after which the lock frees itself, and a release by uid from another object
    of the same session (e.g. after the first one was dropped).
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as s, c.session() as t:
            assert await AsyncMutex(s, NS, "key", ttl=10, ticket="uid-1").acquire(blocking=False)
            assert not await AsyncMutex(t, NS, "key", ticket="uid-2").acquire(blocking=False)
            assert await AsyncMutex(s, NS, "key", ticket="uid-1").release() is True
            # the TTL frees it by itself
            assert await AsyncMutex(s, NS, "key", ttl=10, ticket="uid-1").acquire(blocking=False)
            clock.jump(11)
            other = AsyncMutex(t, NS, "key", ticket="uid-2")
            assert await other.acquire(timeout=5)
            assert await AsyncMutex(s, NS, "key", ticket="uid-1").release() is False


async def test_acquired_at_and_valid_for(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """acquired_at is the wall-clock time of the grant (the server's clock at start, from its
    Welcome, plus the uptime of the entry record selected in the same transaction);
    valid_for() is a conservative local bound from valid_until (session)
    and expires_at (TTL), computed without comparing clocks; refresh() moves the session part
    forward.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session(max_age=20) as s:
            m = AsyncMutex(s, NS, "v")
            assert m.valid_for() == 0.0
            assert await m.acquire()
            r = m.last_result
            assert r is not None and m.acquired_at is not None
            started_at = c.welcome.started_at
            assert started_at is not None and started_at > 1_600_000_000  # a Unix time
            assert m.acquired_at == pytest.approx(started_at + r.server_uptime)
            assert m.expires_at is None
            assert 19 < m.valid_for() <= 20
            clock.jump(5)
            assert 14 < m.valid_for() <= 15
            await m.refresh()
            assert 19 < m.valid_for() <= 20
            await m.release()
            assert m.valid_for() == 0.0 and m.acquired_at is None

            t = AsyncMutex(s, NS, "ttl", ttl=4)
            assert await t.acquire()
            assert t.expires_at is not None and t.acquired_at is not None
            assert t.expires_at == pytest.approx(t.acquired_at + 4)
            assert 3 < t.valid_for() <= 4
            await t.refresh()
            assert t.valid_for() <= 4  # the entry's own TTL does not move
            await t.release()


async def test_ttl_expiry_is_a_loss(server: RunningServer, clock: trio.testing.MockClock) -> None:
    """A TTL that runs out while held: the LockLost(ttl) event marks this grant lost, calls
    on_lost, sets lost_event; check() and release() raise LockLostError; then the object is
    free again and someone else may take the lock.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            seen: list[object] = []
            m = AsyncMutex(a, NS, "t", ttl=5, on_lost=seen.append)
            assert await m.acquire()
            m.check()
            clock.jump(6)
            event = await m.wait_lost()
            assert event is not None and event.reason is LostReason.TTL
            assert m.lost and m.lost_event.is_set() and seen == [event]
            assert m.lost_event_info is event
            with pytest.raises(LockLostError) as info:
                m.check()
            assert info.value.event is event and info.value.lock is m
            with pytest.raises(LockLostError):
                await m.release()
            assert not m.held
            assert await AsyncMutex(b, NS, "t").acquire(blocking=False)


@on_both_loops
async def test_blocking_acquire_waits_on_the_server(server: RunningServer) -> None:
    """A blocking acquire is parked on the server (one request, no polling) and granted right
    after the holder's release."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            ma, mb = AsyncMutex(a, NS, "w"), AsyncMutex(b, NS, "w")
            assert await ma.acquire()
            granted = anyio.Event()

            async def wait_for_it() -> None:
                assert await mb.acquire()
                granted.set()

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(wait_for_it)
                await until(lambda: on_server(waiters, server) == 1)
                sent = c.local_statistics().requests_sent
                await anyio.sleep(0.2)
                assert not granted.is_set()
                assert c.local_statistics().requests_sent == sent  # nobody polls
                await ma.release()
            assert granted.is_set() and mb.held
            assert on_server(server.statistics)["waiting"]["granted_total"] == 1


async def test_timeout_is_the_servers_wait(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """acquire(timeout=t) asks the server to wait t seconds: at the deadline it answers with
    the last failure and acquire returns False.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            assert await AsyncMutex(a, NS, "to").acquire()
            mb = AsyncMutex(b, NS, "to")
            outcome: list[bool] = []

            async def attempt() -> None:
                outcome.append(await mb.acquire(timeout=3))

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(attempt)
                await until(lambda: on_server(waiters, server) == 1)
                clock.jump(3.5)
            assert outcome == [False]
            assert mb.last_result is not None and mb.last_result.cause is Cause.STATEMENT
            assert not mb.held
            assert await mb.acquire(blocking=False) is False  # usable again


@on_both_loops
async def test_cancelled_acquire_leaves_nothing_behind(server: RunningServer) -> None:
    """Cancelling a blocking acquire cancels the wait on the server and removes anything it
    may have been granted; the next waiter, not the cancelled one, gets the lock."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
            c.session() as d,
        ):
            ma, mb, md = AsyncMutex(a, NS, "x"), AsyncMutex(b, NS, "x"), AsyncMutex(d, NS, "x")
            assert await ma.acquire()
            with anyio.move_on_after(0.3):
                await mb.acquire()
            assert not mb.held
            await until(lambda: on_server(waiters, server) == 0)
            assert await mb.acquire(blocking=False) is False
            await ma.release()
            assert await md.acquire(blocking=False)
            assert [e["session"] for e in await entries(a, MUTEX_TABLE, "x")] == [d.id]


@on_both_loops
async def test_misuse_and_refusals(server: RunningServer) -> None:
    """One object is one holder (acquire while held: RuntimeError); bad arguments are
    refused where the lock is built; a refused reliability contract makes acquire return
    False and ``async with`` raise NotAcquired with the result."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            m = AsyncMutex(s, NS, "mis")
            assert await m.acquire()
            with pytest.raises(RuntimeError, match="already held"):
                await m.acquire()
            with pytest.raises(ValueError, match="timeout"):
                await AsyncMutex(s, NS, "other").acquire(blocking=False, timeout=1)
            await m.release()
            with pytest.raises(ValueError):
                AsyncMutex(s, NS, "", ttl=1)
            with pytest.raises(ValueError):
                AsyncMutex(s, NS, "n", ttl=0)
            with pytest.raises(TypeError):
                AsyncMutex(object(), NS, "n")  # type: ignore[arg-type]
            picky = AsyncMutex(s, NS, "picky", min_uptime=10_000)
            assert await picky.acquire() is False
            assert picky.last_result is not None
            assert picky.last_result.cause is Cause.MINIMUM_REQUIREMENTS
            with pytest.raises(NotAcquired) as info:
                async with picky:
                    pass  # pragma: no cover
            assert info.value.result is picky.last_result


@on_both_loops
async def test_context_manager_and_locked(server: RunningServer) -> None:
    """``async with`` acquires (blocking) and releases; locked() tells whether an acquire by
    this session would fail now, changing nothing."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            ma, mb = AsyncMutex(a, NS, "cm"), AsyncMutex(b, NS, "cm")
            assert await mb.locked() is False
            async with ma as held:
                assert held is ma and ma.held
                assert await mb.locked() is True
                assert await ma.locked() is True
                assert ma.fence is not None
            assert not ma.held
            assert await mb.locked() is False
            assert await entries(a, MUTEX_TABLE, "cm") == []
            assert "free" in repr(ma)


async def test_a_failed_acquire_names_who_holds_the_mutex(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``acquire(blocking=False)`` returns False, ``lock.holders`` names the holder
    (session, its description, wall-clock acquired_at, fence); a timed-out acquire logs who
    held it, and NotAcquired's message says "held by session ... since ..., fence ...";
    after a grant ``holders`` is empty."""
    caplog.set_level(logging.INFO, logger="client.recipes")
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(description="worker-7 pid 4411") as a,
            c.session() as b,
        ):
            held = AsyncMutex(a, NS, "m")
            assert await held.acquire() and held.holders == ()
            other = AsyncMutex(b, NS, "m")
            assert not await other.acquire(blocking=False)
            [h] = other.holders
            assert (h.session, h.session_description, h.fence) == (
                a.id,
                "worker-7 pid 4411",
                held.fence,
            )
            assert h.acquired_at == pytest.approx(held.acquired_at, abs=1e-6)
            assert not await other.acquire(timeout=0.2)
            assert [h.session for h in other.holders] == [a.id]
            logged = [r.getMessage() for r in caplog.records if "not acquired" in r.getMessage()]
            assert logged and f"held by session {a.id[:8]}" in logged[-1]
            assert (
                "'worker-7 pid 4411' since " in logged[-1] and f"fence {held.fence}" in logged[-1]
            )
            message = str(NotAcquired(other, other.last_result))
            assert re.search(
                r"held by session \S+ 'worker-7 pid 4411' since \d\d:\d\d:\d\d UTC", message
            )
