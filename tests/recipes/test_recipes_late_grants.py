"""An acquire whose reply is lost and whose transaction is applied later (issue 31, finding 3
of the fault lab): the recipe gives up with the error, and the session it leaves alive holds
nothing -- whether the late transaction was applied before the recipe's cancel (the cancel
removes its grant) or after it (its last statement finds the cancel's tombstone and it
aborts). Real servers, both faces (trio and asyncio for the async one), every lock kind that
acquires through ``_ops.acquire``; the group case runs on a real etcd; and, on the engine
itself with an explicit ``now``, hypothesis tries every order of late applications, the cancel
and another session's acquires and releases.

How the reply is lost: the session's ``execute`` is replaced on the instance by one that keeps
the first call's transaction and raises ClientTimeout instead of sending it (or after running
it, for "applied first"); the test then sends the kept transaction itself, as a replica or an
unread connection would apply it late. The recipe's own cancel goes through the real
``execute``. The decisions and the checks are written once (``LostReply``, ``held_by``) and
driven by a thin sync and async wrapper.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
import trio
from asyncio_support import on_both_loops
from hypothesis import given, settings
from hypothesis import strategies as st
from recipes_support import NS, ThreadedServer

from client import (
    AsyncMutex,
    AsyncSemaphore,
    AsyncSession,
    ClientTimeout,
    Election,
    LockClient,
    LockSet,
    Mutex,
    ReadWriteLock,
    Result,
    Semaphore,
    Session,
    StateLock,
    open_lock_client,
)
from client._core import ClientCore
from client._session_state import SessionState
from client.recipes import CANCELLED_TABLE, TOMBSTONE_LINGER
from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started, wipe
from lockserver import RunningServer, ServerConfig, serve
from lockserver.engine import Engine
from protocol import Exists, SelectOperatorValue, SessionSpec, Status, Transaction


class LostReply:
    """The face-free half of a session whose first ``execute`` loses its reply: it keeps the
    call (namespace, statements, min_uptime, min_trust) to be applied later, and says whether
    to run it now (``applied_first``: the transaction reached the server, only its reply was
    lost) before raising ``error``."""

    def __init__(self, applied_first: bool) -> None:
        self.applied_first = applied_first
        self.error = ClientTimeout("the reply of this acquire was lost")
        self.kept: tuple[str, list[Any], float, float] | None = None
        self.first: Result | None = None  # the reply nobody received (applied_first)

    def take(self, namespace: str, statements: Any, kwargs: dict[str, Any]) -> bool:
        """True when this call is the one whose reply is lost (the first)."""
        if self.kept is not None:
            return False
        self.kept = (
            namespace,
            list(statements),
            kwargs.get("min_uptime", 0.0),
            kwargs.get("min_trust", 0.0),
        )
        return True

    def late_call(self) -> tuple[tuple[str, list[Any]], dict[str, Any]]:
        """The kept call, as ``execute`` arguments, without ``wait``: applied late, it is
        evaluated once (a parked one is tested apart)."""
        assert self.kept is not None
        namespace, statements, min_uptime, min_trust = self.kept
        return (namespace, statements), {"min_uptime": min_uptime, "min_trust": min_trust}

    def check_late(self, late: Result) -> None:
        """The kept transaction, applied after the cancel, was refused at its last statement
        (the tombstone). With ``applied_first`` it had also been granted before the cancel
        (which removed that grant): the late application is then a second one, as a
        failover's retry would make it."""
        assert self.kept is not None
        if self.applied_first:
            assert self.first is not None and self.first.ok, self.first
        assert not late.ok
        assert late.failed_statement == f"{len(self.kept[1]) - 1}:/AssertOp/", late


def lose_first_reply_sync(session: Session, loss: LostReply) -> Callable[..., Result]:
    """Install the lossy ``execute`` on ``session``; returns the real one."""
    real = session.execute

    def execute(namespace: str, statements: Any, **kwargs: Any) -> Result:
        if not loss.take(namespace, statements, kwargs):
            return real(namespace, statements, **kwargs)
        if loss.applied_first:
            loss.first = real(*loss.late_call()[0], **loss.late_call()[1])
        raise loss.error

    session.execute = execute  # type: ignore[method-assign]
    return real


def lose_first_reply_async(session: AsyncSession, loss: LostReply) -> Callable[..., Any]:
    """As :func:`lose_first_reply_sync`, for an AsyncSession."""
    real = session.execute

    async def execute(namespace: str, statements: Any, **kwargs: Any) -> Result:
        if not loss.take(namespace, statements, kwargs):
            return await real(namespace, statements, **kwargs)
        if loss.applied_first:
            args, kw = loss.late_call()
            loss.first = await real(*args, **kw)
        raise loss.error

    session.execute = execute  # type: ignore[method-assign]
    return real


def held_by(holders: Any, session_id: str) -> list[tuple[str, str]]:
    """(table, var) of every lock entry ``session_id`` holds (its tombstones excepted)."""
    return [
        (h.table, h.var) for h in holders if h.session == session_id and h.table != CANCELLED_TABLE
    ]


def tombstones(holders: Any, session_id: str) -> int:
    return sum(1 for h in holders if h.session == session_id and h.table == CANCELLED_TABLE)


# --- the sync face, every kind ------------------------------------------------------------------

KINDS: dict[str, Callable[[Session], Any]] = {
    "mutex": lambda s: Mutex(s, NS, "m"),
    "mutex-ticket": lambda s: Mutex(s, NS, "m", ticket="fixed"),
    "read": lambda s: ReadWriteLock(s, NS, "rw").read,
    "write": lambda s: ReadWriteLock(s, NS, "rw").write,
    "semaphore": lambda s: Semaphore(s, NS, "sem", permits=1),
    "lock-set": lambda s: LockSet(s, NS, {"a": "w", "b": "r"}),
    "task-claim": lambda s: StateLock(s, NS, "task"),
    "election": lambda s: Election(s, NS, "leader"),
}


@pytest.mark.parametrize("applied_first", [False, True], ids=["applied-late", "applied-first"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_sync_a_lost_acquire_applied_late_leaves_nothing_held(
    threaded_server: ThreadedServer, kind: str, applied_first: bool
) -> None:
    """Sync face: the acquire's reply is lost, the recipe raises the ClientTimeout after its
    cancel; the acquire's transaction applied after the cancel is refused at its tombstone
    (applied before it, its grant is removed by the cancel). Either way the giving-up
    session, alive and well, holds no lock entry, and another session gets the lock."""
    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        c.session() as a,
        c.session() as b,
    ):
        lock, other = KINDS[kind](a), KINDS[kind](b)
        loss = LostReply(applied_first)
        real = lose_first_reply_sync(a, loss)
        with pytest.raises(ClientTimeout) as raised:
            lock.acquire(timeout=2.0)
        assert raised.value is loss.error and not lock.held
        args, kwargs = loss.late_call()
        late = real(*args, **kwargs)
        loss.check_late(late)
        holders = c.holders(NS).holders
        assert held_by(holders, a.id) == []
        assert tombstones(holders, a.id) == 1
        assert other.acquire(blocking=False), other.last_result
        other.release()
        # The session goes on: its next acquire (a new call, a new cancel key; the same
        # ticket for "mutex-ticket") is not refused by the old tombstone.
        assert lock.acquire(blocking=False), lock.last_result
        lock.release()


# --- the async face, trio and asyncio ----------------------------------------------------------


@on_both_loops
@pytest.mark.parametrize("applied_first", [False, True], ids=["applied-late", "applied-first"])
async def test_async_a_lost_acquire_applied_late_leaves_nothing_held(
    server: RunningServer, applied_first: bool
) -> None:
    """Async face (shielded, bounded cancel): the same as the sync face for a mutex and a
    semaphore: the late transaction is refused (or its grant removed), the session that gave
    up holds nothing, another session is granted."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c:
            for make in (
                lambda s: AsyncMutex(s, NS, "m"),
                lambda s: AsyncSemaphore(s, NS, "sem", permits=1),
            ):
                a, b = c.session(), c.session()
                lock, other = make(a), make(b)
                loss = LostReply(applied_first)
                real = lose_first_reply_async(a, loss)
                with pytest.raises(ClientTimeout) as raised:
                    await lock.acquire(timeout=2.0)
                assert raised.value is loss.error and not lock.held
                args, kwargs = loss.late_call()
                loss.check_late(await real(*args, **kwargs))
                holders = (await c.holders(NS)).holders
                assert held_by(holders, a.id) == []
                assert await other.acquire(blocking=False)
                await other.release()
                await a.end()
                await b.end()


async def test_a_parked_acquire_given_up_is_never_granted(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """trio only (MockClock): the acquire reached the server and is parked behind a holder
    (its connection still open, say, on a replica the client gave up on); the client's
    cancel comes first; when the holder releases, the parked acquire is re-evaluated, finds
    the tombstone and is not granted; at its deadline it is answered with that failure, and
    a third session gets the lock."""
    with trio.fail_after(100):  # virtual time: the jump of 31 s below counts
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as stale,
        ):
            a, holder, third = c.session(), c.session(), c.session()
            first = AsyncMutex(holder, NS, "m")
            assert await first.acquire(blocking=False)
            lock = AsyncMutex(a, NS, "m")
            loss = LostReply(applied_first=False)
            lose_first_reply_async(a, loss)
            with pytest.raises(ClientTimeout):
                await lock.acquire(timeout=30.0)
            args, kwargs = loss.late_call()
            late: list[Result] = []
            same = stale.session(session_id=a.id)

            async def parked() -> None:
                late.append(await same.execute(*args, wait=30.0, **kwargs))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(parked)
                while int(server.statistics()["waiting"]["waiters"]) == 0:
                    await trio.sleep(0.01)
                await first.release()
                await trio.sleep(0.2)
                assert not late  # re-evaluated, refused by the tombstone, still parked
                assert held_by((await c.holders(NS)).holders, a.id) == []
                clock.jump(31)
            [answer] = late
            loss.check_late(answer)
            assert await AsyncMutex(third, NS, "m").acquire(blocking=False)


async def test_a_tombstone_expires_past_the_longest_wait_and_is_no_loss(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """trio only (MockClock): the tombstone a cancel leaves carries a TTL of
    ``TOMBSTONE_LINGER`` past the server's ``max_wait``. Just before it runs out, the lost
    acquire applied late is still refused; then it is gone, and the session (alive all along,
    its keepalive pinging) heard no lost event for it: a long-lived session whose acquires
    are often cancelled does not gather tombstones."""
    ttl = TOMBSTONE_LINGER + server.config.max_wait
    with trio.fail_after(2 * ttl):  # virtual time: the jumps below count
        async with open_lock_client(port=server.port) as c:
            a = c.session(max_age=3600.0)
            lock = AsyncMutex(a, NS, "m")
            loss = LostReply(applied_first=False)
            real = lose_first_reply_async(a, loss)
            with pytest.raises(ClientTimeout):
                await lock.acquire(timeout=5.0)
            [tombstone] = [h for h in (await c.holders(NS)).holders if h.session == a.id]
            assert tombstone.table == CANCELLED_TABLE and tombstone.expires_at is not None
            assert tombstone.expires_at - tombstone.acquired_at == pytest.approx(ttl)
            jumped = 0.0
            while jumped < ttl - 1.0:  # steps shorter than the keepalive's 1,200 s
                step = min(600.0, ttl - 1.0 - jumped)
                clock.jump(step)
                jumped += step
                await trio.sleep(0.1)  # the keepalive's ping, when due
            args, kwargs = loss.late_call()
            loss.check_late(await real(*args, **kwargs))
            assert tombstones((await c.holders(NS)).holders, a.id) == 1
            clock.jump(2.0)
            await trio.sleep(0.1)
            assert tombstones((await c.holders(NS)).holders, a.id) == 0
            assert await lock.acquire(blocking=False)  # a reply after the expiry's notice
            assert not a.lost and a.lost_events == ()
            assert await lock.release()


# --- a replicated group on a real etcd ----------------------------------------------------------

_groups = itertools.count()


@pytest.fixture
def etcd1(tmp_path: Any) -> Iterator[EtcdCluster]:
    """A one-member etcd cluster for the test (skipped, with the reason, without etcd)."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    for cluster in started(tmp_path, 1):
        wipe(cluster)
        yield cluster


async def _replica(nursery: trio.Nursery, etcd: EtcdCluster, group: str) -> RunningServer:
    config = ServerConfig(
        port=0, replicate="etcd://" + ",".join(etcd.endpoints), group=group, replica_lease_ttl=2
    )
    running: RunningServer = await nursery.start(serve, config)
    return running


async def _caught_up(*replicas: RunningServer) -> None:
    """Until every replica has applied the same revision of the log (the test's
    fail_after bounds it)."""
    while len({r.replica.state.revision for r in replicas if r.replica is not None}) != 1:
        await trio.sleep(0.02)


@pytest.mark.parametrize("applied_first", [False, True], ids=["applied-late", "applied-first"])
async def test_group_a_lost_acquire_applied_late_through_another_replica_holds_nothing(
    etcd1: EtcdCluster, applied_first: bool
) -> None:
    """A group of two replicas on a real etcd: the recipe's acquire through replica 1 loses
    its reply, the recipe cancels through replica 1, and the acquire is applied through
    replica 2 (a proposal that reached etcd late, or a failover retry) after the cancel in
    etcd's order -- refused by the tombstone -- or before it -- removed by the cancel. The
    session lives on in the group and holds nothing; another session is granted."""
    group = f"late{next(_groups)}"
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1 = await _replica(nursery, etcd1, group)
            r2 = await _replica(nursery, etcd1, group)
            async with (
                open_lock_client(port=r1.port) as c1,
                open_lock_client(port=r2.port) as c2,
            ):
                a = c1.session(max_age=30.0)
                lock = AsyncMutex(a, NS, "m")
                loss = LostReply(applied_first)
                via_r2 = c2.session(max_age=30.0, session_id=a.id)
                lose_first_reply_async(a, loss)  # applied first: through replica 1 itself
                with pytest.raises(ClientTimeout):
                    await lock.acquire(timeout=5.0)
                args, kwargs = loss.late_call()
                loss.check_late(await via_r2.execute(*args, **kwargs))
                await _caught_up(r1, r2)
                for c in (c1, c2):  # every replica applied the same: nothing held by a
                    assert held_by((await c.holders(NS)).holders, a.id) == []
                other = AsyncMutex(c2.session(max_age=30.0), NS, "m")
                assert await other.acquire(blocking=False), other.last_result
            nursery.cancel_scope.cancel()


# --- every order, on the engine itself (hypothesis) -------------------------------------------

ENGINE_KINDS: dict[str, Callable[[Any], Any]] = {
    "mutex": lambda s: Mutex(s, NS, "m"),
    "read": lambda s: ReadWriteLock(s, NS, "rw").read,
    "write": lambda s: ReadWriteLock(s, NS, "rw").write,
    "semaphore": lambda s: Semaphore(s, NS, "sem", permits=2),
    "lock-set": lambda s: LockSet(s, NS, {"a": "w", "b": "r"}),
}


class _Session(SessionState):
    """A session of no client: the kinds only need one to build their statements."""

    def __init__(self, session_id: str) -> None:
        super().__init__(ClientCore("late-grants"), session_id, 60.0, "", False)


def _kind(kind: str, session_id: str) -> Any:
    """A lock object over a session of no client: nothing is driven, only its statements
    and its plan are used."""
    return ENGINE_KINDS[kind](_Session(session_id))


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(list(ENGINE_KINDS)),
    schedule=st.lists(st.sampled_from(["late", "other+", "other-"]), max_size=8),
    cancel_at=st.integers(min_value=0, max_value=8),
)
def test_no_order_of_late_acquires_and_the_cancel_leaves_a_grant(
    kind: str, schedule: list[str], cancel_at: int
) -> None:
    """On the engine, for every kind and every order of the lost acquire's applications
    ("late", any number of times), one cancel, and another session acquiring and releasing
    around them: from the cancel on, the session that gave up never holds an entry of the
    acquire's ticket, and its applications after the cancel all fail."""
    engine = Engine(started_at=0.0)
    a, b = _kind(kind, "A"), _kind(kind, "B")
    plan = a._start_acquire(False, None, 0.0)
    cancel = a._cancel_statements(plan)
    mine = [Exists(t, v, plan.ticket, ignore_this_session=False) for t, v in a._variables()]
    other_ticket: str | None = None
    events = list(schedule)
    events.insert(min(cancel_at, len(events)), "cancel")
    now = 1.0
    cancelled = False
    for event in events:
        now += 1.0
        if event == "cancel":
            assert engine.execute(SessionSpec("A"), Transaction(NS, cancel), now=now).status is (
                Status.TRANSACTION_OK
            )
            cancelled = True
        elif event == "late":
            late = engine.execute(SessionSpec("A"), Transaction(NS, plan.statements), now=now)
            if cancelled:  # refused: at the guard, or earlier when the lock is busy
                assert late.status is Status.TRANSACTION_ERROR, late
        elif event == "other+" and other_ticket is None:
            other = b._start_acquire(False, None, 0.0)
            got = engine.execute(SessionSpec("B"), Transaction(NS, other.statements), now=now)
            other_ticket = other.ticket if got.status is Status.TRANSACTION_OK else None
            b._abandon_acquire()
        elif event == "other-" and other_ticket is not None:
            release = b._release_statements(other_ticket)
            engine.execute(SessionSpec("B"), Transaction(NS, release), now=now)
            other_ticket = None
        if cancelled:
            probe = [SelectOperatorValue("held", e) for e in mine]
            held = engine.execute(SessionSpec("C"), Transaction(NS, probe), now=now)
            assert [v for _, v in held.data] == [False] * len(mine), (events, event)
