"""MultiLock (seed 003) on the async face: sets of read/write locks all or nothing, stamps,
unknown stamps, release_all for a crashed instance, and interplay with ReadWriteLock.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import anyio
import pytest
from asyncio_support import on_both_loops
from recipes_support import NS, entries

from client import (
    AsyncLockSet,
    AsyncMultiLock,
    AsyncReadWriteLock,
    LockLostError,
    UnknownStamp,
    open_lock_client,
)
from client.recipes import READ_TABLE, WRITE_TABLE
from lockserver import RunningServer


@on_both_loops
async def test_try_locks_all_or_nothing_with_a_stamp(server: RunningServer) -> None:
    """A set is taken in one transaction; its stamp is the value of every entry; a set that
    conflicts anywhere takes nothing at all."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            AsyncMultiLock(c, NS, "ws2") as ws2,
            AsyncMultiLock(c, NS, "ws3") as ws3,
        ):
            assert ws2.session.id == "app:ws2"
            stamp = await ws2.try_locks({"WS2": "w", "WS1": "r"})
            assert stamp is not None and ws2.stamps() == [stamp]
            [w] = await entries(ws2.session, WRITE_TABLE, "WS2")
            [r] = await entries(ws2.session, READ_TABLE, "WS1")
            assert w["value"] == stamp == r["value"] and w["fence"] == r["fence"]
            assert await ws3.try_locks({"WS2": "r"}) is None
            assert await ws3.try_locks({"WS1": "w", "WS3": "w"}) is None
            assert await entries(ws3.session, WRITE_TABLE, "WS3") == []  # nothing taken
            other = await ws3.try_locks({"WS1": "r", "WS3": "w"})  # readers share WS1
            assert other is not None and other != stamp
            await ws2.release_locks(stamp)
            assert await entries(ws2.session, WRITE_TABLE, "WS2") == []
            assert [e["value"] for e in await entries(ws2.session, READ_TABLE, "WS1")] == [other]
            with pytest.raises(UnknownStamp):
                await ws2.release_locks(stamp)  # already released
            with pytest.raises(UnknownStamp):
                await ws2.release_locks("0")
            with pytest.raises(ValueError):
                await ws3.try_locks({"X": "rw"})
            with pytest.raises(ValueError):
                await ws3.try_locks({})


@on_both_loops
async def test_blocking_try_locks_waits_for_the_whole_set(server: RunningServer) -> None:
    """With blocking=True the set is parked on the server until all of it can be taken."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            AsyncMultiLock(c, NS, "a") as a,
            AsyncMultiLock(c, NS, "b") as b,
        ):
            first = await a.try_locks({"L1": "w"})
            assert first is not None
            got: list[str | None] = []

            async def take() -> None:
                got.append(await b.try_locks({"L1": "r", "L2": "w"}, blocking=True))

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(take)
                await anyio.sleep(0.1)
                assert got == []
                await a.release_locks(first)
            assert got[0] is not None


@on_both_loops
async def test_release_all_removes_what_a_crashed_instance_left(server: RunningServer) -> None:
    """An instance of app "billing" crashes holding locks (its session is still alive); the
    next instance's release_all ends the app's session, which removes them all at once."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            async with open_lock_client(port=server.port) as crashed_client:
                crashed = AsyncMultiLock(crashed_client, NS, "billing")
                assert await crashed.try_locks({"ledger": "w", "rates": "r"}) is not None
                # the process dies: no release, the session stays until it expires
            async with AsyncMultiLock(c, NS, "reports") as reports:
                assert await reports.try_locks({"ledger": "r"}) is None
                async with AsyncMultiLock(c, NS, "billing") as restarted:
                    assert await restarted.release_all() is True
                    assert await reports.try_locks({"ledger": "r"}) is not None
                    assert await restarted.try_locks({"rates": "w"}) is not None
                    assert await restarted.try_locks({"ledger": "w"}) is None  # reports reads


@on_both_loops
async def test_lock_sets_and_read_write_locks_share_their_tables(server: RunningServer) -> None:
    """A ReadWriteLock and a MultiLock set of the same name exclude each other."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as s,
            AsyncMultiLock(c, NS, "app") as app,
        ):
            rw = AsyncReadWriteLock(s, NS, "shared")
            assert await rw.write.acquire()
            assert await app.try_locks({"shared": "r"}) is None
            await rw.write.release()
            stamp = await app.try_locks({"shared": "r"})
            assert stamp is not None
            assert not await rw.write.acquire(blocking=False)
            assert await rw.read.acquire(blocking=False)
            async with AsyncLockSet(s, NS, {"solo": "w"}) as lock_set:
                assert lock_set.stamp is not None and lock_set.locks == {"solo": "w"}


@on_both_loops
async def test_release_locks_of_a_lost_set_raises(server: RunningServer) -> None:
    """A set whose session was ended by someone else is reported lost at its release."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            AsyncMultiLock(c, NS, "fragile") as app,
        ):
            stamp = await app.try_locks({"x": "w"})
            assert stamp is not None
            assert await admin.end_session(app.session.id)
            with pytest.raises(LockLostError):
                await app.release_locks(stamp)
            with pytest.raises(UnknownStamp):
                await app.release_locks(stamp)
