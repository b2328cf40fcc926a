"""Server-side waiting: park a transaction that failed, run it the moment it can succeed.

Why: polling for a lock (redis-py retries every 0.1 s) loads the server and is unfair; client
watch machinery (ZooKeeper) is complex. Here a transaction submitted with ``wait`` that fails
with a Statement error is *parked*; it is re-evaluated only when a variable it reads changes
(a commit, a session end or expiry, an entry TTL), never on a timer and never by re-running
every waiter on every change.

Rules kept (documented for users in docs/waiting.md):
- Dependencies: the (namespace, table, var) of every Exists, SetVar, DeleteVar and
  SelectVarValue node of the transaction, whichever branch it sits in.
- Order: waiters get a global arrival number. When variables change, every waiter of those
  variables is re-evaluated in arrival order, inside the same synchronous step as the change
  (before the server reads any other request). So among waiters of the same variables the
  older one always runs first, and a newcomer can never slip in between a release and the
  grant to an older waiter that can now run ("no barging"). A waiter that still cannot run
  does not block younger ones that can (e.g. readers behind a blocked writer run; writer
  preference is the recipe's job, see client recipes).
- Re-running a waiter is an ordinary ``Engine.execute`` (the QoS gate applies again; a refusal
  then is answered, not kept). A grant is itself a change and cascades to later waiters.
- A waiter ends when it succeeds, at its deadline (answered with its last failure), when
  cancelled, or when its session ends or expires (answered with cause SessionExpired). Waiting
  does not keep the session alive: the client's pings do.

Bounds (issue 14): a change re-evaluates every waiter of the changed variables, so the work
one change can trigger is bounded where waiters park: each parked transaction weighs its ops
plus ``RUN_WEIGHT`` (the fixed cost of running a transaction, in ops), and the weights parked
on one variable, by one session and by one principal are capped (``WaitLimits``): 10,000
parked transactions of 1,000 ops that could never succeed made every release of the variable
they watched block the server ~600 ms; now at most ``max_waiting_ops_per_variable`` (about 15
ms). A parked transaction also counts in the engine's store budget (``waiter_cost``).

Answers are values: ``submit``, ``process`` and the cancels return every answer due, a
TransactionResult or an EngineError (a limit, or ``INTERNAL_ERROR`` carrying the bug as its
``__cause__``), and never raise once anything has been decided: one bad waiter can never lose
another's answer (a release that committed is always answered, and so is every waiter granted
in the same pass).

Cost: parking O(tree); a change costs O(waiters of the changed variables * their ops); a
deadline O(log waiters). Deadlines live in ``Deadlines``, so a cancelled waiter's memory is
freed at once, not when its wait would have run out. The queue is pure: every method takes
``now``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, Final, cast

import attrs
from mypy_extensions import mypyc_attr

from protocol import (
    ArrivedBelow,
    Cause,
    CountBelow,
    DeleteVar,
    ErrorCode,
    Exists,
    Node,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TransactionResult,
    Waiting,
    value_size,
)

from ._deadlines import Deadlines
from ._engine import Engine
from ._records import WaitLimits, WaitStatistics
from ._store import EngineError

__all__ = [
    "RUN_WEIGHT",
    "Answer",
    "WaitLimits",
    "WaitQueue",
    "WaitStatistics",
    "dependencies",
    "internal_error",
    "keys_of",
]

Key = tuple[str, str, str]
_KEYED = (Exists, SetVar, DeleteVar, SelectVarValue, CountBelow, Waiting, ArrivedBelow)
#: What re-running one parked transaction costs beside its ops, in ops (measured: ~5 µs per
#: run plus ~0.08 µs per cheap op).
RUN_WEIGHT = 64
#: Bytes a parked transaction counts in the store budget per op of its tree, and once (measured:
#: ~2,300 bytes for a 5-op mutex acquire parked, its tree and bookkeeping, its session apart).
_OP_BYTES = 128
_WAITER_BYTES = 1536
# Wait-time histogram bucket upper bounds, seconds (the last bucket is "more").
_BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0)


def dependencies(tx: Transaction) -> frozenset[Key]:
    """The variables a transaction reads or writes, in any branch (for ``Waiting`` nodes:
    the variable whose pending setters it looks at; for ``CountBelow``: also its limit)."""
    ns = tx.namespace
    keys: set[Key] = set()
    stack: list[Any] = list(tx.statements)
    while stack:
        node = stack.pop()
        if isinstance(node, _KEYED):
            keys.add((ns, node.table, node.var))
            if type(node) is CountBelow and node.limit_table is not None:
                keys.add((ns, node.limit_table, node.limit_var))  # type: ignore[arg-type]
        stack.extend(_children(node))
    return frozenset(keys)


def keys_of(tx: Transaction, kind: type) -> frozenset[Key]:
    """The variables of every ``kind`` node (SetVar, Waiting...) of a transaction."""
    ns = tx.namespace
    keys: set[Key] = set()
    stack: list[Any] = list(tx.statements)
    while stack:
        node = stack.pop()
        if type(node) is kind:
            keyed: Any = node
            keys.add((ns, keyed.table, keyed.var))
        stack.extend(_children(node))
    return frozenset(keys)


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class _Shape:
    """What parking a transaction needs to know of its tree, from one walk."""

    __slots__ = ("cost", "keys", "ops", "sets", "watches")

    def __init__(self, tx: Transaction) -> None:
        ns = tx.namespace
        keys: set[Key] = set()
        sets: set[Key] = set()
        watches: set[Key] = set()
        ops = 0
        cost = _WAITER_BYTES
        stack: list[Any] = list(tx.statements)
        while stack:
            node = stack.pop()
            ops += 1
            t = type(node)
            if isinstance(node, _KEYED):
                keyed: Any = node
                key = (ns, keyed.table, keyed.var)
                keys.add(key)
                if t is SetVar:
                    sets.add(key)
                elif t is Waiting or t is ArrivedBelow:
                    watches.add(key)
                elif t is CountBelow and keyed.limit_table is not None:
                    keys.add((ns, keyed.limit_table, keyed.limit_var))
            value = getattr(node, "value", None)
            if value is not None:
                cost += value_size(value)
            stack.extend(_children(node))
        self.keys = frozenset(keys)
        self.sets = frozenset(sets)
        self.watches = frozenset(watches)
        self.ops = ops + RUN_WEIGHT  # the weight in the wait limits
        self.cost = cost + _OP_BYTES * ops  # the bytes it counts in the store budget


def internal_error(exc: BaseException) -> EngineError:
    """The answer for a request whose evaluation hit a bug: INTERNAL_ERROR (the connection is
    closed), with the bug as ``__cause__`` for the shell to log."""
    err = EngineError(
        ErrorCode.INTERNAL_ERROR, "internal server error (logged); the connection is closed"
    )
    err.__cause__ = exc
    return err


def _children(node: Node) -> Iterator[Node]:
    for field in attrs.fields(cast("type[attrs.AttrsInstance]", type(node))):
        value = getattr(node, field.name)
        if isinstance(value, Node):
            yield value
        elif type(value) is tuple:
            yield from (v for v in value if isinstance(v, Node))


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class _Waiter:
    __slots__ = (
        "cost",
        "deadline",
        "keys",
        "last",
        "ops",
        "owner",
        "parked_at",
        "principal",
        "seen",
        "seq",
        "session",
        "sets",
        "token",
        "tx",
        "watches",
    )

    def __init__(
        self,
        seq: int,
        owner: Hashable,
        principal: Hashable,
        token: Hashable,
        session: SessionSpec,
        tx: Transaction,
        shape: _Shape,
        parked_at: float,
        deadline: float,
        last: TransactionResult,
    ) -> None:
        self.seq = seq
        self.owner = owner
        self.principal = principal
        self.token = token
        self.session = session
        self.tx = tx
        self.keys = shape.keys
        self.ops = shape.ops
        self.cost = shape.cost
        self.parked_at = parked_at
        self.deadline = deadline
        self.last = last
        self.seen = 0  # the queue's change version this waiter was last evaluated at
        self.sets = shape.sets  # what it would set: visible through Waiting, ArrivedBelow
        self.watches = shape.watches  # whose pending setters it looks at


#: (token, what to answer it with): a result, or an error reply's EngineError.
Answer = tuple[Hashable, TransactionResult | EngineError]

#: Most waiters in one run of ``Arrivals``.
ARRIVAL_RUN: Final = 256


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class Arrivals:
    """The parked waiters in arrival order, found from an arrival number in O(log n), so a
    waiters listing resumes where its cursor left off at the cost of its page (a dict in
    arrival order can only be walked from its start: every page copied all 100,000).

    Kept as runs (lists of at most ``ARRIVAL_RUN`` waiters, in arrival order) and the
    arrival number of each run's first waiter: a newcomer arrives last, so it goes to the
    end of the last run (a new run when that one is full); a waiter leaves from its run,
    found by bisection, and an emptied run goes. Runs are never merged: there are at most as
    many as waiters, and removing one moves only the list of runs (C, pointers)."""

    __slots__ = ("firsts", "runs")

    def __init__(self) -> None:
        self.runs: list[list[Any]] = []
        self.firsts: list[int] = []

    def add(self, w: Any) -> None:
        """Append ``w``, whose arrival number is higher than every other's."""
        runs = self.runs
        if runs and len(runs[-1]) < ARRIVAL_RUN:
            runs[-1].append(w)
        else:
            runs.append([w])
            self.firsts.append(w.seq)

    def remove(self, w: Any) -> None:
        """Remove ``w`` (present)."""
        i = bisect.bisect_right(self.firsts, w.seq) - 1
        run = self.runs[i]
        j = 0
        while run[j] is not w:
            j += 1
        del run[j]
        if not run:
            del self.runs[i]
            del self.firsts[i]
        elif j == 0:
            self.firsts[i] = run[0].seq

    def since(self, seq: int) -> Iterator[Any]:
        """The waiters whose arrival number is ``seq`` or later, oldest first."""
        runs = self.runs
        i = max(0, bisect.bisect_right(self.firsts, seq) - 1)
        for k in range(i, len(runs)):
            for w in runs[k]:
                if w.seq >= seq:
                    yield w


def lacks(obj: object, name: str) -> bool:
    """Whether ``obj`` has no attribute ``name`` (set by a newer version than the snapshot
    that made it; a compiled object has no ``__dict__`` to ask)."""
    try:
        getattr(obj, name)
    except AttributeError:
        return True
    return False


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class WaitQueue:
    """Parked transactions over one engine. ``owner`` is what the shell cancels as a group
    (a connection), ``token`` identifies one parked request (e.g. (connection, request id));
    both are opaque hashables to this module."""

    def __init__(self, engine: Engine, limits: WaitLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits or WaitLimits()
        self._seq = 0
        self._version = 0
        self._by_token: dict[Hashable, _Waiter] = {}
        self._arrivals = Arrivals()  # the same waiters, in arrival order (for listings)
        self._by_key: dict[Key, dict[int, _Waiter]] = {}
        self._by_session: dict[str, dict[int, _Waiter]] = {}
        self._by_owner: dict[Hashable, dict[int, _Waiter]] = {}
        # Variables whose pending setters parked Waiting / ArrivedBelow nodes look at.
        self._watched: dict[Key, int] = {}
        # weights (ops + RUN_WEIGHT) parked per variable, session and principal
        self._ops_by_key: dict[Key, int] = {}
        self._ops_by_session: dict[str, int] = {}
        self._ops_by_principal: dict[Hashable, int] = {}
        # parked transactions per namespace (a principal's scoped statistics; no key at 0)
        self.by_namespace: dict[str, int] = {}
        self._deadlines = Deadlines()  # (deadline, seq, waiter), keyed by the waiter
        self._parked_total = 0
        self._granted_total = 0
        self._timed_out_total = 0
        self._cancelled_total = 0
        self._reevaluations = 0
        self._histogram = [0] * (len(_BUCKETS) + 1)

    def __len__(self) -> int:
        return len(self._by_token)

    # --- submitting ---------------------------------------------------------------------------

    def submit(
        self,
        owner: Hashable,
        token: Hashable,
        session: SessionSpec,
        tx: Transaction,
        *,
        now: float,
        trust: float,
        wait: float | None,
        principal: Hashable = "",
    ) -> list[Answer]:
        """Execute ``tx`` (parking it when it fails and ``wait`` > 0) and return every answer
        now due, this request's own included unless it was parked. Pending expiries are
        handed to older waiters *before* the newcomer runs, so it cannot barge in. A limit
        (or a bug) is this request's answer, an EngineError; nothing then changed for it, and
        every other answer due is still returned. Never raises."""
        waits = wait is not None and wait > 0
        if waits:
            if token in self._by_token:
                return [
                    (
                        token,
                        EngineError(
                            ErrorCode.DUPLICATE_REQUEST_ID,
                            f"request {token!r} is already waiting",
                        ),
                    )
                ]
            refusal = self._check_count(owner, session.session_id)
            if refusal is not None:
                return [(token, refusal)]
        answers = self.process(now=now, trust=trust) if self._by_token else []
        try:
            result = self.engine.execute(session, tx, now=now, trust=trust)
        except EngineError as refused:
            answers.append((token, refused))
        # A name of its own: a compiled build types ``exc`` once per function, by its first
        # ``except``, and would refuse a bug's exception as not an EngineError.
        except Exception as bug:  # a bug: this request's answer, nobody else's
            answers.append((token, internal_error(bug)))
        else:
            if (
                not waits
                or result.status is not Status.TRANSACTION_ERROR
                or (result.cause is not Cause.STATEMENT)
            ):
                answers.append((token, result))
            else:
                assert wait is not None
                refusal = self._park(owner, principal, token, session, tx, now, wait, result)
                if refusal is not None:
                    answers.append((token, refusal))
                elif self.engine.changed:
                    # It is a new pending setter of a variable parked ArrivedBelow / Waiting
                    # nodes look at (``_park`` noted it): they may run now.
                    answers.extend(self.process(now=now, trust=trust))
                return answers
        if self._by_token:
            answers.extend(self.process(now=now, trust=trust))
        return answers

    def _park(
        self,
        owner: Hashable,
        principal: Hashable,
        token: Hashable,
        session: SessionSpec,
        tx: Transaction,
        now: float,
        wait: float,
        last: TransactionResult,
    ) -> EngineError | None:
        """Park a transaction that just failed; the refusal when a weight limit or the store
        budget does not allow it (it ran and changed nothing: refusing it is clean)."""
        shape = _Shape(tx)
        sid = session.session_id
        refusal = self._check_weights(shape, sid, principal)
        if refusal is not None:
            return refusal
        engine = self.engine
        refusal = engine.reserve_bytes(shape.cost)  # released in ``_remove``
        if refusal is not None:
            return refusal
        self._seq += 1
        w = _Waiter(self._seq, owner, principal, token, session, tx, shape, now, now + wait, last)
        w.seen = self._version
        self._by_token[token] = w
        self._arrivals.add(w)
        ops = w.ops
        by_key = self._ops_by_key
        for key in w.keys:
            self._by_key.setdefault(key, {})[w.seq] = w
            by_key[key] = by_key.get(key, 0) + ops
        self._by_session.setdefault(sid, {})[w.seq] = w
        self._ops_by_session[sid] = self._ops_by_session.get(sid, 0) + ops
        self._ops_by_principal[principal] = self._ops_by_principal.get(principal, 0) + ops
        self._by_owner.setdefault(owner, {})[w.seq] = w
        ns = tx.namespace
        self.by_namespace[ns] = self.by_namespace.get(ns, 0) + 1
        watched = self._watched
        for key in w.sets:
            engine.add_pending_setter(key, sid)
            if key in watched:
                # One more pending setter: waiters that count them (ArrivedBelow) or give way
                # to them (Waiting) must be looked at again, as when one goes (``_remove``).
                engine.note_change(key)
        for key in w.watches:
            watched[key] = watched.get(key, 0) + 1
        self._deadlines.add(w, (w.deadline, w.seq, w))
        self._parked_total += 1
        engine.watch_changes()
        return None

    def _check_count(self, owner: Hashable, session_id: str) -> EngineError | None:
        lim = self.limits
        if len(self._by_token) >= lim.max_waiters:
            return EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"the server has {len(self._by_token)} parked transactions, the limit "
                f"(max_waiters={lim.max_waiters})",
            )
        if len(self._by_session.get(session_id, ())) >= lim.max_waiters_per_session:
            return EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"session {session_id!r} has {lim.max_waiters_per_session} parked "
                f"transactions, the limit (max_waiters_per_session)",
            )
        if len(self._by_owner.get(owner, ())) >= lim.max_waiters_per_owner:
            return EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"this connection has {lim.max_waiters_per_owner} parked transactions, "
                f"the limit (max_waiters_per_connection)",
            )
        return None

    def _check_weights(
        self, shape: _Shape, session_id: str, principal: Hashable
    ) -> EngineError | None:
        lim = self.limits
        ops = shape.ops
        checks: list[tuple[str, int, int, str]] = [
            (
                f"variable {key[1]!r}/{key[2]!r}",
                self._ops_by_key.get(key, 0),
                lim.max_waiting_ops_per_variable,
                "max_waiting_ops_per_variable",
            )
            for key in shape.keys
        ]
        checks.append(
            (
                f"session {session_id!r}",
                self._ops_by_session.get(session_id, 0),
                lim.max_waiting_ops_per_session,
                "max_waiting_ops_per_session",
            )
        )
        checks.append(
            (
                "this principal",
                self._ops_by_principal.get(principal, 0),
                lim.max_waiting_ops_per_principal,
                "max_waiting_ops_per_principal",
            )
        )
        for what, parked, limit, setting in checks:
            if parked + ops > limit:
                return _too_heavy(what, parked, ops, limit, setting)
        return None

    # --- progress -----------------------------------------------------------------------------

    def process(self, *, now: float, trust: float) -> list[Answer]:
        """Answer what is due at ``now``: waiters whose variables changed and can now run
        (in arrival order, cascading), waiters of ended sessions, and expired deadlines."""
        answers: list[Answer] = []
        engine = self.engine
        if not self._by_token:
            engine.clear_changes()
            engine.unwatch_changes()
            return answers
        deadlines = self._deadlines
        deadlines.advance(now)  # what is due by now is in the near heap (as the pass needs)
        if not engine.ended_sessions and not engine.expiry_due(now) and not deadlines.due(now):
            # Nothing ended, expired or ran out since the last pass: only a change of a
            # variable a waiter reads can make one run (waiters re-run on nothing else). An
            # execute while unrelated transactions wait changes none of theirs: no pass.
            by_key = self._by_key
            for key in engine.changed:
                if key in by_key:
                    break
            else:
                engine.clear_changes()
                return answers
        engine.sweep(now)
        self._drop_dead_sessions(now, answers)
        deadlines = self._deadlines
        deadlines.advance(now)
        while deadlines.due(now):
            item = deadlines.pop()
            w: _Waiter = item[2]
            # Else answered before (forgotten), or moved later since this item was queued.
            if self._by_token.get(w.token) is w and w.deadline == item[0]:
                self._remove(w)
                self._timed_out_total += 1
                self._observe(now - w.parked_at)
                answers.append((w.token, attrs.evolve(w.last, uptime=engine.uptime(now))))
        # Versions make a cascade cost one evaluation per waiter per change it has not seen:
        # a waiter evaluated after a grant already saw that grant's change.
        self._version += 1
        stamps = dict.fromkeys(engine.changed, self._version)
        engine.clear_changes()
        pending = set(stamps)
        while pending:
            candidates: dict[int, _Waiter] = {}
            for key in pending:
                stamp = stamps[key]
                for seq, w in self._by_key.get(key, {}).items():
                    if w.seen < stamp:
                        candidates[seq] = w
            pending = set()
            for seq in sorted(candidates):
                w = candidates[seq]
                if w.token not in self._by_token:
                    continue  # answered earlier in this cascade
                w.seen = self._version
                self._reevaluations += 1
                try:
                    result = engine.execute(w.session, w.tx, now=now, trust=trust)
                except EngineError:
                    # A limit hit on re-run (e.g. the server filled up): answer with the
                    # waiter's last failure rather than keep retrying against a full server.
                    self._remove(w)
                    answers.append((w.token, w.last))
                    continue
                except Exception as exc:
                    # A bug in this waiter's evaluation (rolled back by the engine): it gets
                    # the error, and the pass goes on for everyone else.
                    self._remove(w)
                    answers.append((w.token, internal_error(exc)))
                    continue
                if result.status is Status.TRANSACTION_ERROR and result.cause is Cause.STATEMENT:
                    w.last = result
                    continue
                self._remove(w)
                self._granted_total += 1
                self._observe(now - w.parked_at)
                answers.append((w.token, result))
                changed = engine.changed
                if changed:
                    self._version += 1
                    for key in changed:
                        stamps[key] = self._version
                    pending |= changed
                    engine.clear_changes()
            self._drop_dead_sessions(now, answers)
        if not self._by_token:
            engine.unwatch_changes()
        return answers

    def _drop_dead_sessions(self, now: float, answers: list[Answer]) -> None:
        """Waiters whose session no longer exists (ended or expired) are answered with
        cause SessionExpired. Only the sessions that ended since the last look are looked at
        (the engine's ``drain_ended``, collected while waiters exist): a pass costs nothing
        per session that merely has a waiter."""
        if not self.engine.ended_sessions:
            return
        ended = self.engine.drain_ended()
        sessions = self.engine.sessions
        by_session = self._by_session
        for sid in ended:
            waiting = by_session.get(sid)
            if waiting is None or sid in sessions:  # no waiters, or the id is in use again
                continue
            for w in list(waiting.values()):
                self._remove(w)
                self._cancelled_total += 1
                answers.append((w.token, _session_gone(w.last)))

    def next_deadline(self) -> float | None:
        """The earliest wait deadline, for the shell's timer (None when nothing waits)."""
        deadlines = self._deadlines
        while True:
            t = deadlines.first()
            if t == math.inf:
                return None
            w: _Waiter = deadlines.near[0][2]
            if self._by_token.get(w.token) is w and w.deadline == t:
                return t
            deadlines.pop()  # answered, cancelled or moved (``grace``) before: forget it now

    def grace(self, since: float, by: float) -> int:
        """Move the deadline of every waiter parked at or after ``since`` ``by`` seconds
        later; return how many. A replicated group calls it when its time jumps forward: a
        wait parked while the group's time lagged real time was promised its length in real
        time (``lockserver/replication/_group.py``). The old deadline's item, when already
        in the near heap, is skipped when it surfaces (its time is no longer the waiter's)."""
        if by <= 0:
            return 0
        moved = 0
        deadlines = self._deadlines
        for w in self._by_token.values():
            if w.parked_at >= since:
                deadlines.discard(w, w.deadline)
                w.deadline += by
                deadlines.add(w, (w.deadline, w.seq, w))
                moved += 1
        return moved

    # --- cancelling ---------------------------------------------------------------------------

    def cancel(self, token: Hashable) -> TransactionResult | None:
        """Cancel one parked request; return its last failure (to answer it with) or None
        when it is not parked."""
        w = self._by_token.get(token)
        if w is None:
            return None
        self._remove(w)
        self._cancelled_total += 1
        return w.last

    def cancel_owner(self, owner: Hashable) -> int:
        """Drop every waiter of an owner (its connection closed): nobody is answered."""
        waiting = self._by_owner.get(owner)
        if not waiting:
            return 0
        ws = list(waiting.values())
        for w in ws:
            self._remove(w)
        self._cancelled_total += len(ws)
        return len(ws)

    def owners_of_session(self, session_id: str) -> list[tuple[Hashable, Hashable]]:
        """(owner, token) of every parked request of a session, oldest first."""
        return [(w.owner, w.token) for w in self._by_session.get(session_id, {}).values()]

    def waiting_on(self, key: Key) -> Iterable[Hashable]:
        """Tokens of the waiters of one variable, oldest first (for tests and statistics)."""
        return [w.token for _, w in sorted(self._by_key.get(key, {}).items())]

    def restored(self) -> None:
        """After a snapshot was loaded into this object: make what a snapshot of an older
        version lacks from the waiters it holds (the count per namespace, the arrival index),
        in arrival order; a snapshot of this version is left as it is."""
        waiters = sorted(self._by_token.values(), key=lambda w: w.seq)
        if lacks(self, "by_namespace"):
            parked: dict[str, int] = {}
            for w in waiters:
                ns = w.tx.namespace
                parked[ns] = parked.get(ns, 0) + 1
            self.by_namespace = parked
        if lacks(self, "_arrivals"):
            arrivals = Arrivals()
            for w in waiters:
                arrivals.add(w)
            self._arrivals = arrivals

    def since(self, seq: int) -> Iterator[Any]:
        """The parked transactions (their waiter records) that arrived as number ``seq`` or
        later, oldest first (for listings: O(log waiters) to start)."""
        return self._arrivals.since(seq)

    def arrivals(self, key: Key) -> list[int]:
        """The arrival numbers of the waiters of ``key``, oldest first (a waiter's position
        in the queue of ``key`` is where its number sorts in: ``bisect``)."""
        return list(self._by_key.get(key, ()))

    def position(self, waiter: Any, key: Key) -> int:
        """How many waiters of ``key`` arrived before ``waiter`` (0: it is the oldest)."""
        return bisect.bisect_left(self.arrivals(key), waiter.seq)

    def parked_count(self, session_id: str) -> int:
        """How many transactions of a session are parked."""
        return len(self._by_session.get(session_id, ()))

    def statistics(self) -> WaitStatistics:
        """Counts and the wait-time histogram."""
        labels = [f"{b:g}" for b in _BUCKETS] + ["+inf"]
        return WaitStatistics(
            waiters=len(self._by_token),
            parked_total=self._parked_total,
            granted_total=self._granted_total,
            timed_out_total=self._timed_out_total,
            cancelled_total=self._cancelled_total,
            reevaluations_total=self._reevaluations,
            wait_time_histogram=dict(zip(labels, self._histogram, strict=True)),
        )

    # --- internals ----------------------------------------------------------------------------

    def _remove(self, w: _Waiter) -> None:
        del self._by_token[w.token]
        self._arrivals.remove(w)
        ns = w.tx.namespace
        parked = self.by_namespace[ns] - 1
        if parked:
            self.by_namespace[ns] = parked
        else:
            del self.by_namespace[ns]
        self._deadlines.discard(w, w.deadline)
        self.engine.release_bytes(w.cost)
        ops = w.ops
        by_key = self._ops_by_key
        for key in w.keys:
            left = by_key[key] - ops
            if left:
                by_key[key] = left
            else:
                del by_key[key]
        sid = w.session.session_id
        left = self._ops_by_session[sid] - ops
        if left:
            self._ops_by_session[sid] = left
        else:
            del self._ops_by_session[sid]
        left = self._ops_by_principal[w.principal] - ops
        if left:
            self._ops_by_principal[w.principal] = left
        else:
            del self._ops_by_principal[w.principal]
        for key in w.watches:
            if self._watched[key] == 1:
                del self._watched[key]
            else:
                self._watched[key] -= 1
        if w.sets:
            # One fewer pending setter: waiters that gave way to it (``Waiting``) or counted
            # it (``ArrivedBelow``) must be looked at again, so for them this counts as a
            # change of those variables.
            engine = self.engine
            sid = w.session.session_id
            for key in w.sets:
                engine.remove_pending_setter(key, sid)
                if key in self._watched:
                    engine.note_change(key)
        for key in w.keys:
            waiting = self._by_key[key]
            del waiting[w.seq]
            if not waiting:
                del self._by_key[key]
        sid = w.session.session_id
        group = self._by_session[sid]
        del group[w.seq]
        if not group:
            del self._by_session[sid]
        group = self._by_owner[w.owner]
        del group[w.seq]
        if not group:
            del self._by_owner[w.owner]

    def _observe(self, seconds: float) -> None:
        for i, bound in enumerate(_BUCKETS):
            if seconds <= bound:
                self._histogram[i] += 1
                return
        self._histogram[-1] += 1


def _too_heavy(what: str, parked: int, ops: int, limit: int, setting: str) -> EngineError:
    return EngineError(
        ErrorCode.TOO_MANY_WAITERS,
        f"{what} has parked transactions weighing {parked}; this one weighs {ops} (its ops "
        f"plus {RUN_WEIGHT}), past the limit ({setting}={limit}): every change would "
        "re-evaluate them all",
    )


def _session_gone(last: TransactionResult) -> TransactionResult:
    return attrs.evolve(last, cause=Cause.SESSION_EXPIRED, failed_statement=None, valid_until=None)
