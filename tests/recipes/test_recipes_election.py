"""Leader election (issue 33): campaign in FIFO order on the server, terms = grant fences that
increase across leaders, leader(), proclaim, resign, leadership lost with the session
(expiry, end, an operator's release) cancelling the leader's block, observe() from the change
feed with gaps reported, on the async faces (trio and asyncio) and the sync face.

Tests marked ``@on_both_loops`` run under trio and under asyncio (tests/asyncio_support.py);
those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import socket
import threading
import time

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, ThreadedServer, waiters

from client import (
    AsyncElection,
    Election,
    LockClient,
    LockLostError,
    LostReason,
    NotAcquired,
    open_lock_client,
)
from client.recipes import ELECTION_TABLE, ELECTION_VALUE_TABLE, LeaderChange
from lockserver import RunningServer


@on_both_loops
async def test_campaign_returns_a_term_and_leader_names_the_leader(server: RunningServer) -> None:
    """Nobody leads at first; campaign returns the term (the grant's fence); leader() gives
    the value, the term, the session and its description, and the grant's wall-clock time;
    the next leader's term is larger."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(description="node-a") as a,
            c.session(description="node-b") as b,
        ):
            ea, eb = AsyncElection(a, NS, "db"), AsyncElection(b, NS, "db")
            assert await ea.leader() is None
            before = time.time()
            term = await ea.campaign({"addr": "10.0.0.1"})
            assert term is not None and term == ea.term == ea.fence and ea.leading
            info = await eb.leader()
            assert info is not None
            assert (info.value, info.term, info.session) == ({"addr": "10.0.0.1"}, term, a.id)
            assert info.description == "node-a"
            assert info.since is not None and before - 5 < info.since < time.time() + 5
            assert await eb.campaign("b", timeout=0) is None  # busy: one try
            assert await ea.resign() is True
            assert not ea.leading and ea.term is None
            term_b = await eb.campaign("b")
            assert term_b is not None and term_b > term
            info = await ea.leader()
            assert info is not None and (info.value, info.term) == ("b", term_b)


@on_both_loops
async def test_candidates_are_served_in_arrival_order_without_polling(
    server: RunningServer,
) -> None:
    """Three candidates wait on the server (one parked transaction each, no polling); each
    resignation hands the leadership to the oldest waiting candidate; terms increase."""
    with anyio.fail_after(15):
        async with open_lock_client(port=server.port) as c:
            sessions = [await c.session().__aenter__() for _ in range(4)]
            leader = AsyncElection(sessions[0], NS, "fifo")
            assert await leader.campaign("first")
            order: list[tuple[str, int]] = []
            done = {i: anyio.Event() for i in (1, 2, 3)}
            elections = {i: AsyncElection(sessions[i], NS, "fifo") for i in (1, 2, 3)}

            async def candidate(i: int) -> None:
                term = await elections[i].campaign(f"c{i}")
                assert term is not None
                order.append((f"c{i}", term))
                done[i].set()

            async with anyio.create_task_group() as tg:
                for i in (1, 2, 3):
                    tg.start_soon(candidate, i)
                    await until(lambda i=i: on_server(waiters, server) >= i)
                sent = c.local_statistics().requests_sent
                await leader.resign()
                for i in (1, 2, 3):
                    await done[i].wait()
                    await elections[i].resign()
            assert [name for name, _ in order] == ["c1", "c2", "c3"]
            terms = [term for _, term in order]
            assert terms == sorted(terms) and len(set(terms)) == 3
            # one resign each and no other request: nobody polled
            assert c.local_statistics().requests_sent == sent + 4
            for s in sessions:
                await s.end()


@on_both_loops
async def test_proclaim_keeps_the_term_and_needs_the_leadership(server: RunningServer) -> None:
    """proclaim changes the leader's value under the same term; a non-leader's proclaim is
    misuse (RuntimeError); a leader whose grant was released by an operator learns it at
    proclaim (LockLostError), and its old value is not shown for the next leader."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
        ):
            ea, eb = AsyncElection(a, NS, "cfg"), AsyncElection(b, NS, "cfg")
            with pytest.raises(RuntimeError, match="does not lead"):
                await ea.proclaim(1)
            term = await ea.campaign(1)
            await ea.proclaim([2, {"x": None}])
            info = await eb.leader()
            assert info is not None and info.value == [2, {"x": None}] and info.term == term
            released = await c.release(NS, ELECTION_TABLE, "cfg")
            assert released.entries == 1
            with pytest.raises(LockLostError):
                await ea.proclaim(3)
            assert ea.lost
            assert await eb.campaign("fresh") is not None
            info = await ea.leader()
            assert info is not None and info.value == "fresh" and info.session == b.id


@on_both_loops
async def test_leadership_block_is_cancelled_when_the_session_is_ended(
    server: RunningServer,
) -> None:
    """``async with election.leadership(v):`` runs as the leader; another connection ends
    the leader's session: the block is cancelled at once and the ``async with`` raises
    LockLostError (reason ended); the waiting candidate becomes leader with a larger term."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as a,
            c.session() as b,
        ):
            ea, eb = AsyncElection(a, NS, "svc"), AsyncElection(b, NS, "svc")
            got: list[int | None] = []
            reached_the_end = False
            async with anyio.create_task_group() as tg:

                async def follower() -> None:
                    got.append(await eb.campaign("b"))

                with pytest.raises(LockLostError) as info:
                    async with ea.leadership("a") as led:
                        first = led.term
                        tg.start_soon(follower)
                        await until(lambda: on_server(waiters, server) >= 1)
                        assert await admin.end_session(a.id)
                        await anyio.sleep_forever()
                        reached_the_end = True  # pragma: no cover
            assert not reached_the_end
            event = info.value.event
            assert event is not None and event.reason is LostReason.ENDED
            assert got[0] is not None and first is not None and got[0] > first


async def test_leadership_is_lost_when_the_session_expires(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A leader whose session expires (its process stopped: no keepalive) loses the
    leadership on the server; the waiting candidate is served within the max age; the old
    leader's object reports the loss. Trio only: it jumps trio's MockClock."""
    with trio.fail_after(30):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=5, keepalive=False) as a,
            c.session(max_age=60) as b,
        ):
            ea, eb = AsyncElection(a, NS, "exp"), AsyncElection(b, NS, "exp")
            lost = []
            ea.on_lost = lost.append
            term = await ea.campaign("a")
            async with trio.open_nursery() as n:
                got: list[int | None] = []

                async def follower() -> None:
                    got.append(await eb.campaign("b"))

                n.start_soon(follower)
                await until(lambda: waiters(server) >= 1)
                clock.jump(6)
            assert term is not None and got[0] is not None and got[0] > term
            assert lost and lost[0].reason is LostReason.EXPIRED and ea.lost


@on_both_loops
async def test_cancelled_campaign_leaves_nothing_behind(server: RunningServer) -> None:
    """A campaign cancelled while it waits withdraws: the server forgets the parked
    transaction, and when the leader resigns nobody leads (no stray grant)."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            ea, eb = AsyncElection(a, NS, "w"), AsyncElection(b, NS, "w")
            assert await ea.campaign("a")
            with anyio.move_on_after(0.2):
                await eb.campaign("b")
            await until(lambda: on_server(waiters, server) == 0)
            await ea.resign()
            assert await ea.leader() is None
            assert not eb.held


@on_both_loops
async def test_observe_yields_each_change_from_the_feed(server: RunningServer) -> None:
    """observe() yields the leader now, then every change of leader, term or value (from the
    change feed: nothing is polled), and ends its subscriptions when the block ends."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
            c.session() as watcher,
        ):
            ea, eb = AsyncElection(a, NS, "obs"), AsyncElection(b, NS, "obs")
            seen: list[LeaderChange] = []
            async with AsyncElection(watcher, NS, "obs").observe() as changes:
                it = changes.__aiter__()
                seen.append(await it.__anext__())
                assert seen[-1] == LeaderChange(None, gap=False)
                term = await ea.campaign("a1")
                seen.append(await it.__anext__())
                await ea.proclaim("a2")
                seen.append(await it.__anext__())
                await ea.resign()
                seen.append(await it.__anext__())
                term_b = await eb.campaign("b1")
                seen.append(await it.__anext__())
                assert len(c._core.feed_sinks) == 2  # the two tables, with the watcher's sink
            leaders = [
                None if ch.leader is None else (ch.leader.value, ch.leader.term) for ch in seen
            ]
            assert leaders == [None, ("a1", term), ("a2", term), None, ("b1", term_b)]
            assert not any(ch.gap for ch in seen)
            assert c._core.feed_sinks == {} and c._core.subscriptions == {}


@on_both_loops
async def test_observe_reports_a_gap_after_a_reconnect(server: RunningServer) -> None:
    """The watcher's connection dies; the change made meanwhile is not hidden: the watcher
    reconnects, reads the leader again, and yields it with ``gap=True``."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as other,
            c.session() as watcher,
            other.session() as a,
        ):
            ea = AsyncElection(a, NS, "gap")
            async with AsyncElection(watcher, NS, "gap").observe() as changes:
                it = changes.__aiter__()
                assert (await it.__anext__()).leader is None
                conn = c._conn
                assert conn is not None
                conn.sock.shutdown(socket.SHUT_RDWR)  # the connection dies under the client
                term = await ea.campaign("while-away")
                change = await it.__anext__()
                assert change.gap
                assert change.leader is not None and change.leader.term == term


def test_sync_election_leadership_and_observe(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """The sync face: ``with election.leadership(v):``, a second candidate in another thread
    waits on the server and takes over when the block ends; observe() (an iterator) sees
    both leaders, and stops cleanly on ``close()``."""
    with LockClient(port=threaded_server.port) as c, c.session() as a, c.session() as b:
        ea, eb = Election(a, NS, "sync"), Election(b, NS, "sync")
        changes = Election(a, NS, "sync").observe()
        assert next(changes).leader is None
        terms: list[int | None] = []
        with ea.leadership("a") as led:
            assert ea.leader() is not None and led.term is not None
            first_term = led.term
            thread = threading.Thread(target=lambda: terms.append(eb.campaign("b", timeout=10)))
            thread.start()
            first = next(changes).leader
            assert first is not None and first.value == "a"
            deadline = time.monotonic() + 5
            while threaded_server.call(waiters, threaded_server.server) < 1:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        thread.join(10)
        assert terms and terms[0] is not None and terms[0] > first_term
        nxt = next(changes).leader
        while nxt is None:  # the resignation may be seen before the next grant
            nxt = next(changes).leader
        assert nxt.value == "b" and nxt.term == terms[0]
        changes.close()
        assert c._core.feed_sinks == {} and c._core.subscriptions == {}
        assert eb.resign()
        ea2 = Election(a, NS, "taken")
        assert ea2.campaign(1)
        with pytest.raises(RuntimeError):
            ea2.campaign(2)
        with pytest.raises(NotAcquired), Election(b, NS, "taken").leadership("x", timeout=0.1):
            pass  # pragma: no cover - the campaign timed out


def test_sync_leader_lost_after_operator_release(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """An operator's release (``lockctl release``) takes the leadership: the leader's next
    operation raises LockLostError (reason released), and a new campaign works."""
    with LockClient(port=threaded_server.port) as c, c.session() as a:
        e = Election(a, NS, "op")
        assert e.campaign("v")
        c.release(NS, ELECTION_TABLE, "op")
        with pytest.raises(LockLostError) as info:
            e.check()
        assert info.value.event is not None and info.value.event.reason is LostReason.RELEASED
        with pytest.raises(LockLostError):
            e.resign()
        assert e.campaign("again") is not None
        rows = c.holders(NS, ELECTION_VALUE_TABLE).holders
        assert [r.value for r in rows] == ["again"]


async def test_a_standby_waiting_longer_than_its_max_age_keeps_its_session(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A standby whose very first call is its campaign (a fresh session) waits on the server
    for three times its session's max age: its keepalive runs during that first wait (a
    parked transaction does not keep a session alive), so the session lives and the campaign
    is granted when the leader resigns. Trio only: it jumps trio's MockClock, a third of a
    max age at a time, letting each keepalive ping through."""
    with trio.fail_after(30):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=60) as a,
            c.session(max_age=3) as standby_session,
        ):
            leader = AsyncElection(a, NS, "patient")
            assert await leader.campaign("a")
            standby = AsyncElection(standby_session, NS, "patient")
            got: list[int | None] = []
            async with trio.open_nursery() as n:

                async def wait_for_it() -> None:
                    got.append(await standby.campaign("b"))

                n.start_soon(wait_for_it)
                await until(lambda: waiters(server) == 1)
                for _ in range(9):  # 9 s of waiting, pings every 1 s of idleness
                    clock.jump(1.0)
                    await trio.sleep(0.05)
                    deadline = standby_session._valid_deadline
                    await until(
                        lambda: (
                            standby_session._valid_deadline is not None
                            and standby_session._valid_deadline > trio.current_time() + 1.5
                        )
                    )
                    assert deadline is None or standby_session._valid_deadline >= deadline
                await a.execute(NS, [])
                assert await leader.resign()
            assert got and got[0] is not None
