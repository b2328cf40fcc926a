"""The sync face of the recipes: blocking calls over a :class:`~client.Session`.

Why: the transactions and the grant bookkeeping are shared (``_kinds``, ``_base``); this
module only sends them and signals a loss with a ``threading.Event``. Each public class is
``<Kind>[Session] + SyncLock`` and adds nothing but its docstring (and, for the task claim,
the final state of ``release``).

Lost locks on this face: ``LockLost`` events are dispatched by whichever thread reads the
connection (there is no background reader, docs/client.md), so ``lock.lost`` flips when some
thread reads — a call, a keepalive, :meth:`SyncLock.check` (which reads pending events first).
The loss is then raised as :class:`LockLostError` by the next operation on the lock:
``check()``, ``refresh()``, ``release()`` (also at the end of a ``with`` block) or
``acquire()``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Mapping
from time import monotonic
from types import TracebackType
from typing import Self

from client._errors import ClientClosed, LockClientError, ServerError
from client._sync import LockClient
from client._sync_session import Session

from ._base import LockCore, LockLostError, NotAcquired, OnLost, max_wait_of
from ._kinds import (
    LockSetKind,
    MutexKind,
    ReadKind,
    SemaphoreKind,
    TaskClaimKind,
    TimeWindowKind,
    WriteKind,
    task_state,
)
from ._multi import StampRegistry, app_session_id

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

log = logging.getLogger("client.recipes")


class SyncLock(LockCore[Session]):
    """The blocking lock interface every sync recipe has (``threading.Lock`` conventions)."""

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
        plan = self._start_acquire(blocking, timeout, monotonic())
        session = self._session
        try:
            while True:
                sent_at = monotonic()
                result = session.execute(
                    self.namespace,
                    plan.statements,
                    min_uptime=self.min_uptime,
                    min_trust=self.min_trust,
                    wait=plan.wait(sent_at, max_wait_of(session.client.welcome.limits)),
                )
                done = self._attempt_done(plan, result, sent_at, monotonic())
                if done is not None:
                    return done
        except BaseException as exc:
            self._abandon_acquire()
            if not isinstance(exc, (ServerError, ClientClosed)):
                try:
                    session.execute(self.namespace, self._cleanup_statements(plan.ticket))
                except LockClientError:
                    log.warning("cleanup after a failed acquire of %r failed", self, exc_info=True)
            raise

    def release(self) -> bool:
        """Release in one transaction; True when this grant's entries were removed. False
        (without a call) when not held. Raises LockLostError when the grant was lost (the
        local state is cleared either way)."""
        statements = self._start_release()
        if statements is None:
            return False
        return self._release_done(self._session.execute(self.namespace, statements))

    def locked(self) -> bool:
        """True when an acquire by this session would not succeed right now (held by someone,
        this object included). One transaction that changes nothing."""
        statements = self._probe_statements()
        return self._probe_locked(self._session.execute(self.namespace, statements), statements)

    def check(self) -> None:
        """Raise LockLostError if the current grant has been lost. Reads the events that have
        arrived on the connection first (when no other thread is reading it)."""
        with contextlib.suppress(LockClientError):  # closed or broken: the next call tells
            self._session.client.process_events(0.0)
        self._check()

    def refresh(self) -> None:
        """Confirm with the server that the grant is still there, and move ``valid_for()``
        forward (the session was just touched). Raises LockLostError when it is gone. No-op
        when not held."""
        statements = self._refresh_statements()
        if statements is None:
            return
        sent_at = monotonic()
        self._refresh_done(self._session.execute(self.namespace, statements), sent_at)

    def valid_for(self) -> float:
        """Seconds the grant is certainly still valid, computed from the server's replies
        without comparing clocks (0.0 when not held or lost). Keepalive pings extend the
        session without this object seeing them: call ``refresh()`` to update it."""
        return self._valid_for(monotonic())

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
        self._prepare_exit(exc is not None)
        if not self.RELEASE_ON_EXIT:
            lost = self.held and self.lost
            info = self.lost_event_info
            self._forget()
            if lost and exc is None:
                raise LockLostError(self, info)
            return
        if exc is None:
            self.release()
            return
        try:
            self.release()
        except LockClientError:
            # Do not mask the body's exception; the session's expiry frees the lock anyway.
            log.warning("releasing %r after an error failed", self, exc_info=True)


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

    def state(self) -> str:
        """The task's state now: ``in_progress`` while claimed (by anyone), else the newest
        final state recorded (``done`` when none)."""
        r = self._session.execute(self.namespace, self._state_statements())
        return task_state(r.get("claim"), r.get("states"))


class ReadWriteLock:
    """Many readers or one writer (seed 000), **writer preference**: a waiting writer stops
    new readers, so writers cannot starve. ``rw.read`` and ``rw.write`` are the two locks
    (each one holder, with the whole lock interface)."""

    def __init__(
        self,
        session: Session,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self.read = ReadLock(
            session,
            namespace,
            name,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
            description=description,
        )
        self.write = WriteLock(
            session,
            namespace,
            name,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
            description=description,
        )

    def __repr__(self) -> str:
        return f"<ReadWriteLock {self.read.namespace}/{self.read.name}>"


class MultiLock:
    """Seed 003's lock service for one application: ``MultiLock(client, namespace, app_id,
    *, max_age=60.0, ...)``.

    ``try_locks({name: "r" | "w"})`` takes a set all or nothing and returns its stamp (None
    when not granted); ``release_locks(stamp)`` releases it (UnknownStamp for a stamp not
    handed out here); ``release_all()`` ends the application's session (``app:<app_id>``),
    removing every lock it holds — those a crashed instance left behind included. Use it as
    a context manager to end the session on exit.
    """

    def __init__(
        self,
        client: LockClient,
        namespace: str,
        app_id: str,
        *,
        max_age: float = 60.0,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
    ) -> None:
        self.client = client
        self.app_id = app_id
        self.namespace = namespace
        self.session = client.session(
            max_age=max_age, description=f"MultiLock {app_id}", session_id=app_session_id(app_id)
        )
        self._options = (on_lost, min_uptime, min_trust)
        self._stamps: StampRegistry[LockSet] = StampRegistry()

    def lock_set(self, locks: Mapping[str, str] | Iterable[tuple[str, str]]) -> LockSet:
        """A lock object for the set ``locks`` in this application's session."""
        on_lost, min_uptime, min_trust = self._options
        return LockSet(
            self.session,
            self.namespace,
            locks,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
        )

    def try_locks(
        self,
        locks: Mapping[str, str] | Iterable[tuple[str, str]],
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> str | None:
        """Take every lock of ``locks`` or none, in one transaction; the stamp, or None when
        not granted. Tries once unless ``blocking`` (then as ``acquire``)."""
        lock_set = self.lock_set(locks)
        if not lock_set.acquire(blocking, timeout):
            return None
        stamp = lock_set.stamp
        assert stamp is not None
        self._stamps.add(stamp, lock_set)
        return stamp

    def release_locks(self, stamp: str) -> None:
        """Release the set ``stamp`` names, in one transaction. UnknownStamp when this
        MultiLock did not hand it out (or it was released already); LockLostError when the
        set was lost meanwhile."""
        self._stamps.pop(stamp).release()

    def stamps(self) -> list[str]:
        """The stamps handed out and not released."""
        return self._stamps.stamps()

    def release_all(self) -> bool:
        """End the application's session: every lock it holds is removed at once (also those
        of a crashed instance with the same app id). True when the session existed."""
        for lock_set in self._stamps.take_all():
            lock_set._forget()
        return self.client.end_session(self.session.id)

    def close(self) -> None:
        """End the session (releasing everything); stamps are forgotten."""
        for lock_set in self._stamps.take_all():
            lock_set._forget()
        self.session.end()

    def __enter__(self) -> MultiLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except LockClientError:
            log.warning("ending MultiLock session %s failed", self.session.id, exc_info=True)

    def __repr__(self) -> str:
        return f"<MultiLock {self.namespace} app={self.app_id} stamps={len(self._stamps)}>"
