"""Concurrency: 16 tasks over 4 connections hammer a few locks with blocking acquires for a
bounded time; the safety checker (lockbench.safety) records every critical section with
its fence and proves that no two exclusive holders overlapped, readers never overlapped a
writer, the semaphore never exceeded its permits, fences strictly increased per lock, and
every client got in. The sync face gets the same treatment with 16 threads.

The async tests run under trio and under asyncio (``@on_both_loops``,
tests/asyncio_support.py)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

import anyio
from asyncio_support import on_both_loops
from recipes_support import NS, ThreadedServer

from client import (
    AsyncLockClient,
    AsyncMultiLock,
    AsyncMutex,
    AsyncReadWriteLock,
    AsyncSemaphore,
    AsyncSession,
    LockClient,
    Mutex,
    open_lock_client,
)
from client.recipes import AsyncLock
from lockbench.safety import Recorder, Report
from lockserver import RunningServer

CONNECTIONS = 4
TASKS = 16
DURATION = 1.5  # seconds of hammering per recipe
MAX_ROUNDS = 150  # per task, whichever comes first
LOCKS = ("L0", "L1")

Body = Callable[[int, random.Random, AsyncSession, AsyncLockClient, Recorder], Awaitable[None]]


async def hammer(server: RunningServer, body: Body) -> Report:
    """Run ``body(task, rng, session, client, recorder)`` in TASKS tasks spread over
    CONNECTIONS clients until DURATION has passed (or MAX_ROUNDS each); check the record."""
    recorder = Recorder()
    deadline = time.monotonic() + DURATION
    with anyio.fail_after(30):
        async with AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(open_lock_client(port=server.port))
                for _ in range(CONNECTIONS)
            ]

            async def task(i: int) -> None:
                rng = random.Random(i)
                client = clients[i % CONNECTIONS]
                async with client.session() as session:
                    for n in range(MAX_ROUNDS):
                        if n and time.monotonic() >= deadline:
                            break
                        await body(i, rng, session, client, recorder)

            async with anyio.create_task_group() as nursery:
                for i in range(TASKS):
                    nursery.start_soon(task, i)
    report = recorder.check()
    report.assert_ok()
    assert sorted(report.holders) == sorted(f"t{i}" for i in range(TASKS)), report.holders
    return report


async def critical(lock: AsyncLock, recorder: Recorder, name: str, mode: str, i: int) -> None:
    """Hold ``lock`` (already acquired) for a moment, recorded, then release it."""
    assert lock.fence is not None
    with recorder.hold(name, mode, lock.fence, f"t{i}"):
        await anyio.sleep(0)
        await anyio.sleep(0)
    assert await lock.release()


@on_both_loops
async def test_mutex_under_contention(server: RunningServer) -> None:
    """Mutex: never two holders of a lock at once; fences increase in grant order."""

    async def body(
        i: int, rng: random.Random, s: AsyncSession, c: AsyncLockClient, rec: Recorder
    ) -> None:
        name = rng.choice(LOCKS)
        lock = AsyncMutex(s, NS, f"mutex-{name}")
        assert await lock.acquire()
        await critical(lock, rec, name, "w", i)

    report = await hammer(server, body)
    assert all(report.max_holders[name] == {"w": 1} for name in LOCKS)


@on_both_loops
async def test_read_write_lock_under_contention(server: RunningServer) -> None:
    """ReadWriteLock: writers alone, readers together but never beside a writer; both
    modes actually happen, readers really share."""

    async def body(
        i: int, rng: random.Random, s: AsyncSession, c: AsyncLockClient, rec: Recorder
    ) -> None:
        name = rng.choice(LOCKS)
        rw = AsyncReadWriteLock(s, NS, f"rw-{name}")
        if rng.random() < 0.3:
            assert await rw.write.acquire()
            await critical(rw.write, rec, name, "w", i)
        else:
            assert await rw.read.acquire()
            await critical(rw.read, rec, name, "r", i)

    report = await hammer(server, body)
    for name in LOCKS:
        assert report.max_holders[name]["w"] == 1
        assert report.max_holders[name]["r"] >= 2


@on_both_loops
async def test_multilock_under_contention(server: RunningServer) -> None:
    """MultiLock sets over three locks with random modes: every lock of every set obeys the
    read/write rules while all are held together."""
    names = ("A", "B", "C")

    async def body(
        i: int, rng: random.Random, s: AsyncSession, c: AsyncLockClient, rec: Recorder
    ) -> None:
        chosen = rng.sample(names, rng.randint(1, 3))
        spec = {n: ("w" if rng.random() < 0.3 else "r") for n in chosen}
        app = AsyncMultiLock(c, NS, f"app-{i}")
        lock_set = app.lock_set(spec)
        assert await lock_set.acquire()
        assert lock_set.fence is not None
        start = rec.now()
        await anyio.sleep(0)
        end = rec.now()
        for n, mode in spec.items():
            rec.record(f"multi-{n}", mode, start, end, lock_set.fence, f"t{i}")
        assert await lock_set.release()

    report = await hammer(server, body)
    assert all(report.max_holders[f"multi-{n}"]["w"] == 1 for n in names)


@on_both_loops
async def test_semaphore_under_contention(server: RunningServer) -> None:
    """Semaphore(permits=3): never more than three holders, and three do happen."""

    async def body(
        i: int, rng: random.Random, s: AsyncSession, c: AsyncLockClient, rec: Recorder
    ) -> None:
        sem = AsyncSemaphore(s, NS, "sem", permits=3)
        assert await sem.acquire()
        assert sem.fence is not None
        with rec.hold("sem", "s", sem.fence, f"t{i}", capacity=3):
            await anyio.sleep(0.001)
        assert await sem.release()

    report = await hammer(server, body)
    assert report.max_holders["sem"] == {"s": 3}


def test_sync_mutex_threads_under_contention(threaded_server: ThreadedServer) -> None:
    """The sync face: 16 threads over 4 LockClients (a session each) on two mutexes."""
    recorder = Recorder()
    errors: list[BaseException] = []
    deadline = time.monotonic() + DURATION
    clients = [LockClient(port=threaded_server.port, timeout=20) for _ in range(CONNECTIONS)]

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            with clients[i % CONNECTIONS].session() as s:
                for n in range(MAX_ROUNDS):
                    if n and time.monotonic() >= deadline:
                        break
                    name = rng.choice(LOCKS)
                    with Mutex(s, NS, f"sync-{name}") as lock:
                        assert lock.fence is not None
                        with recorder.hold(name, "w", lock.fence, f"t{i}"):
                            time.sleep(0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(TASKS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert not errors, errors
    report = recorder.check()
    report.assert_ok()
    assert len(report.holders) == TASKS
