"""The recipes' operations written once, as plain logic that both faces drive.

Why: acquiring (with its retry/wait loop and the cleanup after a failure), releasing, probing,
refreshing and leaving a ``with`` block are the same decisions on the sync and the async
face; only "send this transaction" and "what time is it" differ. As psycopg does for its
protocol exchanges, each operation here is a generator that **yields a step** and receives
its outcome; it never touches a socket, a thread or an event loop. A face's driver
(``SyncLock._drive`` in ``_sync``, ``AsyncLock._drive`` in ``_async``) runs the steps:

- :data:`NOW` -> the driver sends back its clock's time (``time.monotonic`` on the sync face,
  the event loop's clock on the async face).
- :data:`WELCOME` -> the driver sends back the Welcome of the server the lock's namespace
  lives on (``session.welcome_for``; on a client of several servers this may connect).
- :class:`RunTx` -> the driver runs the statements in the lock's session and namespace and
  sends back the :class:`~client.Result`, or throws the call's exception into the generator.
  A ``cleanup`` step is one that must finish even when the caller is being cancelled: the
  async driver shields it and bounds it by ``CLEANUP_TIMEOUT`` (sending back None when that
  runs out); the sync driver runs it as any other.

The generator's return value is the operation's result. The grant bookkeeping the steps feed
(``_start_acquire``, ``_attempt_done``, ``_release_done``...) is :class:`~._base.RecipeCore`'s.

Rules kept (see ``_base`` for the rest):
- Blocking acquires never poll: each attempt asks the server to park the transaction up to
  its ``max_wait`` (the client's Welcome limits), or up to what is left of the caller's
  timeout; only an attempt that ran out of server wait is sent again.
- An acquire that ends with an exception whose outcome is unknown (a timeout, a
  cancellation, a lost connection; not a ServerError or ClientClosed, which say nothing was
  granted) is **cancelled** in a cleanup step before the exception propagates: one
  transaction leaves a tombstone of the call's cancel key (which every attempt of the call
  asserts absent) and removes whatever the ticket was granted, so an attempt applied later
  changes nothing (``RecipeCore._cancel_statements``). A cancel that fails or runs out is
  logged, deferred to the session's next call or ping and noted on the exception (never raised over
  the original).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from client._errors import (
    ClientClosed,
    ClientTimeout,
    ConnectionLost,
    LockClientError,
    ServerError,
)
from client._result import Result
from protocol import Statement

from ._base import LockLostError, RecipeCore, max_wait_of, tombstone_ttl
from ._feed import Emit, NextFeed, SubscribeFeed, UnsubscribeFeed
from ._task_kinds import TaskClaimKind, task_state

__all__ = [
    "NOW",
    "WELCOME",
    "AskWelcome",
    "RunTx",
    "Now",
    "Op",
    "Run",
    "Step",
    "acquire",
    "exit_block",
    "locked",
    "refresh",
    "release",
    "state",
]

log = logging.getLogger("client.recipes")

T = TypeVar("T")


class Now:
    """The step "send me the time" (use the singleton :data:`NOW`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NOW"


NOW = Now()


class AskWelcome:
    """The step "send me the Welcome of the lock's server" (use the singleton
    :data:`WELCOME`): its limits bound the ``wait`` an attempt may ask for."""

    __slots__ = ()
    cleanup = False

    def __repr__(self) -> str:
        return "WELCOME"

    def run(self, session: Any, namespace: str) -> Any:
        """``session.welcome_for(namespace)``: the Welcome (sync face) or an awaitable of it
        (async face)."""
        return session.welcome_for(namespace)


WELCOME = AskWelcome()


class RunTx:
    """The step "run these statements in the lock's session (or in ``session``, when given)
    and namespace"."""

    __slots__ = ("cleanup", "min_trust", "min_uptime", "session", "statements", "wait")

    def __init__(
        self,
        statements: list[Statement],
        *,
        wait: float | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        cleanup: bool = False,
        session: Any = None,
    ) -> None:
        self.statements = statements
        self.wait = wait
        self.min_uptime = min_uptime
        self.min_trust = min_trust
        self.cleanup = cleanup
        self.session = session  # another session of the same face to run in (a latch's own)

    def __repr__(self) -> str:
        return f"<RunTx {len(self.statements)} statement(s) wait={self.wait}>"

    def run(self, session: Any, namespace: str) -> Any:
        """``session.execute(...)`` of this step: a Result (sync face), or an awaitable of it
        (async face)."""
        if self.session is not None:
            session = self.session
        return session.execute(
            namespace,
            self.statements,
            min_uptime=self.min_uptime,
            min_trust=self.min_trust,
            wait=self.wait,
        )


Step = Now | AskWelcome | RunTx | SubscribeFeed | UnsubscribeFeed | NextFeed | Emit
#: An operation: yields steps, receives their outcomes, returns its result.
Op = Generator[Step, Any, T]


class Run(Generic[T]):
    """One operation being driven: ``next()`` gives the next step that is not :data:`NOW`
    (those it answers from ``clock`` itself: a RunTx, WELCOME, or a coordination step of
    ``_feed``) or None once the operation has returned
    (``result``). The driver sets ``value`` (the step's outcome) or ``error`` (its
    exception) before the next ``next()``; neither: None is sent."""

    __slots__ = ("clock", "error", "op", "result", "value")

    def __init__(self, op: Op[T], clock: Callable[[], float]) -> None:
        self.op = op
        self.clock = clock
        self.value: Any = None
        self.error: BaseException | None = None
        self.result: T

    def next(self) -> Any:
        op = self.op
        value, error = self.value, self.error
        self.value = self.error = None
        try:
            while True:
                step = op.send(value) if error is None else op.throw(error)
                if step is not NOW:
                    return step
                value, error = self.clock(), None
        except StopIteration as stop:
            self.result = stop.value
            return None


def acquire(lock: RecipeCore[Any], blocking: bool, timeout: float | None) -> Op[bool]:
    """``acquire(blocking, timeout)``: True when granted, False when not (busy, refused,
    timed out on the server). See the faces' docstrings for the contract."""
    plan = lock._start_acquire(blocking, timeout, (yield NOW))
    try:
        limits = (yield WELCOME).limits
        max_wait = max_wait_of(limits)
        plan.tombstone_ttl = tombstone_ttl(limits)
    except BaseException:  # nothing was sent: no cleanup
        lock._abandon_acquire()
        raise
    try:
        while True:
            sent_at = yield NOW
            result = yield RunTx(
                plan.statements,
                min_uptime=lock.min_uptime,
                min_trust=lock.min_trust,
                wait=plan.wait(sent_at, max_wait),
            )
            now = yield NOW
            if lock._late_grant(plan, result, now):
                # A grant we know of (its reply came): released as such, and the same call
                # asks again; its key stays usable.
                if (yield RunTx(lock._cleanup_statements(plan.ticket), cleanup=True)) is None:
                    raise ClientTimeout(f"removing a late grant of {lock!r} ran out of time")
                continue
            done = lock._attempt_done(plan, result, sent_at, now)
            if done is not None:
                return done
    except GeneratorExit:  # pragma: no cover - a driver never drops an operation midway
        raise
    except BaseException as exc:
        lock._abandon_acquire()
        if not isinstance(exc, (ServerError, ClientClosed)):
            cancel = lock._cancel_statements(plan)
            try:
                done_cancel = (yield RunTx(cancel, cleanup=True)) is not None
            except LockClientError:
                done_cancel = False
                log.warning("cancelling a failed acquire of %r failed", lock, exc_info=True)
            if not done_cancel:
                # Its outcome is unknown too: sent again before the session's next call or
                # keepalive ping, so that a grant nobody knows of cannot outlive the failure
                # (a replicated group's session lives on). The caller learns it from the note.
                lock._session.defer_cleanup(lock.namespace, cancel)
                exc.add_note(
                    f"{lock!r}: the cancel of this acquire did not complete; it is sent again "
                    "before the session's next call or keepalive ping, and until then the lock "
                    "may be held by this session"
                )
        raise


def release(lock: RecipeCore[Any]) -> Op[bool]:
    """Release in one transaction; True when this grant's entries were removed. False
    (without a call) when not held. Raises LockLostError when the grant was lost (the local
    state is cleared either way)."""
    statements = lock._start_release()
    if statements is None:
        return False
    try:
        result: Result = yield RunTx(statements)
    except (ConnectionLost, ClientTimeout):
        # Its outcome is unknown (the connection, or a group's replica, died or stalled with
        # the release in flight). A release removes only this grant's entries, so sending it
        # again is safe, and needed: a session that lives on (a replicated group) would
        # otherwise keep the lock that its owner believes released.
        try:
            result = yield RunTx(statements)
        except LockClientError:
            lock._session.defer_cleanup(lock.namespace, statements)
            raise
    return lock._release_done(result)


def exit_block(lock: RecipeCore[Any], failed: bool) -> Op[None]:
    """Leaving a ``with`` block (``failed``: the block raised): release (a cleanup step:
    shielded on the async face), or just forget the grant for a lock that is not released
    on exit (a time window). Raises LockLostError when the grant was lost and the block did
    not fail; a failing release after a failed block is logged, not raised over the block's
    exception."""
    lock._prepare_exit(failed)
    if not lock.RELEASE_ON_EXIT:
        lost = lock.held and lock.lost
        info = lock.lost_event_info
        lock._forget()
        if lost and not failed:
            raise LockLostError(lock, info)
        return
    try:
        statements = lock._start_release()
        if statements is None:
            return
        result = yield RunTx(statements, cleanup=True)
        if result is not None:  # None: the bounded cleanup ran out; the session's expiry frees it
            lock._release_done(result)
    except LockClientError:
        if not failed:
            raise
        # Do not mask the body's exception; the session's expiry frees the lock anyway.
        log.warning("releasing %r after an error failed", lock, exc_info=True)


def locked(lock: RecipeCore[Any]) -> Op[bool]:
    """True when an acquire by this session would not succeed right now (held by someone,
    this object included). One transaction that changes nothing."""
    statements = lock._probe_statements()
    result: Result = yield RunTx(statements)
    return lock._probe_locked(result, statements)


def refresh(lock: RecipeCore[Any]) -> Op[None]:
    """Confirm with the server that the grant is still there, and move ``valid_for()``
    forward (the session was just touched). Raises LockLostError when it is gone. No-op when
    not held."""
    statements = lock._refresh_statements()
    if statements is None:
        return
    sent_at = yield NOW
    lock._refresh_done((yield RunTx(statements)), sent_at)


def state(lock: TaskClaimKind[Any]) -> Op[str]:
    """The task's state now: ``in_progress`` while claimed (by anyone), else the newest
    final state recorded (``done`` when none)."""
    result: Result = yield RunTx(lock._state_statements())
    return task_state(result.get("claim"), result.get("states"))
