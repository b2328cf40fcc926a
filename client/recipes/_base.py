"""The face-independent half of every lock recipe: grant state, lost tracking, timing.

Why: a recipe is "one transaction to acquire, one to release" plus bookkeeping that both faces
must get exactly right: which ticket the grant carries, which fence it was granted at, when a
``LockLost`` event is about *this* grant, how long the grant is guaranteed to last, and the
``threading.Lock`` rules of ``acquire(blocking, timeout)``. All of that lives here, free of
I/O (time is passed in as ``now``). The operations that feed it (acquire with its wait loop,
release, probe, refresh, leaving a block) are written once in ``_ops``; the sync and async
faces (``_sync`` / ``_async``) add only a driver for them, their clock and their way of
signalling a loss. Each recipe kind (``_kinds``) adds the statements it sends. The errors,
argument checks and constants are ``_values``' (re-exported here); telling which ``LockLost``
events are about the grant is ``_lost``' (:class:`~client.recipes._lost.LostTracking`, this
class's base).

Rules kept:
- One lock object is **one holder**: ``acquire`` while it holds (or is acquiring) is misuse
  (RuntimeError), as with a non-reentrant lock. Share the lock's *name*, not the object.
- Every acquire uses a fresh random ticket (uuid4 hex) as the value of the entries it writes,
  and every release deletes only entries carrying that ticket. A stale cleanup can therefore
  never remove a later grant, and nobody can release someone else's lock.
- A ``LockLost`` event is about this grant when it names one of the grant's variables **at
  the grant's fence**. The lost listener is registered *before* the acquire is sent and
  buffers events while the reply is in flight: the event of a very short grant may be
  dispatched before the acquiring caller has even seen its reply.
- An event with **no entries** and reason ``RESTARTED`` or ``EXPIRED`` is one the client made
  at a reconnect (``client._core.ClientCore.reconnected``: the server restarted, or the
  session's guarantee ran out while no connection could hear): it is about **every** grant of
  the session held then. It is not buffered while acquiring: it is delivered before anything
  is sent on the new connection, so the acquire in flight goes to that connection, and its
  grant is new.
- Validity: ``local send time + (valid_until - uptime of the reply)`` (and the same with an
  entry's ``expires_at``) is a conservative local deadline; no wall clocks are compared.
- Blocking acquires never poll: each attempt asks the server to park the transaction
  (``wait``) up to its ``max_wait``; only an attempt that ran out of server wait is re-sent.
- An acquire whose outcome is unknown is **cancelled**: its transaction ends asserting that
  no tombstone of its call's fresh cancel key exists, and the cancel sets that tombstone (an
  entry of the session) and removes the ticket's entries in one transaction; in whichever
  order the two apply, no grant outlives the cancel (docs/recipes.md, "Unknown outcomes").
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from client._errors import ClientTimeout
from client._inspect import describe_holders
from client._result import Result
from client._session_state import SessionState
from protocol import (
    Abort,
    AnywayContinueAfter,
    Assert,
    Cause,
    DeleteVar,
    Exists,
    HolderInfo,
    LockLost,
    SelectOperatorValue,
    SetVar,
    Statement,
)

from ._lost import LostTracking
from ._values import (
    CANCELLED_TABLE,
    CLEANUP_TIMEOUT,
    DEFAULT_MAX_WAIT,
    MAX_LATE_GRANTS,
    TOMBSTONE_LINGER,
    AcquirePlan,
    LockLostError,
    NotAcquired,
    OnLost,
    S,
    UnknownStamp,
    check_name,
    local_deadline,
    max_wait_of,
    not_cancelled,
    same_value,
    seconds,
    tombstone_ttl,
)

__all__ = [
    "CANCELLED_TABLE",
    "CLEANUP_TIMEOUT",
    "DEFAULT_MAX_WAIT",
    "MAX_LATE_GRANTS",
    "TOMBSTONE_LINGER",
    "AcquirePlan",
    "RecipeCore",
    "LockLostError",
    "NotAcquired",
    "OnLost",
    "S",
    "UnknownStamp",
    "check_name",
    "max_wait_of",
    "same_value",
    "seconds",
    "tombstone_ttl",
]

log = logging.getLogger("client.recipes")


class RecipeCore(LostTracking[S]):
    """State shared by every recipe. Subclasses (the kinds) say what to send; the faces send.

    Public read-only state: ``namespace``, ``name``, ``held``, ``fence``, ``ticket``,
    ``lost``, ``lost_event_info``, ``last_result``; ``valid_for()``; ``on_lost`` (settable).
    """

    #: Shown in repr and messages.
    KIND: ClassVar[str] = "lock"
    #: Whether the expiry of an entry's own time to live is a loss (False for time windows,
    #: whose entries end with their window by design).
    TTL_IS_LOSS: ClassVar[bool] = True
    #: Whether leaving ``with lock:`` releases it (False for time windows).
    RELEASE_ON_EXIT: ClassVar[bool] = True
    #: Whether a loss notice naming one of the grant's variables at a *later* fence is about
    #: this grant (True for kinds whose grant moves its own entries on: a barrier party that
    #: starts to leave); otherwise only the grant's fence matches.
    MATCH_LATER: ClassVar[bool] = False

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        if not isinstance(session, SessionState):
            raise TypeError(f"session must be a client session, got {type(session).__name__}")
        if on_lost is not None and not callable(on_lost):
            raise TypeError(f"on_lost must be callable, got {type(on_lost).__name__}")
        if type(description) is not str:
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        self._session = session
        self.namespace = check_name("namespace", namespace)
        self.name = check_name("name", name)
        self.on_lost: OnLost | None = on_lost
        self.min_uptime = seconds("min_uptime", min_uptime)
        if type(min_trust) not in (int, float) or not 0.0 <= min_trust <= 1.0:
            raise ValueError(f"min_trust must be a number in 0..1, got {min_trust!r}")
        self.min_trust = float(min_trust)
        self.description = description
        # Guards the grant state: the sync face's lost listener runs in whichever thread reads.
        self._mu = threading.Lock()
        self._ticket: str | None = None  # of the grant, or of the acquire in flight
        self._fixed_ticket: str | None = None  # a caller-chosen ticket (Mutex(ticket=...))
        self._fence: int | None = None  # of the grant; None when not held
        self._acquiring = False
        self._listening = False
        self._early: deque[LockLost] = deque(maxlen=64)  # events seen while acquiring
        self._lost_info: LockLost | None = None
        self._lost = False
        # Local times until which the grant is safe: the session's part (moved by refresh())
        # and the entries' own expiry (TTL, time window), when they have one.
        self._session_deadline: float | None = None
        self._entry_deadline: float | None = None
        self.last_result: Result | None = None
        self._new_grant()

    # --- what the kinds provide -------------------------------------------------------------

    def _variables(self) -> Sequence[tuple[str, str]]:
        """(table, var) of every entry a grant writes."""
        raise NotImplementedError

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        raise NotImplementedError

    def _release_statements(self, ticket: str) -> list[Statement]:
        """Default: delete every entry carrying the ticket, telling which were there."""
        return [
            SelectOperatorValue("released", DeleteVar(table, var, ticket))
            for table, var in self._variables()
        ]

    def _was_released(self, result: Result) -> bool:
        """Default: every entry was still there (and is now gone)."""
        values = result.all("released")
        return result.ok and bool(values) and all(v is True for v in values)

    def _on_grant(self, result: Result) -> float | None:
        """Read kind-specific data of a grant; return the entries' ``expires_at`` (server
        uptime) when they expire by themselves, else None."""
        return None

    def _on_release(self) -> None:
        """Forget kind-specific grant data."""

    def _prepare_exit(self, failed: bool) -> None:
        """Called before the release at the end of a ``with`` block (``failed``: the block
        raised). The task claim picks its final state here."""

    # --- public state -------------------------------------------------------------------------

    @property
    def session(self) -> S:
        """The session that holds the lock."""
        return self._session

    @property
    def held(self) -> bool:
        """True while this object holds a grant (even if it has been lost meanwhile: see
        ``lost``). Local knowledge, no call."""
        return self._fence is not None

    @property
    def fence(self) -> int | None:
        """The fencing token of the current grant (the revision it committed at), None when
        not held. Pass it to the resource you protect."""
        return self._fence

    @property
    def ticket(self) -> str | None:
        """The random value stored in this grant's entries (None when not held)."""
        return self._ticket if self._fence is not None else None

    @property
    def lost(self) -> bool:
        """True when the last grant was lost (reset by the next successful acquire)."""
        return self._lost

    @property
    def lost_event_info(self) -> LockLost | None:
        """The server's LockLost notice for the last grant, if one arrived."""
        return self._lost_info

    def valid_for(self) -> float:
        """Seconds the grant is certainly still valid, computed from the server's replies
        and this face's clock without comparing clocks (0.0 when not held or lost).
        Keepalive pings extend the session without this object seeing them: call
        ``refresh()`` to update it."""
        return self._valid_for(self._clock())

    def _valid_for(self, now: float) -> float:
        with self._mu:
            if self._fence is None or self._lost:
                return 0.0
            bounds = [d for d in (self._session_deadline, self._entry_deadline) if d is not None]
            return max(0.0, min(bounds) - now) if bounds else 0.0

    def __repr__(self) -> str:
        state = (
            "lost"
            if self._lost and self._fence is not None
            else ("held" if self._fence is not None else "free")
        )
        return f"<{type(self).__name__} {self.namespace}/{self.name} {state}>"

    # --- acquiring ----------------------------------------------------------------------------

    def _start_acquire(self, blocking: bool, timeout: float | None, now: float) -> AcquirePlan:
        """Validate the arguments, take a fresh ticket, start listening. Raises
        LockLostError (and forgets the grant) when a lost grant is still held, RuntimeError
        when a live one is."""
        if type(blocking) is not bool:
            raise TypeError(f"blocking must be a bool, got {type(blocking).__name__}")
        if timeout is not None and timeout != -1:
            timeout = seconds("timeout", timeout)
            if not blocking:
                raise ValueError("can't specify a timeout for a non-blocking call")
        else:
            timeout = None
        lost_info: LockLost | None = None
        with self._mu:
            if (
                self._fence is not None
                and not self.RELEASE_ON_EXIT
                and self._entry_deadline is not None
                and self._entry_deadline <= now
            ):
                self._clear_grant()  # a time window that has ended: nothing left to hold
            if self._fence is not None and self._lost:
                lost_info = self._lost_info
                self._clear_grant()
                stale = True
            else:
                stale = False
                if self._fence is not None or self._acquiring:
                    raise RuntimeError(
                        f"{self!r} is already held (or being acquired) by this object: one lock "
                        "object is one holder; release it first, or make one object per holder"
                    )
                self._acquiring = True
                ticket = self._fixed_ticket or uuid.uuid4().hex
                self._ticket = ticket
                self._early.clear()
        if stale:
            self._unlisten()
            raise LockLostError(self, lost_info)
        self._listen()
        deadline = None if timeout is None else now + timeout
        key = uuid.uuid4().hex
        statements = [*self._acquire_statements(ticket), not_cancelled(key)]
        return AcquirePlan(ticket, statements, blocking, deadline, key)

    def _late_grant(self, plan: AcquirePlan, result: Result, now: float) -> bool:
        """True when ``result`` is a grant that arrived after every guarantee of its session
        had run out (the reply was held up longer than the session max age: a paused server
        or replica, a stalled network). The session may have expired meanwhile and the lock
        gone to someone else, so the grant is not taken: the caller removes it (the
        cleanup) and asks again. After :data:`MAX_LATE_GRANTS` of them in one acquire this
        raises ClientTimeout. The guarantee is the session's latest one (its keepalives
        count), so a long wait on the server is not taken for a late reply."""
        if not result.ok:
            return False
        guaranteed = self._session._guaranteed_until(self.namespace)
        if guaranteed is None or guaranteed > now:
            return False
        plan.late += 1
        log.warning(
            "%r: a grant arrived %.3f s after its session's guarantee ran out (the reply was "
            "held up longer than the session max age); released and asked again",
            self,
            now - guaranteed,
        )
        if plan.late > MAX_LATE_GRANTS:
            raise ClientTimeout(
                f"{self!r}: {plan.late} grants in a row arrived after their session's "
                "guarantee ran out (replies held up longer than the session max age)"
            )
        return True

    def _attempt_done(
        self, plan: AcquirePlan, result: Result, sent_at: float, now: float
    ) -> bool | None:
        """Digest one attempt: True (granted), False (given up), None (ask again)."""
        self.last_result = result
        if result.ok:
            expires_at = self._on_grant(result)
            with self._mu:
                self._acquiring = False
                self._fence = result.fence
                self._lost = False
                self._lost_info = None
                self._session_deadline = local_deadline(result, sent_at, result.valid_until)
                self._entry_deadline = local_deadline(result, sent_at, expires_at)
                self._new_grant()
                early = [ev for ev in self._early if self._matches(ev, result.fence)]
                self._early.clear()
            if early:
                self._mark_lost(early[0])
            return True
        if (
            plan.blocking
            and result.cause is Cause.STATEMENT
            and (plan.deadline is None or now < plan.deadline)
            and not plan.cancelled(result)
        ):
            return None
        if result.holders:
            log.info("%r not acquired: %s", self, describe_holders(result.holders))
        self._abandon_acquire()
        return False

    @property
    def holders(self) -> tuple[HolderInfo, ...]:
        """Who held the lock when the last acquire failed on it (``acquire(blocking=False)``
        returned False, or a timeout ran out): the server's records of the entries in the
        way (session, its description, ``acquired_at`` wall clock, fence...). Empty after a
        grant, and when the failure named nobody (e.g. a refused reliability contract)."""
        result = self.last_result
        return () if result is None or result.ok else result.holders

    def _wall_clock(self, uptime: float | None) -> float | None:
        """A server uptime as wall-clock Unix seconds (UTC), from the server's Welcome
        (``started_at``); None when it is None or the server does not say."""
        client = getattr(self.session, "client", None)
        welcome = getattr(client, "welcome", None)
        started_at = getattr(welcome, "started_at", None)
        if uptime is None or started_at is None:
            return None
        return float(started_at) + uptime

    def _abandon_acquire(self) -> None:
        """The acquire ended without a grant (refused, timed out, failed, cancelled)."""
        with self._mu:
            if not self._acquiring:
                return
            self._acquiring = False
            self._ticket = None
            self._early.clear()
        self._unlisten()

    def _cleanup_statements(self, ticket: str) -> list[Statement]:
        """Remove whatever an acquire with ``ticket`` may have been granted; harmless when
        nothing was. Must never abort: it runs in the cancel's transaction, whose tombstone
        an abort would roll back."""
        return self._release_statements(ticket)

    def _cancel_statements(self, plan: AcquirePlan) -> list[Statement]:
        """After an acquire whose outcome is unknown (cancelled, timed out, connection lost):
        the tombstone of the call's cancel key, then the cleanup of its ticket, in one
        transaction. Sending it again is harmless (the tombstone is set once, the cleanup
        finds nothing)."""
        # No description: a lock set's name may be longer than the server's max_text, and a
        # cancel refused for its size would leave the late grant possible.
        tombstone = SetVar(CANCELLED_TABLE, plan.key, plan.ticket, ttl=plan.tombstone_ttl)
        return [AnywayContinueAfter(tombstone), *self._cleanup_statements(plan.ticket)]

    def _probe_statements(self) -> list[Statement]:
        """``locked()``: the acquire statements followed by an Abort, so nothing is kept. It
        fails at the final Abort exactly when an acquire would succeed now."""
        return [*self._acquire_statements(uuid.uuid4().hex), Abort()]

    def _probe_locked(self, result: Result, statements: list[Statement]) -> bool:
        return result.failed_statement != f"{len(statements) - 1}:/AbortOp/"

    # --- releasing ----------------------------------------------------------------------------

    def _start_release(self) -> list[Statement] | None:
        """The release statements, or None when there is nothing to release (not held and
        no caller-chosen ticket)."""
        with self._mu:
            ticket = self._ticket if self._fence is not None else self._fixed_ticket
            if ticket is None or self._acquiring:
                return None
        return self._release_statements(ticket)

    def _release_done(self, result: Result | None) -> bool:
        """Digest a release reply (None: it could not be sent). Raises LockLostError when the
        grant had been lost (announced, or found gone by the release itself)."""
        if result is not None:
            self.last_result = result
        with self._mu:
            was_held = self._fence is not None
            lost = self._lost
            info = self._lost_info
            released = result is not None and self._was_released(result)
            if was_held and not released and not lost and result is not None:
                lost = self._lost = True  # gone without a notice reaching us (yet)
            self._clear_grant()
        self._unlisten()
        self._on_release()
        if was_held and lost:
            raise LockLostError(self, info)
        return released

    def _forget(self) -> None:
        """Drop the grant locally without a call (a time window kept until it ends)."""
        with self._mu:
            self._clear_grant()
        self._unlisten()
        self._on_release()

    def _clear_grant(self) -> None:
        self._fence = None
        self._ticket = None
        self._session_deadline = None
        self._entry_deadline = None

    # --- checking -----------------------------------------------------------------------------

    def _check(self) -> None:
        with self._mu:
            lost = self._fence is not None and self._lost
            info = self._lost_info
        if lost:
            raise LockLostError(self, info)

    def _refresh_statements(self) -> list[Statement] | None:
        with self._mu:
            ticket = self._ticket if self._fence is not None else None
        if ticket is None:
            return None
        return [
            Assert(Exists(table, var, ticket, ignore_this_session=False))
            for table, var in self._variables()
        ]

    def _refresh_done(self, result: Result, sent_at: float) -> None:
        self.last_result = result
        if result.ok:
            with self._mu:
                if self._fence is not None:
                    self._session_deadline = local_deadline(result, sent_at, result.valid_until)
        elif result.cause is Cause.STATEMENT:
            with self._mu:
                newly = self._fence is not None and not self._lost
                if newly:
                    self._lost = True
            if newly:
                self._signal_lost()
        self._check()

    # --- what the faces provide ---------------------------------------------------------------

    @staticmethod
    def _clock() -> float:
        """The face's clock (the one its session's deadlines are on)."""
        raise NotImplementedError

    def _new_grant(self) -> None:
        """A new grant (called under ``_mu``): reset the face's lost signal."""
        raise NotImplementedError

    def _signal_lost(self) -> None:
        """The grant is lost: set the face's event, cancel what it protects."""
        raise NotImplementedError
