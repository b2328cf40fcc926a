"""Issue 14, item 9 (recipes): a lock held through a server that restarted, or whose session's
guarantee ran out while the client was cut off, is lost — the trio block is cancelled and
raises LockLostError, the sync lock reports ``lost`` and raises at its next use. The client's
own notice (``LockLost`` with no entries, reason RESTARTED or EXPIRED) is about every grant of
the session; an acquire that itself triggers the reconnect is not affected by it.

Real servers on 127.0.0.1: a restart is a new server on the same port. Time under MockClock."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.testing
from recipes_support import NS, ThreadedServer, start_server, until

from client import (
    AsyncMutex,
    AsyncTimeWindowLock,
    LockClient,
    LockLost,
    LockLostError,
    LostReason,
    Mutex,
    open_lock_client,
)
from client.recipes import MUTEX_TABLE
from lockserver import RunningServer

MAX_AGE = 3.0


async def test_trio_block_is_cancelled_when_the_server_restarts(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """The finding: a holder inside ``async with AsyncMutex``; the server is killed and
    restarted; no lost event arrived, the keepalive silently re-created the session, and
    another client (min_uptime = max_age) was granted the lock while the first block ran on
    with ``lock.lost == False``. Now the holder's keepalive reconnects, sees another server
    instance, and the block is cancelled with LockLostError (RESTARTED) before the other
    client can be granted the lock."""
    with trio.fail_after(60):
        first = await start_server(nursery)
        port = first.port
        async with (
            open_lock_client(port=port) as c,
            c.session(max_age=MAX_AGE) as s,
        ):
            m = AsyncMutex(s, NS, "restart")
            outcome: list[object] = []

            async def holder() -> None:
                try:
                    async with m:
                        outcome.append("entered")
                        await trio.sleep_forever()
                except LockLostError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as inner:
                inner.start_soon(holder)
                await until(lambda: m.held)
                await first.aclose()  # the restart (no call of ours follows it)
                await start_server(nursery, port=port)
                async with open_lock_client(port=port) as other_client:
                    o = other_client.session(max_age=MAX_AGE, keepalive=False)
                    other = AsyncMutex(o, NS, "restart", min_uptime=MAX_AGE)
                    while not await other.acquire(blocking=False):
                        clock.jump(0.5)  # refused until the new server is MAX_AGE old
                        await trio.sleep(0.01)
                        assert other.last_result is not None
                    # Granted on the new server: the old holder had already been told.
                    assert m.lost
                    assert len(outcome) == 2
                    await other.release()
                    await o.end()
            [entered, error] = outcome
            assert entered == "entered" and isinstance(error, LockLostError)
            assert error.event == LockLost(s.id, LostReason.RESTARTED, ())
            assert m.lost_event_info == error.event and not m.held
            assert c.local_statistics().restarts == 1


async def test_trio_block_is_cancelled_when_the_session_expired_while_cut_off(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """Same server instance: the holder is cut off from the server longer than its
    session's max age (no keepalive can reach it), the server expires the session and the
    event reaches nobody. At the reconnect the session's guarantee has run out: the block is
    cancelled with LockLostError (EXPIRED, no entries), before the keepalive re-creates the
    session."""
    with trio.fail_after(60):
        async with open_lock_client(port=server.port) as c:
            s = c.session(max_age=5, keepalive=False)
            m = AsyncMutex(s, NS, "cut-off")
            outcome: list[BaseException] = []

            async def holder() -> None:
                try:
                    async with m:
                        await trio.sleep_forever()
                except LockLostError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as inner:
                inner.start_soon(holder)
                await until(lambda: m.held)
                assert c._conn is not None
                c._conn.sock.shutdown(socket.SHUT_RDWR)  # the network is gone
                await until(lambda: c._conn is not None and c._conn.broken is not None)
                clock.jump(6)
                await until(lambda: s.id not in server.engine.sessions)  # expired, unheard
                assert not m.lost and m.valid_for() == 0.0
                await c.ping()  # any call reconnects
            [error] = outcome
            assert isinstance(error, LockLostError)
            assert error.event == LockLost(s.id, LostReason.EXPIRED, ())
            await s.end()


async def test_an_acquire_that_triggers_the_reconnect_is_not_lost(nursery: trio.Nursery) -> None:
    """The notice is delivered while the acquire is in progress (it is what reconnects), but
    before the acquire is sent: the new grant, on the new server, is not lost."""
    with trio.fail_after(20):
        first = await start_server(nursery)
        port = first.port
        async with open_lock_client(port=port) as c, c.session() as s:
            old = AsyncMutex(s, NS, "old")
            assert await old.acquire()
            await first.aclose()
            await start_server(nursery, port=port)
            fresh = AsyncMutex(s, NS, "fresh")
            assert await fresh.acquire()
            assert old.lost and not fresh.lost
            assert s.lost_events == (LockLost(s.id, LostReason.RESTARTED, ()),)
            with pytest.raises(LockLostError):
                await old.release()
            assert await fresh.release()


async def test_entry_less_notices_match_every_grant_of_the_session(server: RunningServer) -> None:
    """An event with no entries is a loss of the grant for RESTARTED and EXPIRED (the
    client's notices), also for a time window (whose own TTL ends are not losses); an
    entry-less TTL or ENDED event is not."""
    async with open_lock_client(port=server.port) as c, c.session() as s:
        m = AsyncMutex(s, NS, "notice")
        assert await m.acquire()
        fence = m.fence
        assert fence is not None
        for reason in (LostReason.TTL, LostReason.ENDED):
            assert not m._matches(LockLost(s.id, reason, ()), fence)
        other_var = LockLost(s.id, LostReason.EXPIRED, ((NS, MUTEX_TABLE, "x", fence),))
        assert not m._matches(other_var, fence)
        for reason in (LostReason.RESTARTED, LostReason.EXPIRED):
            assert m._matches(LockLost(s.id, reason, ()), fence)
        window = AsyncTimeWindowLock(s, NS, "w", period=3600)
        assert await window.acquire(blocking=False)
        assert window.fence is not None
        assert window._matches(LockLost(s.id, LostReason.RESTARTED, ()), window.fence)
        s._deliver(LockLost(s.id, LostReason.RESTARTED, ()))
        assert m.lost and window.lost
        with pytest.raises(LockLostError):
            m.check()


# --- sync face ----------------------------------------------------------------------------------


def test_sync_lock_is_lost_when_the_server_restarts(threaded_server: ThreadedServer) -> None:
    """Sync face: the server restarts while a Mutex is held; the next call (any call)
    reconnects and the lock is lost: ``lock.lost`` and its event are set, on_lost ran, and
    the next use of the lock raises LockLostError (RESTARTED)."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c:
        s = c.session()
        calls: list[LockLost] = []
        m = Mutex(s, NS, "sync-restart", on_lost=calls.append)
        assert m.acquire()
        threaded_server.stop()
        restarted = ThreadedServer(port=port).start()
        try:
            assert not m.lost  # nothing has read the connection yet
            c.ping()  # any call: reconnects
            assert m.lost and m.lost_event.is_set()
            assert calls == [LockLost(s.id, LostReason.RESTARTED, ())]
            with pytest.raises(LockLostError) as info:
                m.check()
            assert info.value.event == calls[0]
            with pytest.raises(LockLostError):
                m.release()
            assert not m.held
            s.end()
        finally:
            restarted.stop()


def test_sync_with_block_raises_after_a_restart(threaded_server: ThreadedServer) -> None:
    """Sync face, ``with lock:``: a restart during the block makes its end raise
    LockLostError (RESTARTED) once the client has reconnected."""
    port = threaded_server.port
    restarted: list[ThreadedServer] = []
    try:
        with LockClient(port=port, timeout=5) as c, c.session() as s:
            with pytest.raises(LockLostError) as info, Mutex(s, NS, "sync-with"):
                threaded_server.stop()
                restarted.append(ThreadedServer(port=port).start())
                c.ping()
            assert info.value.event == LockLost(s.id, LostReason.RESTARTED, ())
    finally:
        for ts in restarted:
            ts.stop()
