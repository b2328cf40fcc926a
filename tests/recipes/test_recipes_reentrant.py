"""The reentrant mutex (issue 33): the same owner (thread on the sync face, task on the async
faces) acquires again with no round trip and must release as many times; every other owner,
of this process or another session, waits on the server; it excludes a Mutex of the same name;
a lost grant is reported to its owner and cancels the outermost ``async with``.

Tests marked ``@on_both_loops`` run under trio and under asyncio (tests/asyncio_support.py).
"""

from __future__ import annotations

import threading
import time

import anyio
import pytest
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, ThreadedServer, sync_entries, waiters

from client import (
    AsyncMutex,
    AsyncReentrantMutex,
    LockClient,
    LockLostError,
    Mutex,
    ReentrantMutex,
    open_lock_client,
)
from client.recipes import MUTEX_TABLE
from lockserver import RunningServer


@on_both_loops
async def test_nested_acquires_cost_no_round_trip(server: RunningServer) -> None:
    """The first acquire is one request; the nested ones and all releases but the last are
    none; the count follows; the fence is the one grant's; the last release ends it."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            rm = AsyncReentrantMutex(s, NS, "walk")
            sent = c.local_statistics().requests_sent
            assert await rm.acquire()
            assert c.local_statistics().requests_sent == sent + 1
            fence = rm.fence
            async with rm:
                assert await rm.acquire(blocking=False)
                assert rm.count == 3 and rm.fence == fence and rm.held
                assert await rm.release()
            assert rm.count == 1
            assert c.local_statistics().requests_sent == sent + 1  # none of those was sent
            assert await rm.release()
            assert c.local_statistics().requests_sent == sent + 2
            assert not rm.held and rm.count == 0 and rm.fence is None
            with pytest.raises(RuntimeError, match="does not hold"):
                await rm.release()


@on_both_loops
async def test_other_owner_is_served_after_the_owner_lets_go(server: RunningServer) -> None:
    """Order: the owner holds twice, a second task waits (parked), the owner releases twice,
    then (and only then) the second task holds."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            rm = AsyncReentrantMutex(s, NS, "order")
            log: list[str] = []
            assert await rm.acquire() and await rm.acquire()

            async def other() -> None:
                assert await rm.acquire()
                log.append("other")
                await rm.release()

            async with anyio.create_task_group() as tg:
                tg.start_soon(other)
                await until(lambda: on_server(waiters, server) == 1)
                await rm.release()
                await anyio.sleep(0.05)
                assert log == []  # still held once
                log.append("owner done")
                await rm.release()
            assert log == ["owner done", "other"]


@on_both_loops
async def test_excludes_a_mutex_of_the_same_name(server: RunningServer) -> None:
    """A ReentrantMutex takes the same entry as a Mutex of its name: each excludes the
    other."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as a, c.session() as b:
            rm = AsyncReentrantMutex(a, NS, "x")
            m = AsyncMutex(b, NS, "x")
            assert await rm.acquire()
            assert not await m.acquire(blocking=False)
            assert await rm.locked()
            await rm.release()
            assert await m.acquire(blocking=False)
            assert not await rm.acquire(blocking=False)
            assert rm.owners == 0


@on_both_loops
async def test_lost_grant_cancels_the_outer_block(server: RunningServer) -> None:
    """The session is ended under a nested hold: the outermost ``async with`` body is
    cancelled and raises LockLostError; nested acquires refuse a lost grant."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as s,
        ):
            rm = AsyncReentrantMutex(s, NS, "lost")
            with pytest.raises(LockLostError):
                async with rm, rm:
                    assert rm.count == 2
                    assert await admin.end_session(s.id)
                    await anyio.sleep_forever()
            assert not rm.held and rm.owners == 0


def test_sync_owner_is_the_thread(threaded_server: ThreadedServer[RunningServer]) -> None:
    """Sync face: nested ``with`` in one thread; another thread of the same session waits on
    the server until the first thread's last release; lost grants raise at the last release."""
    with LockClient(port=threaded_server.port) as c, c.session() as s:
        rm = ReentrantMutex(s, NS, "t")
        order: list[str] = []
        with rm:
            with rm:
                assert rm.count == 2

                def other() -> None:
                    with rm:
                        order.append("other")

                thread = threading.Thread(target=other)
                thread.start()
                deadline = time.monotonic() + 5
                while threaded_server.call(waiters, threaded_server.server) < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            order.append("owner inner out")
            time.sleep(0.05)
            assert order == ["owner inner out"]
        thread.join(10)
        assert order == ["owner inner out", "other"]
        assert sync_entries(s, MUTEX_TABLE, "t") == []
        # a Mutex of the same name is excluded
        assert rm.acquire()
        assert not Mutex(c.session(), NS, "t").acquire(blocking=False)
        c.release(NS, MUTEX_TABLE, "t")  # an operator takes it
        with pytest.raises(LockLostError):
            rm.acquire()  # nested acquire of a lost grant
        with pytest.raises(LockLostError):
            rm.release()
        assert not rm.held
        with pytest.raises(RuntimeError):
            rm.release()
