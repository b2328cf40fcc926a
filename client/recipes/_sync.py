"""The sync face of the recipes: blocking calls over a :class:`~client.Session`.

Why: the transactions (``_kinds``), the grant bookkeeping (``_base``) and the operations
(``_ops``: acquire with its wait loop and cleanup, release, probe, refresh, leaving a
``with`` block) are written once for both faces; this module only **drives** those
operations with blocking calls (:meth:`SyncLock._drive`) and signals a loss with a
``threading.Event``. Each public class is ``<Kind>[Session] + SyncLock`` and adds nothing but
its docstring (and, for the task claim, the final state of ``release``).

Lost locks on this face: ``LockLost`` events are dispatched by whichever thread reads the
connection (there is no background reader, docs/client.md), so ``lock.lost`` flips when some
thread reads — a call, a keepalive, :meth:`SyncLock.check` (which reads pending events first).
The loss is then raised as :class:`LockLostError` by the next operation on the lock:
``check()``, ``refresh()``, ``release()`` (also at the end of a ``with`` block) or
``acquire()``.
"""

from __future__ import annotations

import contextlib
import threading
from time import monotonic
from types import TracebackType
from typing import Any, Self

from client._errors import LockClientError
from client._methods import blocking
from client._sync import LockClient
from client._sync_session import Session

from . import _ops
from ._base import NotAcquired, RecipeCore
from ._kinds import (
    LockSetKind,
    MutexKind,
    ReadKind,
    SemaphoreKind,
    WriteKind,
)
from ._multi import MultiLockBase, ReadWriteBase, try_locks
from ._task_kinds import TaskClaimKind, TimeWindowKind

__all__ = [
    "LockSet",
    "MultiLock",
    "Mutex",
    "ReadLock",
    "ReadWriteLock",
    "Semaphore",
    "StateLock",
    "SyncLock",
    "TimeWindowLock",
    "WriteLock",
]


def drive(session: Any, namespace: str, op: _ops.Op[_ops.T]) -> _ops.T:
    """Run an operation of ``_ops`` to its end with blocking calls, in ``session`` and
    ``namespace`` (a lock's, or those of an object that is not a single grant: the reentrant
    mutex's owners, the latch's own session)."""
    run = _ops.Run(op, monotonic)
    while (step := run.next()) is not None:
        try:
            run.value = step.run(session, namespace)
        except BaseException as exc:
            run.error = exc
    return run.result


class SyncLock(RecipeCore[Session]):
    """The blocking lock interface every sync recipe has (``threading.Lock`` conventions)."""

    _clock = staticmethod(monotonic)

    def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        """Run an operation of ``_ops`` to its end with blocking calls."""
        return drive(self._session, self.namespace, op)

    def _new_grant(self) -> None:
        self._lost_signal = threading.Event()

    def _signal_lost(self) -> None:
        self._lost_signal.set()

    @property
    def lost_event(self) -> threading.Event:
        """Set when the current grant is lost (a new Event per grant)."""
        return self._lost_signal

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire in one transaction; True when granted.

        ``blocking=False``: try once. ``blocking=True`` with ``timeout=None`` (or -1): wait
        until granted — the server parks the transaction (``wait`` up to its ``max_wait``,
        re-sent when that runs out); with ``timeout=t``: wait at most ``t`` seconds, on the
        server. False when not granted: busy, or refused (``last_result.cause``). Raises
        RuntimeError when this object already holds the lock, LockLostError when it held a
        lost grant that nobody released (the grant is then forgotten), and the client's
        errors. After a timeout, cancellation or lost connection whose outcome is unknown,
        whatever may have been granted is released before the error propagates.
        """
        return self._drive(_ops.acquire(self, blocking, timeout))

    release = blocking(_ops.release)

    locked = blocking(_ops.locked)

    def check(self) -> None:
        """Raise LockLostError if the current grant has been lost. Reads the events that have
        arrived on the connection first (when no other thread is reading it)."""
        with contextlib.suppress(LockClientError):  # closed or broken: the next call tells
            self._session.client.process_events(0.0)
        self._check()

    refresh = blocking(_ops.refresh)

    def __enter__(self) -> Self:
        if not self.acquire():
            raise NotAcquired(self, self.last_result)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._drive(_ops.exit_block(self, exc is not None))


class Mutex(MutexKind[Session], SyncLock):
    """An exclusive lock (seeds 000, 001): ``Mutex(session, namespace, name, *, ttl=None,
    ticket=None, on_lost=None, min_uptime=0.0, min_trust=0.0, description="")``.

    Each grant stores a random ticket (or the ``ticket`` given, seed 001's ``uid``), and the
    release deletes only an entry with that ticket. ``ttl``: the lock frees itself after
    that many seconds. ``acquired_at``: server uptime of the grant."""


class ReadLock(ReadKind[Session], SyncLock):
    """The read side of a read/write lock (see :class:`ReadWriteLock`)."""


class WriteLock(WriteKind[Session], SyncLock):
    """The write side of a read/write lock (see :class:`ReadWriteLock`)."""


class LockSet(LockSetKind[Session], SyncLock):
    """A set of read/write locks ``{name: "r" | "w"}`` taken all or nothing in one
    transaction; ``stamp`` identifies the grant. See :class:`MultiLock` for the seed's
    stamp API."""


class Semaphore(SemaphoreKind[Session], SyncLock):
    """At most ``permits`` holders at once: ``Semaphore(session, namespace, name, *,
    permits)``. One session holds at most one permit of a given semaphore (a second acquire
    in the same session waits); every user must pass the same ``permits``."""


class TimeWindowLock(TimeWindowKind[Session], SyncLock):
    """Acquirable once per ``period`` window of the server's clock (seed 004's timeout lock):
    the first acquire of a window wins; no release is needed, the next window frees it. A
    ``with`` block keeps the window when it ends; ``release()`` gives it back early."""


class StateLock(TaskClaimKind[Session], SyncLock):
    """Claim a task exclusively (seed 004's state transition): ``done``/``failed`` ->
    ``in_progress``; ``release(state)`` records the final state. A worker whose session
    expires loses its claim instead of leaving the task stuck. ``with`` records ``done``,
    or ``failed`` when the block raised."""

    def release(self, state: str | None = None) -> bool:
        """Release the claim recording ``state`` (``"done"`` when not given, or
        ``"failed"``), in one transaction. False when not held; LockLostError when the claim
        was lost."""
        if state is not None:
            self._set_final_state(state)
        return super().release()

    state = blocking(_ops.state)


class ReadWriteLock(ReadWriteBase[Session, ReadLock, WriteLock]):
    """Many readers or one writer (seed 000), **writer preference**: a waiting writer stops
    new readers, so writers cannot starve. ``rw.read`` and ``rw.write`` are the two locks
    (each one holder, with the whole lock interface)."""

    _read_lock = ReadLock
    _write_lock = WriteLock


class MultiLock(MultiLockBase[LockClient, Session, LockSet]):
    """Seed 003's lock service for one application: ``MultiLock(client, namespace, app_id,
    *, max_age=60.0, ...)``.

    ``try_locks({name: "r" | "w"})`` takes a set all or nothing and returns its stamp (None
    when not granted); ``release_locks(stamp)`` releases it (UnknownStamp for a stamp not
    handed out here); ``release_all()`` ends the application's session (``app:<app_id>``),
    removing every lock it holds — those a crashed instance left behind included. Use it as
    a context manager to end the session on exit.
    """

    _lock_set = LockSet

    try_locks = blocking(try_locks)

    def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        return drive(self.session, self.namespace, op)

    def release_locks(self, stamp: str) -> None:
        """Release the set ``stamp`` names, in one transaction. UnknownStamp when this
        MultiLock did not hand it out (or it was released already); LockLostError when the
        set was lost meanwhile."""
        self._stamps.pop(stamp).release()

    def release_all(self) -> bool:
        """End the application's session: every lock it holds is removed at once (also those
        of a crashed instance with the same app id). True when the session existed."""
        self._forget_all()
        return self.client.end_session(self.session.id)

    def close(self) -> None:
        """End the session (releasing everything); stamps are forgotten."""
        self._forget_all()
        self.session.end()

    def __enter__(self) -> MultiLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except LockClientError as error:
            self._end_failed(error, exc)
