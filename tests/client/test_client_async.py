"""The async face end to end against the real server (127.0.0.1, port 0, real sockets), on
both event loops it supports: every test marked ``@on_both_loops`` runs under trio and under
asyncio (asyncio_support.py); the tests that jump trio's MockClock run under trio only."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server

from client import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    Assert,
    AsyncLockClient,
    AsyncSession,
    Block,
    Cause,
    ClientClosed,
    DeleteVar,
    ErrorCode,
    Exists,
    If,
    LimitExceeded,
    LockLost,
    LostReason,
    Not,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SetVar,
    Status,
    Xor,
    open_lock_client,
)
from lockserver import RunningServer

NS = "Test"


def acquire(table: str, var: str, value: Any = None) -> list[Any]:
    return [Assert(Not(Exists(table, var))), Assert(SetVar(table, var, value))]


async def holders(c: AsyncLockClient, table: str, var: str) -> list[str]:
    """The session ids holding ``table``/``var`` (seen from a throwaway session)."""
    async with c.session(keepalive=False) as probe:
        r = await probe.execute(NS, [SelectVarValue("h", table, var, select_many=True)])
    return [rec["session"] for rec in r["h"] or []]


@on_both_loops
async def test_ping_statistics_and_welcome(server: RunningServer) -> None:
    """ping gives uptime and trust, statistics the server's map, welcome its limits."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port, client_name="t") as c:
            pong = await c.ping()
            assert pong.uptime >= 0 and 0 <= pong.trust <= 1
            stats = await c.statistics()
            assert isinstance(stats, dict) and stats
            assert c.welcome.limits["max_depth"] == 32
            assert c.local_statistics().connections == 1
            assert "open" in repr(c)
        assert c.closed


@on_both_loops
async def test_exclusive_setvar_exists_and_deletevar(server: RunningServer) -> None:
    """SetVar is exclusive (the holder's own entry included), Exists ignores the caller's own
    entries unless asked, matches values, DeleteVar removes only the caller's own entry, and
    each commit returns a larger fence."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
        ):
            r1 = await a.execute(NS, [Assert(SetVar("T", "k", "va"))])
            assert r1.ok and r1.status is Status.TRANSACTION_OK
            again = await a.execute(NS, [Assert(SetVar("T", "k", "va"))])
            assert not again.ok and again.failed_statement == "0:/AssertOp/"
            r = await a.execute(
                NS,
                [
                    SelectOperatorValue("mine", Exists("T", "k")),
                    SelectOperatorValue("incl", Exists("T", "k", ignore_this_session=False)),
                ],
            )
            assert (r["mine"], r["incl"]) == (False, True)
            r = await b.execute(
                NS,
                [
                    SelectOperatorValue("any", Exists("T", "k")),
                    SelectOperatorValue("va", Exists("T", "k", "va")),
                    SelectOperatorValue("vb", Exists("T", "k", "vb")),
                    SelectOperatorValue("del", DeleteVar("T", "k")),
                ],
            )
            assert (r["any"], r["va"], r["vb"], r["del"]) == (True, True, False, False)
            wrong = await a.execute(NS, [Assert(DeleteVar("T", "k", "other"))])
            assert not wrong.ok
            r2 = await a.execute(NS, [Assert(DeleteVar("T", "k", "va"))])
            assert r2.ok and r2.fence > r1.fence
            assert await holders(c, "T", "k") == []


@on_both_loops
async def test_select_ops_and_data_lookup(server: RunningServer) -> None:
    """Constants, operator values (And/Or/Xor/Not/TRUE/FALSE, no short-circuit) and entry
    records come back in order, with duplicates, and are looked up by name."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session(description="me") as s:
            await s.execute(NS, [Assert(SetVar("T", "rec", {"n": 1}, description="d1"))])
            r = await s.execute(
                NS,
                [
                    SelectConstantValue("c", [1, "two", None, 3.5, b"x", {"k": True}]),
                    SelectOperatorValue("and", And(TRUE, FALSE)),
                    SelectOperatorValue("or", Or(FALSE, TRUE)),
                    SelectOperatorValue("xor", Xor(TRUE, TRUE)),
                    SelectOperatorValue("not", Not(FALSE)),
                    # Or does not short-circuit: the SetVar on the right runs.
                    SelectOperatorValue("both", Or(TRUE, SetVar("T", "side"))),
                    SelectVarValue("own", "T", "rec", ignore_this_session=False),
                    SelectVarValue("others", "T", "rec"),
                    SelectVarValue("many", "T", "rec", ignore_this_session=False, select_many=True),
                    SelectConstantValue("c", "second"),
                ],
            )
            assert r.ok
            assert r["c"] == [1, "two", None, 3.5, b"x", {"k": True}]
            assert r.all("c") == [r["c"], "second"]
            assert (r["and"], r["or"], r["xor"], r["not"], r["both"]) == (
                False,
                True,
                False,
                True,
                True,
            )
            assert r["own"]["value"] == {"n": 1} and r["own"]["description"] == "d1"
            assert r["own"]["session"] == s.id
            assert r["others"] is None
            assert [rec["value"] for rec in r["many"]] == [{"n": 1}]
            assert r.get("missing", "dflt") == "dflt"
            assert [name for name, _ in r.data][:2] == ["c", "and"]
            assert s.id in await holders(c, "T", "side")


@on_both_loops
async def test_block_if_abort_and_rollback(server: RunningServer) -> None:
    """Abort rolls back every change of the transaction and reports the failing node's
    path; data selected before the abort is kept; If may branch on a SetVar; a Block stops at
    the first abort; AnywayContinueAfter ignores its change's result."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            r = await s.execute(
                NS,
                [
                    Assert(SetVar("T", "rolled")),
                    SelectConstantValue("before", 1),
                    Block(
                        SelectConstantValue("in", 2), If(TRUE, Abort()), SelectConstantValue("x", 3)
                    ),
                ],
            )
            assert not r.ok
            assert (r.status, r.cause) == (Status.TRANSACTION_ERROR, Cause.STATEMENT)
            assert r.failed_statement == "2:/BlockOp/IfOp/AbortOp/"
            assert r.data == (("before", 1), ("in", 2))
            assert await holders(c, "T", "rolled") == []

            r = await s.execute(
                NS,
                [
                    If(
                        SetVar("T", "try"),
                        SelectConstantValue("got", True),
                        SelectConstantValue("got", False),
                    ),
                    If(
                        SetVar("T", "try"),
                        SelectConstantValue("again", True),
                        SelectConstantValue("again", False),
                    ),
                    AnywayContinueAfter(DeleteVar("T", "nothing-there")),
                    If(FALSE, Abort()),
                ],
            )
            assert r.ok and (r["got"], r["again"]) == (True, False)

            r = await s.execute(NS, [SelectVarValue("x", "T", "nothing", abort_if_not_found=True)])
            assert not r.ok and r.failed_statement == "0:/SelectVarValueOp/"
            r = await s.execute(NS, [SelectConstantValue("a", 1), Assert(FALSE)])
            assert r.failed_statement == "1:/AssertOp/" and r["a"] == 1


async def test_allow_duplicates_and_ttl_expiry_event(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """allow_duplicates lets sessions share a variable; a TTL entry disappears on its own and
    its holder's listener receives LockLost(ttl) naming it.
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
        ):
            assert (await a.execute(NS, [Assert(SetVar("D", "v", 1, allow_duplicates=True))])).ok
            assert (await b.execute(NS, [Assert(SetVar("D", "v", 2, allow_duplicates=True))])).ok
            assert sorted(await holders(c, "D", "v")) == sorted([a.id, b.id])
            events: list[LockLost] = []
            a.add_lost_listener(events.append)
            assert (await a.execute(NS, [Assert(SetVar("D", "ttl", ttl=5.0))])).ok
            clock.jump(6)
            lost = await a.wait_lost()
            assert lost.reason is LostReason.TTL
            assert [e[:3] for e in lost.entries] == [(NS, "D", "ttl")]
            assert events == [lost] and a.lost
            assert await holders(c, "D", "ttl") == []


@on_both_loops
async def test_minimum_requirements_are_a_refused_result(server: RunningServer) -> None:
    """A reliability contract the server cannot meet is a Result (cause MINIMUM_REQUIREMENTS),
    not an exception."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            r = await s.execute(NS, acquire("T", "k"), min_uptime=10_000.0)
            assert not r.ok and r.cause is Cause.MINIMUM_REQUIREMENTS
            assert r.valid_until is None
            r = await s.execute(NS, acquire("T", "k"), transaction_id="tx-7", description="d")
            assert r.ok and r.transaction_id == "tx-7" and r.valid_until is not None


@on_both_loops
async def test_two_clients_contend_for_one_lock(server: RunningServer) -> None:
    """Of two clients racing for one lock exactly one wins; the loser's result names the
    failed assert; after release the other gets it."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c1,
            open_lock_client(port=server.port) as c2,
            c1.session() as s1,
            c2.session() as s2,
        ):
            results: dict[str, Any] = {}

            async def grab(name: str, s: AsyncSession) -> None:
                results[name] = await s.execute(NS, acquire("L", "res", name))

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(grab, "one", s1)
                nursery.start_soon(grab, "two", s2)
            winners = [n for n, r in results.items() if r.ok]
            assert len(winners) == 1
            loser = "two" if winners == ["one"] else "one"
            assert results[loser].failed_statement == "0:/AssertOp/"
            win_s, lose_s = (s1, s2) if winners == ["one"] else (s2, s1)
            assert (await win_s.execute(NS, [AnywayContinueAfter(DeleteVar("L", "res"))])).ok
            assert (await lose_s.execute(NS, acquire("L", "res", loser))).ok


@on_both_loops
async def test_mds_example(server: RunningServer) -> None:
    """SEMANTICS.md's seed example: two users enter MDS for a facility; a review of one of
    those patients fails at "1:/AssertOp/"; review of another patient works and blocks entry
    for it; unlock frees it."""

    def entry(facility: str, patient: str) -> list[Any]:
        return [
            Assert(Not(Exists("Month-End", facility))),
            Assert(Not(Exists("MDS-Review", facility, patient))),
            Assert(SetVar("MDS-Entry", facility, patient, allow_duplicates=True)),
        ]

    def review(facility: str, patient: str) -> list[Any]:
        return [
            Assert(Not(Exists("Month-End", facility))),
            Assert(Not(Exists("MDS-Entry", facility, patient))),
            Assert(SetVar("MDS-Review", facility, patient)),
        ]

    def unlock(facility: str, patient: str) -> list[Any]:
        return [AnywayContinueAfter(DeleteVar("MDS-Review", facility, patient))]

    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as u1,
            c.session() as u2,
            c.session() as u3,
        ):
            assert (await u1.execute("Clinical", entry("F1", "P1"))).ok
            assert (await u2.execute("Clinical", entry("F1", "P2"))).ok
            r = await u3.execute("Clinical", review("F1", "P1"))
            assert not r.ok and r.failed_statement == "1:/AssertOp/"
            assert (await u3.execute("Clinical", review("F1", "P3"))).ok
            blocked = await u1.execute("Clinical", entry("F1", "P3"))
            assert blocked.failed_statement == "1:/AssertOp/"
            assert (await u3.execute("Clinical", unlock("F1", "P3"))).ok
            assert (await u1.execute("Clinical", entry("F1", "P3"))).ok


@on_both_loops
async def test_session_context_manager_ends_the_session(server: RunningServer) -> None:
    """Leaving the block ends the session (its entries vanish at once), also when the block
    raises or is cancelled; end() twice answers False without a call."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            s = c.session()
            async with s:
                await s.execute(NS, acquire("E", "a"))
                assert on_server(lambda: s.id in server.engine.sessions)
            assert s.ended and not on_server(lambda: s.id in server.engine.sessions)
            assert await holders(c, "E", "a") == []
            assert await s.end() is False

            with pytest.raises(RuntimeError, match="body"):
                async with c.session() as s2:
                    await s2.execute(NS, acquire("E", "b"))
                    raise RuntimeError("body")
            assert s2.ended and not on_server(lambda: s2.id in server.engine.sessions)

            with anyio.move_on_after(0.2):
                async with c.session() as s3:
                    await s3.execute(NS, acquire("E", "c"))
                    await anyio.sleep_forever()
            assert s3.ended and not on_server(lambda: s3.id in server.engine.sessions)
            assert await holders(c, "E", "c") == []

            explicit = c.session(max_age=5.0, description="x", session_id="fixed-id")
            assert (explicit.id, explicit.max_age, explicit.description) == ("fixed-id", 5.0, "x")
            await explicit.execute(NS, acquire("E", "d"))
            assert await explicit.end() is True
            with pytest.raises(ClientClosed):
                await explicit.execute(NS, acquire("E", "d"))


async def test_keepalive_keeps_an_idle_session_alive(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """An idle session with keepalive outlives its max_age many times over; one without
    expires (virtual time, jumped in steps below max_age / 3).
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(20):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=3.0) as kept,
            c.session(max_age=3.0, keepalive=False) as bare,
        ):
            await kept.execute(NS, acquire("K", "kept"))
            await bare.execute(NS, acquire("K", "bare"))
            assert kept.keepalive_interval == 1.0 and bare.keepalive_interval is None
            for _ in range(30):  # 15 virtual seconds = 5 max ages
                clock.jump(0.5)
                await anyio.sleep(0.01)
            assert await holders(c, "K", "kept") == [kept.id]
            assert await holders(c, "K", "bare") == []
            assert kept.keepalive_error is None


async def test_a_keepalive_ping_sends_the_deferred_cleanups_first(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A cleanup whose outcome was unknown (``defer_cleanup``: a recipe's cancel) is sent by
    the session's next keepalive ping when no call comes: a session kept alive by pings
    alone does not keep what it removes. Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(20):
        async with open_lock_client(port=server.port) as c, c.session(max_age=3.0) as s:
            await s.execute(NS, acquire("D", "k"))
            s.defer_cleanup(NS, [AnywayContinueAfter(DeleteVar("D", "k"))])
            assert await holders(c, "D", "k") == [s.id]
            for _ in range(10):  # past one keepalive interval (1 s)
                clock.jump(0.25)
                await anyio.sleep(0.01)
            assert await holders(c, "D", "k") == []
            assert s._deferred == [] and s.keepalive_error is None


@on_both_loops
async def test_reconnect_resumes_the_session(server: RunningServer) -> None:
    """When the connection dies under the client, the next call reconnects transparently and
    the session still holds its entries; a ping in flight at the drop is re-sent."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            await s.execute(NS, acquire("R", "k", "v"))
            conn = c._conn
            assert conn is not None
            conn.sock.shutdown(socket.SHUT_RDWR)  # the connection dies under the client
            await anyio.wait_all_tasks_blocked()
            r = await s.execute(NS, [SelectVarValue("me", "R", "k", ignore_this_session=False)])
            assert r["me"]["session"] == s.id and r["me"]["value"] == "v"
            assert c.local_statistics().connections == 2
            assert c._conn is not conn


@on_both_loops
async def test_64_tasks_pipeline_on_one_connection(server: RunningServer) -> None:
    """64 tasks share one connection with their requests in flight together; each gets its
    own reply (a unique echoed value), whatever the order of arrival."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            peak = 0

            async def worker(i: int) -> None:
                nonlocal peak
                for j in range(50):
                    assert c._conn is not None
                    peak = max(peak, len(c._conn.wire.pending))
                    r = await s.execute(NS, [SelectConstantValue("echo", [i, j])])
                    assert r["echo"] == [i, j]

            async with anyio.create_task_group() as nursery:
                for i in range(64):
                    nursery.start_soon(worker, i)
            stats = c.local_statistics()
            assert stats.connections == 1 and stats.in_flight == 0
            assert peak >= 32  # genuinely pipelined


@on_both_loops
async def test_cancelled_callers_never_desynchronise_the_connection(server: RunningServer) -> None:
    """Callers cancelled right after their request went out leave the connection in sync:
    their late replies are dropped by id, concurrent and later callers get their own."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            caught = 0

            async def cancelled_call(i: int) -> None:
                nonlocal caught
                async with anyio.create_task_group() as nursery:
                    with anyio.CancelScope() as scope:

                        async def cancel() -> None:
                            scope.cancel()

                        # Runs once we are parked, usually before the reply is read (trio
                        # orders a batch of runnable tasks at random, so not always).
                        nursery.start_soon(cancel)
                        r = await s.execute(NS, [SelectConstantValue("echo", ["lost", i])])
                        assert r["echo"] == ["lost", i]
                    caught += scope.cancelled_caught

            async def honest(i: int) -> None:
                for j in range(20):
                    r = await s.execute(NS, [SelectConstantValue("echo", [i, j])])
                    assert r["echo"] == [i, j]

            for i in range(50):
                await cancelled_call(i)
            async with anyio.create_task_group() as nursery:
                for i in range(16):
                    nursery.start_soon(honest, i)
                for i in range(100):
                    nursery.start_soon(cancelled_call, i)
            for j in range(20):
                r = await s.execute(NS, [SelectConstantValue("after", j)])
                assert r["after"] == j
            await anyio.sleep(0.05)
            assert caught > 0
            assert c.local_statistics().replies_dropped == caught  # every late reply dropped
            assert c.local_statistics().in_flight == 0

            # A deadline expiring at random points of many calls, concurrently.
            async def racer(i: int) -> None:
                for j in range(30):
                    with anyio.move_on_after(0.0001 * (j % 7)):
                        r = await s.execute(NS, [SelectConstantValue("e", [i, j])])
                        assert r["e"] == [i, j]

            async with anyio.create_task_group() as nursery:
                for i in range(16):
                    nursery.start_soon(racer, i)
            assert (await s.execute(NS, [SelectConstantValue("last", 1)]))["last"] == 1


@on_both_loops
async def test_server_errors_are_exceptions_and_the_connection_survives(
    server: RunningServer,
) -> None:
    """A too-deep tree and a too-big transaction are refused with LimitExceeded carrying the
    wire code; the connection stays usable."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            deep: Any = TRUE
            for _ in range(40):
                deep = Not(deep)
            with pytest.raises(LimitExceeded) as info:
                await s.execute(NS, [Assert(deep)])
            assert info.value.code is ErrorCode.TREE_TOO_DEEP
            assert "32" in info.value.message
            with pytest.raises(LimitExceeded) as info:
                await s.execute(NS, [SelectConstantValue("x", 1)] * 1001)
            assert info.value.code is ErrorCode.TOO_MANY_OPS
            assert (await s.execute(NS, [SelectConstantValue("ok", 1)]))["ok"] == 1


@on_both_loops
async def test_lock_lost_when_another_connection_ends_the_session(server: RunningServer) -> None:
    """Ending a session from another connection pushes LockLost(ended) to the holder's
    connection; the session's listeners get it, naming the lost entries."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as holder,
            open_lock_client(port=server.port) as admin,
        ):
            async with holder.session() as s:
                got: list[LockLost] = []
                s.add_lost_listener(got.append)
                await s.execute(NS, acquire("X", "a"))
                await s.execute(NS, acquire("X", "b"))
                assert await admin.end_session(s.id) is True
                lost = await s.wait_lost()
                assert lost.reason is LostReason.ENDED and lost.session_id == s.id
                assert sorted(e[2] for e in lost.entries) == ["a", "b"]
                assert got == [lost] and s.lost_events == (lost,)
            assert await admin.end_session(s.id) is False


async def test_lock_lost_when_the_session_expires(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A session left idle past its max age expires; its listener gets LockLost(expired).
    Trio only: it jumps trio's MockClock."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            s = c.session(max_age=5.0, keepalive=False)
            await s.execute(NS, acquire("X", "exp"))
            clock.jump(6)
            lost = await s.wait_lost()
            assert lost.reason is LostReason.EXPIRED
            assert [e[:3] for e in lost.entries] == [(NS, "X", "exp")]
            assert c.local_statistics().events == 1


@on_both_loops
async def test_wait_is_passed_through(server: RunningServer) -> None:
    """An Execute with ``wait`` on a free lock is answered at once."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            r = await s.execute(NS, acquire("W", "k"), wait=5.0)
            assert r.ok
