"""The load itself: tasks that run workload cycles and record what happened.

Why: one worker (the main process, or each of ``--processes`` children) opens its share of the
connections, waits at the start gate, then runs its tasks until the common deadline or its share
of ``--count``. The cycle logic is written once (:func:`task_loop`) and awaited under trio (our
client) or asyncio (redis.asyncio): a coroutine does not care which loop drives it as long as
what it awaits belongs to that loop. The sync faces get the same cycle in :func:`sync_loop`.

A cycle: take ``pipeline`` ops from the task's stream; send their acquires together; record one
latency per request (for a pipelined batch: the batch's round trip, for both backends); if any
succeeded, hold ``hold`` seconds, then release those together (timed the same way). Failed
acquires are counted, never retried: the success ratio is part of the result.

Timing rules: deadlines are ``time.monotonic`` values (CLOCK_MONOTONIC, one clock for every
process of the machine) handed out by the gate, so all workers measure the same window. Before
``measure_at`` is the warm-up: cycles run but the recorder is reset when the window opens.
Latencies come from ``time.perf_counter_ns``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import attrs

from ._hdr import LatencyHistogram
from ._targets import Backend
from ._workloads import Op, OpKind, WorkloadParams, op_stream

__all__ = [
    "MAX_ERRORS",
    "Gate",
    "Recorder",
    "WorkerReport",
    "WorkerSpec",
    "run_worker",
    "sync_loop",
    "task_loop",
]

MAX_ERRORS = 1000  # a worker gives up after this many failed requests
ERROR_BACKOFF = 0.01  # seconds a task pauses after a failed request
MAX_ERROR_SAMPLES = 5
PUBLISH_EVERY = 0.1  # seconds between progress publications to the parent
STOP_GRACE = 15.0  # after the deadline, tasks get this long to finish their cycle


class Gate(Protocol):
    """The start gate. A worker calls :meth:`wait` once its connections are open; it returns
    ``(measure_at, end_at)`` (monotonic seconds) when every worker is ready."""

    def wait(self) -> tuple[float, float]: ...


@attrs.frozen
class WorkerSpec:
    """What one worker runs (picklable: sent to child processes)."""

    backend: Backend
    host: str
    port: int
    workload: str
    params: WorkloadParams
    client: str  # "sync" or "async"
    first_task: int  # global index of this worker's first task
    tasks: int
    connections: int
    pipeline: int
    hold: float
    count: int  # this worker's share of --count
    run_id: str = attrs.field(factory=lambda: uuid.uuid4().hex[:8])


@attrs.frozen
class WorkerReport:
    """What a worker measured in the window (picklable)."""

    ops: int
    requests: int
    acquires: int
    acquired: int
    errors: int
    error_samples: tuple[str, ...]
    histogram: str  # LatencyHistogram.encode()
    measure_at: float
    finished_at: float
    extra_histogram: str = ""  # a second latency histogram, when the worker keeps one
    per_server: tuple[int, ...] = ()  # blast over several servers: replies from each
    # The blasters: the longest time in the window without any reply (0: fewer than two
    # replies) and when it began, in seconds from the window's start.
    reply_gap_ns: int = 0
    reply_gap_at: float = 0.0
    # The bigtable blaster: acquires that succeeded over the whole run (warm-up included),
    # and requests still unanswered when it stopped.
    acquired_total: int = 0
    unanswered: int = 0
    # The bigtable blaster, where the kernel timestamps received data (Linux): latency to
    # the reply's arrival in this machine's kernel (LatencyHistogram.encode(); "" without
    # timestamps), the longest a reply lay there before the blaster read it, and the
    # replies that came without a stamp (the kernel turns stamping on for the whole host
    # with a delay, and off when no socket asks: under load a few go unstamped).
    arrival_histogram: str = ""
    read_delay_max_ns: int = 0
    arrival_unstamped: int = 0


class Recorder:
    """Counters and the latency histogram of one worker, plus its deadlines."""

    __slots__ = (
        "_next_publish",
        "acquired",
        "acquires",
        "end_at",
        "error_samples",
        "errors",
        "hist",
        "limit",
        "measure_at",
        "measuring",
        "ops",
        "publish",
        "requests",
    )

    def __init__(
        self,
        limit: int,
        measure_at: float = 0.0,
        end_at: float = float("inf"),
        publish: Callable[[Recorder], None] | None = None,
    ) -> None:
        self.limit = limit
        self.measure_at = measure_at
        self.end_at = end_at
        self.measuring = False
        self.publish = publish
        self._next_publish = 0.0
        self.hist = LatencyHistogram()
        self.ops = self.requests = self.acquires = self.acquired = self.errors = 0
        self.error_samples: list[str] = []

    def open(self, measure_at: float, end_at: float) -> None:
        """Set the window (from the gate)."""
        self.measure_at = measure_at
        self.end_at = end_at

    def go(self) -> bool:
        """Whether a task may start another cycle; opens the window when its time comes."""
        now = time.monotonic()
        if now >= self.end_at or self.errors >= MAX_ERRORS:
            return False
        if not self.measuring and now >= self.measure_at:
            self.measuring = True
            self.hist.reset()
            self.ops = self.requests = self.acquires = self.acquired = 0
        if self.publish is not None and now >= self._next_publish:
            self._next_publish = now + PUBLISH_EVERY
            self.publish(self)
        return self.ops < self.limit or not self.measuring

    def error(self, exc: BaseException, requests: int) -> None:
        """Count ``requests`` failed requests and keep a few messages."""
        self.errors += requests
        if len(self.error_samples) < MAX_ERROR_SAMPLES:
            self.error_samples.append(f"{type(exc).__name__}: {exc}")

    def report(self, finished_at: float) -> WorkerReport:
        """The worker's figures for the window."""
        return WorkerReport(
            self.ops,
            self.requests,
            self.acquires,
            self.acquired,
            self.errors,
            tuple(self.error_samples),
            self.hist.encode(),
            self.measure_at,
            finished_at,
        )


class AsyncOps(Protocol):
    """What the cycle needs from a backend (see _lockserver / _redis)."""

    async def ping(self, n: int) -> None: ...
    async def acquire(self, ops: Sequence[Op]) -> list[bool]: ...
    async def release(self, ops: Sequence[Op]) -> None: ...
    async def discard(self, ops: Sequence[Op]) -> None: ...


class SyncOps(Protocol):
    """The sync twin of :class:`AsyncOps`."""

    def ping(self, n: int) -> None: ...
    def acquire(self, ops: Sequence[Op]) -> list[bool]: ...
    def release(self, ops: Sequence[Op]) -> None: ...
    def discard(self, ops: Sequence[Op]) -> None: ...


async def task_loop(
    backend: AsyncOps,
    stream: Any,
    rec: Recorder,
    pipeline: int,
    hold: float,
    sleep: Callable[[float], Awaitable[Any]],
) -> None:
    """Run cycles until the recorder says stop."""
    perf = time.perf_counter_ns
    while rec.go():
        ops: list[Op] = [next(stream) for _ in range(pipeline)]
        n = len(ops)
        t0 = perf()
        try:
            if ops[0].kind is OpKind.PING:
                await backend.ping(n)
                got = None
            else:
                got = await backend.acquire(ops)
        except Exception as exc:
            rec.error(exc, n)
            await sleep(ERROR_BACKOFF)
            continue
        lat = perf() - t0
        rec.requests += n
        rec.hist.record_us(lat // 1000, n)  # one latency per request of the batch
        if got is not None:
            held = [op for op, ok in zip(ops, got, strict=True) if ok]
            rec.acquires += n
            rec.acquired += len(held)
            failed_sessions = [op for op, ok in zip(ops, got, strict=True) if not ok]
            if failed_sessions and ops[0].kind is OpKind.SESSION:
                with contextlib.suppress(Exception):
                    await backend.discard(failed_sessions)
            if held:
                if hold > 0:
                    await sleep(hold)
                t0 = perf()
                try:
                    await backend.release(held)
                except Exception as exc:
                    rec.error(exc, len(held))
                    await sleep(ERROR_BACKOFF)
                    continue
                lat = perf() - t0
                rec.requests += len(held)
                rec.hist.record_us(lat // 1000, len(held))
        rec.ops += n


def sync_loop(backend: SyncOps, stream: Any, rec: Recorder, pipeline: int, hold: float) -> None:
    """The sync twin of :func:`task_loop` (one task, one connection)."""
    perf = time.perf_counter_ns
    while rec.go():
        ops: list[Op] = [next(stream) for _ in range(pipeline)]
        n = len(ops)
        t0 = perf()
        try:
            if ops[0].kind is OpKind.PING:
                backend.ping(n)
                got = None
            else:
                got = backend.acquire(ops)
        except Exception as exc:
            rec.error(exc, n)
            time.sleep(ERROR_BACKOFF)
            continue
        lat = perf() - t0
        rec.requests += n
        rec.hist.record_us(lat // 1000, n)  # one latency per request of the batch
        if got is not None:
            held = [op for op, ok in zip(ops, got, strict=True) if ok]
            rec.acquires += n
            rec.acquired += len(held)
            failed_sessions = [op for op, ok in zip(ops, got, strict=True) if not ok]
            if failed_sessions and ops[0].kind is OpKind.SESSION:
                with contextlib.suppress(Exception):
                    backend.discard(failed_sessions)
            if held:
                if hold > 0:
                    time.sleep(hold)
                t0 = perf()
                try:
                    backend.release(held)
                except Exception as exc:
                    rec.error(exc, len(held))
                    time.sleep(ERROR_BACKOFF)
                    continue
                lat = perf() - t0
                rec.requests += len(held)
                rec.hist.record_us(lat // 1000, len(held))
        rec.ops += n


# --- drivers: connect, wait at the gate, run the tasks ----------------------------------------


def run_worker(
    spec: WorkerSpec, gate: Gate, publish: Callable[[Recorder], None] | None = None
) -> WorkerReport:
    """Run one worker to completion and return its report."""
    rec = Recorder(spec.count, publish=publish)
    if spec.client == "sync":
        if spec.tasks != 1 or spec.connections != 1:
            raise ValueError("the sync client runs one task on one connection")
        if spec.backend is Backend.LOCKSERVER:
            _sync_lockserver(spec, gate, rec)
        else:
            _sync_redis(spec, gate, rec)
    elif spec.backend is Backend.LOCKSERVER:
        import trio

        trio.run(_trio_lockserver, spec, gate, rec)
    else:
        asyncio.run(_asyncio_redis(spec, gate, rec))
    if publish is not None:
        publish(rec)
    return rec.report(time.monotonic())


def _streams(spec: WorkerSpec) -> list[Any]:
    return [op_stream(spec.workload, spec.params, spec.first_task + i) for i in range(spec.tasks)]


def _session_id(spec: WorkerSpec, i: int) -> str:
    return f"lockbench-{spec.run_id}-{spec.first_task + i}"


def _sync_lockserver(spec: WorkerSpec, gate: Gate, rec: Recorder) -> None:
    from client import LockClient

    from ._lockserver import LockserverSyncOps

    with LockClient(spec.host, spec.port, client_name="lockbench-sync") as client:
        session = client.session(session_id=_session_id(spec, 0), keepalive=False)
        ops = LockserverSyncOps(client, session)
        rec.open(*gate.wait())
        try:
            sync_loop(ops, _streams(spec)[0], rec, spec.pipeline, spec.hold)
        finally:
            with contextlib.suppress(Exception):
                session.end()


def _sync_redis(spec: WorkerSpec, gate: Gate, rec: Recorder) -> None:
    import redis

    from ._redis import RedisSyncOps

    client = redis.Redis(host=spec.host, port=spec.port)
    try:
        ops = RedisSyncOps(client)
        client.ping()
        rec.open(*gate.wait())
        sync_loop(ops, _streams(spec)[0], rec, spec.pipeline, spec.hold)
    finally:
        client.close()


async def _trio_lockserver(spec: WorkerSpec, gate: Gate, rec: Recorder) -> None:
    import trio

    from client import open_lock_client

    from ._lockserver import LockserverAsyncOps

    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                open_lock_client(spec.host, spec.port, client_name="lockbench-trio")
            )
            for _ in range(spec.connections)
        ]
        sessions = [
            clients[i % spec.connections].session(session_id=_session_id(spec, i), keepalive=False)
            for i in range(spec.tasks)
        ]
        streams = _streams(spec)
        rec.open(*await trio.to_thread.run_sync(gate.wait))
        with trio.move_on_after(max(0.0, rec.end_at - time.monotonic()) + STOP_GRACE):
            async with trio.open_nursery() as nursery:
                for i, session in enumerate(sessions):
                    ops = LockserverAsyncOps(clients[i % spec.connections], session)
                    nursery.start_soon(
                        task_loop, ops, streams[i], rec, spec.pipeline, spec.hold, trio.sleep
                    )
        with trio.move_on_after(5):
            for session in sessions:
                with contextlib.suppress(Exception):
                    await session.end()


async def _asyncio_redis(spec: WorkerSpec, gate: Gate, rec: Recorder) -> None:
    import redis.asyncio

    from ._redis import SCRIPTS, RedisAsyncOps

    # One pool of --connections connections shared by every task: redis-py gives a command a
    # connection of its own for its whole round trip (RESP has no request ids), so tasks queue
    # for a free connection when there are more tasks than connections.
    pool = redis.asyncio.BlockingConnectionPool(
        host=spec.host, port=spec.port, max_connections=spec.connections, timeout=None
    )
    client = redis.asyncio.Redis(connection_pool=pool)
    try:
        ops = RedisAsyncOps(client)
        for src in SCRIPTS.values():
            await client.script_load(src)
        streams = _streams(spec)
        rec.open(*await asyncio.to_thread(gate.wait))
        grace = max(0.0, rec.end_at - time.monotonic()) + STOP_GRACE
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await asyncio.gather(
                    *(
                        task_loop(ops, streams[i], rec, spec.pipeline, spec.hold, asyncio.sleep)
                        for i in range(spec.tasks)
                    )
                )
    finally:
        await client.aclose()
        await pool.aclose()
