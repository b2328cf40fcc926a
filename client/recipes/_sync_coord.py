"""The sync face of the coordination recipes: election, reentrant mutex, barriers, latch, group.

Why: their transactions and operations are written once (``_election``, ``_reentrant``,
``_barrier``, ``_latch``, ``_group``, over ``_ops`` and ``_feed``); this module only **drives**
them with blocking calls and gives them signatures. Two drivers beside ``SyncLock._drive``:
:func:`~._sync.drive` runs an operation of an object that is not a single grant (the reentrant
mutex's owners, the latch's own session), and :func:`_iterate` turns a watching operation
(``observe``, ``watch``) into a generator: its ``Emit`` steps are yielded to the caller, and
when the caller stops (``break``, ``close()``), the operation is told to stop and its cleanup
(ending its subscriptions) runs before the generator returns.

Watching on this face: there is no reader thread (docs/client.md), so a watcher waiting for
events reads the connection itself (``process_events``) while no other thread is reading, and
otherwise sleeps on its sink's condition, which the reading thread signals.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable, Iterator
from time import monotonic
from types import TracebackType
from typing import Any, Self

from client._methods import blocking
from client._sync_session import Session

from . import _ops
from ._barrier import DoubleBarrierKind, abandon, abandon_block, barrier_wait, enter, leave
from ._base import NotAcquired
from ._election import (
    ElectionKind,
    LeaderChange,
    campaign,
    leader,
    observe,
    proclaim,
    resign,
)
from ._feed import Emit, FeedBatch, FeedSinkBase, StopWatching
from ._group import GroupChange, GroupKind, join, leave_group, members, update, watch
from ._latch import LatchCore, count_down, latch_count, latch_wait
from ._reentrant import ReentrantCore, reentrant_acquire, reentrant_locked, reentrant_release
from ._sync import Mutex, SyncLock, drive

__all__ = [
    "Barrier",
    "CountDownLatch",
    "DoubleBarrier",
    "Election",
    "Group",
    "ReentrantMutex",
    "SyncFeedSink",
]

#: How long a watcher sleeps on its sink while another thread holds the connection's reader
#: role before it looks again (that thread may stop reading without anything arriving).
_READER_NAP = 0.05


def _iterate(session: Any, namespace: str, op: _ops.Op[None]) -> Iterator[Any]:
    """Drive a watching operation, yielding what it emits; stopping the iteration stops it
    (its cleanup runs first)."""
    run = _ops.Run(op, monotonic)
    try:
        while (step := run.next()) is not None:
            if type(step) is Emit:
                yield step.value
                continue
            try:
                run.value = step.run(session, namespace)
            except BaseException as exc:
                run.error = exc
    except GeneratorExit:
        run.error = StopWatching()
        while (step := run.next()) is not None:
            if type(step) is Emit:
                continue
            try:
                run.value = step.run(session, namespace)
            except BaseException as exc:
                run.error = exc


class SyncFeedSink(FeedSinkBase):
    """A watcher's sink on the sync face: the reading thread signals a condition."""

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition(threading.Lock())

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def next(self, client: Any, timeout: float | None) -> FeedBatch:
        """Wait until something arrived (or ``timeout`` passed): read the connection while
        no other thread does, else sleep on the condition the reading thread signals."""
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            batch = self.take()
            if batch:
                return batch
            left = None if deadline is None else deadline - monotonic()
            if left is not None and left <= 0:
                return batch
            slice_ = 1.0 if left is None else min(1.0, left)
            # Reads until something arrives; returns at once when another thread reads.
            client.process_events(slice_, until=self._pending)
            with self._cond:
                if not self._pending():
                    self._cond.wait(min(slice_, _READER_NAP))


class Election(ElectionKind[Session], SyncLock):
    """A candidate in a leader election: ``Election(session, namespace, name, *,
    on_lost=None, min_uptime=0.0, min_trust=0.0, description="")``.

    ``campaign(value)`` waits (on the server, first come first served) until this candidate
    leads and returns its **term**: the fence of its grant, strictly larger than every
    earlier leader's; ``proclaim(value)`` publishes a new value under the same term;
    ``resign()`` steps down; ``leader()`` says who leads; ``observe()`` yields each change.
    The leadership is a grant: it is lost with the session (expiry, ``end``, an operator's
    ``lockctl release``), which ``lost``, ``on_lost`` and ``check()`` report."""

    campaign = blocking(campaign)

    proclaim = blocking(proclaim)

    resign = blocking(resign)

    leader = blocking(leader)

    def observe(self) -> Iterator[LeaderChange]:
        """The leader now, then each change of leader, term or value, from the change feed
        (no polling): an iterator of :class:`LeaderChange`. A change after a reconnect has
        ``gap=True``. Stop it with ``break`` or ``close()`` (its subscriptions end then)."""
        return _iterate(self._session, self.namespace, observe(self, SyncFeedSink()))

    @contextlib.contextmanager
    def leadership(self, value: Any = None, *, timeout: float | None = None) -> Iterator[Self]:
        """``with election.leadership(value):`` campaign, run the block as the leader, resign
        at its end. NotAcquired when ``timeout`` ran out; LockLostError at the end when the
        leadership was lost meanwhile (check ``lost`` / ``check()`` inside)."""
        if self.campaign(value, timeout=timeout) is None:
            raise NotAcquired(self, self.last_result)
        try:
            yield self
        except BaseException:
            self._drive(_ops.exit_block(self, True))
            raise
        self._drive(_ops.exit_block(self, False))


class ReentrantMutex(ReentrantCore[Session, Mutex]):
    """An exclusive lock the same **thread** may acquire again (and must release as many
    times): ``ReentrantMutex(session, namespace, name, *, ttl=None, on_lost=None,
    min_uptime=0.0, min_trust=0.0, description="")``. One round trip for the first acquire,
    none for the nested ones; other threads and sessions wait on the server as for a
    :class:`Mutex` (same table: the two exclude each other). Share one object between the
    threads."""

    def _owner(self) -> Hashable:
        return threading.get_ident()

    _lock_class = Mutex

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire for the calling thread: at once (no call) when it holds the lock
        already, else as :meth:`Mutex.acquire`. LockLostError when the thread's grant was
        lost (release what it holds)."""
        return drive(
            self._session,
            self.namespace,
            reentrant_acquire(self, self._owner(), blocking, timeout),
        )

    def release(self) -> bool:
        """Release once for the calling thread; the last release ends the grant (one call;
        LockLostError when it was lost). RuntimeError when the thread does not hold it."""
        return drive(self._session, self.namespace, reentrant_release(self, self._owner()))

    def locked(self) -> bool:
        """True when an acquire by a new owner would not succeed now (one read)."""
        return drive(self._session, self.namespace, reentrant_locked(self))

    def check(self) -> None:
        """Raise LockLostError if the calling thread's grant has been lost."""
        hold = self._hold()
        if hold is not None:
            hold.lock.check()

    def __enter__(self) -> Self:
        if not self.acquire():
            hold = self._hold()
            raise NotAcquired(self, None if hold is None else hold.lock.last_result)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except Exception:  # do not mask the body's exception
            _ops.log.warning("releasing %r after an error failed", self, exc_info=True)


class DoubleBarrier(DoubleBarrierKind[Session], SyncLock):
    """One party of a double barrier of ``parties``: ``DoubleBarrier(session, namespace,
    name, *, parties, on_party_lost=None, on_lost=None, ...)``. ``enter()`` blocks until all
    the parties have entered, ``leave()`` until all have left (both on the server). One
    party per session. ``with barrier:`` enters, and leaves at the end (or, when the block
    raised, drops out at once without waiting: ``release()``)."""

    enter = blocking(enter)

    leave = blocking(leave)

    release = blocking(abandon)

    def __enter__(self) -> Self:
        if not self.enter():
            raise NotAcquired(self, self.last_result)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.leave()
        else:
            self._drive(abandon_block(self, True))


class Barrier(DoubleBarrierKind[Session], SyncLock):
    """A cyclic barrier of ``parties`` across processes: ``Barrier(session, namespace, name,
    *, parties, on_party_lost=None, ...)``; ``wait()`` blocks until all the parties have
    called it, then all go on, and the barrier is ready for the next round. One party per
    session."""

    wait = blocking(barrier_wait)

    release = blocking(abandon)


class CountDownLatch(LatchCore[Session]):
    """Wait until ``count`` count-downs have been made: ``CountDownLatch(session,
    namespace, name, *, count, max_age=None, description="")``. The count-downs belong to the
    latch (its own session), not to the party that made them. Every party passes the same
    ``count``."""

    def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        return drive(self._session, self.namespace, op)

    count_down = blocking(count_down)

    wait = blocking(latch_wait)

    count = blocking(latch_count)


class Group(GroupKind[Session], SyncLock):
    """Membership of a group: ``Group(session, namespace, name, *, member_id=None,
    on_lost=None, ...)``. ``join(metadata)``, ``update(metadata)``, ``leave()``,
    ``members()``, ``watch()``. A member whose session dies leaves by itself, and the
    watchers hear why."""

    join = blocking(join)

    leave = blocking(leave_group)

    update = blocking(update)

    members = blocking(members)

    def watch(self) -> Iterator[GroupChange]:
        """The members now (all as ``joined``), then each change: an iterator of
        :class:`GroupChange` from the change feed. Stop it with ``break`` or ``close()``."""
        return _iterate(self._session, self.namespace, watch(self, SyncFeedSink()))

    @contextlib.contextmanager
    def membership(self, metadata: Any = None) -> Iterator[Self]:
        """``with group.membership(metadata):`` join, run the block as a member, leave."""
        if not self.join(metadata):
            raise NotAcquired(self, self.last_result)
        try:
            yield self
        except BaseException:
            self._drive(_ops.exit_block(self, True))
            raise
        self._drive(_ops.exit_block(self, False))
