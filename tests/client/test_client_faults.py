"""Transport faults and ordering, both faces, against the fake server (fake_lockserver):
requests genuinely in flight when a connection dies, replies out of order, late replies,
refused handshakes, closing with calls in flight."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
import trio
import trio.testing
from client_support import ThreadedServer
from fake_lockserver import FakeServer

from client import (
    Assert,
    ClientClosed,
    ClientTimeout,
    ConnectionLost,
    ErrorCode,
    LockClient,
    LockLost,
    SelectConstantValue,
    ServerError,
    ServerUnavailable,
    SetVar,
    open_lock_client,
)
from protocol import Cancel, Execute

NS = "Faults"


def free_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def until(predicate: Any, step: float = 0.005) -> None:
    while not predicate():
        await trio.sleep(step)


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


# --- async face -----------------------------------------------------------------------------------


async def test_async_execute_in_flight_when_the_connection_drops(fake: FakeServer) -> None:
    """An Execute in flight when the connection drops raises ConnectionLost (its outcome is
    unknown; it is not re-sent); the next call reconnects and works."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, c.session() as s:
            await s.execute(NS, [SelectConstantValue("warm", 1)])
            fake.hold = True
            failure: list[BaseException] = []

            async def call() -> None:
                with pytest.raises(ConnectionLost, match="outcome is unknown") as info:
                    await s.execute(NS, [Assert(SetVar("T", "k"))])
                failure.append(info.value)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await until(lambda: fake.held)
                fake.hold = False
                await fake.drop_connections()
            assert failure
            executes = [m for m in fake.received if type(m) is Execute and m.transaction.statements]
            assert len(executes) == 2  # the lost one was not re-sent
            r = await s.execute(NS, [SelectConstantValue("after", 2)])
            assert r["after"] == 2
            assert c.local_statistics().connections == 2


async def test_async_server_death_then_unavailable(fake: FakeServer) -> None:
    """When the server dies with a request in flight the caller gets ConnectionLost; with no
    server to reconnect to, the next call raises ServerUnavailable."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, c.session(keepalive=False) as s:
            await s.execute(NS, [SelectConstantValue("warm", 1)])
            fake.hold = True

            async def kill() -> None:
                await until(lambda: fake.held)
                fake.stop()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(kill)
                with pytest.raises(ConnectionLost):
                    await s.execute(NS, [Assert(SetVar("T", "k"))])
            with pytest.raises(ServerUnavailable):
                await c.ping()
            s._mark_ended()  # nothing to end it on


async def test_async_idempotent_request_is_retried_after_a_drop(fake: FakeServer) -> None:
    """A ping in flight when the connection drops is re-sent once on a new connection and
    answered there, transparently."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c:
            fake.hold = True
            async with trio.open_nursery() as nursery:

                async def drop() -> None:
                    await until(lambda: fake.held)
                    fake.hold = False
                    await fake.drop_connections()

                nursery.start_soon(drop)
                pong = await c.ping()
            assert pong.trust == 1.0
            stats = c.local_statistics()
            assert (stats.retries, stats.connections) == (1, 2)


async def test_async_replies_in_reverse_order(fake: FakeServer) -> None:
    """With the server answering every batch in reverse order, 64 pipelining tasks each
    still get their own reply."""
    fake.reverse = True
    with trio.fail_after(20):
        async with open_lock_client(port=fake.port) as c, c.session() as s:

            async def worker(i: int) -> None:
                for j in range(30):
                    r = await s.execute(NS, [SelectConstantValue("echo", [i, j])])
                    assert r["echo"] == [i, j]

            async with trio.open_nursery() as nursery:
                for i in range(64):
                    nursery.start_soon(worker, i)


async def test_async_cancelling_a_waiting_execute_cancels_it_on_the_server(
    fake: FakeServer,
) -> None:
    """Cancelling a caller whose Execute has ``wait`` also sends a Cancel for it; its late
    reply is dropped and the next caller gets its own."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, c.session() as s:
            fake.hold = True
            with trio.move_on_after(0.1):
                await s.execute(NS, [Assert(SetVar("T", "k"))], wait=30.0)
            await until(lambda: any(type(m) is Cancel for m, _ in fake.held))
            [(execute, _), (cancel, _)] = fake.held
            assert cancel.target_id == execute.request_id
            await fake.release()
            r = await s.execute(NS, [SelectConstantValue("next", 1)])
            assert r["next"] == 1
            assert c.local_statistics().replies_dropped == 2


async def test_async_no_server() -> None:
    """open_lock_client raises ServerUnavailable (not an ExceptionGroup) when nothing
    listens."""
    with trio.fail_after(10), pytest.raises(ServerUnavailable, match="cannot connect"):
        async with open_lock_client(port=free_port()):
            pass  # pragma: no cover


async def test_async_refused_handshake(fake: FakeServer) -> None:
    """An error reply to Hello is raised as ServerError with its code."""
    fake.hello_error = ErrorCode.UNSUPPORTED_VERSION
    with trio.fail_after(10), pytest.raises(ServerError) as info:
        async with open_lock_client(port=fake.port):
            pass  # pragma: no cover
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION


async def test_async_body_exceptions_are_not_wrapped(fake: FakeServer) -> None:
    """An exception leaving the client's block propagates as itself, not in a group."""
    with trio.fail_after(10), pytest.raises(KeyError):
        async with open_lock_client(port=fake.port):
            raise KeyError("mine")


async def test_async_calls_in_flight_when_the_client_closes(fake: FakeServer) -> None:
    """Leaving the client's block fails calls still in flight with ClientClosed; the closed
    client refuses new calls."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery, open_lock_client(port=fake.port) as c:
            s = c.session(keepalive=False)
            fake.hold = True

            async def call() -> None:
                with pytest.raises(ClientClosed):
                    await s.execute(NS, [SelectConstantValue("x", 1)])

            nursery.start_soon(call)
            await until(lambda: fake.held)
        assert c.closed
        with pytest.raises(ClientClosed):
            c.session()
        with pytest.raises(ClientClosed):
            await c.ping()


async def test_async_events_for_ended_sessions_are_unclaimed(fake: FakeServer) -> None:
    """After a session ends it receives no more events; the client counts them unclaimed."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, open_lock_client(port=fake.port) as d:
            s = c.session()
            await s.execute(NS, [Assert(SetVar("T", "k"))])
            assert await d.end_session(s.id)
            await s.wait_lost()
            s._mark_ended()
            event = LockLost(s.id, s.lost_events[0].reason)
            c._core.dispatch([event])
            assert c.local_statistics().events_unclaimed == 1


async def test_async_keepalive_failure_is_recorded(
    fake: FakeServer, clock: trio.testing.MockClock
) -> None:
    """A keepalive that cannot reach the server records the error and keeps trying; the
    client stays usable."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c:
            s = c.session(max_age=3.0)
            await s.execute(NS, [SelectConstantValue("x", 1)])
            fake.stop()
            for _ in range(10):
                clock.jump(0.5)
                await trio.sleep(0.01)
            assert isinstance(s.keepalive_error, (ServerUnavailable, ConnectionLost))
            s._mark_ended()


# --- sync face ------------------------------------------------------------------------------------


def test_sync_timeout_then_late_reply_is_dropped(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """A call that times out raises ClientTimeout; its late reply is dropped by id and the
    next call gets its own reply on the same connection."""
    fake = threaded_fake.server
    with LockClient(port=threaded_fake.port, timeout=0.2) as c:
        s = c.session(keepalive=False)
        fake.hold = True
        with pytest.raises(ClientTimeout, match="outcome is unknown"):
            s.execute(NS, [SelectConstantValue("x", "late")])
        threaded_fake.acall(fake.release)
        r = s.execute(NS, [SelectConstantValue("x", "mine")])
        assert r["x"] == "mine"
        stats = c.local_statistics()
        assert (stats.replies_dropped, stats.connections, stats.in_flight) == (1, 1, 0)


def test_sync_timeout_of_a_waiting_execute_cancels_it(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """The per-call timeout is extended by ``wait``; giving up on a waiting Execute sends a
    Cancel for it."""
    fake = threaded_fake.server
    with LockClient(port=threaded_fake.port, timeout=0.1) as c:
        s = c.session(keepalive=False)
        fake.hold = True
        started = time.monotonic()
        with pytest.raises(ClientTimeout):
            s.execute(NS, [Assert(SetVar("T", "k"))], wait=0.3)
        assert time.monotonic() - started >= 0.35
        wait_until(lambda: any(type(m) is Cancel for m, _ in fake.held))
        threaded_fake.acall(fake.release)


def test_sync_execute_in_flight_when_the_connection_drops(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """ConnectionLost for the Execute in flight; a ping in flight is retried; the next call
    reconnects."""
    fake = threaded_fake.server
    with LockClient(port=threaded_fake.port) as c:
        s = c.session(keepalive=False)
        s.execute(NS, [SelectConstantValue("warm", 1)])
        fake.hold = True
        outcomes: dict[str, Any] = {}

        def run(name: str, fn: Any) -> None:
            try:
                outcomes[name] = fn()
            except Exception as exc:
                outcomes[name] = exc

        threads = [
            threading.Thread(
                target=run, args=("exec", lambda: s.execute(NS, [Assert(SetVar("T", "k"))]))
            ),
            threading.Thread(target=run, args=("ping", c.ping)),
        ]
        for t in threads:
            t.start()
        wait_until(lambda: len(fake.held) == 2)
        fake.hold = False
        threaded_fake.acall(fake.drop_connections)
        for t in threads:
            t.join(5)
        assert isinstance(outcomes["exec"], ConnectionLost)
        assert "outcome is unknown" in str(outcomes["exec"])
        assert outcomes["ping"].trust == 1.0
        assert s.execute(NS, [SelectConstantValue("after", 1)])["after"] == 1
        stats = c.local_statistics()
        assert stats.retries == 1 and stats.connections == 2
        s._mark_ended()


def test_sync_threads_share_one_connection_with_reversed_replies(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """Many threads calling at once (the caller-reads hand-off under contention, replies in
    reverse batch order) each get their own replies."""
    threaded_fake.server.reverse = True
    errors: list[BaseException] = []
    with LockClient(port=threaded_fake.port) as c, c.session() as s:

        def worker(i: int) -> None:
            try:
                for j in range(100):
                    r = s.execute(NS, [SelectConstantValue("echo", [i, j])])
                    assert r["echo"] == [i, j]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert c.local_statistics().connections == 1


def test_sync_no_server_and_refused_handshake(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """No listener: ServerUnavailable at construction. An error reply to Hello: ServerError.
    Bad arguments: ValueError."""
    with pytest.raises(ServerUnavailable, match="cannot connect"):
        LockClient(port=free_port())
    threaded_fake.server.hello_error = ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(ServerError) as info:
        LockClient(port=threaded_fake.port)
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(ValueError):
        LockClient(port=threaded_fake.port, timeout=0)


def test_sync_close_with_a_call_in_flight(threaded_fake: ThreadedServer[FakeServer]) -> None:
    """close() from another thread fails the call in flight with ClientClosed; the closed
    client refuses new calls; close() twice is fine."""
    fake = threaded_fake.server
    c = LockClient(port=threaded_fake.port)
    s = c.session(keepalive=False)
    fake.hold = True
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            s.execute(NS, [SelectConstantValue("x", 1)])
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=call)
    t.start()
    wait_until(lambda: fake.held)
    c.close()
    t.join(5)
    assert isinstance(outcome[0], ClientClosed)
    c.close()
    assert c.closed and "closed" in repr(c)
    with pytest.raises(ClientClosed):
        c.ping()
    with pytest.raises(ClientClosed):
        c.session()
