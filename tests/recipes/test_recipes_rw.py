"""Read/write locks (seed 000's doorman lock) and configured permits (seed 003) on the
async face: readers share, writers exclude, writer preference, one entry per session, permits read
from the server in the same transaction.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import anyio
from asyncio_support import on_both_loops, on_server, until
from recipes_support import NS, entries, waiters

from client import AsyncReadWriteLock, clear_permits, get_permits, open_lock_client, set_permits
from client.recipes import PERMITS_TABLES, READ_TABLE, WRITE_TABLE
from lockserver import RunningServer


@on_both_loops
async def test_readers_share_writers_exclude(server: RunningServer) -> None:
    """Any number of readers at once; no writer while a reader holds, no reader while the
    writer holds; every grant is one transaction with its own fence."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as a,
            c.session() as b,
            c.session() as w,
        ):
            ra, rb = AsyncReadWriteLock(a, NS, "doc"), AsyncReadWriteLock(b, NS, "doc")
            rw = AsyncReadWriteLock(w, NS, "doc")
            assert await ra.read.acquire(blocking=False)
            assert await rb.read.acquire(blocking=False)
            assert ra.read.fence is not None and rb.read.fence is not None
            assert rb.read.fence > ra.read.fence
            values = sorted(e["value"] for e in await entries(a, READ_TABLE, "doc"))
            assert values == sorted([ra.read.ticket, rb.read.ticket])
            assert not await rw.write.acquire(blocking=False)
            assert await ra.read.release() and await rb.read.release()
            assert await rw.write.acquire(blocking=False)
            assert [e["session"] for e in await entries(a, WRITE_TABLE, "doc")] == [w.id]
            assert not await ra.read.acquire(blocking=False)
            assert not await AsyncReadWriteLock(b, NS, "doc").write.acquire(blocking=False)
            await rw.write.release()
            assert await ra.read.acquire(blocking=False)


@on_both_loops
async def test_one_entry_per_session(server: RunningServer) -> None:
    """A session holds at most one entry per variable: a second read lock of the same name
    in the same session is not granted while the first is held (instead of silently sharing
    the first one's entry), and a session holding the read side cannot take the write side."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            first, second = AsyncReadWriteLock(s, NS, "one"), AsyncReadWriteLock(s, NS, "one")
            assert await first.read.acquire(blocking=False)
            assert not await second.read.acquire(blocking=False)
            assert not await second.write.acquire(blocking=False)
            assert [e["value"] for e in await entries(s, READ_TABLE, "one")] == [first.read.ticket]
            await first.read.release()
            assert await second.read.acquire(blocking=False)


@on_both_loops
async def test_writer_preference(server: RunningServer) -> None:
    """With readers holding, a waiting writer stops newcomer readers (they give way to it:
    ``Not(Waiting(...))``); the writer gets in as soon as the existing readers leave, then
    the newcomer once the writer is done."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as r1,
            c.session() as r2,
            c.session() as w,
            c.session() as r3,
        ):
            reader1, reader2 = AsyncReadWriteLock(r1, NS, "wp"), AsyncReadWriteLock(r2, NS, "wp")
            writer, late = AsyncReadWriteLock(w, NS, "wp"), AsyncReadWriteLock(r3, NS, "wp")
            assert await reader1.read.acquire(blocking=False)
            assert await reader2.read.acquire(blocking=False)
            order: list[str] = []

            async def write() -> None:
                assert await writer.write.acquire()
                order.append("writer")
                await anyio.sleep(0.05)
                await writer.write.release()

            async def read_late() -> None:
                assert await late.read.acquire()
                order.append("late reader")
                await late.read.release()

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(write)
                await until(lambda: on_server(waiters, server) == 1)
                # A newcomer gives way to the parked writer, although only readers hold.
                assert not await late.read.acquire(blocking=False)
                assert late.read.last_result is not None
                assert "AssertOp" in (late.read.last_result.failed_statement or "")
                nursery.start_soon(read_late)
                await until(lambda: on_server(waiters, server) == 2)
                await reader1.read.release()
                await anyio.sleep(0.05)
                assert order == []  # reader2 still holds
                await reader2.read.release()
            assert order == ["writer", "late reader"]


@on_both_loops
async def test_a_writer_that_gives_up_lets_the_readers_in(server: RunningServer) -> None:
    """A waiting writer that times out stops holding readers back: the reader parked behind
    it is granted without anything else changing."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session() as r1,
            c.session() as w,
            c.session() as r2,
        ):
            holder = AsyncReadWriteLock(r1, NS, "giveup")
            writer, reader = (
                AsyncReadWriteLock(w, NS, "giveup"),
                AsyncReadWriteLock(r2, NS, "giveup"),
            )
            assert await holder.read.acquire()
            outcome: list[tuple[str, bool]] = []

            async def write() -> None:
                outcome.append(("writer", await writer.write.acquire(timeout=0.3)))

            async def read() -> None:
                outcome.append(("reader", await reader.read.acquire(timeout=5)))

            async with anyio.create_task_group() as nursery:
                nursery.start_soon(write)
                await until(lambda: on_server(waiters, server) == 1)
                nursery.start_soon(read)
            assert sorted(outcome) == [("reader", True), ("writer", False)]


@on_both_loops
async def test_configured_permits(server: RunningServer) -> None:
    """Permits stored in the server apply to every client at once: 2 readers max, then 2
    concurrent writers; another session cannot overwrite the setting; clearing it (or ending
    the admin session) restores the defaults."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as admin:
            sessions = [c.session() for _ in range(3)]
            locks = [AsyncReadWriteLock(s, NS, "db") for s in sessions]
            assert await get_permits(admin, NS, "db", "r") is None
            assert await set_permits(admin, NS, "db", "r", 2) is True
            assert await get_permits(admin, NS, "db", "r") == 2
            [record] = await entries(admin, PERMITS_TABLES["r"], "db")
            assert record["value"] == 2 and record["session"] == admin.id
            async with c.session() as intruder:
                assert await set_permits(intruder, NS, "db", "r", 50) is False
            assert await set_permits(admin, NS, "db", "r", 2) is True  # own: replaced

            assert await locks[0].read.acquire(blocking=False)
            assert await locks[1].read.acquire(blocking=False)
            assert not await locks[2].read.acquire(blocking=False)
            assert await clear_permits(admin, NS, "db", "r") is True
            assert await clear_permits(admin, NS, "db", "r") is False
            assert await locks[2].read.acquire(blocking=False)
            for lock in locks:
                await lock.read.release()

            assert await set_permits(admin, NS, "db", "w", 2) is True
            assert await locks[0].write.acquire(blocking=False)
            assert await locks[1].write.acquire(blocking=False)
            assert not await locks[2].write.acquire(blocking=False)
            assert not await locks[2].read.acquire(blocking=False)  # writers hold
            await locks[0].write.release()
            assert await locks[2].write.acquire(blocking=False)
            await locks[1].write.release()
            await locks[2].write.release()
            await admin.end()
            # The setting lived as long as the admin session: back to one writer.
            assert await locks[0].write.acquire(blocking=False)
            assert not await locks[1].write.acquire(blocking=False)
            for s in sessions:
                await s.end()
