"""The lock engine: namespaces, tables, sessions, expiry, fences, statistics.

Why / rules kept (SEMANTICS.md, issue #2):
- Pure and synchronous: every method that depends on time takes ``now`` (the shell's
  monotonic clock, seconds); nothing here reads a clock, sleeps or does I/O. One ``execute``
  call is one serializable step.
- Data model: namespace -> table -> variable -> ordered entries (stored as the one Entry, or a
  list of 2+: see _eval.py "Memory notes"); a session holds at most one entry per (namespace,
  table, variable) and knows its keys, so ending it costs O(its entries), never O(all data).
- Sessions expire after ``max_age`` seconds idle; entries may carry a TTL. Both deadlines live
  in ``Deadlines`` (_deadlines.py: a heap for what is due within a second, dicts for the rest)
  and are processed at the start of every call (and by ``sweep``), so an expired session or
  entry is invisible to the very next transaction and reclaiming costs O(expired * log n).
  A session's deadline moves on every touch; the queue keeps the old one and re-queues
  lazily when it surfaces (touching costs nothing). What ends early (an entry released, a
  session ended) leaves the queue at once: its memory never waits for the deadline the client
  chose.
- The store budget (``EngineLimits.max_store_bytes``, docs/configuration.md "Memory"):
  ``stored`` counts entries (``entry_cost``), sessions (``SESSION_BASE`` plus id and
  description), the data of remembered results, and what the wait queue charges for parked
  transactions; a change that would pass the budget fails whole with STORE_FULL.
- Fences: ``fence_epoch`` (the shell passes the wall-clock start time in microseconds) plus
  one per committing transaction that changed data. Strictly increasing within a run, and
  across restarts as long as fewer than 10**6 transactions commit per second of uptime and the
  wall clock is not set back (see PROTOCOL.md "Fences").
- QoS gate: the shell passes the current trust; uptime is ``now - started_at``. A refused
  call touches nothing, not even its session.
- Idempotent retry (docs/faults.md): a transaction with a non-empty ``transaction_id`` has its
  result remembered in its session (the last ``RETRY_MEMORY`` ids, at most ``RETRY_BYTES`` of
  their selected data, dropped with the session; a result whose data alone is bigger, or does
  not fit the store budget, is remembered without it, and a retry of it is answered with
  TOO_LARGE stating the outcome rather than run again);
  a later transaction with the same id in the same session gets that result back without
  running (a client that lost the connection mid-call can learn the outcome). A refusal or a
  limit is not remembered (nothing ran, so running again is safe). The WaitQueue re-runs a
  parked transaction with the *same* Transaction object: that is a re-evaluation, not a
  retry, so a remembered result whose Transaction is the very object passed runs again.
  Without an id the cost is one truth test.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import Any, cast

from mypy_extensions import mypyc_attr

from protocol import (
    Cause,
    ErrorCode,
    FeedKind,
    LockLost,
    LostReason,
    SessionSpec,
    Status,
    Transaction,
    TransactionResult,
    new_transaction_result,
    value_size,
)

from ._deadlines import Deadlines
from ._eval import REPLY_DATA_LIMIT, TxContext
from ._inspect import denial_holders, holders_size
from ._records import EngineLimits, EngineStatistics
from ._sharded import ShardedDict
from ._store import (
    ENTRY_BASE,
    S_FENCE,
    S_OWNER,
    S_SET_AT,
    SESSION_BASE,
    BigTable,
    EngineError,
    Entry,
    Namespaces,
    SessionRecord,
    Slot,
    Store,
    Tables,
    as_entries,
    drop_var,
    entry_cost,
    entry_desc,
    entry_expires,
    entry_value,
    find_slot,
    shard_of,
    store_full,
    text_len,
    with_expires,
)

__all__ = [
    "RETRY_BYTES",
    "RETRY_MEMORY",
    "SESSION_BASE",
    "Engine",
    "EngineLimits",
    "EngineStatistics",
    "FeedRecord",
]

Key = tuple[str, str, str]  # (namespace, table, var)

#: Results of transactions with an id remembered per session for idempotent retries.
RETRY_MEMORY = 32
#: At most this many bytes of remembered results' selected data per session (``data_size``).
RETRY_BYTES = 64 * 1024


def data_size(data: tuple[tuple[str, Any], ...]) -> int:
    """An upper bound of the encoded size of a result's selected data."""
    size = 0
    for name, value in data:
        size += 8 + text_len(name) + value_size(value)
    return size


#: What a denial's holder records may take of a reply: the room REPLY_DATA_LIMIT leaves for
#: the other fields, less 4 KiB for them, plus what the selected data does not use.
_HOLDERS_ROOM = REPLY_DATA_LIMIT + 12 * 1024

# Outcome names of EngineStatistics.by_outcome; counted by name (a str key hashes faster than
# a (Status, Cause) tuple on the hot path).
_OK = "TransactionOK"
_FAILED = "TransactionError:Statement"
_REFUSED = "TransactionError:MinimumRequirements"


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class Engine:
    """The pure lock engine. See the module docstring for the rules it keeps."""

    def __init__(
        self,
        *,
        started_at: float,
        host: str = "",
        fence_epoch: int = 0,
        limits: EngineLimits | None = None,
        track_changes: bool = False,
    ) -> None:
        self.started_at = started_at
        self.host = host
        limits = limits or EngineLimits()
        # The data and its counts: what a transaction touches (the evaluator gets this, never
        # the engine). Period windows align on the wall clock: the fence epoch is the
        # wall-clock µs at start.
        self.store = Store(
            started_at=started_at,
            wall_at_start=fence_epoch / 1_000_000,
            max_entries=limits.max_entries,
            max_entries_per_session=limits.max_entries_per_session,
            max_store_bytes=limits.max_store_bytes,
        )
        self.store.track_changes = track_changes
        self._limits = limits
        # Sharded: a million sessions coming and going must not pause everything while one
        # dict rebuilds (see _sharded.py).
        self.sessions: ShardedDict[SessionRecord] = ShardedDict()
        self.fence = fence_epoch
        self._seq = 0
        # (deadline, seq, session), keyed by the session
        self._sessions_due = Deadlines()
        # (expires_at, seq, namespace, table, var, session_id, fence), keyed by
        # (namespace, table, var, session_id)
        self._ttls_due = Deadlines()
        # At or before the earliest deadline of either (the hot path's one comparison).
        self._next_expiry = math.inf
        # Lost events with the tag their session had (the principal that owned it): the
        # shell routes them when this is not empty (a plain list: checked per request).
        self.lost_queue: list[tuple[LockLost, str | None]] = []
        # The change feed (the door turns these into events for its subscribers): None while
        # nobody subscribes; then every change of an entry in a namespace of
        # ``feed_namespaces`` is appended as a FeedRecord. A commit pays one ``is None`` test.
        self.feed_log: list[FeedRecord] | None = None
        self.feed_namespaces: dict[str, int] = {}
        self._outcomes: dict[str, int] = {_OK: 0, _FAILED: 0, _REFUSED: 0}
        # Counts a principal's scoped statistics read (``LockCore.visible_counts``): entries
        # per namespace (kept per committed transaction, expiry, release and end: a
        # transaction is in one namespace) and live sessions per tag (the principal that
        # owns them). No key holds 0.
        self.entries_by_namespace: dict[str, int] = {}
        self.sessions_by_tag: dict[str, int] = {}
        self._sessions_expired = 0
        self._entries_expired = 0
        self.retries_answered = 0  # retries answered from a session's retry memory

    @property
    def limits(self) -> EngineLimits:
        """The engine's bounds (setting them sets the store's)."""
        return self._limits

    @limits.setter
    def limits(self, limits: EngineLimits) -> None:
        self._limits = limits
        store = self.store
        store.max_entries = limits.max_entries
        store.max_entries_per_session = limits.max_entries_per_session
        store.max_store_bytes = limits.max_store_bytes

    # Views of the store, for readers of the engine (the engine itself uses ``store``).

    @property
    def namespaces(self) -> Namespaces:
        """namespace -> table -> variables (the store's)."""
        return self.store.namespaces

    @property
    def entry_count(self) -> int:
        """Entries held."""
        return self.store.entry_count

    @property
    def table_count(self) -> int:
        """Tables that hold entries."""
        return self.store.table_count

    @property
    def stored(self) -> int:
        """What the store budget counts now (``max_store_bytes``)."""
        return self.store.stored

    @property
    def pending_sets(self) -> dict[tuple[str, str, str], dict[str, int]]:
        """Variables parked transactions would set, by session (the ``Waiting`` operator)."""
        return self.store.pending_sets

    @property
    def track_changes(self) -> bool:
        """Whether changed variables and ended sessions are collected (for the wait queue:
        ``watch_changes``)."""
        return self.store.track_changes

    @property
    def changed(self) -> AbstractSet[Key]:
        """The variables changed since the last ``drain_changes`` or ``clear_changes`` (a
        view: read it, take it with ``drain_changes`` or forget it with ``clear_changes``)."""
        return self.store.changed

    @property
    def ended_sessions(self) -> Sequence[str]:
        """The ids of the sessions ended since the last ``drain_ended`` (a view)."""
        return self.store.ended

    # --- public API ---------------------------------------------------------------------------

    def window_end(self, now: float, period: float) -> float:
        """Engine time at which the current ``period`` window of the wall clock ends."""
        return self.store.window_end(now, period)

    def note_change(self, key: tuple[str, str, str]) -> None:
        """Record a change of ``key`` for waiters (when changes are tracked)."""
        self.store.note_change(key)

    # --- for the wait queue -----------------------------------------------------------------
    # What it parks counts in the store budget and shows as pending setters (``Waiting``,
    # ``ArrivedBelow``), and it watches what changes and which sessions end: the engine keeps
    # those counts and collections, the queue asks through these (it never changes the store).

    def reserve_bytes(self, cost: int) -> EngineError | None:
        """Count ``cost`` more bytes in the store budget (what a parked transaction holds);
        the refusal (STORE_FULL, nothing counted) when that would pass ``max_store_bytes``."""
        store = self.store
        if store.stored + cost > store.max_store_bytes:
            return store_full(store.stored, store.max_store_bytes)
        store.stored += cost
        return None

    def release_bytes(self, cost: int) -> None:
        """Stop counting ``cost`` bytes that ``reserve_bytes`` counted."""
        self.store.stored -= cost

    def add_pending_setter(self, key: Key, session_id: str) -> None:
        """One more parked transaction of ``session_id`` would set ``key`` (``pending_sets``)."""
        setters = self.store.pending_sets.setdefault(key, {})
        setters[session_id] = setters.get(session_id, 0) + 1

    def remove_pending_setter(self, key: Key, session_id: str) -> None:
        """One fewer (one ``add_pending_setter`` of these undone); a count leaves at 0, a key
        with no setter left goes."""
        pending = self.store.pending_sets
        setters = pending[key]
        left = setters[session_id] - 1
        if left:
            setters[session_id] = left
        else:
            del setters[session_id]
            if not setters:
                del pending[key]

    def watch_changes(self) -> None:
        """Collect from now on the variables that change (``drain_changes``) and the sessions
        that end (``drain_ended``)."""
        self.store.track_changes = True

    def unwatch_changes(self) -> None:
        """Stop collecting, and forget the ended sessions collected (changed variables
        collected stay until ``drain_changes``)."""
        store = self.store
        store.ended.clear()
        store.track_changes = False

    def clear_changes(self) -> None:
        """Forget the variables changed since the last ``drain_changes`` / ``clear_changes``,
        in place: the wait queue reads them through ``changed`` and then clears them, so a
        pass (one per request while something is parked) makes no new set."""
        self.store.changed.clear()

    def drain_ended(self) -> list[str]:
        """Take the ids of the sessions ended since the last call, in the order they ended
        (only collected while watching, ``watch_changes``)."""
        ended, self.store.ended = self.store.ended, []
        return ended

    def uptime(self, now: float) -> float:
        """Seconds since the engine started (never negative)."""
        return max(0.0, now - self.started_at)

    def execute(
        self,
        session: SessionSpec,
        tx: Transaction,
        *,
        now: float,
        trust: float = 1.0,
    ) -> TransactionResult:
        """Run ``tx`` in ``session`` at time ``now``, all or nothing.

        Expected outcomes (OK, a failed statement, a refused contract) are results. A limit
        (too many sessions or entries) raises :class:`EngineError` and changes nothing: the
        transaction's changes are rolled back and its session is neither created nor touched.
        A non-empty ``tx.transaction_id`` makes it idempotent within the session: a repeat
        returns the first result without running again (module docstring).
        """
        # Hot path: one comparison (nothing is due on almost every call).
        if self._next_expiry <= now:
            self._expire(now)
        tid = tx.transaction_id
        if tid:  # the only cost of the retry memory to a transaction without an id
            s = self.sessions.get(session.session_id)
            if s is not None and s.retry_memory is not None:
                hit = s.retry_memory.get(tid)
                if hit is not None and hit[0] is not tx:  # the same object: a parked re-run
                    s.last_touch = now
                    self.retries_answered += 1
                    if hit[2] < 0:
                        raise _forgotten_data(tid, hit[1])
                    return hit[1]
        uptime = now - self.started_at
        if uptime < tx.min_uptime or trust < tx.min_trust:
            self._outcomes[_REFUSED] += 1
            return TransactionResult(
                Status.TRANSACTION_ERROR,
                Cause.MINIMUM_REQUIREMENTS,
                tx.transaction_id,
                self.host,
                uptime,
                trust,
                None,
                (),
                self.fence,
                None,
            )
        s = self.sessions.get(session.session_id)
        if s is None:
            s = self._new_session(session, now)
            previous_touch = None
        else:
            previous_touch = s.last_touch
            s.last_touch = now
        valid_until = now + s.max_age - self.started_at
        statements = tx.statements
        if not statements:
            self._outcomes[_OK] += 1
            result = TransactionResult(
                Status.TRANSACTION_OK,
                Cause.UNSPECIFIED,
                tid,
                self.host,
                uptime,
                trust,
                None,
                (),
                self.fence,
                valid_until,
            )
            if tid:
                self._remember(s, tx, result)
            return result
        entries = self.store.entry_count
        ctx = TxContext(self.store, s, tx.namespace, tx.transaction_id, now, self.fence + 1)
        try:
            failed = ctx.run(statements)
        except BaseException:  # a limit (EngineError) or a bug: leave no trace either way
            ctx.rollback()
            if previous_touch is None:
                self._forget_session(s)
            else:
                s.last_touch = previous_touch
            raise
        if failed is not None:
            # Who made it fail, as the statement saw it (before the rollback): the denial
            # path only, a grant pays nothing for it.
            holders = denial_holders(
                self,
                statements[int(failed[: failed.index(":")])],
                tx.namespace,
                s.session_id,
                ctx.fence,
                _HOLDERS_ROOM - ctx.data_bytes,
            )
            ctx.rollback()
            self._outcomes[_FAILED] += 1
            result = TransactionResult(
                Status.TRANSACTION_ERROR,
                Cause.STATEMENT,
                tid,
                self.host,
                uptime,
                trust,
                failed,
                tuple(ctx.data),
                self.fence,
                valid_until,
                holders,
            )
            if tid:
                self._remember(s, tx, result)
            return result
        if ctx.snapshots:
            self.fence += 1
            self.store.stored += ctx.stored
            ns = tx.namespace
            entries = self.store.entry_count - entries
            if entries:  # _count_entries inlined (the hot path: once per acquire)
                counts = self.entries_by_namespace
                entries += counts.get(ns, 0)
                if entries:
                    counts[ns] = entries
                else:
                    del counts[ns]
            if ctx.ttl_ops:
                self._apply_ttl_ops(ns, s.session_id, ctx.ttl_ops)
            if not ctx.tables:  # the transaction deleted the namespace's last entries
                self.store.namespaces.pop(ns, None)
            if self.store.track_changes:
                self.store.changed.update((ns, t, v) for t, v in ctx.snapshots)
            if self.feed_log is not None and ns in self.feed_namespaces:
                self._log_commit(ns, s.session_id, ctx.snapshots, now)
        self._outcomes[_OK] += 1
        result = new_transaction_result(
            Status.TRANSACTION_OK,
            Cause.UNSPECIFIED,
            tid,
            self.host,
            uptime,
            trust,
            None,
            tuple(ctx.data),
            self.fence,
            valid_until,
            (),
        )
        if tid:
            self._remember(s, tx, result)
        return result

    def end_session(self, session_id: str, *, now: float, notify: bool = False) -> bool:
        """End a session now, removing all its entries atomically. False when unknown.
        ``notify``: queue a LockLost(ENDED) event (an end the holder did not ask for)."""
        self._expire(now)
        s = self.sessions.get(session_id)
        if s is None:
            return False
        self._drop_session(s, LostReason.ENDED if notify else None, now)
        return True

    def force_release(
        self, ns: str, table: str, var: str, session_id: str | None, *, now: float
    ) -> int:
        """Remove the entries of ``ns``/``table``/``var`` (only ``session_id``'s when given)
        as of ``now``: each holder's loss is queued (``LostReason.RELEASED``), the variable
        counts as changed for waiters, and the fence advances once when anything went.
        Returns how many entries went."""
        self._expire(now)
        tables = self.store.namespaces.get(ns)
        slot = find_slot(tables, table, var)
        if slot is None:
            return 0
        assert tables is not None  # (it holds slot)
        victims = [
            (e[S_OWNER], e[S_FENCE], entry_expires(e))
            for e in as_entries(slot)
            if session_id is None or e[S_OWNER] == session_id
        ]
        for sid, fence, expires in victims:
            if expires is not None:
                self._ttls_due.discard((ns, table, var, sid), expires)
            self._remove_entry(ns, table, var, sid, fence, expires)
            s = self.sessions[sid]
            self.lost_queue.append(
                (LockLost(sid, LostReason.RELEASED, ((ns, table, var, fence),)), s.tag)
            )
            self._feed(FeedKind.LOST, ns, table, var, sid, fence, now, LostReason.RELEASED)
        if victims:
            self.fence += 1
        return len(victims)

    def sweep(self, now: float) -> int:
        """Expire every session and entry due by ``now``; return how many were removed."""
        return self._expire(now)

    def expiry_due(self, now: float) -> bool:
        """Whether anything may be due to expire by ``now`` (False: a sweep would do
        nothing). One comparison."""
        return self._next_expiry <= now

    def next_deadline(self) -> float | None:
        """The earliest queued expiry time (a session's may have moved later since), None
        when none."""
        t = min(self._sessions_due.first(), self._ttls_due.first())
        return None if t == math.inf else t

    def drain_lost(self) -> list[LockLost]:
        """Take the LockLost events queued since the last call."""
        lost, self.lost_queue = self.lost_queue, []
        return [event for event, _ in lost]

    def drain_lost_tagged(self) -> list[tuple[LockLost, str | None]]:
        """Take the LockLost events queued since the last call, each with the tag its session
        had when the entries were lost (``tag_session``: the principal that owned it)."""
        lost, self.lost_queue = self.lost_queue, []
        return lost

    def drain_changes(self) -> set[tuple[str, str, str]]:
        """Take the set of (namespace, table, var) changed since the last call
        (only collected when ``track_changes`` is on)."""
        changed, self.store.changed = self.store.changed, set()
        return changed

    def grace_sessions(self, since: float, by: float) -> tuple[int, int]:
        """Move the last touch of every live session touched at or after ``since`` (engine
        time) ``by`` seconds later, so it expires that much later, and the TTL of each of its
        entries set at or after ``since`` too; return how many sessions and entries moved. A
        replicated group calls it when its time jumps forward: a session used, or a TTL
        chosen, while the group's time lagged real time was promised its max age, or its
        TTL, in real time (``lockserver/replication/_group.py``). What was touched or set
        before ``since`` keeps its deadline. An entry set since then belongs to a session
        touched since then, so only those sessions' entries are looked at. The session
        expiry queue follows lazily (a later deadline is re-queued when due); a moved TTL is
        queued again and its old item skipped when it surfaces (``_remove_entry`` checks
        the expiry)."""
        if by <= 0:
            return 0, 0
        moved = entries = 0
        sessions = self.sessions
        for sid in sessions:
            s = sessions[sid]
            if not s.ended and s.last_touch >= since:
                s.last_touch += by
                moved += 1
                if s.held:
                    entries += self._grace_ttls(s, since, by)
        return moved, entries

    def _grace_ttls(self, s: SessionRecord, since: float, by: float) -> int:
        """Move the TTL of each of ``s``'s entries set at or after ``since`` ``by`` later."""
        moved = 0
        sid = s.session_id
        namespaces = self.store.namespaces
        due = self._ttls_due
        for (ns, table), group in s.keys.items():
            t = namespaces[ns][table]  # the session's entries are in it
            big = t if type(t) is BigTable else None
            for var in group:
                vars_ = t if big is None else big.shards[hash(var) & big.mask]
                slot = vars_[var]
                entries = None if type(slot) is tuple else cast("list[Entry]", slot)
                i = 0
                if entries is None:
                    e: Entry = slot  # type: ignore[assignment]
                else:
                    while entries[i][S_OWNER] != sid:
                        i += 1
                    e = entries[i]
                expires = entry_expires(e)
                if expires is None or e[S_SET_AT] < since:
                    continue
                if entries is None:
                    vars_[var] = with_expires(e, expires + by)
                else:
                    entries[i] = with_expires(e, expires + by)
                key = (ns, table, var, sid)
                due.discard(key, expires)
                self._seq += 1
                due.add(key, (expires + by, self._seq, ns, table, var, sid, e[S_FENCE]))
                moved += 1
        return moved

    def tag_session(self, session_id: str, tag: str) -> None:
        """Label a live, unlabelled session with ``tag`` (no-op otherwise). The engine only
        keeps the label, and drops it with the session: the shell uses it for the principal
        that owns the session, so ownership ends exactly when the session does."""
        s = self.sessions.get(session_id)
        if s is not None and s.tag is None:
            s.tag = tag
            tagged = self.sessions_by_tag
            tagged[tag] = tagged.get(tag, 0) + 1

    def session_tag(self, session_id: str, now: float | None = None) -> str | None:
        """The label of a live session (None: unknown or unlabelled). With ``now``, deadlines
        due by then are processed first, so a session whose max age has passed is not seen
        (nor its owner) even before anything else expired it."""
        if now is not None and self._next_expiry <= now:
            self._expire(now)
        s = self.sessions.get(session_id)
        return None if s is None else s.tag

    def session_valid_until(self, session_id: str) -> float | None:
        """Uptime at which the session expires unless touched again, or None if unknown."""
        s = self.sessions.get(session_id)
        return None if s is None else s.last_touch + s.max_age - self.started_at

    def statistics(self, now: float, expire: bool = True) -> EngineStatistics:
        """Counts of namespaces, tables, entries, sessions and outcomes; what is due by
        ``now`` expires first unless ``expire`` is False (then it reads only)."""
        if expire:
            self._expire(now)
        return EngineStatistics(
            uptime=self.uptime(now),
            namespaces=len(self.store.namespaces),
            tables=self.store.table_count,
            entries=self.store.entry_count,
            sessions=len(self.sessions),
            fence=self.fence,
            transactions=sum(self._outcomes.values()),
            by_outcome={k: v for k, v in self._outcomes.items() if v},
            sessions_expired=self._sessions_expired,
            entries_expired=self._entries_expired,
            retries_answered=self.retries_answered,
            stored_bytes=self.store.stored,
        )

    # --- internals ----------------------------------------------------------------------------

    def _new_session(self, spec: SessionSpec, now: float) -> SessionRecord:
        if len(self.sessions) >= self.limits.max_sessions:
            raise EngineError(
                ErrorCode.TOO_MANY_SESSIONS,
                f"the server holds {len(self.sessions)} sessions, the limit "
                f"(max_sessions={self.limits.max_sessions})",
            )
        s = SessionRecord(spec, now)
        if self.store.stored + s.cost > self.store.max_store_bytes:
            raise store_full(self.store.stored, self.store.max_store_bytes)
        self.sessions[spec.session_id] = s
        self.store.stored += s.cost
        self._seq += 1
        deadline = s.queued
        self._sessions_due.add(s, (deadline, self._seq, s))
        self._next_expiry = min(self._next_expiry, deadline)
        return s

    def _forget_session(self, s: SessionRecord) -> None:
        """Drop a session that holds nothing (created by a call that then failed)."""
        s.ended = True
        del self.sessions[s.session_id]
        self._untag(s)
        self._sessions_due.discard(s, s.queued)
        self.store.stored -= s.cost + s.retry_bytes
        s.retry_memory = None
        if self.store.track_changes:
            self.store.ended.append(s.session_id)

    def _remember(self, s: SessionRecord, tx: Transaction, result: TransactionResult) -> None:
        """Keep ``result`` in the session's retry memory: the last RETRY_MEMORY ids, at most
        RETRY_BYTES of their data (oldest forgotten first), within the store budget; a result
        whose data cannot be kept is remembered without it (a retry is then refused)."""
        memory = s.retry_memory
        tid = tx.transaction_id
        if memory is None:
            memory = s.retry_memory = {}
        else:
            old = memory.pop(tid, None)
            if old is not None:
                self._unremember(s, old[2])
        size = data_size(result.data) if result.data else 0
        if result.holders:  # a denial's records count like its data
            size += holders_size(result.holders)
        if size > RETRY_BYTES or self.store.stored + size > self.store.max_store_bytes:
            memory[tid] = (tx, result, -1)
        else:
            while memory and (s.retry_bytes + size > RETRY_BYTES):
                oldest = next(iter(memory))
                self._unremember(s, memory.pop(oldest)[2])
            memory[tid] = (tx, result, size)
            s.retry_bytes += size
            self.store.stored += size
        while len(memory) > RETRY_MEMORY:
            oldest = next(iter(memory))  # dicts keep insertion order
            self._unremember(s, memory.pop(oldest)[2])

    def _unremember(self, s: SessionRecord, size: int) -> None:
        if size > 0:
            s.retry_bytes -= size
            self.store.stored -= size

    def _apply_ttl_ops(
        self, ns: str, sid: str, ops: list[tuple[float, str, str, int | None]]
    ) -> None:
        """Queue the deadlines a committed transaction wrote, forget those it removed."""
        due = self._ttls_due
        for expires, table, var, fence in ops:
            key = (ns, table, var, sid)
            if fence is None:
                due.discard(key, expires)
            else:
                self._seq += 1
                due.add(key, (expires, self._seq, ns, table, var, sid, fence))
                self._next_expiry = min(self._next_expiry, expires)

    def _expire(self, now: float) -> int:
        """Process every session and entry deadline due by ``now`` in time order (a session
        before an entry at the same instant), so each loss is reported with its true cause."""
        removed = 0
        sessions = self._sessions_due
        ttls = self._ttls_due
        sessions.advance(now)
        ttls.advance(now)
        snear = sessions.near
        tnear = ttls.near
        while (snear and snear[0][0] <= now) or (tnear and tnear[0][0] <= now):
            if snear and snear[0][0] <= now and (not tnear or snear[0][0] <= tnear[0][0]):
                queued, _, s = sessions.pop()
                if s.ended or s.queued != queued:
                    continue  # ended meanwhile (forgotten by the queue), or re-queued
                deadline = s.deadline
                if deadline > queued:  # touched since queued: re-queue at its real deadline
                    self._seq += 1
                    s.queued = deadline
                    sessions.add(s, (deadline, self._seq, s))
                    continue
                removed += s.held
                self._sessions_expired += 1
                self._drop_session(s, LostReason.EXPIRED, now)
            else:
                expires, _, ns, table, var, sid, fence = ttls.pop()
                if self._remove_entry(ns, table, var, sid, fence, expires):
                    removed += 1
                    self._entries_expired += 1
                    tag = self.sessions[sid].tag
                    self.lost_queue.append(
                        (LockLost(sid, LostReason.TTL, ((ns, table, var, fence),)), tag)
                    )
                    self._feed(FeedKind.EXPIRED, ns, table, var, sid, fence, now, LostReason.TTL)
        self._next_expiry = min(sessions.next_time(), ttls.next_time())
        return removed

    def _remove_entry(
        self, ns: str, table: str, var: str, sid: str, fence: int, expires: float | None
    ) -> bool:
        """Remove ``sid``'s entry of a variable if it is still the one queued to expire at
        ``expires``: same fence (not replaced by a later transaction) and same expiry (not
        replaced within its own transaction, where the fence is shared)."""
        tables = self.store.namespaces.get(ns)
        slot = find_slot(tables, table, var)
        if slot is None:
            return False
        assert tables is not None  # (it holds slot)
        entries = as_entries(slot)
        i = 0
        while entries[i][S_OWNER] != sid:
            i += 1
            if i == len(entries):
                return False
        e = entries[i]
        if e[S_FENCE] != fence or entry_expires(e) != expires:
            return False
        self.store.stored -= entry_cost(table, var, entry_value(e), entry_desc(e))
        self._unlink(ns, table, var, tables, slot, i)
        # The owner is alive: a dropped session's entries are gone with it.
        s = self.sessions[sid]
        group = s.keys[ns, table]
        del group[var]
        if not group:
            del s.keys[ns, table]
        s.held -= 1
        self.store.entry_count -= 1
        self._count_entries(ns, -1)
        return True

    def _count_entries(self, ns: str, change: int) -> None:
        """``entries_by_namespace[ns] += change`` (the key goes at 0)."""
        counts = self.entries_by_namespace
        left = counts.get(ns, 0) + change
        if left:
            counts[ns] = left
        else:
            del counts[ns]

    def _untag(self, s: SessionRecord) -> None:
        """A session leaves ``sessions_by_tag``."""
        tag = s.tag
        if tag is not None:
            tagged = self.sessions_by_tag
            left = tagged[tag] - 1
            if left:
                tagged[tag] = left
            else:
                del tagged[tag]

    def _unlink(
        self,
        ns: str,
        table: str,
        var: str,
        tables: Tables,
        slot: Slot,
        i: int,
    ) -> None:
        """Delete entry ``i`` of ``slot`` (the slot of ``table``/``var`` in ``tables``) and
        drop the containers it leaves empty; a list left with one entry becomes that entry."""
        if type(slot) is tuple:
            if drop_var(tables, table, var):
                self.store.table_count -= 1
                if not tables:
                    del self.store.namespaces[ns]
        elif len(slot) == 2:
            shard_of(tables[table], var)[var] = slot[1 - i]  # the other one, alone again
        else:
            del cast("list[Entry]", slot)[i]
        if self.store.track_changes:
            self.store.changed.add((ns, table, var))

    def _drop_session(self, s: SessionRecord, reason: LostReason | None, now: float) -> None:
        s.ended = True
        del self.sessions[s.session_id]
        self._untag(s)
        if self.store.track_changes:
            self.store.ended.append(s.session_id)  # its waiters are answered (_waiting.py)
        self._sessions_due.discard(s, s.queued)
        lost: list[tuple[str, str, str, int]] = []
        sid = s.session_id
        namespaces = self.store.namespaces
        ttls = self._ttls_due
        freed = s.cost + s.retry_bytes
        store = self.store
        for (ns, table), group in s.keys.items():
            self._count_entries(ns, -len(group))
            tables = namespaces[ns]
            t = tables[table]  # not dropped in the loop: this session's entries are in it
            # A plain lock alone on its variable (a 3-field entry: no value, TTL or description;
            # the common case by far) is unlinked right here: ending a session of 62,500 such
            # locks in a table of 1M held took ~110 ms through the helpers of the general case
            # below. The table is dropped after the group if that emptied it.
            fast = self.feed_log is None or ns not in self.feed_namespaces
            big = t if type(t) is BigTable else None
            base = ENTRY_BASE + len(table)
            for var in group:
                vars_ = t if big is None else big.shards[hash(var) & big.mask]
                slot = vars_[var]
                if fast and type(slot) is tuple and len(slot) == 3:
                    lost.append((ns, table, var, slot[S_FENCE]))
                    freed += base + len(var)
                    del vars_[var]
                    if big is not None:
                        big.n -= 1
                    if store.track_changes:
                        store.changed.add((ns, table, var))
                    continue
                if type(slot) is tuple:
                    i = 0
                    e: Entry = slot
                else:
                    entries = cast("list[Entry]", slot)
                    i = 0  # the session holds exactly one entry here (its keys say so)
                    while entries[i][S_OWNER] != sid:
                        i += 1
                    e = entries[i]
                lost.append((ns, table, var, e[S_FENCE]))
                if self.feed_log is not None and ns in self.feed_namespaces:
                    expired = reason is LostReason.EXPIRED
                    self._feed(
                        FeedKind.EXPIRED if expired else FeedKind.KILLED,
                        ns,
                        table,
                        var,
                        sid,
                        e[S_FENCE],
                        now,
                        LostReason.EXPIRED if expired else LostReason.ENDED,
                    )
                freed += entry_cost(table, var, entry_value(e), entry_desc(e))
                expires = entry_expires(e)
                if expires is not None:
                    ttls.discard((ns, table, var, sid), expires)
                self._unlink(ns, table, var, tables, slot, i)
            if not t and tables.get(table) is t:  # emptied by the fast path
                del tables[table]
                store.table_count -= 1
                if not tables:
                    del namespaces[ns]
        self.store.entry_count -= s.held
        self.store.stored -= freed
        s.held = 0
        s.keys.clear()
        s.retry_memory = None  # freed now, not when the session's deadline would have come
        s.retry_bytes = 0
        if reason is not None:
            self.lost_queue.append((LockLost(sid, reason, tuple(lost)), s.tag))

    def _feed(
        self,
        kind: FeedKind,
        ns: str,
        table: str,
        var: str,
        sid: str,
        fence: int,
        now: float,
        reason: LostReason | None,
    ) -> None:
        """Log one change for the feed when somebody subscribes to its namespace."""
        log = self.feed_log
        if log is not None and ns in self.feed_namespaces:
            log.append((kind, ns, table, var, sid, fence, now, reason))

    def _log_commit(
        self, ns: str, sid: str, snapshots: dict[tuple[str, str], Slot | None], now: float
    ) -> None:
        """Log what a committed transaction of ``sid`` did to each variable it changed: its
        entry set (granted, at the new fence) or removed (released, at the entry's fence)."""
        tables = self.store.namespaces.get(ns)
        for (table, var), before in snapshots.items():
            after = find_slot(tables, table, var)
            mine = None
            if after is not None:
                for e in as_entries(after):
                    if e[S_OWNER] == sid:
                        mine = e
                        break
            if mine is not None and mine[S_FENCE] == self.fence:
                self._feed(FeedKind.GRANTED, ns, table, var, sid, self.fence, now, None)
            elif mine is None and before is not None:
                for e in as_entries(before):
                    if e[S_OWNER] == sid:
                        self._feed(FeedKind.RELEASED, ns, table, var, sid, e[S_FENCE], now, None)


#: One logged change: (kind, namespace, table, var, session, fence, engine time, lost reason).
FeedRecord = tuple[FeedKind, str, str, str, str, int, float, LostReason | None]


def _forgotten_data(tid: str, result: TransactionResult) -> EngineError:
    """The refusal of a retry whose result was remembered without its selected data."""
    outcome = (
        result.status.name
        if result.cause is Cause.UNSPECIFIED
        else (f"{result.status.name}/{result.cause.name}")
    )
    return EngineError(
        ErrorCode.TOO_LARGE,
        f"transaction {tid!r} already ran in this session ({outcome}, fence {result.fence}); "
        "its selected data was too large to remember for retries, so it is not repeated "
        "and its data cannot be sent again",
    )
