"""The operator's requests end to end over a real socket (issue 16, PROTOCOL.md "Inspection"):
listings with wall-clock times and client addresses, paging, precise errors, force-release
with waiters, and the denial's holders on the wire."""

from __future__ import annotations

import time
from typing import Any

import attrs
import trio

from lockserver import RunningServer
from protocol import (
    MAX_PAGE,
    Assert,
    ErrorCode,
    ErrorReply,
    ForceRelease,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    LockLost,
    LostReason,
    Released,
    Reply,
    SessionsPage,
    SessionSpec,
    SetVar,
    TransactionResult,
    WaitersPage,
    frame,
    pack,
)

from ._wire import WireClient, wait_for


def mutex(name: str = "printer") -> Any:
    return Assert(SetVar("locks", name, "ticket", description="nightly job"))


async def test_listings_show_holders_sessions_and_waiters_in_wall_clock_time(
    server: RunningServer,
) -> None:
    """holders, sessions and waiters answer pages of records whose times are wall-clock
    seconds near now (the server's start offset plus its uptime), and a session record names
    the address of the connection that used it."""
    before = time.time()
    with trio.fail_after(10):
        async with (
            await WireClient.connect(server) as holder,
            await WireClient.connect(server) as waiter,
            await WireClient.connect(server) as op,
        ):
            msg = holder.execute_message("h1", [mutex()])
            msg = attrs.evolve(msg, session=SessionSpec("h1", 60.0, "worker-7 pid 4411"))
            result = await holder.call(msg)
            assert isinstance(result, TransactionResult) and result.ok
            await waiter.send(waiter.execute_message("w1", [mutex()], wait=30.0))
            await wait_for(lambda: len(server.core.waits) == 1)

            page = await op.call(ListHolders(op.rid(), ListQuery(namespace="ns")))
            assert isinstance(page, HoldersPage) and page.cursor is None
            [h] = page.holders
            assert (h.session, h.session_description, h.var, h.fence) == (
                "h1",
                "worker-7 pid 4411",
                "printer",
                result.fence,
            )
            assert h.description == "nightly job" and h.value == "ticket"
            assert before - 1 <= h.acquired_at <= time.time() + 1 and h.expires_at is None

            sessions = await op.call(ListSessions(op.rid(), ListQuery(session="h1")))
            assert isinstance(sessions, SessionsPage)
            [s] = sessions.sessions
            local = holder.stream.socket.getsockname()
            assert s.clients == (f"{local[0]}:{local[1]}",)
            assert (s.entries, s.waiters, s.max_age, s.principal) == (1, 0, 60.0, "")
            assert before - 1 <= s.created <= s.last_touch <= time.time() + 1
            assert s.valid_until == s.last_touch + 60.0

            waiters = await op.call(ListWaiters(op.rid()))
            assert isinstance(waiters, WaitersPage)
            [w] = waiters.waiters
            assert (w.session, w.namespace, w.variables) == ("w1", "ns", (("locks", "printer", 0),))
            assert w.deadline == w.since + 30.0 and before - 1 <= w.since <= time.time() + 1


async def test_welcome_says_the_wall_clock_at_start(server: RunningServer) -> None:
    """Welcome.started_at is the server's wall clock at uptime 0: a Unix time at most a few
    seconds before now, so started_at + uptime reads as wall-clock time."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            welcome = await c.hello()
    assert welcome.started_at is not None
    assert time.time() - 60 < welcome.started_at <= time.time()


async def test_pages_follow_the_cursor_and_errors_are_precise(server: RunningServer) -> None:
    """2,500 holders page through as 1,000 + 1,000 + 500 at the maximum page size; a limit
    past the maximum and a garbage cursor are INVALID_MESSAGE with the id, and the connection
    keeps serving."""
    with trio.fail_after(20):
        async with await WireClient.connect(server) as c:
            for start in range(0, 2500, 500):
                statements = [mutex(f"v{i:05}") for i in range(start, start + 500)]
                assert (await c.execute(f"s{start}", *statements)).ok
            sizes = []
            cursor = None
            while True:
                page = await c.call(ListHolders(c.rid(), ListQuery(limit=MAX_PAGE, cursor=cursor)))
                assert isinstance(page, HoldersPage)
                sizes.append(len(page.holders))
                cursor = page.cursor
                if cursor is None:
                    break
            assert sizes == [1000, 1000, 500]

            rid = c.rid()
            raw = {"type": "holders", "id": rid, "limit": MAX_PAGE + 1}
            await c.send_raw(frame(pack(raw)))
            err = await c.reply(rid)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.INVALID_MESSAGE
            assert "limit must be an integer in 1..1000" in err.message

            err = await c.error(ListWaiters(c.rid(), ListQuery(cursor="bm90IG91cnM=")))
            assert err.code is ErrorCode.INVALID_MESSAGE and "cursor is not valid" in err.message
            await c.ping()


async def test_force_release_wakes_the_waiter_and_the_holder_hears_released(
    server: RunningServer,
) -> None:
    """A force-release (no tokens: anyone may) removes the held entry: the holder's
    connection gets lost(released) naming it, the parked waiter is granted, and the operator
    is answered Released(1, fence)."""
    with trio.fail_after(10):
        async with (
            await WireClient.connect(server) as holder,
            await WireClient.connect(server) as waiter,
            await WireClient.connect(server) as op,
        ):
            granted = await holder.execute("h1", mutex())
            msg = waiter.execute_message("w1", [mutex()], wait=30.0)
            await waiter.send(msg)
            await wait_for(lambda: len(server.core.waits) == 1)
            released = await op.call(ForceRelease(op.rid(), "ns", "locks", "printer"))
            assert isinstance(released, Released) and released.entries == 1
            assert released.fence > granted.fence
            event = await holder.event()
            assert event == LockLost(
                "h1", LostReason.RELEASED, (("ns", "locks", "printer", granted.fence),)
            )
            answer = await waiter.reply(msg.request_id)
            assert isinstance(answer, Reply) and isinstance(answer.body, TransactionResult)
            assert answer.body.ok and answer.body.fence > released.fence
            # the holder's session lives on
            assert "h1" in server.engine.sessions


async def test_a_denial_carries_its_holders_on_the_wire(server: RunningServer) -> None:
    """A transaction that fails on a statement is answered with the holders in its way (the
    ``holders`` key); a grant's reply has no such key."""
    with trio.fail_after(5):
        async with (
            await WireClient.connect(server) as a,
            await WireClient.connect(server) as b,
        ):
            ok = await a.execute("a1", mutex())
            assert ok.holders == ()
            denied = await b.execute("b1", mutex())
            assert not denied.ok
            [h] = denied.holders
            assert (h.session, h.fence) == ("a1", ok.fence)
