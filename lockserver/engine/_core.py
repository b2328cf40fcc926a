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
  (with ``authenticated``, only owners of the principal that owned the session);
- :class:`~protocol.HoldersPage`, :class:`SessionsListing` (a sessions page and the owners
  that used each session: the shell names them), :class:`~protocol.WaitersPage`,
  :class:`~protocol.Released`, :class:`~protocol.Subscribed`, :class:`~protocol.Unsubscribed`
  -- answers of the operator's requests;
- :class:`~protocol.FeedEvent` -- a change-feed event: ONE per change, shared by an output
  for every subscription that hears it, addressed ``(owner, subscription id)`` (not an
  answer: its own ``subscription`` is 0, its ``dropped`` the shell's to fill: the door never
  drops).

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
  engine's session tag, which ends with the session); another principal's ``execute`` on it
  is refused with ``SESSION_CONFLICT``, its ``end`` with ``FORBIDDEN`` unless the shell says
  the principal is an admin. Which namespaces a principal may use, and who is an admin, are
  the shell's checks (configuration, not lock state); listings take what the principal may
  see as a ``Visibility`` value.
- **Times people read** (listings, denials, feed events) are wall-clock seconds: engine time
  plus the offset the shell measured once at start (``fence_epoch``). No clock is read.
- **The feed**: the engine logs every change of an entry in a subscribed namespace (grants,
  releases, expiries, force-releases, ends); each call turns what it logged into events,
  after its other outputs. Nothing is logged while nobody subscribes (one ``is None`` test
  per committing transaction). The subscriptions that hear a change are found by index
  (the namespace's, then the table's; issue 30: a change costs one tuple per subscription
  that hears it, none per one that does not), and they are capped: 64 per owner,
  ``max_subscriptions`` in all, ``max_subscriptions_per_principal`` per principal with
  ``authenticated`` (TOO_LARGE past any, naming it).
- **Counts per principal** (``visible_counts``): what a principal may see of the state,
  counted from figures the engine keeps per namespace and per owner, never by a walk.

Cost on the hot path (an ``execute`` answered at once, nothing lost): one wait-queue submit,
one list, one membership test for the session's routing.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Final, Generic, TypeVar, cast

from mypy_extensions import mypyc_attr

from protocol import (
    Cancelled,
    ErrorCode,
    FeedEvent,
    HoldersPage,
    ListQuery,
    LockLost,
    LostReason,
    Released,
    SessionEnded,
    SessionsPage,
    SessionSpec,
    Subscribed,
    Transaction,
    TransactionResult,
    Unsubscribed,
    WaitersPage,
)

from ._engine import Engine
from ._inspect import LISTINGS as _LISTINGS
from ._inspect import BusyTable, Visibility, busiest_tables
from ._records import CoreStatistics, EngineLimits, SessionsListing, VisibleCounts, WaitLimits
from ._sharded import ShardedDict
from ._store import EngineError
from ._waiting import WaitQueue, lacks

__all__ = [
    "MAX_SUBSCRIPTIONS",
    "OwnerT",
    "Address",
    "Listed",
    "BusyTable",
    "CoreStatistics",
    "LockCore",
    "Output",
    "Payload",
    "SessionsListing",
    "Visibility",
    "VisibleCounts",
]

#: Most feed subscriptions one owner (connection) may hold at once.
MAX_SUBSCRIPTIONS: Final = 64
#: Defaults of the door's subscription caps (the ``max_subscriptions`` and
#: ``max_subscriptions_per_principal`` settings).
DEFAULT_MAX_SUBSCRIPTIONS: Final = 10_000
DEFAULT_MAX_SUBSCRIPTIONS_PER_PRINCIPAL: Final = 2_500


#: The type of the owners one door is called with (the shell's connections; a replicated
#: group's ``(replica, connection)`` names): every output is addressed to one of them.
OwnerT = TypeVar("OwnerT", bound=Hashable)
#: Where an output goes: (owner, request id) for an answer, (owner, None) for an event.
Address = tuple[OwnerT, int | None]
Payload = (
    TransactionResult
    | EngineError
    | SessionEnded
    | Cancelled
    | LockLost
    | HoldersPage
    | SessionsListing
    | WaitersPage
    | Released
    | Subscribed
    | Unsubscribed
    | FeedEvent
)
Output = tuple[Address[OwnerT], Payload]
#: What a listing answers: a page (sessions: with the owners of each session), or a refusal.
Listed = HoldersPage | SessionsListing | WaitersPage | EngineError


_NOT_ENDED: Final = SessionEnded(False)
_ENDED: Final = SessionEnded(True)
_NOT_CANCELLED: Final = Cancelled(False)
_CANCELLED: Final = Cancelled(True)


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class _Owner:
    """What the door knows of one owner: its principal and the sessions it used."""

    __slots__ = ("principal", "sessions")

    def __init__(self, principal: str) -> None:
        self.principal = principal
        self.sessions: dict[str, None] = {}


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class LockCore(Generic[OwnerT]):
    """The engine, the wait queue and the session routing behind one synchronous door.

    ``engine`` and ``waits`` are exposed for reading (statistics, tests, embedding); every
    change goes through the calls below. ``authenticated``: sessions are owned by principals
    (see the module docstring).
    """

    __slots__ = (
        "_authenticated",
        "_by_namespace",
        "_by_table",
        "_max_subscriptions",
        "_max_subscriptions_per_principal",
        "_owners",
        "_routes",
        "_run",
        "_subscribers",
        "_subscriptions",
        "_subscriptions_held",
        "_subscriptions_total",
        "engine",
        "waits",
    )

    def __init__(
        self,
        *,
        started_at: float,
        host: str = "",
        fence_epoch: int = 0,
        limits: EngineLimits | None = None,
        wait_limits: WaitLimits | None = None,
        authenticated: bool = False,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_subscriptions_per_principal: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_PRINCIPAL,
    ) -> None:
        self.engine = Engine(
            started_at=started_at, host=host, fence_epoch=fence_epoch, limits=limits
        )
        self.waits = WaitQueue(self.engine, wait_limits)
        self._authenticated = authenticated
        # session id -> owners that used it (as many as the sessions: sharded like them)
        self._routes: ShardedDict[dict[OwnerT, None]] = ShardedDict()
        self._owners: dict[OwnerT, _Owner] = {}
        # Cursors name the run that made them: this core's fence epoch (the start, in µs).
        self._run = fence_epoch
        # Feed subscriptions: owner -> {subscription id: (namespace, table or None)}; who
        # hears a change of namespace/table, found by index, never by a scan: the whole
        # namespace's subscribers (namespace -> {(owner, subscription id): None}) and the
        # table's ((namespace, table) -> the same), each in subscribe order; how many each
        # principal holds (the caps: with ``authenticated`` only, per principal).
        self._subscriptions: dict[OwnerT, dict[int, tuple[str, str | None]]] = {}
        self._by_namespace: dict[str, dict[tuple[OwnerT, int], None]] = {}
        self._by_table: dict[tuple[str, str], dict[tuple[OwnerT, int], None]] = {}
        self._subscribers: dict[OwnerT, str] = {}  # owner -> its principal (subscribers)
        self._subscriptions_held: dict[str, int] = {}  # principal -> its subscriptions
        self._subscriptions_total = 0
        self._max_subscriptions = max_subscriptions
        self._max_subscriptions_per_principal = max_subscriptions_per_principal

    # --- requests -----------------------------------------------------------------------------

    def execute(
        self,
        owner: OwnerT,
        request_id: int,
        session: SessionSpec,
        tx: Transaction,
        wait: float | None,
        now: float,
        trust: float,
        principal: str,
        site: Hashable | None = None,
    ) -> list[Output[OwnerT]]:
        """Run ``tx`` in ``session`` for ``owner`` (parking it up to ``wait`` seconds when it
        fails on a statement). Returns the losses it caused, then every answer now due: this
        request's own unless it was parked, and those of waiters it (or expiries due by
        ``now``) let run.

        ``site`` (a replicated group: the replica the request came through; owners are then
        ``(site, ...)`` tuples): a session's parked requests follow the session. Used through
        ``site`` now, its requests parked through another site are answered first, with
        their last failure (their connection most likely died with that replica, before its
        lease lapsed; granted later, they would hold a lock nobody knows of)."""
        sid = session.session_id
        if site is not None and self.waits.parked_count(sid):
            followed = self._follow(sid, site, now, trust)
            return followed + self.execute(
                owner, request_id, session, tx, wait, now, trust, principal
            )
        engine = self.engine
        authenticated = self._authenticated
        if authenticated:
            conflict = self._conflict(sid, principal, now)
            if conflict is not None:
                return self._refuse(owner, request_id, conflict, now, trust)
        # The wait queue's tokens are this door's addresses: (owner, request id).
        answers = cast(
            "list[Output[OwnerT]]",
            self.waits.submit(
                owner,
                (owner, request_id),
                session,
                tx,
                now=now,
                trust=trust,
                wait=wait,
                principal=principal,
            ),
        )
        if engine.lost_queue:
            # Losses this call caused (it may have expired the session it then re-created)
            # go to the owners of the session that was lost, before this owner is counted
            # among the users of the session it uses now.
            out: list[Output[OwnerT]] = []
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
        if engine.feed_log:
            answers += self._publish()
        return answers

    def end_session(
        self,
        owner: OwnerT,
        request_id: int,
        session_id: str,
        *,
        now: float,
        trust: float,
        principal: str,
        admin: bool = False,
    ) -> list[Output[OwnerT]]:
        """End a session: its entries go, its other owners get a ``LockLost(ENDED)`` event,
        waiters it let run are answered, then ``owner`` gets ``SessionEnded`` (False: there
        was no such session). What was due by ``now`` expires first, so a session whose max
        age had passed is lost by every owner that used it, ``owner`` included. With
        ``authenticated``, another principal's session is ended only for an ``admin``
        (FORBIDDEN otherwise)."""
        engine = self.engine
        engine.sweep(now)
        out: list[Output[OwnerT]] = []
        self._route_lost(out)
        if self._authenticated and not admin:
            conflict = self._conflict(session_id, principal, now)
            if conflict is not None:
                refusal = EngineError(
                    ErrorCode.FORBIDDEN,
                    f"end: session {session_id!r} belongs to another principal; ending it "
                    "needs an admin token",
                )
                out += self._refuse(owner, request_id, refusal, now, trust)
                return out
        routes = self._routes.get(session_id)
        # Tell the session's other owners; the one ending it gets SessionEnded instead. With
        # subscribers the loss is always queued (the feed reports it; nobody else hears it).
        notify = engine.feed_log is not None or (
            routes is not None and any(o != owner for o in routes)
        )
        if routes is not None and owner in routes:
            self._unuse(owner, session_id, routes)
        existed = engine.end_session(session_id, now=now, notify=notify)
        self._settle(out, now, trust)
        out.append(((owner, request_id), _ENDED if existed else _NOT_ENDED))
        return out

    def release(
        self,
        owner: OwnerT,
        request_id: int,
        namespace: str,
        table: str,
        var: str,
        session_id: str | None,
        *,
        now: float,
        trust: float,
    ) -> list[Output[OwnerT]]:
        """Force-release: remove the entries of one variable (only ``session_id``'s when
        given). What was due by ``now`` expires first; the waiters it lets run are answered;
        each holder's owners get ``LockLost(RELEASED)`` (their session lives on); then
        ``owner`` gets ``Released`` (how many entries went, the fence). Who may ask is the
        shell's check (an admin token)."""
        engine = self.engine
        engine.sweep(now)
        out: list[Output[OwnerT]] = []
        self._route_lost(out)
        removed = engine.force_release(namespace, table, var, session_id, now=now)
        released = Released(removed, engine.fence)  # before waiters' grants move it on
        self._settle(out, now, trust)
        out.append(((owner, request_id), released))
        return out

    # --- the operator's reads -----------------------------------------------------------------

    def listing(
        self,
        owner: OwnerT,
        request_id: int,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> list[Output[OwnerT]]:
        """A page of the listing ``kind`` matching ``query``, as of ``now`` (what was due
        expires first): ``"holders"`` (a HoldersPage), ``"sessions"`` (a
        :class:`SessionsListing`: the page and the owners that used each session) or
        ``"waiters"`` (a WaitersPage, oldest first). With ``visible`` (a principal's view),
        only the namespaces it allows (sessions: also its own). A bad cursor is refused
        (INVALID_MESSAGE naming why); an unknown ``kind`` is a KeyError (the shell's bug)."""
        read = _LISTINGS[kind]
        out = self._expired(now, trust)
        try:
            page = read(self.engine, self.waits, query, visible, self._run)
        except EngineError as exc:
            out.append(((owner, request_id), exc))
            return out
        out.append(((owner, request_id), self._named(page)))
        return out

    def page_at(
        self,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> tuple[Listed, list[Output[OwnerT]]]:
        """The page :meth:`listing` answers at ``now`` (or the refusal of a bad cursor), for
        a reader with no connection to answer (the HTTP face), and what reading it caused:
        what was due by ``now`` expires first (a listing never shows a session that is gone),
        its losses routed and the waiters it frees answered, as :meth:`statistics` does."""
        out = self._expired(now, trust)
        return self.read_listing(kind, query, visible=visible), out

    def read_listing(
        self, kind: str, query: ListQuery, *, visible: Visibility | None = None
    ) -> Listed:
        """The page :meth:`listing` would answer (or the refusal of a bad cursor), read from
        the state as it stands: nothing expires first, nothing changes. A replicated group
        reads its applied state so (only the log may change it)."""
        try:
            page = _LISTINGS[kind](self.engine, self.waits, query, visible, self._run)
        except EngineError as exc:
            return exc
        return self._named(page)

    def busiest_tables(
        self, n: int, *, visible: Visibility | None = None
    ) -> tuple[list[BusyTable], int]:
        """The ``n`` tables holding the most variables (of the namespaces ``visible``
        allows), and how many tables were looked at (at most ``BUSIEST_SCAN``: bounded
        work whatever the store holds). Reads only: what is due to expire is still
        counted until a call that advances time (``statistics``, which the status page makes
        first)."""
        return busiest_tables(self.engine, n, visible)

    # --- the change feed ----------------------------------------------------------------------

    def subscribe(
        self,
        owner: OwnerT,
        request_id: int,
        namespace: str,
        table: str | None,
        principal: str = "",
    ) -> list[Output[OwnerT]]:
        """Subscribe ``owner`` (of ``principal``) to the changes of ``namespace`` (of one
        ``table`` when given), as subscription ``request_id``. Refused (TOO_LARGE, naming the
        limit) past ``MAX_SUBSCRIPTIONS`` per owner, ``max_subscriptions`` in all, and, with
        ``authenticated``, ``max_subscriptions_per_principal`` per principal; refused
        (DUPLICATE_REQUEST_ID) when the id names a live subscription of ``owner``."""
        mine = self._subscriptions.get(owner)
        if mine is not None and request_id in mine:
            return self._refused_subscription(
                owner,
                request_id,
                ErrorCode.DUPLICATE_REQUEST_ID,
                f"subscribe: subscription {request_id} of this connection is live",
            )
        if mine is not None and len(mine) >= MAX_SUBSCRIPTIONS:
            return self._refused_subscription(
                owner,
                request_id,
                ErrorCode.TOO_LARGE,
                f"subscribe: this connection has {len(mine)} subscriptions, the limit "
                f"(MAX_SUBSCRIPTIONS={MAX_SUBSCRIPTIONS})",
            )
        held, everyone = self.subscription_counts(principal)
        if everyone >= self._max_subscriptions:
            return self._refused_subscription(
                owner,
                request_id,
                ErrorCode.TOO_LARGE,
                f"subscribe: the server has {everyone} subscriptions, the limit "
                f"(max_subscriptions={self._max_subscriptions})",
            )
        if self._authenticated and held >= self._max_subscriptions_per_principal:
            return self._refused_subscription(
                owner,
                request_id,
                ErrorCode.TOO_LARGE,
                f"subscribe: principal {principal!r} has {held} subscriptions, the limit "
                f"(max_subscriptions_per_principal={self._max_subscriptions_per_principal})",
            )
        if mine is None:
            mine = self._subscriptions[owner] = {}
            self._subscribers[owner] = principal
        mine[request_id] = (namespace, table)
        self._subscriptions_held[principal] = held + 1
        self._subscriptions_total += 1
        if table is None:
            self._by_namespace.setdefault(namespace, {})[owner, request_id] = None
        else:
            self._by_table.setdefault((namespace, table), {})[owner, request_id] = None
        engine = self.engine
        engine.feed_namespaces[namespace] = engine.feed_namespaces.get(namespace, 0) + 1
        if engine.feed_log is None:
            engine.feed_log = []
        return [((owner, request_id), Subscribed(request_id))]

    def subscription_counts(self, principal: str) -> tuple[int, int]:
        """(subscriptions ``principal`` holds, subscriptions in all)."""
        return self._subscriptions_held.get(principal, 0), self._subscriptions_total

    def restored(
        self,
        *,
        max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS,
        max_subscriptions_per_principal: int = DEFAULT_MAX_SUBSCRIPTIONS_PER_PRINCIPAL,
    ) -> None:
        """After a snapshot was loaded into this object (``lockserver.replication._group``): set the
        subscription caps (the group's), and make what a snapshot of an older version lacks
        from the state it holds: the feed's index by table and its counts (its namespace
        index held every subscription, with its table: split in the same order; owners count
        under principal ""), the counts per namespace and per owner. A snapshot of this
        version is left as it is (a rebuilt dict could list its keys in another order than
        the replicas that never restored hold)."""
        self._max_subscriptions = max_subscriptions
        self._max_subscriptions_per_principal = max_subscriptions_per_principal
        if lacks(self, "_by_table"):
            self._index_old_subscriptions()
        engine = self.engine
        if lacks(engine, "entries_by_namespace"):
            entries: dict[str, int] = {}
            tagged: dict[str, int] = {}
            for s in engine.sessions.values():
                if s.tag is not None:
                    tagged[s.tag] = tagged.get(s.tag, 0) + 1
                for (ns, _), group in s.keys.items():
                    entries[ns] = entries.get(ns, 0) + len(group)
            engine.entries_by_namespace = entries
            engine.sessions_by_tag = tagged
        self.waits.restored()

    def _index_old_subscriptions(self) -> None:
        """The feed's indexes and counts from a snapshot of a version before them: its
        namespace index maps every subscription to its table (None: the namespace's)."""
        old: dict[str, dict[tuple[OwnerT, int], str | None]] = self._by_namespace  # type: ignore[assignment]
        self._by_namespace = {}
        self._by_table = {}
        for namespace, subs in old.items():
            for address, table in subs.items():
                if table is None:
                    self._by_namespace.setdefault(namespace, {})[address] = None
                else:
                    self._by_table.setdefault((namespace, table), {})[address] = None
        self._subscribers = dict.fromkeys(self._subscriptions, "")
        total = sum(len(mine) for mine in self._subscriptions.values())
        self._subscriptions_held = {"": total} if total else {}
        self._subscriptions_total = total

    def _refused_subscription(
        self, owner: OwnerT, request_id: int, code: ErrorCode, message: str
    ) -> list[Output[OwnerT]]:
        return [((owner, request_id), EngineError(code, message))]

    def unsubscribe(self, owner: OwnerT, request_id: int, target: int) -> list[Output[OwnerT]]:
        """End ``owner``'s subscription ``target``; ``Unsubscribed(False)`` when it has none
        of that id."""
        found = self._drop_subscription(owner, target)
        return [((owner, request_id), Unsubscribed(found))]

    def cancel(
        self, owner: OwnerT, request_id: int, target: int, *, now: float, trust: float
    ) -> list[Output[OwnerT]]:
        """Cancel ``owner``'s parked request ``target``: it is answered with its last failure,
        then this request with ``Cancelled(True)``, then waiters that gave way to it run.
        ``Cancelled(False)`` alone when ``target`` is not parked (answered already)."""
        last = self.waits.cancel((owner, target))
        if last is None:
            return [((owner, request_id), _NOT_CANCELLED)]
        out: list[Output[OwnerT]] = [((owner, target), last), ((owner, request_id), _CANCELLED)]
        out += cast("list[Output[OwnerT]]", self.waits.process(now=now, trust=trust))
        self._route_lost(out)
        if self.engine.feed_log:
            out += self._publish()
        return out

    def owner_gone(self, owner: OwnerT, *, now: float, trust: float) -> list[Output[OwnerT]]:
        """``owner`` is gone (its connection closed): its parked requests are dropped
        unanswered, its routes forgotten; waiters its requests held back run now. Sessions
        outlive their owners: a client that reconnects keeps its session."""
        if owner in self._subscriptions:
            for sub in list(self._subscriptions[owner]):
                self._drop_subscription(owner, sub)
        record = self._owners.pop(owner, None)
        if record is not None:
            routes_by_session = self._routes
            for sid in record.sessions:
                routes = routes_by_session.get(sid)
                if routes is not None:
                    routes.pop(owner, None)
                    if not routes:
                        del routes_by_session[sid]
        out: list[Output[OwnerT]] = []
        if self.waits.cancel_owner(owner):
            out += cast("list[Output[OwnerT]]", self.waits.process(now=now, trust=trust))
        self._route_lost(out)
        if self.engine.feed_log:
            out += self._publish()
        return out

    # --- time ---------------------------------------------------------------------------------

    def advance(self, now: float, *, trust: float, fence_floor: int = 0) -> list[Output[OwnerT]]:
        """Time has come to ``now``: expire what is due (sessions, entry TTLs), answer
        waiters whose deadline passed or who can run now; the losses go last.

        ``fence_floor`` (a replicated group, before each log entry): the next fence granted
        is above it (fences name the log position: ``lockserver/replication/_group.py``)."""
        engine = self.engine
        engine.fence = max(engine.fence, fence_floor)
        engine.sweep(now)
        out: list[Output[OwnerT]] = []
        self._settle(out, now, trust)
        return out

    def grace(self, since: float, by: float) -> tuple[int, int, int]:
        """Every live session touched at or after ``since`` expires ``by`` seconds later, and
        so does every entry TTL set and every wait parked at or after ``since``
        (``Engine.grace_sessions``, ``Waiting.grace``); how many sessions, entries and
        waits. Decides nothing else: what is due is expired by the next :meth:`advance`."""
        sessions, entries = self.engine.grace_sessions(since, by)
        return sessions, entries, self.waits.grace(since, by)

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

    def session_principal(self, session_id: str) -> str | None:
        """The principal that owns a live session (None: unknown, or no tokens). Reads only."""
        return self.engine.session_tag(session_id)

    def peek_statistics(self, now: float) -> CoreStatistics:
        """The counts as the state stands, with the uptime at ``now``: reads only (nothing
        expires first; a replicated group reads its applied state so)."""
        return CoreStatistics(
            engine=self.engine.statistics(now, expire=False),
            waiting=self.waits.statistics(),
            sessions_routed=len(self._routes),
        )

    def statistics(
        self, now: float, *, trust: float
    ) -> tuple[CoreStatistics, list[Output[OwnerT]]]:
        """The counts as of ``now``, and what taking them caused: sessions and entries due by
        ``now`` are expired first (the counts never include what is gone), their losses
        routed and the waiters they free answered."""
        engine = self.engine.statistics(now)
        out: list[Output[OwnerT]] = []
        self._settle(out, now, trust)
        stats = CoreStatistics(
            engine=engine, waiting=self.waits.statistics(), sessions_routed=len(self._routes)
        )
        return stats, out

    def visible_counts(self, visible: Visibility) -> VisibleCounts:
        """What ``visible`` (a principal's view) may see, counted: the namespaces it may use
        that hold entries, their tables and entries, the transactions parked in them, and
        the live sessions it owns (tagged with its name). Reads only, as of the last call
        that advanced time; one ``allows`` per namespace holding entries or waiters (the
        engine keeps the counts per namespace and per owner), never a walk of the entries,
        sessions or waiters."""
        engine = self.engine
        allows = visible.allows
        by_namespace = engine.entries_by_namespace
        namespaces = tables = entries = 0
        for ns, held in engine.store.namespaces.items():
            if allows(ns):
                namespaces += 1
                tables += len(held)
                entries += by_namespace.get(ns, 0)
        waiters = 0
        for ns, parked in self.waits.by_namespace.items():
            if allows(ns):
                waiters += parked
        sessions = engine.sessions_by_tag.get(visible.name, 0)
        return VisibleCounts(namespaces, tables, entries, sessions, waiters)

    # --- internals ----------------------------------------------------------------------------

    def _follow(
        self, session_id: str, site: Hashable, now: float, trust: float
    ) -> list[Output[OwnerT]]:
        """Answer at once, with their last failure, the parked requests of ``session_id``
        parked through another site than ``site`` (owners are ``(site, ...)`` tuples); then
        the waiters that gave way to them run."""
        out: list[Output[OwnerT]] = []
        for owner, token in self.waits.owners_of_session(session_id):
            named: tuple[Hashable, ...] = owner  # type: ignore[assignment]
            if named[0] == site:
                continue
            last = self.waits.cancel(token)
            if last is not None:
                out.append((cast("Address[OwnerT]", token), last))
        if not out:
            return out
        out += cast("list[Output[OwnerT]]", self.waits.process(now=now, trust=trust))
        self._route_lost(out)
        if self.engine.feed_log:
            out += self._publish()
        return out

    def _settle(self, out: list[Output[OwnerT]], now: float, trust: float) -> None:
        """After a call that may have expired or freed something: the waiters that can run
        now are answered, then the losses are routed, then the feed's events (appended to
        ``out``)."""
        if len(self.waits):
            out += cast("list[Output[OwnerT]]", self.waits.process(now=now, trust=trust))
        self._route_lost(out)
        if self.engine.feed_log:
            out += self._publish()

    def _expired(self, now: float, trust: float) -> list[Output[OwnerT]]:
        """What expiring everything due by ``now`` causes (before a read that must not show
        what is gone)."""
        out: list[Output[OwnerT]] = []
        if self.engine.expiry_due(now):
            self.engine.sweep(now)
            self._settle(out, now, trust)
        return out

    def _named(self, page: HoldersPage | SessionsPage | WaitersPage) -> Listed:
        """A listing's page as answered: a sessions page with the owners of each session."""
        if isinstance(page, SessionsPage):
            routes = self._routes
            owners = tuple(tuple(routes.get(r.session) or ()) for r in page.sessions)
            return SessionsListing(page, owners)
        return page

    def _drop_subscription(self, owner: OwnerT, sub: int) -> bool:
        mine = self._subscriptions.get(owner)
        if mine is None or sub not in mine:
            return False
        namespace, table = mine.pop(sub)
        principal = self._subscribers[owner]
        if not mine:
            del self._subscriptions[owner]
            del self._subscribers[owner]
        held = self._subscriptions_held[principal] - 1
        if held:
            self._subscriptions_held[principal] = held
        else:
            del self._subscriptions_held[principal]
        self._subscriptions_total -= 1
        if table is None:
            subs = self._by_namespace[namespace]
            del subs[owner, sub]
            if not subs:
                del self._by_namespace[namespace]
        else:
            key = (namespace, table)
            subs = self._by_table[key]
            del subs[owner, sub]
            if not subs:
                del self._by_table[key]
        engine = self.engine
        left = engine.feed_namespaces[namespace] - 1
        if left:
            engine.feed_namespaces[namespace] = left
        else:
            del engine.feed_namespaces[namespace]
            if not engine.feed_namespaces:
                engine.feed_log = None
        return True

    def _publish(self) -> list[Output[OwnerT]]:
        """The feed events of what the engine logged since the last call: per change, ONE
        FeedEvent (its ``subscription`` 0) shared by an output for every subscription that
        hears it, addressed (owner, subscription id) -- the namespace's subscriptions, then
        the table's, each in subscribe order. Found by index: a change costs one tuple per
        subscription that hears it, nothing per one that does not."""
        engine = self.engine
        log = engine.feed_log
        assert log is not None
        engine.feed_log = []
        offset = engine.store.wall_offset
        by_namespace = self._by_namespace
        by_table = self._by_table
        out: list[Output[OwnerT]] = []
        for kind, ns, table, var, sid, fence, at, reason in log:
            wide = by_namespace.get(ns)
            only = by_table.get((ns, table)) if by_table else None
            if wide is None and only is None:
                continue
            event = FeedEvent(
                0,
                kind,
                ns,
                table,
                var,
                sid,
                fence,
                at + offset,
                None if reason is None else str(reason),
            )
            # The (owner, subscription id) keys are the outputs' addresses as they are.
            if wide is not None:
                out += [(address, event) for address in wide]
            if only is not None:
                out += [(address, event) for address in only]
        return out

    def _refuse(
        self, owner: OwnerT, request_id: int, refusal: EngineError, now: float, trust: float
    ) -> list[Output[OwnerT]]:
        """A refused request's outputs: what checking it expired (answers, losses), then the
        refusal. It changed nothing else."""
        out: list[Output[OwnerT]] = []
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

    def _use(self, owner: OwnerT, session_id: str, principal: str) -> None:
        routes = self._routes.get(session_id)
        if routes is None:
            self._routes[session_id] = {owner: None}
        else:
            routes[owner] = None
        record = self._owners.get(owner)
        if record is None:
            record = self._owners[owner] = _Owner(principal)
        record.sessions[session_id] = None

    def _unuse(self, owner: OwnerT, session_id: str, routes: dict[OwnerT, None]) -> None:
        del routes[owner]
        if not routes:
            del self._routes[session_id]
        record = self._owners.get(owner)
        if record is not None:
            record.sessions.pop(session_id, None)

    def _route_lost(self, out: list[Output[OwnerT]]) -> None:
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
            if event.reason is LostReason.EXPIRED or event.reason is LostReason.ENDED:
                del routes_by_session[sid]
                for owner in routes:
                    owners[owner].sessions.pop(sid, None)
