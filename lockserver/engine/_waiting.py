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

Cost: parking O(deps); a change costs O(waiters of the changed variables * their ops); a
deadline O(log waiters). The queue is pure: every method takes ``now``.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Iterator
from typing import Any, cast

import attrs

from protocol import (
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
)

from ._engine import Engine
from ._eval import EngineError

__all__ = ["WaitLimits", "WaitQueue", "WaitStatistics", "dependencies", "keys_of"]

Key = tuple[str, str, str]
_KEYED = (Exists, SetVar, DeleteVar, SelectVarValue, CountBelow, Waiting)
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


def _children(node: Node) -> Iterator[Node]:
    for field in attrs.fields(cast("type[attrs.AttrsInstance]", type(node))):
        value = getattr(node, field.name)
        if isinstance(value, Node):
            yield value
        elif type(value) is tuple:
            yield from (v for v in value if isinstance(v, Node))


def _at_least_one(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be an integer >= 1, got {value!r}")


@attrs.frozen
class WaitLimits:
    """Bounds on parked transactions; past one, the request is refused with TOO_MANY_WAITERS."""

    max_waiters: int = attrs.field(default=100_000, validator=_at_least_one)
    max_waiters_per_session: int = attrs.field(default=1_000, validator=_at_least_one)
    max_waiters_per_owner: int = attrs.field(default=10_000, validator=_at_least_one)


@attrs.frozen
class WaitStatistics:
    """Figures of the wait queue."""

    waiters: int
    parked_total: int
    granted_total: int
    timed_out_total: int
    cancelled_total: int
    reevaluations_total: int
    # upper bound (s) as str ("0.001", ..., "+inf") -> count of finished waits
    wait_time_histogram: dict[str, int]

    def to_wire(self) -> dict[str, Any]:
        """As a plain map for the statistics reply."""
        return attrs.asdict(self)


class _Waiter:
    __slots__ = (
        "deadline",
        "keys",
        "last",
        "owner",
        "parked_at",
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
        token: Hashable,
        session: SessionSpec,
        tx: Transaction,
        keys: frozenset[Key],
        parked_at: float,
        deadline: float,
        last: TransactionResult,
    ) -> None:
        self.seq = seq
        self.owner = owner
        self.token = token
        self.session = session
        self.tx = tx
        self.keys = keys
        self.parked_at = parked_at
        self.deadline = deadline
        self.last = last
        self.seen = 0  # the queue's change version this waiter was last evaluated at
        self.sets = keys_of(tx, SetVar)  # what it would set: visible through ``Waiting``
        self.watches = keys_of(tx, Waiting)  # whose pending setters it looks at


Answer = tuple[Hashable, TransactionResult]


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
        self._by_key: dict[Key, dict[int, _Waiter]] = {}
        self._by_session: dict[str, dict[int, _Waiter]] = {}
        self._by_owner: dict[Hashable, dict[int, _Waiter]] = {}
        self._watched: dict[Key, int] = {}  # variables parked Waiting nodes look at
        self._deadlines: list[tuple[float, int, _Waiter]] = []
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
    ) -> list[Answer]:
        """Execute ``tx`` (parking it when it fails and ``wait`` > 0) and return every answer
        now due, this request's own included unless it was parked. Pending expiries are
        handed to older waiters *before* the newcomer runs, so it cannot barge in.
        Raises EngineError for limits (nothing parked, nothing changed)."""
        waits = wait is not None and wait > 0
        if waits:
            if token in self._by_token:
                raise EngineError(
                    ErrorCode.DUPLICATE_REQUEST_ID, f"request {token!r} is already waiting"
                )
            self._check_limits(owner, session.session_id)
        answers = self.process(now=now, trust=trust) if self._by_token else []
        result = self.engine.execute(session, tx, now=now, trust=trust)
        if (
            not waits
            or result.status is not Status.TRANSACTION_ERROR
            or (result.cause is not Cause.STATEMENT)
        ):
            answers.append((token, result))
            if self._by_token:
                answers.extend(self.process(now=now, trust=trust))
            return answers
        assert wait is not None
        self._seq += 1
        w = _Waiter(self._seq, owner, token, session, tx, dependencies(tx), now, now + wait, result)
        w.seen = self._version
        self._by_token[token] = w
        for key in w.keys:
            self._by_key.setdefault(key, {})[w.seq] = w
        self._by_session.setdefault(session.session_id, {})[w.seq] = w
        self._by_owner.setdefault(owner, {})[w.seq] = w
        sid = session.session_id
        pending = self.engine.pending_sets
        for key in w.sets:
            setters = pending.setdefault(key, {})
            setters[sid] = setters.get(sid, 0) + 1
        for key in w.watches:
            self._watched[key] = self._watched.get(key, 0) + 1
        heapq.heappush(self._deadlines, (w.deadline, w.seq, w))
        self._parked_total += 1
        self.engine.track_changes = True
        return answers

    def _check_limits(self, owner: Hashable, session_id: str) -> None:
        lim = self.limits
        if len(self._by_token) >= lim.max_waiters:
            raise EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"the server has {len(self._by_token)} parked transactions, the limit "
                f"(max_waiters={lim.max_waiters})",
            )
        if len(self._by_session.get(session_id, ())) >= lim.max_waiters_per_session:
            raise EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"session {session_id!r} has {lim.max_waiters_per_session} parked "
                f"transactions, the limit (max_waiters_per_session)",
            )
        if len(self._by_owner.get(owner, ())) >= lim.max_waiters_per_owner:
            raise EngineError(
                ErrorCode.TOO_MANY_WAITERS,
                f"this connection has {lim.max_waiters_per_owner} parked transactions, "
                f"the limit (max_waiters_per_connection)",
            )

    # --- progress -----------------------------------------------------------------------------

    def process(self, *, now: float, trust: float) -> list[Answer]:
        """Answer what is due at ``now``: waiters whose variables changed and can now run
        (in arrival order, cascading), waiters of ended sessions, and expired deadlines."""
        answers: list[Answer] = []
        engine = self.engine
        if not self._by_token:
            engine.drain_changes()
            engine.track_changes = False
            return answers
        engine.sweep(now)
        self._drop_dead_sessions(now, answers)
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _, _, w = heapq.heappop(heap)
            if w.token in self._by_token:
                self._remove(w)
                self._timed_out_total += 1
                self._observe(now - w.parked_at)
                answers.append((w.token, attrs.evolve(w.last, uptime=engine.uptime(now))))
        # Versions make a cascade cost one evaluation per waiter per change it has not seen:
        # a waiter evaluated after a grant already saw that grant's change.
        self._version += 1
        stamps = dict.fromkeys(engine.drain_changes(), self._version)
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
                if result.status is Status.TRANSACTION_ERROR and result.cause is Cause.STATEMENT:
                    w.last = result
                    continue
                self._remove(w)
                self._granted_total += 1
                self._observe(now - w.parked_at)
                answers.append((w.token, result))
                changed = engine.drain_changes()
                if changed:
                    self._version += 1
                    for key in changed:
                        stamps[key] = self._version
                    pending |= changed
            self._drop_dead_sessions(now, answers)
        if not self._by_token:
            engine.track_changes = False
        return answers

    def _drop_dead_sessions(self, now: float, answers: list[Answer]) -> None:
        """Waiters whose session no longer exists (ended or expired) are answered with
        cause SessionExpired. Only sessions with waiters are looked at."""
        sessions = self.engine.sessions
        dead = [sid for sid in self._by_session if sid not in sessions]
        for sid in dead:
            for w in list(self._by_session[sid].values()):
                self._remove(w)
                self._cancelled_total += 1
                answers.append((w.token, _session_gone(w.last)))

    def next_deadline(self) -> float | None:
        """The earliest wait deadline, for the shell's timer."""
        heap = self._deadlines
        while heap and heap[0][2].token not in self._by_token:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

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

    def waiting_on(self, key: Key) -> Iterable[Hashable]:
        """Tokens of the waiters of one variable, oldest first (for tests and statistics)."""
        return [w.token for _, w in sorted(self._by_key.get(key, {}).items())]

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
        for key in w.watches:
            if self._watched[key] == 1:
                del self._watched[key]
            else:
                self._watched[key] -= 1
        if w.sets:
            # One fewer pending setter: waiters that gave way to it (``Waiting``) must be
            # looked at again, so for them this counts as a change of those variables.
            engine = self.engine
            pending = engine.pending_sets
            sid = w.session.session_id
            for key in w.sets:
                setters = pending[key]
                if setters[sid] == 1:
                    del setters[sid]
                    if not setters:
                        del pending[key]
                else:
                    setters[sid] -= 1
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


def _session_gone(last: TransactionResult) -> TransactionResult:
    return attrs.evolve(last, cause=Cause.SESSION_EXPIRED, failed_statement=None, valid_until=None)
