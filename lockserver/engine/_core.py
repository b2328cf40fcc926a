"""The one synchronous door into the lock state: ``LockCore``.

``LockCore`` owns the engine (``_engine.py``), the wait queue (``_waiting.py``) and the routing
of sessions to the owners that used them (opaque handles: the shell's connections). Everything
that decides anything about lock state happens inside one of its calls; everything that
touches a socket, a clock or the configuration file stays outside. Each call takes ``now``
(and ``trust``, the shell's call-norm reading, where transactions run) and returns the
complete, ordered list of what must be sent: :data:`Output` pairs of an address and a payload.

Addresses are ``(owner, request_id)`` for answers and ``(owner, None)`` for events. Payloads:

- :class:`~protocol.TransactionResult` -- a transaction's answer (at once or after waiting);
- :class:`EngineError` -- a refusal (a limit, ``SESSION_CONFLICT``) or ``INTERNAL_ERROR``
  carrying a bug as its ``__cause__`` (the shell logs it and closes that owner's connection);
- :class:`~protocol.SessionEnded`, :class:`~protocol.Cancelled` -- answers of ``end`` and
  ``cancel``;
- :class:`~protocol.LockLost` -- an event, addressed to every owner that used the session
  (with ``authenticated``, only owners of the principal that owned the session).

Rules kept:

- **Deterministic**: the same sequence of calls with the same arguments gives the same outputs
  in the same order (owners are kept in insertion-ordered dicts, never sets). Replication
  applies one log through this door on every replica.
- **Order of outputs** is the order of delivery: losses a call caused go out before the
  answers that follow from it (a connection learns that its session expired before it sees
  the answer of the request that re-created the session), and an owner is registered on a
  session only after the call's losses were routed.
- **Answers are values**: no call raises once something has been decided (the wait queue's
  rule); a bug in one transaction is that request's ``INTERNAL_ERROR``.
- **Ownership** (``authenticated``): the first principal to use a session owns it (the
  engine's session tag, which ends with the session); another principal's ``execute`` or
  ``end`` on it is refused with ``SESSION_CONFLICT``. Which namespaces a principal may use is
  the shell's check (configuration, not lock state).

Cost on the hot path (an ``execute`` answered at once, nothing lost): one wait-queue submit,
one list, one membership test for the session's routing.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final

import attrs

from protocol import (
    Cancelled,
    ErrorCode,
    LockLost,
    LostReason,
    SessionEnded,
    SessionSpec,
    Transaction,
    TransactionResult,
)

from ._engine import Engine, EngineLimits, EngineStatistics
from ._sharded import ShardedDict
from ._store import EngineError
from ._waiting import WaitLimits, WaitQueue, WaitStatistics

__all__ = ["Address", "CoreStatistics", "LockCore", "Output", "Payload"]

#: Where an output goes: (owner, request id) for an answer, (owner, None) for an event.
Address = tuple[Hashable, int | None]
Payload = TransactionResult | EngineError | SessionEnded | Cancelled | LockLost
Output = tuple[Address, Payload]

_NOT_ENDED: Final = SessionEnded(False)
_ENDED: Final = SessionEnded(True)
_NOT_CANCELLED: Final = Cancelled(False)
_CANCELLED: Final = Cancelled(True)


@attrs.frozen
class CoreStatistics:
    """What the door counts: the engine's and the wait queue's figures, and the sessions
    with at least one owner to tell of a loss (``sessions_routed``)."""

    engine: EngineStatistics
    waiting: WaitStatistics
    sessions_routed: int


class _Owner:
    """What the door knows of one owner: its principal and the sessions it used."""

    __slots__ = ("principal", "sessions")

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.sessions: dict[str, None] = {}


class LockCore:
    """The engine, the wait queue and the session routing behind one synchronous door.

    ``engine`` and ``waits`` are exposed for reading (statistics, tests, embedding); every
    change goes through the calls below. ``authenticated``: sessions are owned by principals
    (see the module docstring).
    """

    __slots__ = ("_authenticated", "_owners", "_routes", "engine", "waits")

    def __init__(
        self,
        *,
        started_at: float,
        host: str = "",
        fence_epoch: int = 0,
        limits: EngineLimits | None = None,
        wait_limits: WaitLimits | None = None,
        authenticated: bool = False,
    ) -> None:
        self.engine = Engine(
            started_at=started_at, host=host, fence_epoch=fence_epoch, limits=limits
        )
        self.waits = WaitQueue(self.engine, wait_limits)
        self._authenticated = authenticated
        # session id -> owners that used it (as many as the sessions: sharded like them)
        self._routes: ShardedDict[dict[Hashable, None]] = ShardedDict()
        self._owners: dict[Hashable, _Owner] = {}

    # --- requests -----------------------------------------------------------------------------

    def execute(
        self,
        owner: Hashable,
        request_id: int,
        session: SessionSpec,
        tx: Transaction,
        wait: float | None,
        now: float,
        trust: float,
        principal: str,
    ) -> list[Output]:
        """Run ``tx`` in ``session`` for ``owner`` (parking it up to ``wait`` seconds when it
        fails on a statement). Returns the losses it caused, then every answer now due: this
        request's own unless it was parked, and those of waiters it (or expiries due by
        ``now``) let run."""
        engine = self.engine
        sid = session.session_id
        authenticated = self._authenticated
        if authenticated:
            conflict = self._conflict(sid, principal, now)
            if conflict is not None:
                return self._refuse(owner, request_id, conflict, now, trust)
        # The wait queue's tokens are this door's addresses: (owner, request id).
        answers: list[Output] = self.waits.submit(  # type: ignore[assignment]
            owner,
            (owner, request_id),
            session,
            tx,
            now=now,
            trust=trust,
            wait=wait,
            principal=principal,
        )
        if engine.lost_queue:
            # Losses this call caused (it may have expired the session it then re-created)
            # go to the owners of the session that was lost, before this owner is counted
            # among the users of the session it uses now.
            out: list[Output] = []
            self._route_lost(out)
            out += answers
            answers = out
        # First use of a session by this owner: remember it for LockLost routing if the
        # session exists now (a refused call may have created nothing).
        record = self._owners.get(owner)
        if (record is None or sid not in record.sessions) and sid in engine.sessions:
            self._use(owner, sid, principal)
        if authenticated:
            engine.tag_session(sid, principal)  # the first principal owns it
        return answers

    def end_session(
        self,
        owner: Hashable,
        request_id: int,
        session_id: str,
        *,
        now: float,
        trust: float,
        principal: str,
    ) -> list[Output]:
        """End a session: its entries go, its other owners get a ``LockLost(ENDED)`` event,
        waiters it let run are answered, then ``owner`` gets ``SessionEnded`` (False: there
        was no such session). What was due by ``now`` expires first, so a session whose max
        age had passed is lost by every owner that used it, ``owner`` included."""
        engine = self.engine
        engine.sweep(now)
        out: list[Output] = []
        self._route_lost(out)
        if self._authenticated:
            conflict = self._conflict(session_id, principal, now)
            if conflict is not None:
                out += self._refuse(owner, request_id, conflict, now, trust)
                return out
        routes = self._routes.get(session_id)
        # Tell the session's other owners; the one ending it gets SessionEnded instead.
        notify = routes is not None and any(o != owner for o in routes)
        if routes is not None and owner in routes:
            self._unuse(owner, session_id, routes)
        existed = engine.end_session(session_id, now=now, notify=notify)
        self._settle(out, now, trust)
        out.append(((owner, request_id), _ENDED if existed else _NOT_ENDED))
        return out

    def cancel(
        self, owner: Hashable, request_id: int, target: int, *, now: float, trust: float
    ) -> list[Output]:
        """Cancel ``owner``'s parked request ``target``: it is answered with its last failure,
        then this request with ``Cancelled(True)``, then waiters that gave way to it run.
        ``Cancelled(False)`` alone when ``target`` is not parked (answered already)."""
        last = self.waits.cancel((owner, target))
        if last is None:
            return [((owner, request_id), _NOT_CANCELLED)]
        out: list[Output] = [((owner, target), last), ((owner, request_id), _CANCELLED)]
        out += self.waits.process(now=now, trust=trust)  # type: ignore[arg-type]
        self._route_lost(out)
        return out

    def owner_gone(self, owner: Hashable, *, now: float, trust: float) -> list[Output]:
        """``owner`` is gone (its connection closed): its parked requests are dropped
        unanswered, its routes forgotten; waiters its requests held back run now. Sessions
        outlive their owners: a client that reconnects keeps its session."""
        record = self._owners.pop(owner, None)
        if record is not None:
            routes_by_session = self._routes
            for sid in record.sessions:
                routes = routes_by_session.get(sid)
                if routes is not None:
                    routes.pop(owner, None)
                    if not routes:
                        del routes_by_session[sid]
        out: list[Output] = []
        if self.waits.cancel_owner(owner):
            out += self.waits.process(now=now, trust=trust)  # type: ignore[arg-type]
        self._route_lost(out)
        return out

    # --- time ---------------------------------------------------------------------------------

    def advance(self, now: float, *, trust: float) -> list[Output]:
        """Time has come to ``now``: expire what is due (sessions, entry TTLs), answer
        waiters whose deadline passed or who can run now; the losses go last."""
        self.engine.sweep(now)
        out: list[Output] = []
        self._settle(out, now, trust)
        return out

    def next_deadline(self) -> float | None:
        """When :meth:`advance` has something to do at the latest (an expiry or a wait
        deadline); None when nothing is due ever. Calls in between may move it earlier
        (a new waiter's deadline) — the shell's timer must allow for that."""
        engine_due = self.engine.next_deadline()
        waits_due = self.waits.next_deadline()
        if engine_due is None:
            return waits_due
        if waits_due is None:
            return engine_due
        return min(engine_due, waits_due)

    # --- reading ------------------------------------------------------------------------------

    def uptime(self, now: float) -> float:
        """Seconds since start (what ``pong`` and every result carry)."""
        return self.engine.uptime(now)

    def statistics(self, now: float, *, trust: float) -> tuple[CoreStatistics, list[Output]]:
        """The counts as of ``now``, and what taking them caused: sessions and entries due by
        ``now`` are expired first (the counts never include what is gone), their losses
        routed and the waiters they free answered."""
        engine = self.engine.statistics(now)
        out: list[Output] = []
        self._settle(out, now, trust)
        stats = CoreStatistics(
            engine=engine, waiting=self.waits.statistics(), sessions_routed=len(self._routes)
        )
        return stats, out

    # --- internals ----------------------------------------------------------------------------

    def _settle(self, out: list[Output], now: float, trust: float) -> None:
        """After a call that may have expired or freed something: the waiters that can run
        now are answered, then the losses are routed (appended to ``out``)."""
        if len(self.waits):
            out += self.waits.process(now=now, trust=trust)  # type: ignore[arg-type]
        self._route_lost(out)

    def _refuse(
        self, owner: Hashable, request_id: int, refusal: EngineError, now: float, trust: float
    ) -> list[Output]:
        """A refused request's outputs: what checking it expired (answers, losses), then the
        refusal. It changed nothing else."""
        out: list[Output] = []
        self._settle(out, now, trust)
        out.append(((owner, request_id), refusal))
        return out

    def _conflict(self, session_id: str, principal: str, now: float) -> EngineError | None:
        """The refusal when ``session_id`` belongs to another principal, else None."""
        tag = self.engine.session_tag(session_id, now)
        if tag is None or tag == principal:
            return None
        return EngineError(
            ErrorCode.SESSION_CONFLICT, f"session {session_id!r} belongs to another principal"
        )

    def _use(self, owner: Hashable, session_id: str, principal: str) -> None:
        routes = self._routes.get(session_id)
        if routes is None:
            self._routes[session_id] = {owner: None}
        else:
            routes[owner] = None
        record = self._owners.get(owner)
        if record is None:
            record = self._owners[owner] = _Owner(principal)
        record.sessions[session_id] = None

    def _unuse(self, owner: Hashable, session_id: str, routes: dict[Hashable, None]) -> None:
        del routes[owner]
        if not routes:
            del self._routes[session_id]
        record = self._owners.get(owner)
        if record is not None:
            record.sessions.pop(session_id, None)

    def _route_lost(self, out: list[Output]) -> None:
        """Append the engine's queued LockLost events, addressed to the owners that used each
        session (with ``authenticated``, only those of the principal that owned it). A loss
        that ends the session (expired, ended) ends its routing: those owners used a session
        that is gone, whatever reuses the id next."""
        lost = self.engine.drain_lost_tagged()
        if not lost:
            return
        routes_by_session = self._routes
        owners = self._owners
        authenticated = self._authenticated
        for event, tag in lost:
            sid = event.session_id
            routes = routes_by_session.get(sid)
            if not routes:
                continue
            for owner in routes:
                if authenticated and tag is not None and owners[owner].principal != tag:
                    continue  # never another principal's loss
                out.append(((owner, None), event))
            if event.reason is not LostReason.TTL:
                del routes_by_session[sid]
                for owner in routes:
                    owners[owner].sessions.pop(sid, None)
