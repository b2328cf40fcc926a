"""The lab's workloads: client threads that use a lock service as an application would and
record every operation (``Op``), every critical section (``hold``) and, through the fenced
resource, every write a critical section made.

Against our group (``system="lockserver"``), through the client library and its recipes:

- ``register``: read, write and compare-and-set of a handful of registers, **one transaction
  each** over the transaction language. A register is the entry of variable ``key`` in table
  ``reg``, held by one session shared by every register client (``lab-register``, kept alive
  by all of them; the data model keeps entries per session, so a shared session is what makes
  a value outlive its writer). The keys change every ``key_period`` seconds (``r<period>.<k>``),
  as Jepsen's independent keys do, so each key's history stays short enough to check. Read:
  ``SelectVarValue``; write: ``SetVar(..., allow_duplicates=True)``, which replaces the
  session's entry in place; cas: ``Assert(Exists(..., value=expected))`` then the same
  ``SetVar`` -- a cas that finds another value aborts at its ``Assert`` and is ``fail``.
- ``mutex`` (``client.Mutex``), ``rw`` (``client.ReadWriteLock``, readers and writers) and
  ``semaphore`` (``client.Semaphore``): acquire with a bounded wait, hold for a random while
  (sometimes long, to be caught by a fault), release. Exclusive holders (mutex, rw writers)
  write to the fenced resource at the start and at the end of their critical section.

Against etcd (``system="etcd"``): the same ``register`` over etcd's KV (range, put, and a
txn compare-and-set) and ``mutex`` over etcd's lock service with a lease kept alive, the fence
being the lock key's create revision. etcd has no readers-writer lock or semaphore of its own,
so those have no reference line.

Outcomes as the clients know them: ``ok``; ``fail`` when the operation certainly had no
effect (a refused or aborted transaction, an error reply, nothing sent, any failed read);
``unknown`` when it may have taken effect (a lost connection, a timeout). After an unknown
operation the process takes a new name (``c1-reg0`` -> ``c1-reg0.1``), as Jepsen retires a
process whose operation is still in doubt. An operation in flight when the worker is told to
stop is recorded ``unknown`` then.

A holder's guarantee (``valid_until`` in the acquire's ``value``, lab time) is computed as
the recipes compute ``valid_for()``: the time the request was sent plus the server's
``valid_until - uptime``; for etcd, the last keepalive's send time plus the TTL it granted.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import attrs

from lockbench.safety import Interval

from ._etcdgw import EtcdError, EtcdGateway, NotSent, Unknown
from ._history import HistoryWriter, Op, Outcome
from ._resource import ResourceClient

__all__ = ["LOCKSERVER_WORKLOADS", "ETCD_WORKLOADS", "Context", "WorkloadSettings", "run_thread"]

LOCKSERVER_WORKLOADS: Final = ("register", "mutex", "rw", "semaphore")
ETCD_WORKLOADS: Final = ("register", "mutex")
NAMESPACE: Final = "lab"
REGISTER_TABLE: Final = "reg"
REGISTER_SESSION: Final = "lab-register"
#: Operations per thread at most (the stop time ends a thread long before, normally).
MAX_OPS: Final = 10_000_000


@attrs.frozen
class WorkloadSettings:
    """The knobs of every workload (seconds unless said)."""

    timeout: float = 2.0  # a client call's bound
    max_age: float = 4.0  # a lock session's max age (etcd: the lease TTL)
    register_max_age: float = 120.0  # the register session's
    acquire_wait: float = 3.0  # how long an acquire may wait for the lock
    hold_max: float = 0.4  # a critical section's usual length at most
    long_hold: float = 2.5  # ... and a long one's (one in ten)
    think_max: float = 0.1  # pause between a lock thread's operations at most
    register_think: float = 0.1  # pause between register operations at most
    keys: int = 3  # registers at a time
    key_period: float = 10.0  # a new set of registers every so often (bounds each key's history)
    values: int = 5  # values written: 0 .. values-1
    mutexes: int = 2  # mutex names
    permits: int = 2  # the semaphore's

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Context:
    """What every thread of one worker process shares: the lab clock, the history, the stop
    signal, where the servers are, and the operations in flight (for the stop)."""

    def __init__(
        self,
        *,
        system: str,
        name: str,
        servers: list[str],
        etcd: list[str],
        resource: tuple[str, int],
        origin: float,
        stop_at: float,
        seed: int,
        writer: HistoryWriter,
        settings: WorkloadSettings,
    ) -> None:
        self.system = system
        self.name = name
        self.servers = servers
        self.etcd = etcd
        self.resource = resource
        self.origin = origin
        self.stop_at = stop_at
        self.seed = seed
        self.writer = writer
        self.settings = settings
        self.stop = threading.Event()
        self._mu = threading.Lock()
        self._inflight: dict[int, Op] = {}

    def now(self) -> float:
        """The lab clock."""
        return time.monotonic() - self.origin

    def stopping(self) -> bool:
        return self.stop.is_set() or self.now() >= self.stop_at

    def pause(self, seconds: float) -> None:
        """Sleep, cut short by the stop."""
        self.stop.wait(max(0.0, min(seconds, self.stop_at - self.now())))

    def begin(self, op: Op) -> None:
        """An operation was sent: remembered until :meth:`end` (written unknown if the worker
        stops first)."""
        with self._mu:
            self._inflight[threading.get_ident()] = op

    def end(self, op: Op) -> None:
        with self._mu:
            self._inflight.pop(threading.get_ident(), None)
        self.writer.write(op)

    def flush_inflight(self, error: str) -> int:
        """Write every operation still in flight as unknown (the worker is stopping)."""
        with self._mu:
            pending = list(self._inflight.values())
            self._inflight.clear()
        for op in pending:
            self.writer.write(attrs.evolve(op, outcome="unknown", complete=None, error=error))
        return len(pending)


class Process:
    """A thread's process name, renewed after an unknown outcome."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.generation = 0

    @property
    def name(self) -> str:
        return self.base if not self.generation else f"{self.base}.{self.generation}"

    def retire(self) -> None:
        self.generation += 1


def _start(ctx: Context, proc: Process, workload: str, f: str, key: str, value: Any) -> Op:
    op = Op(proc.name, workload, f, key, value, ctx.now(), None, "unknown")
    ctx.begin(op)
    return op


def _finish(
    ctx: Context,
    proc: Process,
    op: Op,
    outcome: Outcome,
    *,
    value: Any = None,
    fence: int | None = None,
    node: str = "",
    error: str = "",
    keep_value: bool = True,
) -> Op:
    done = attrs.evolve(
        op,
        complete=ctx.now(),
        outcome=outcome,
        value=op.value if keep_value else value,
        fence=fence,
        node=node,
        error=error[:300],
    )
    ctx.end(done)
    if outcome == "unknown":
        proc.retire()
    return done


def run_thread(ctx: Context, workload: str, index: int) -> None:
    """Run one workload thread until the stop (exceptions other than the clients' are bugs:
    they propagate and the worker reports them)."""
    rng = random.Random(f"{ctx.seed}-{ctx.name}-{workload}-{index}")
    proc = Process(f"{ctx.name}-{workload}{index}")
    if ctx.system == "lockserver":
        if workload == "register":
            _lockserver_register(ctx, proc, rng)
        else:
            _lockserver_locks(ctx, proc, rng, workload)
    elif workload == "register":
        _etcd_register(ctx, proc, rng)
    elif workload == "mutex":
        _etcd_mutex(ctx, proc, rng)
    else:
        raise ValueError(f"etcd has no {workload!r} workload (only {', '.join(ETCD_WORKLOADS)})")


# --- lockserver ------------------------------------------------------------------------------


def _open_client(ctx: Context) -> Any:
    """A client of the group, its home replica first; None (after a pause) when no replica
    could be reached."""
    from client import LockClient, LockClientError

    try:
        return LockClient(servers=[ctx.servers], timeout=ctx.settings.timeout, connect_timeout=1.0)
    except LockClientError:
        ctx.pause(0.3)
        return None


def _register_ops(ctx: Context, rng: random.Random) -> tuple[str, str, Any]:
    s = ctx.settings
    key = f"r{int(ctx.now() // s.key_period)}.{rng.randrange(s.keys)}"
    f = rng.choice(("read", "write", "cas"))
    if f == "read":
        return f, key, None
    if f == "write":
        return f, key, rng.randrange(s.values)
    return f, key, [rng.randrange(s.values), rng.randrange(s.values)]


def _register_statements(f: str, key: str, value: Any) -> list[Any]:
    from client import Assert, Exists, SelectVarValue, SetVar

    if f == "read":
        return [SelectVarValue("v", REGISTER_TABLE, key, ignore_this_session=False)]
    if f == "write":
        return [Assert(SetVar(REGISTER_TABLE, key, value, allow_duplicates=True))]
    expected, new = value
    return [
        Assert(Exists(REGISTER_TABLE, key, value=expected, ignore_this_session=False)),
        Assert(SetVar(REGISTER_TABLE, key, new, allow_duplicates=True)),
    ]


def _classify(exc: BaseException) -> Outcome:
    """The outcome a client exception means: fail (certainly not executed) or unknown."""
    from client import ClientClosed, ServerError, ServerUnavailable

    if isinstance(exc, ServerError | ServerUnavailable):
        return "fail"
    if isinstance(exc, ClientClosed):
        return "unknown"
    return "unknown"  # ConnectionLost, ClientTimeout: it may have run


def _lockserver_register(ctx: Context, proc: Process, rng: random.Random) -> None:
    from client import LockClientError

    s = ctx.settings
    client = None
    session = None
    try:
        for _ in range(MAX_OPS):
            if ctx.stopping():
                return
            if client is None:
                client = _open_client(ctx)
                if client is None:
                    continue
                session = client.session(max_age=s.register_max_age, session_id=REGISTER_SESSION)
            assert session is not None
            f, key, value = _register_ops(ctx, rng)
            op = _start(ctx, proc, "register", f, key, value)
            try:
                result = session.execute(NAMESPACE, _register_statements(f, key, value))
            except LockClientError as exc:
                outcome: Outcome = "fail" if f == "read" else _classify(exc)
                _finish(
                    ctx,
                    proc,
                    op,
                    outcome,
                    error=f"{type(exc).__name__}: {exc}",
                    keep_value=f != "read",
                )
            else:
                node = f"{client.host}:{client.port}"
                if f == "read" and result.ok:
                    record = result.get("v")
                    read = None if record is None else record.get("value")
                    _finish(ctx, proc, op, "ok", value=read, node=node, keep_value=False)
                elif result.ok:
                    _finish(ctx, proc, op, "ok", fence=result.fence, node=node)
                else:
                    why = f"{result.cause.name} at {result.failed_statement}"
                    _finish(ctx, proc, op, "fail", node=node, error=why, keep_value=f != "read")
            ctx.pause(rng.random() * s.register_think)
    finally:
        if client is not None:
            client.close()  # never end the shared session: the registers live in it


def _lock_object(
    kind: str, session: Any, rng: random.Random, s: WorkloadSettings
) -> tuple[Any, str, str, int | None]:
    """A fresh lock object for one acquire: (object, lock name, mode, capacity)."""
    from client import Mutex, ReadWriteLock, Semaphore

    if kind == "mutex":
        name = f"m{rng.randrange(s.mutexes)}"
        return Mutex(session, NAMESPACE, name), name, "w", None
    if kind == "rw":
        rw = ReadWriteLock(session, NAMESPACE, "rw0")
        if rng.random() < 0.6:
            return rw.read, "rw0", "r", None
        return rw.write, "rw0", "w", None
    if kind == "semaphore":
        return Semaphore(session, NAMESPACE, "s0", permits=s.permits), "s0", "s", s.permits
    raise ValueError(f"unknown lock workload {kind!r}")


def _hold_time(rng: random.Random, s: WorkloadSettings) -> float:
    if rng.random() < 0.1:
        return s.hold_max + rng.random() * (s.long_hold - s.hold_max)
    return rng.random() * s.hold_max


def _critical_section(
    ctx: Context,
    proc: Process,
    rng: random.Random,
    resource: ResourceClient | None,
    lock: str,
    mode: str,
    fence: int | None,
    capacity: int | None,
) -> None:
    """Hold: write to the resource (exclusive holders), wait, write again; the interval is
    recorded from after the grant to before the release."""
    start = ctx.now()
    if resource is not None and fence is not None:
        resource.write(lock, proc.name, fence)
    ctx.pause(_hold_time(rng, ctx.settings))
    if resource is not None and fence is not None:
        resource.write(lock, proc.name, fence)
    ctx.writer.write(Interval(lock, mode, start, ctx.now(), fence, proc.name, capacity))


def _lockserver_locks(ctx: Context, proc: Process, rng: random.Random, kind: str) -> None:
    from client import LockClientError, LockLostError

    s = ctx.settings
    resource = ResourceClient(ctx.resource, timeout=s.timeout)
    client = None
    session = None
    try:
        for _ in range(MAX_OPS):
            if ctx.stopping():
                return
            if client is None:
                client = _open_client(ctx)
                if client is None:
                    continue
                session = client.session(max_age=s.max_age, description=proc.base)
            lock, name, mode, capacity = _lock_object(kind, session, rng, s)
            op = _start(ctx, proc, kind, "acquire", name, {"mode": mode})
            try:
                granted = lock.acquire(timeout=s.acquire_wait)
            except LockClientError as exc:
                _finish(ctx, proc, op, _classify(exc), error=f"{type(exc).__name__}: {exc}")
                continue
            node = f"{client.host}:{client.port}"
            if not granted:
                cause = lock.last_result.cause.name if lock.last_result is not None else ""
                _finish(ctx, proc, op, "fail", node=node, error=f"not granted {cause}")
                ctx.pause(rng.random() * s.think_max)
                continue
            mono = time.monotonic()  # first: the guarantee is then early, never late
            valid_until = mono + lock.valid_for() - ctx.origin
            _finish(
                ctx,
                proc,
                op,
                "ok",
                value={"mode": mode, "valid_until": valid_until},
                fence=lock.fence,
                node=node,
                keep_value=False,
            )
            exclusive = resource if mode == "w" else None
            _critical_section(ctx, proc, rng, exclusive, name, mode, lock.fence, capacity)
            release = _start(ctx, proc, kind, "release", name, {"mode": mode})
            try:
                released = lock.release()
            except LockLostError as exc:
                _finish(ctx, proc, release, "fail", error=f"lost: {exc}")
            except LockClientError as exc:
                _finish(ctx, proc, release, _classify(exc), error=f"{type(exc).__name__}: {exc}")
            else:
                _finish(
                    ctx,
                    proc,
                    release,
                    "ok" if released else "fail",
                    fence=lock.fence if released else None,
                    node=f"{client.host}:{client.port}",
                    error="" if released else "not held",
                )
            ctx.pause(rng.random() * s.think_max)
    finally:
        resource.close()
        if client is not None:
            with contextlib.suppress(Exception):
                if session is not None:
                    session.end()
            client.close()


# --- etcd ------------------------------------------------------------------------------------


def _etcd_outcome(exc: BaseException) -> Outcome:
    return "fail" if isinstance(exc, NotSent | EtcdError) else "unknown"


def _etcd_register(ctx: Context, proc: Process, rng: random.Random) -> None:
    s = ctx.settings
    gw = EtcdGateway(ctx.etcd, timeout=s.timeout)
    try:
        for _ in range(MAX_OPS):
            if ctx.stopping():
                return
            f, key, value = _register_ops(ctx, rng)
            path = f"lab/reg/{key}"
            op = _start(ctx, proc, "register", f, key, value)
            node = gw.endpoint
            try:
                if f == "read":
                    raw, _ = gw.get(path)
                    read = None if raw is None else int(raw)
                    _finish(ctx, proc, op, "ok", value=read, node=node, keep_value=False)
                elif f == "write":
                    gw.put(path, str(value).encode())
                    _finish(ctx, proc, op, "ok", node=node)
                else:
                    expected, new = value
                    done = gw.cas(path, str(expected).encode(), str(new).encode())
                    _finish(
                        ctx,
                        proc,
                        op,
                        "ok" if done else "fail",
                        node=node,
                        error="" if done else "compare failed",
                    )
            except (NotSent, Unknown, EtcdError) as exc:
                outcome: Outcome = "fail" if f == "read" else _etcd_outcome(exc)
                _finish(
                    ctx,
                    proc,
                    op,
                    outcome,
                    node=node,
                    error=f"{type(exc).__name__}: {exc}",
                    keep_value=f != "read",
                )
            ctx.pause(rng.random() * s.register_think)
    finally:
        gw.close()


class _Lease:
    """An etcd lease kept alive by a thread of its own (with its own connection):
    ``deadline`` (lab time) is the last keepalive's send time plus the TTL it granted."""

    def __init__(self, ctx: Context, ttl: int) -> None:
        self.ctx = ctx
        self.ttl = ttl
        self._mu = threading.Lock()
        self.id = 0
        self.deadline = 0.0
        self._thread = threading.Thread(target=self._keep, daemon=True)
        self._thread.start()

    def ensure(self, gw: EtcdGateway) -> int:
        """The lease id, granting a new lease when there is none (or it ran out)."""
        with self._mu:
            if self.id and self.deadline > self.ctx.now():
                return self.id
        sent = self.ctx.now()
        lease, ttl = gw.lease_grant(self.ttl)
        with self._mu:
            self.id, self.deadline = lease, sent + ttl
        return lease

    def drop(self, gw: EtcdGateway) -> None:
        """Revoke it (best effort: it runs out by itself otherwise) and forget it."""
        with self._mu:
            lease, self.id = self.id, 0
        if lease:
            with contextlib.suppress(NotSent, Unknown, EtcdError):
                gw.lease_revoke(lease)

    def _keep(self) -> None:
        gw = EtcdGateway(self.ctx.etcd, timeout=self.ctx.settings.timeout)
        try:
            while not self.ctx.stopping():
                self.ctx.pause(self.ttl / 3)
                with self._mu:
                    lease = self.id
                if not lease:
                    continue
                sent = self.ctx.now()
                try:
                    ttl = gw.lease_keepalive(lease)
                except (NotSent, Unknown, EtcdError):
                    continue
                with self._mu:
                    if self.id == lease:
                        if ttl > 0:
                            self.deadline = max(self.deadline, sent + ttl)
                        else:
                            self.id = 0
        finally:
            gw.close()

    @property
    def valid_until(self) -> float:
        with self._mu:
            return self.deadline

    def join(self) -> None:
        self._thread.join(timeout=self.ctx.settings.timeout + 1)


def _etcd_mutex(ctx: Context, proc: Process, rng: random.Random) -> None:
    s = ctx.settings
    gw = EtcdGateway(ctx.etcd, timeout=s.timeout)
    resource = ResourceClient(ctx.resource, timeout=s.timeout)
    lease = _Lease(ctx, max(2, round(s.max_age)))
    try:
        for _ in range(MAX_OPS):
            if ctx.stopping():
                return
            name = f"m{rng.randrange(s.mutexes)}"
            try:
                lease_id = lease.ensure(gw)
            except (NotSent, Unknown, EtcdError):
                ctx.pause(0.3)
                continue
            node = gw.endpoint
            op = _start(ctx, proc, "mutex", "acquire", name, {"mode": "w"})
            try:
                key = gw.lock(f"lab/lock/{name}", lease_id, timeout=s.acquire_wait)
            except (NotSent, Unknown, EtcdError) as exc:
                _finish(
                    ctx,
                    proc,
                    op,
                    _etcd_outcome(exc),
                    node=node,
                    error=f"{type(exc).__name__}: {exc}",
                )
                lease.drop(gw)  # whatever it may hold goes with its lease
                continue
            valid_until = lease.valid_until
            try:
                _, fence = gw.get(key)
            except (NotSent, Unknown, EtcdError):
                fence = 0
            if not fence:
                # Granted, but the key (and so the lock) is gone already, or its revision
                # could not be read: no critical section without a fence.
                _finish(
                    ctx,
                    proc,
                    op,
                    "ok",
                    value={"mode": "w", "valid_until": valid_until},
                    node=node,
                    error="granted; its key could not be read",
                    keep_value=False,
                )
                lease.drop(gw)
                continue
            _finish(
                ctx,
                proc,
                op,
                "ok",
                value={"mode": "w", "valid_until": valid_until},
                fence=fence,
                node=node,
                keep_value=False,
            )
            _critical_section(ctx, proc, rng, resource, name, "w", fence, None)
            release = _start(ctx, proc, "mutex", "release", name, {"mode": "w"})
            try:
                gw.unlock(key)
            except (NotSent, Unknown, EtcdError) as exc:
                _finish(
                    ctx,
                    proc,
                    release,
                    _etcd_outcome(exc),
                    node=gw.endpoint,
                    error=f"{type(exc).__name__}: {exc}",
                )
                lease.drop(gw)
            else:
                _finish(ctx, proc, release, "ok", fence=fence, node=gw.endpoint)
            ctx.pause(rng.random() * s.think_max)
    finally:
        lease.drop(gw)
        lease.join()
        resource.close()
        gw.close()


def start_threads(
    ctx: Context, workloads: dict[str, int], errors: list[str]
) -> list[threading.Thread]:
    """Start ``workloads`` ({name: threads}) on ``ctx``; a thread that dies of a bug appends
    its error to ``errors``."""

    def body(workload: str, index: int) -> None:
        try:
            run_thread(ctx, workload, index)
        except Exception as exc:  # a bug of the lab: reported by the worker
            import traceback

            errors.append(f"{workload}{index}: {exc!r}\n{traceback.format_exc()}")

    threads = []
    for workload, count in workloads.items():
        for index in range(count):
            t = threading.Thread(
                target=body,
                args=(workload, index),
                daemon=True,
                name=f"{ctx.name}-{workload}{index}",
            )
            t.start()
            threads.append(t)
    return threads


Clock = Callable[[], float]
