"""Issue 14, item 9 (client core and faces): losses no connection could hear are reported at
the reconnect, before the keepalives re-create the sessions.

- A welcome naming another server instance (a restart: the server forgot every session) gives
  every open, used session ``LockLost(id, RESTARTED, ())``.
- On the same instance, a session whose last known guarantee (``valid_until`` as a local
  deadline, PROTOCOL.md §8) ran out while the client was disconnected gets
  ``LockLost(id, EXPIRED, ())``: the server may have expired it with no connection to hear.
- A plain reconnect to the same server, within the guarantee, reports nothing.
Real servers on 127.0.0.1 (a restart is a new server on the same port); time under MockClock."""

from __future__ import annotations

import socket
from typing import Any

import trio
import trio.testing
from client_support import ThreadedServer, server_on, start_server

from client import (
    Assert,
    LockClient,
    LockLost,
    LostReason,
    SetVar,
    open_lock_client,
)
from client._core import ClientCore
from client._session_state import CANCELLED_TABLE, SessionState
from lockserver import RunningServer
from protocol import Cause, Status, TransactionResult, Welcome

NS = "Restart"
Server = ThreadedServer[RunningServer]


async def until(predicate: Any) -> None:
    while not predicate():
        await trio.sleep(0.005)


def reply(uptime: float, valid_until: float | None) -> Any:
    from client import Result

    return Result(
        TransactionResult(
            Status.TRANSACTION_OK, Cause.UNSPECIFIED, "", "h", uptime, 1.0, None, (), 7, valid_until
        )
    )


# --- the core -----------------------------------------------------------------------------------


def test_core_reports_restarts_and_expired_guarantees_at_a_reconnect() -> None:
    """ClientCore.reconnected(now): RESTARTED for every used session when the welcome names
    another (non-empty) instance; else EXPIRED for a used session whose local deadline
    (sent_at + valid_until - uptime) has passed, once; nothing for unused sessions, for a
    guarantee still running, or for a server that sends no instance."""
    core = ClientCore("t")
    used = SessionState(core, "used", 10.0, "", True)
    unused = SessionState(core, "unused", 10.0, "", True)
    got: list[LockLost] = []
    used.add_lost_listener(got.append)
    unused.add_lost_listener(got.append)
    used._build_execute(NS, [], 0.0, 0.0, "", None, None)
    used._note_reply(100.0, reply(uptime=5.0, valid_until=15.0))  # deadline: 110
    used._note_reply(101.0, reply(uptime=6.0, valid_until=None))  # refused: no change

    core.handshake_done(Welcome(1, "s", "h", {}, "A"))
    core.reconnected(0.0)  # the first connection
    core.handshake_done(Welcome(1, "s", "h", {}, "A"))
    core.reconnected(109.9)
    assert got == []  # same instance, guarantee still running
    core.handshake_done(Welcome(1, "s", "h", {}, "A"))
    core.reconnected(110.0)
    assert got == [LockLost("used", LostReason.EXPIRED, ())]
    core.reconnected(500.0)
    assert len(got) == 1  # reported once: nothing is guaranteed until the next reply

    core.handshake_done(Welcome(1, "s", "h", {}, "B"))
    core.reconnected(0.0)
    assert got[1:] == [LockLost("used", LostReason.RESTARTED, ())]
    core.handshake_done(Welcome(1, "s", "h", {}, ""))  # a server that does not say
    core.reconnected(0.0)
    assert len(got) == 2
    stats = core.statistics(0)
    assert (stats.restarts, stats.events_synthetic, stats.events) == (1, 2, 0)
    assert not unused.lost


def test_a_server_event_for_the_whole_session_clears_the_guarantee() -> None:
    """After the server's own EXPIRED (or ENDED) event, no EXPIRED is made up for the same
    session at the next reconnect; a TTL event (one entry) leaves the guarantee."""
    core = ClientCore("t")
    s = SessionState(core, "s", 10.0, "", True)
    s._build_execute(NS, [], 0.0, 0.0, "", None, None)
    s._note_reply(0.0, reply(uptime=0.0, valid_until=10.0))
    s._deliver(LockLost("s", LostReason.TTL, ((NS, "t", "v", 3),)))
    assert s._valid_deadline == 10.0
    s._deliver(LockLost("s", LostReason.EXPIRED, ((NS, "t", "w", 4),)))
    assert s._valid_deadline is None
    core.handshake_done(Welcome(1, "s", "h", {}, "A"))
    core.reconnected(100.0)
    assert len(s.lost_events) == 2


def test_a_recipe_tombstones_ttl_is_not_a_loss() -> None:
    """The expiry of a recipe's cancel tombstone (an entry of ``recipes.cancelled`` that ran
    out its TTL) reaches no listener and marks nothing lost; the other entries of the same
    event do, and a whole session's loss is delivered as it came, tombstones included."""
    core = ClientCore("t")
    s = SessionState(core, "s", 10.0, "", True)
    heard: list[LockLost] = []
    s.add_lost_listener(heard.append)
    s._deliver(LockLost("s", LostReason.TTL, ((NS, CANCELLED_TABLE, "k1", 3),)))
    assert not s.lost and s.lost_events == () and heard == []
    mixed = ((NS, CANCELLED_TABLE, "k2", 4), (NS, "t", "v", 5))
    s._deliver(LockLost("s", LostReason.TTL, mixed))
    assert heard == [LockLost("s", LostReason.TTL, ((NS, "t", "v", 5),))]
    whole = LockLost("s", LostReason.EXPIRED, ((NS, CANCELLED_TABLE, "k3", 6),))
    s._deliver(whole)
    assert heard[-1] == whole and s.lost_events == (heard[0], whole)


# --- trio face ----------------------------------------------------------------------------------


async def test_async_restart_is_reported_before_the_keepalive(nursery: trio.Nursery) -> None:
    """The server is stopped and a new one started on the same port; the next call
    reconnects: the used session's listeners get LockLost(RESTARTED, no entries) while the
    new server does not know the session yet (before the reconnect's keepalive), an unused
    session gets nothing, and the keepalive then re-creates the session."""
    with trio.fail_after(20):
        first = await start_server(nursery)
        port = first.port
        servers: list[RunningServer] = [first]
        async with open_lock_client(port=port) as c:
            s = c.session(keepalive=False)
            unused = c.session()
            assert (await s.execute(NS, [Assert(SetVar("T", "k"))])).ok
            old_instance = c.welcome.instance
            seen: list[tuple[LockLost, bool]] = []
            s.add_lost_listener(lambda ev: seen.append((ev, s.id in servers[-1].engine.sessions)))
            await first.aclose()
            servers.append(await start_server(nursery, port=port))
            await c.ping()
            assert seen == [(LockLost(s.id, LostReason.RESTARTED, ()), False)]
            assert s.lost and await s.wait_lost() == seen[0][0]
            assert not unused.lost
            assert c.welcome.instance not in ("", old_instance)
            stats = c.local_statistics()
            assert (stats.restarts, stats.events_synthetic, stats.connections) == (1, 1, 2)
            await until(lambda: s.id in servers[-1].engine.sessions)  # the keepalive, after
            await s.end()
            unused._mark_ended()


async def test_async_reconnect_to_the_same_server_reports_nothing(server: RunningServer) -> None:
    """A dropped connection to the same server instance, within the session's guarantee:
    the reconnect reports no loss (the session and its entry are still there)."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            assert (await s.execute(NS, [Assert(SetVar("T", "same"))])).ok
            assert c._conn is not None
            c._conn.sock.shutdown(socket.SHUT_RDWR)
            await until(lambda: c._conn is not None and c._conn.broken is not None)
            await c.ping()
            assert not s.lost
            stats = c.local_statistics()
            assert (stats.connections, stats.restarts, stats.events_synthetic) == (2, 0, 0)


async def test_async_session_expired_while_disconnected_is_reported(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """Same server instance: the client is cut off longer than the session's max age, the
    server expires the session with no connection to hear the event; the reconnect gives
    LockLost(EXPIRED, no entries) before its keepalive silently re-creates the session."""
    with trio.fail_after(60):
        async with open_lock_client(port=server.port) as c:
            s = c.session(max_age=5, keepalive=False)
            assert (await s.execute(NS, [Assert(SetVar("T", "exp"))])).ok
            seen: list[tuple[LockLost, bool]] = []
            s.add_lost_listener(lambda ev: seen.append((ev, s.id in server.engine.sessions)))
            assert c._conn is not None
            c._conn.sock.shutdown(socket.SHUT_RDWR)  # the network is gone
            await until(lambda: c._conn is not None and c._conn.broken is not None)
            clock.jump(6)
            await until(lambda: s.id not in server.engine.sessions)  # expired, unheard
            assert not s.lost
            await c.ping()
            assert seen == [(LockLost(s.id, LostReason.EXPIRED, ()), False)]
            await until(lambda: s.id in server.engine.sessions)  # the keepalive, after
            await s.end()


# --- sync face ----------------------------------------------------------------------------------


def test_sync_restart_is_reported_before_the_keepalive(threaded_server: Server) -> None:
    """Sync face: the server is stopped and restarted on the same port while the client is
    idle; the next call reconnects and the used session gets LockLost(RESTARTED, no
    entries) before the keepalive re-creates it on the new server."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c:
        s = c.session(keepalive=False)
        assert s.execute(NS, [Assert(SetVar("T", "k"))]).ok
        servers: list[Server] = [threaded_server]
        seen: list[tuple[LockLost, bool]] = []

        def listener(ev: LockLost) -> None:
            ts = servers[-1]
            seen.append((ev, ts.call(lambda: s.id in ts.server.engine.sessions)))

        s.add_lost_listener(listener)
        threaded_server.stop()
        servers.append(ThreadedServer(server_on(port)).start())
        try:
            assert c.ping().uptime >= 0
            assert seen == [(LockLost(s.id, LostReason.RESTARTED, ()), False)]
            assert s.lost
            assert c.local_statistics().restarts == 1
            assert s.end() is True  # the reconnect's keepalive re-created it (empty), after
            assert s.lost_events == (seen[0][0],)
        finally:
            servers[-1].stop()
