"""Server-side waiting and lock-lost notices end to end (issue #5), over real sockets."""

from __future__ import annotations

import contextlib

import trio
import trio.testing
from support import fail_after_real

from lockserver import RunningServer
from protocol import (
    AnywayContinueAfter,
    Assert,
    Cancel,
    Cancelled,
    Cause,
    DeleteVar,
    ErrorCode,
    ErrorReply,
    LostReason,
    Reply,
    SetVar,
    Status,
    TransactionResult,
)

from ._wire import WireClient
from .conftest import start_server

LOCK = Assert(SetVar("locks", "printer", "ticket"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))


async def test_waiter_gets_the_lock_when_the_holder_releases(server: RunningServer) -> None:
    """A parked acquire is answered (OK) right after the holder's release, not before."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
            assert (await a.execute("alice", LOCK)).ok
            parked = b.execute_message("bob", [LOCK], wait=30.0)
            await b.send(parked)
            await a.ping()  # a round trip later the waiter is still unanswered
            assert not [m for m in b.inbox if getattr(m, "request_id", None) == parked.request_id]
            assert server.statistics()["waiting"]["waiters"] == 1
            assert (await a.execute("alice", UNLOCK)).ok
            answer = await b.reply(parked.request_id)
            assert isinstance(answer, Reply) and isinstance(answer.body, TransactionResult)
            assert answer.body.ok
            assert server.statistics()["waiting"]["granted_total"] == 1


async def test_fifo_among_waiters_over_the_network(server: RunningServer) -> None:
    """Ten waiters on ten connections get the lock in the order they parked: each release
    answers exactly the oldest remaining waiter and nobody else."""
    with trio.fail_after(10):
        async with contextlib.AsyncExitStack() as stack:
            holder = await stack.enter_async_context(await WireClient.connect(server))
            assert (await holder.execute("s0", LOCK)).ok
            waiters = []
            for i in range(1, 11):
                w = await stack.enter_async_context(await WireClient.connect(server))
                msg = w.execute_message(f"s{i}", [LOCK], wait=60.0)
                await w.send(msg)
                await w.ping()  # parked before the next one arrives
                waiters.append((w, msg.request_id, f"s{i}"))
            current, sid = holder, "s0"
            for i, (w, rid, wsid) in enumerate(waiters):
                assert (await current.execute(sid, UNLOCK)).ok
                answer = await w.reply(rid)
                assert isinstance(answer, Reply) and answer.body.ok  # type: ignore[union-attr]
                for other, other_rid, _ in waiters[i + 1 :]:
                    await other.ping()
                    assert not [m for m in other.inbox if getattr(m, "request_id", 0) == other_rid]
                current, sid = w, wsid


async def test_deadline_answered_exactly(clock: trio.testing.MockClock) -> None:
    """At its wait deadline the request is answered with its last failure, not earlier: with
    the clock stopped, nothing has come 19.999 s after the request; 0.01 s later the answer
    is there."""
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        with trio.fail_after(60):
            async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
                assert (await a.execute("alice", LOCK)).ok
                msg = b.execute_message("bob", [LOCK], wait=20.0)
                clock.rate = 0  # virtual time stands still from here: only the jumps move it
                with fail_after_real(10):  # trio.fail_after cannot fire meanwhile
                    await b.send(msg)
                    await b.ping()  # answered after the execute: the request is parked
                    clock.jump(19.999)
                    await b.ping()
                    assert not [
                        m for m in b.inbox if getattr(m, "request_id", None) == msg.request_id
                    ]
                    clock.jump(0.01)
                    answer = await b.reply(msg.request_id)
                clock.rate = 1.0
                assert isinstance(answer, Reply) and isinstance(answer.body, TransactionResult)
                assert answer.body.status is Status.TRANSACTION_ERROR
                assert answer.body.cause is Cause.STATEMENT
                assert answer.body.failed_statement == "0:/AssertOp/"
        nursery.cancel_scope.cancel()


async def test_holder_expiry_wakes_waiter_and_tells_holder(clock: trio.testing.MockClock) -> None:
    """The holder's session expires: the waiter (kept alive) is granted, and the holder's
    connection receives a LockLost(expired) event naming the lost entry."""
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        with trio.fail_after(10):
            async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
                held = await a.execute("alice", LOCK, max_age=5.0)
                assert held.ok
                msg = b.execute_message("bob", [LOCK], wait=60.0, max_age=120.0)
                await b.send(msg)
                await b.ping()
                clock.jump(6.0)
                answer = await b.reply(msg.request_id)
                assert isinstance(answer, Reply) and answer.body.ok  # type: ignore[union-attr]
                event = await a.event()
                assert event.session_id == "alice"
                assert event.reason is LostReason.EXPIRED
                assert event.entries == (("ns", "locks", "printer", held.fence),)
        nursery.cancel_scope.cancel()


async def test_ttl_expiry_wakes_waiter(clock: trio.testing.MockClock) -> None:
    """An entry's TTL running out hands the lock to the waiter and tells the holder (ttl)."""
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery)
        with trio.fail_after(10):
            async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
                assert (await a.execute("alice", Assert(SetVar("locks", "printer", 1, ttl=3)))).ok
                msg = b.execute_message("bob", [LOCK], wait=60.0)
                await b.send(msg)
                await b.ping()
                clock.jump(3.5)
                answer = await b.reply(msg.request_id)
                assert isinstance(answer, Reply) and answer.body.ok  # type: ignore[union-attr]
                event = await a.event()
                assert event.reason is LostReason.TTL
        nursery.cancel_scope.cancel()


async def test_a_ttl_set_while_the_timer_sleeps_still_wakes_the_waiter_on_time(
    clock: trio.testing.MockClock,
) -> None:
    """The timer went to sleep for sweep_interval (10 s) before the holder's entry with a 3 s
    TTL existed; the waiter that parks behind it is granted when the TTL runs out, not when
    the timer would have woken anyway. Clock stopped: only the jumps move it."""
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, sweep_interval=10.0)
        with trio.fail_after(60):
            async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
                assert (await a.execute("alice", Assert(SetVar("locks", "printer", 1, ttl=3)))).ok
                msg = b.execute_message("bob", [LOCK], wait=60.0)
                clock.rate = 0
                with fail_after_real(10):
                    await b.send(msg)
                    await b.ping()  # answered after the execute: the request is parked
                    clock.jump(3.01)
                    answer = await b.reply(msg.request_id)
                clock.rate = 1.0
                assert isinstance(answer, Reply) and answer.body.ok  # type: ignore[union-attr]
        nursery.cancel_scope.cancel()


async def test_holder_session_end_wakes_waiter(server: RunningServer) -> None:
    """Ending the holder's session releases its locks to the waiter at once."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
            assert (await a.execute("alice", LOCK)).ok
            msg = b.execute_message("bob", [LOCK], wait=30.0)
            await b.send(msg)
            await b.ping()
            assert await a.end_session("alice")
            answer = await b.reply(msg.request_id)
            assert isinstance(answer, Reply) and answer.body.ok  # type: ignore[union-attr]


async def test_disconnect_cancels_the_waiter(server: RunningServer) -> None:
    """A waiter whose connection closes is dropped: the next holder is the newcomer."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a:
            assert (await a.execute("alice", LOCK)).ok
            b = await WireClient.connect(server)
            await b.send(b.execute_message("bob", [LOCK], wait=30.0))
            await b.ping()
            assert server.statistics()["waiting"]["waiters"] == 1
            await b.aclose()
            await a.ping()
            await a.ping()
            assert server.statistics()["waiting"]["waiters"] == 0
            assert (await a.execute("alice", UNLOCK)).ok
            assert (await a.execute("carol", LOCK)).ok


async def test_cancel_answers_the_waiter_then_confirms(server: RunningServer) -> None:
    """Cancel: the parked request is answered with its last failure, then Cancelled(True)."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
            assert (await a.execute("alice", LOCK)).ok
            msg = b.execute_message("bob", [LOCK], wait=30.0)
            await b.send(msg)
            cancel = Cancel(b.rid(), msg.request_id)
            assert await b.call(cancel) == Cancelled(True)
            answer = b.inbox.pop(0)
            assert isinstance(answer, Reply) and answer.request_id == msg.request_id
            assert answer.body.failed_statement == "0:/AssertOp/"  # type: ignore[union-attr]
            assert await b.call(Cancel(b.rid(), msg.request_id)) == Cancelled(False)


async def test_wait_past_max_wait_is_refused(nursery: trio.Nursery) -> None:
    """A wait longer than max_wait is an invalid request naming the cap; nothing runs."""
    server = await start_server(nursery, max_wait=10.0)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            err = await c.error(c.execute_message("s", [LOCK], wait=10.5))
            assert err.code is ErrorCode.INVALID_MESSAGE and "max_wait of 10 s" in err.message
            assert (await c.execute("s", LOCK, wait=10.0)).ok


async def test_waiter_limits_refuse_with_too_many_waiters(nursery: trio.Nursery) -> None:
    """Past max_waiters_per_connection the next parked request gets TOO_MANY_WAITERS and
    the connection keeps working."""
    server = await start_server(nursery, max_waiters_per_connection=2)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
            assert (await a.execute("alice", LOCK)).ok
            m1 = b.execute_message("b1", [LOCK], wait=30.0)
            m2 = b.execute_message("b2", [LOCK], wait=30.0)
            m3 = b.execute_message("b3", [LOCK], wait=30.0)
            await b.send(m1, m2, m3)
            err = await b.reply(m3.request_id)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.TOO_MANY_WAITERS
            assert (await a.execute("alice", UNLOCK)).ok
            first = await b.reply(m1.request_id)
            assert isinstance(first, Reply) and first.body.ok  # type: ignore[union-attr]
