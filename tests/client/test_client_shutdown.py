"""Issue 14, item 11: a call made around a server's shutdown says what happened to it.

The server, shutting down, stops reading between batches, answers every request it has read
(parked ``wait`` requests are dropped unanswered, never granted), sends a connection-level
``SHUTTING_DOWN`` error and closes. So a request still unanswered then was not executed
(ServerError SHUTTING_DOWN, "not executed"), and a call made afterwards must not be sent to
that connection at all: it goes to a new connection, or raises ServerUnavailable "not sent"
when there is no server. Never ConnectionLost "outcome unknown". Both faces, real servers."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
from client_support import ThreadedServer, server_on, start_server, wait_until

from client import (
    Assert,
    ConnectionLost,
    ErrorCode,
    LockClient,
    SelectConstantValue,
    ServerError,
    ServerUnavailable,
    SetVar,
    open_lock_client,
)
from lockserver import RunningServer

NS = "Shutdown"
Server = ThreadedServer[RunningServer]


def waiters(server: RunningServer) -> int:
    """Parked transactions on the server (call from the server's trio run)."""
    return int(server.statistics()["waiting"]["waiters"])


async def until(predicate: Any) -> None:
    while not predicate():
        await trio.sleep(0.005)


# --- sync face ----------------------------------------------------------------------------------


def test_sync_call_after_a_shutdown_while_idle_is_not_sent(threaded_server: Server) -> None:
    """The finding: the server shut down while the client was idle; the next call was sent
    to the closed connection and raised ConnectionLost "execute request 3 in flight ...
    outcome unknown". Now the client reads what arrived first (the SHUTTING_DOWN error and
    the close), does not send, tries a new connection, and with no server raises
    ServerUnavailable saying the call was not sent."""
    c = LockClient(port=threaded_server.port, timeout=5)
    try:
        s = c.session(keepalive=False)
        s.execute(NS, [SelectConstantValue("warm", 1)])
        sent = c.local_statistics().requests_sent
        threaded_server.stop()  # graceful: SHUTTING_DOWN, then the close
        with pytest.raises(ServerUnavailable, match="not sent") as info:
            s.execute(NS, [Assert(SetVar("T", "k"))])
        assert not isinstance(info.value, ConnectionLost)
        assert "outcome" not in str(info.value)
        assert c.local_statistics().requests_sent == sent  # nothing was registered or sent
        s._mark_ended()
    finally:
        c.close()


def test_sync_call_after_a_restart_goes_to_the_new_server(threaded_server: Server) -> None:
    """Shut down while idle, restarted on the same port: the next call is not lost on the
    old connection; it is sent on a new one and answered."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c:
        s = c.session(keepalive=False)
        s.execute(NS, [SelectConstantValue("warm", 1)])
        threaded_server.stop()
        restarted = ThreadedServer(server_on(port)).start()
        try:
            assert s.execute(NS, [Assert(SetVar("T", "k"))]).ok
            assert c.local_statistics().connections == 2
        finally:
            restarted.stop()
        s._mark_ended()


def test_sync_request_parked_at_shutdown_was_not_executed(threaded_server: Server) -> None:
    """A waiting Execute parked on the server when it shuts down is dropped unanswered
    (never granted): the caller gets ServerError(SHUTTING_DOWN) saying it was not executed,
    not ConnectionLost (outcome unknown)."""
    ts = threaded_server
    with LockClient(port=ts.port, timeout=5) as holder, LockClient(port=ts.port, timeout=5) as c:
        h = holder.session(keepalive=False)
        assert h.execute(NS, [Assert(SetVar("T", "busy"))]).ok
        s = c.session(keepalive=False)
        outcome: list[BaseException] = []

        def wait_for_it() -> None:
            try:
                s.execute(NS, [Assert(SetVar("T", "busy"))], wait=30.0)
            except BaseException as exc:  # checked below
                outcome.append(exc)

        t = threading.Thread(target=wait_for_it)
        t.start()
        wait_until(lambda: ts.call(waiters, ts.server) == 1)
        ts.stop()
        t.join(10)
        assert not t.is_alive()
        [error] = outcome
        assert type(error) is ServerError and error.code is ErrorCode.SHUTTING_DOWN
        assert "was not executed" in str(error)
        h._mark_ended()
        s._mark_ended()


# --- trio face ----------------------------------------------------------------------------------


async def test_async_call_after_a_shutdown_while_idle_is_not_sent(nursery: trio.Nursery) -> None:
    """The finding, trio face: the reader task has seen SHUTTING_DOWN and broken the
    connection; a call made afterwards tries a new connection and, with no server, raises
    ServerUnavailable "not sent" (not ConnectionLost)."""
    with trio.fail_after(10):
        server = await start_server(nursery)
        async with open_lock_client(port=server.port) as c:
            s = c.session(keepalive=False)
            await s.execute(NS, [SelectConstantValue("warm", 1)])
            sent = c.local_statistics().requests_sent
            await server.aclose()
            with pytest.raises(ServerUnavailable, match="not sent") as info:
                await s.execute(NS, [Assert(SetVar("T", "k"))])
            assert not isinstance(info.value, ConnectionLost)
            assert c.local_statistics().requests_sent == sent
            with pytest.raises(ServerUnavailable, match="not sent"):
                await c.ping()
            s._mark_ended()


async def test_async_request_parked_at_shutdown_was_not_executed(nursery: trio.Nursery) -> None:
    """A waiting Execute parked when the server shuts down: ServerError(SHUTTING_DOWN),
    "not executed"; the next call after a restart on the same port is served."""
    with trio.fail_after(20):
        server = await start_server(nursery)
        port = server.port
        async with (
            open_lock_client(port=port) as holder,
            open_lock_client(port=port) as c,
        ):
            h = holder.session(keepalive=False)
            assert (await h.execute(NS, [Assert(SetVar("T", "busy"))])).ok
            s = c.session(keepalive=False)
            outcome: list[BaseException] = []

            async def wait_for_it() -> None:
                try:
                    await s.execute(NS, [Assert(SetVar("T", "busy"))], wait=30.0)
                except ServerError as exc:
                    outcome.append(exc)

            async with trio.open_nursery() as inner:
                inner.start_soon(wait_for_it)
                await until(lambda: waiters(server) == 1)
                await server.aclose()
            [error] = outcome
            assert isinstance(error, ServerError) and error.code is ErrorCode.SHUTTING_DOWN
            assert "was not executed" in str(error)
            await start_server(nursery, port=port)
            assert (await s.execute(NS, [Assert(SetVar("T", "busy"))])).ok
            h._mark_ended()
            await s.end()
