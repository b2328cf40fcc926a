"""The countdown latch (issue 33): count_down, count, wait on the server; the count belongs
to the latch's own session, so a party that counts down and exits still counted; racing
count-downs each count once; an open latch stays open; a party that dies before counting
down is never heard of, and a bounded wait says so (False).

Tests marked ``@on_both_loops`` run under trio and under asyncio (tests/asyncio_support.py).
"""

from __future__ import annotations

import anyio
import pytest
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, ThreadedServer, entries, waiters

from client import AsyncCountDownLatch, CountDownLatch, LockClient, open_lock_client
from client.recipes import LATCH_TABLE
from lockserver import RunningServer


@on_both_loops
async def test_waiters_open_together_on_the_last_count_down(server: RunningServer) -> None:
    """Two waiters park on the server (one request each); two count-downs from other
    sessions; both waiters pass on the second; count() follows; a late waiter passes at once."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            w1, w2, p1, p2 = [await c.session().__aenter__() for _ in range(4)]
            latch = AsyncCountDownLatch(w1, NS, "ready", count=2)
            assert await latch.count() == 2
            opened: list[str] = []

            async def waiter(s: object, name: str) -> None:
                assert await AsyncCountDownLatch(s, NS, "ready", count=2).wait()  # type: ignore[arg-type]
                opened.append(name)

            async with anyio.create_task_group() as tg:
                tg.start_soon(waiter, w1, "w1")
                tg.start_soon(waiter, w2, "w2")
                await until(lambda: on_server(waiters, server) == 2)
                assert await AsyncCountDownLatch(p1, NS, "ready", count=2).count_down() == 1
                await anyio.sleep(0.05)
                assert opened == [] and await latch.count() == 1
                assert await AsyncCountDownLatch(p2, NS, "ready", count=2).count_down() == 0
            assert sorted(opened) == ["w1", "w2"]
            assert await latch.count() == 0
            assert await latch.wait(timeout=0)
            assert await latch.count_down() == 0  # no effect once open
            [record] = await entries(w1, LATCH_TABLE, "ready")
            assert record["value"] == 2 and record["session"] == latch.session_id


@on_both_loops
async def test_a_count_down_outlives_the_party_that_made_it(server: RunningServer) -> None:
    """A worker counts down and ends its session (it is done and exits): its count-down
    stays, because it belongs to the latch's session."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as boss:
            for _ in range(3):
                async with c.session() as worker:
                    await AsyncCountDownLatch(worker, NS, "jobs", count=3).count_down()
            assert await AsyncCountDownLatch(boss, NS, "jobs", count=3).wait(timeout=1)


@on_both_loops
async def test_racing_count_downs_each_count_once(server: RunningServer) -> None:
    """Twenty count-downs racing from twenty sessions (compare-and-set retries): the count
    reaches exactly twenty, and the latch of twenty opens."""
    with anyio.fail_after(20):
        async with open_lock_client(port=server.port) as c, c.session() as boss:
            sessions = [await c.session().__aenter__() for _ in range(20)]
            async with anyio.create_task_group() as tg:
                for s in sessions:
                    tg.start_soon(AsyncCountDownLatch(s, NS, "race", count=20).count_down)
            latch = AsyncCountDownLatch(boss, NS, "race", count=20)
            assert await latch.count() == 0 and await latch.wait(timeout=0)
            [record] = await entries(boss, LATCH_TABLE, "race")
            assert record["value"] == 20


@on_both_loops
async def test_a_dead_party_is_not_waited_for_forever(server: RunningServer) -> None:
    """Of three workers one dies before counting down: the latch cannot hear from it, so a
    bounded wait ends with False (the count says one is missing), and a replacement
    worker's count-down opens it."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as boss:
            async with c.session() as w1, c.session() as w2:
                await AsyncCountDownLatch(w1, NS, "crew", count=3).count_down()
                await AsyncCountDownLatch(w2, NS, "crew", count=3).count_down()
            async with c.session() as dead:
                pass  # it dies without counting down
            latch = AsyncCountDownLatch(boss, NS, "crew", count=3)
            assert await latch.wait(timeout=0.2) is False
            assert await latch.count() == 1
            async with c.session() as replacement:
                await AsyncCountDownLatch(replacement, NS, "crew", count=3).count_down()
            assert await latch.wait(timeout=1)
            assert dead.ended


def test_sync_latch(threaded_server: ThreadedServer[RunningServer]) -> None:
    """The sync face: count, count_down, wait with and without a timeout; bad arguments are
    refused before anything is sent."""
    with LockClient(port=threaded_server.port) as c, c.session() as s:
        latch = CountDownLatch(s, NS, "sync", count=2)
        assert latch.count() == 2
        assert latch.wait(timeout=0.1) is False
        assert latch.count_down() == 1
        assert latch.count_down() == 0
        assert latch.wait()
        with pytest.raises(ValueError):
            CountDownLatch(s, NS, "bad", count=0)
        with pytest.raises(ValueError):
            latch.wait(timeout=-1)
