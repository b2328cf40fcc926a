"""Barriers (issue 33): a double barrier's ``enter`` is one transaction each, nobody passes
before all N arrived and all pass together; ``leave`` waits until all have left; the next
round cannot start while a slow party still leaves; dead parties are counted out and the
others told; the cyclic barrier runs round after round; timeouts leave nothing behind.

Tests marked ``@on_both_loops`` run under trio and under asyncio (tests/asyncio_support.py);
those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import threading

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, ThreadedServer, entries, waiters

from client import (
    AsyncBarrier,
    AsyncDoubleBarrier,
    Barrier,
    DoubleBarrier,
    LockClient,
    LockLostError,
    open_lock_client,
)
from client.recipes import BARRIER_OUT_TABLE, BARRIER_TABLE
from lockbench.safety import Attempt, check_barrier
from lockserver import RunningServer
from protocol import FeedKind


@on_both_loops
async def test_enter_is_one_transaction_and_nobody_passes_before_the_last(
    server: RunningServer,
) -> None:
    """Three parties: the first two park on the server (one request each); neither passes
    until the third arrives; then all three pass in the same step, and every party's entry
    is in the barrier."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            sessions = [await c.session().__aenter__() for _ in range(3)]
            parties = [AsyncDoubleBarrier(s, NS, "go", parties=3) for s in sessions]
            passed: list[int] = []
            sent = c.local_statistics().requests_sent

            async def party(i: int) -> None:
                assert await parties[i].enter()
                passed.append(i)

            async with anyio.create_task_group() as tg:
                for i in (0, 1):
                    tg.start_soon(party, i)
                await until(lambda: on_server(waiters, server) == 2)
                await anyio.sleep(0.05)
                assert passed == []
                tg.start_soon(party, 2)
            assert sorted(passed) == [0, 1, 2]
            assert c.local_statistics().requests_sent == sent + 3
            assert len(await entries(sessions[0], BARRIER_TABLE, "go")) == 3
            assert all(p.inside for p in parties)
            fences = {p.fence for p in parties}
            assert len(fences) == 3  # three commits, one step


@on_both_loops
async def test_leave_waits_until_all_have_left(server: RunningServer) -> None:
    """After entering, two parties leave and wait; the third's leave lets all three out;
    the barrier's tables are empty again."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            sessions = [await c.session().__aenter__() for _ in range(3)]
            parties = [AsyncDoubleBarrier(s, NS, "out", parties=3) for s in sessions]
            async with anyio.create_task_group() as tg:
                for p in parties:
                    tg.start_soon(p.enter)
            left: list[int] = []

            async def leave(i: int) -> None:
                assert await parties[i].leave()
                left.append(i)

            async with anyio.create_task_group() as tg:
                tg.start_soon(leave, 0)
                tg.start_soon(leave, 1)
                await until(lambda: on_server(waiters, server) == 2)
                assert left == [] and parties[0].leaving
                await leave(2)
            assert sorted(left) == [0, 1, 2]
            assert await entries(sessions[0], BARRIER_TABLE, "out") == []
            assert await entries(sessions[0], BARRIER_OUT_TABLE, "out") == []
            assert not any(p.held for p in parties)


@on_both_loops
async def test_late_leaver_is_never_overtaken_by_the_next_round(server: RunningServer) -> None:
    """A and B in a barrier of 2. A moves out while B is still in, but its wait for the end of
    the round is late (not sent yet). B, the last one in, is out at once and enters round two
    at once: it waits behind A's "out" entry. A's late wait still passes (nobody of round two
    is in), and only then round two fills: A enters, both pass."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            pa = AsyncDoubleBarrier(a, NS, "late", parties=2)
            pb = AsyncDoubleBarrier(b, NS, "late", parties=2)
            async with anyio.create_task_group() as tg:
                tg.start_soon(pa.enter)
                tg.start_soon(pb.enter)
            ticket = pa.ticket
            assert ticket is not None
            r = await a.execute(NS, pa._mark_out_statements(ticket))  # A's first half only
            assert r.ok and r.get("left") is None  # B is still in
            pa._leaving = True
            assert await pb.leave()  # B was the last one in: out at once
            round_two: list[str] = []
            async with anyio.create_task_group() as tg:

                async def b_side() -> None:
                    assert await pb.enter()
                    round_two.append("b")

                tg.start_soon(b_side)
                await until(lambda: on_server(waiters, server) == 1)  # behind A's out entry
                await anyio.sleep(0.05)
                assert round_two == []
                assert await pa.leave()  # the late wait passes
                assert await pa.enter()
                round_two.append("a")
            assert sorted(round_two) == ["a", "b"]


@on_both_loops
async def test_enter_timeout_leaves_nothing_behind(server: RunningServer) -> None:
    """An enter that times out (not enough parties) answers False and leaves no entry; the
    parties that come later are not fooled into counting it."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            pa = AsyncDoubleBarrier(a, NS, "few", parties=2)
            assert await pa.enter(timeout=0.2) is False
            assert not pa.held
            assert await entries(a, BARRIER_TABLE, "few") == []
            pb = AsyncDoubleBarrier(b, NS, "few", parties=2)
            assert await pb.enter(timeout=0.2) is False


async def test_a_dead_party_is_counted_out_and_the_others_are_told(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """Three parties enter; one's session expires (its process stopped): it is counted out
    (the two others' leave does not wait for it), the others' ``on_party_lost`` hears it
    (kind expired), and the dead party's own object reports its loss. Trio only: it jumps
    trio's MockClock."""
    with trio.fail_after(30):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=60) as a,
            c.session(max_age=60) as b,
            c.session(max_age=5, keepalive=False) as dead,
        ):
            told: list[object] = []
            pa = AsyncDoubleBarrier(a, NS, "crew", parties=3, on_party_lost=told.append)
            pb = AsyncDoubleBarrier(b, NS, "crew", parties=3)
            pd = AsyncDoubleBarrier(dead, NS, "crew", parties=3)
            async with trio.open_nursery() as n:
                n.start_soon(pa.enter)
                n.start_soon(pb.enter)
                n.start_soon(pd.enter)
            assert pa.inside and pb.inside and pd.inside
            await a.execute(NS, [])  # keep the living sessions fresh across the jump
            await b.execute(NS, [])
            clock.jump(6)
            await until(lambda: pd.lost)
            await until(lambda: bool(told))
            assert told[0].kind is FeedKind.EXPIRED and told[0].session == dead.id  # type: ignore[attr-defined]
            async with trio.open_nursery() as n:
                n.start_soon(pa.leave)
                n.start_soon(pb.leave)
            assert not pa.held and not pb.held
            with pytest.raises(LockLostError):
                await pd.leave()


@on_both_loops
async def test_cyclic_barrier_rounds_are_safe(server: RunningServer) -> None:
    """Four parties, twenty rounds of ``Barrier.wait``: every wait passes, and the recorded
    history shows nobody ever passed before all four had arrived."""
    with anyio.fail_after(30):
        async with open_lock_client(port=server.port) as c:
            sessions = [await c.session().__aenter__() for _ in range(4)]
            attempts: list[Attempt] = []

            async def party(i: int) -> None:
                barrier = AsyncBarrier(sessions[i], NS, "cycle", parties=4)
                for _ in range(20):
                    arrived = anyio.current_time()
                    assert await barrier.wait()
                    attempts.append(Attempt("cycle", f"p{i}", arrived, anyio.current_time()))

            async with anyio.create_task_group() as tg:
                for i in range(4):
                    tg.start_soon(party, i)
            assert len(attempts) == 80
            check_barrier(attempts, 4).assert_ok()


def test_sync_double_barrier_with_threads(threaded_server: ThreadedServer[RunningServer]) -> None:
    """The sync face: three threads, ``with DoubleBarrier(...)`` blocks: each body starts only
    once all three entered, and each ``with`` ends only once all three left."""
    with LockClient(port=threaded_server.port) as c:
        sessions = [c.session() for _ in range(3)]
        log: list[str] = []
        mu = threading.Lock()

        def party(i: int) -> None:
            with DoubleBarrier(sessions[i], NS, "threads", parties=3), mu:
                log.append("in")
            with mu:
                log.append("out")

        threads = [threading.Thread(target=party, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert log == ["in"] * 3 + ["out"] * 3
        assert threaded_server.call(waiters, threaded_server.server) == 0
        sync_barrier = Barrier(sessions[0], NS, "alone", parties=2)
        assert sync_barrier.wait(timeout=0.1) is False
