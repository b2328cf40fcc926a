"""Stateful property test: the engine against a small, obviously-correct model.

The model keeps plain dicts and lists (no heaps, no undo, no per-session key index): a
transaction runs on a copy of the model's tables and the copy replaces them only when the
transaction succeeds. Expiry is found by scanning every session and entry, processed in time
order (a session before an entry at the same instant). Hypothesis drives random sessions,
random small transaction trees over a few tables / variables / values (every op, including TTLs,
duplicates, value filters and nested Block / If / And / Or / Xor / Not), session ends, sweeps
and time jumps past max ages and TTLs, with tight limits so that limit errors happen too.

After every step the engine's stored entries, sessions, counts and events must equal the
model's; every result (status, cause, failed path, data, fence, valid-until) must be equal too,
compared strictly (1, 1.0 and True are different values).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from lockserver.engine import Engine, EngineError, EngineLimits
from lockserver.engine._store import entry_cost
from protocol import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    Block,
    Cause,
    DeleteVar,
    ErrorCode,
    Exists,
    FalseOp,
    If,
    LostReason,
    Not,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TransactionResult,
    TrueOp,
    Xor,
)

from ._helpers import session_keys, slot_entries

START = 100.0
HOST = "model-host"
EPOCH = 1_000
LIMITS = EngineLimits(max_sessions=3, max_entries=6, max_entries_per_session=3)

SESSION_IDS = ["s1", "s2", "s3", "s1", "s2", "s3", "s4"]  # s4 rarely: max_sessions is 3
NAMESPACES = ["N", "M"]
TABLES = ["T", "U"]
VARS = ["k", "j"]
VALUES: list[Any] = [None, 1, 1.0, True, "x", [1], [1.0]]
NAMES = ["a", "b"]
TTLS = [None, None, 1.0, 2.5, 7.0]
MAX_AGES = [3.0, 10.0, 60.0]
STEPS = [0.0, 0.5, 1.0, 2.5, 3.0, 7.0, 10.0, 61.0]

Key = tuple[str, str, str]  # (namespace, table, var)
# (owner, value, description, tx_id, set_at, expires_at, fence): the engine's entry layout.
Entry = tuple[str, Any, str | None, str, float, float | None, int]

# --- strategies ---------------------------------------------------------------------------------

values = st.sampled_from(VALUES)
# Weighted towards one table and one variable so that changes often meet on the same entries.
tables = st.sampled_from([TABLES[0], TABLES[0], TABLES[0], TABLES[1]])
variables = st.sampled_from([VARS[0], VARS[0], VARS[0], VARS[1]])
names = st.sampled_from(NAMES)

exists = st.builds(Exists, tables, variables, values, ignore_this_session=st.booleans())
setvar = st.builds(
    SetVar,
    tables,
    variables,
    values,
    description=st.sampled_from([None, "why"]),
    ttl=st.sampled_from(TTLS),
    allow_duplicates=st.booleans(),
)
deletevar = st.builds(DeleteVar, tables, variables, values)
arrived = st.builds(ArrivedBelow, tables, variables, st.integers(0, 3))
changes = st.one_of(setvar, deletevar)
operators = st.recursive(
    st.one_of(st.sampled_from([TRUE, FALSE]), exists, setvar, deletevar, arrived),
    lambda inner: st.one_of(
        st.builds(And, inner, inner),
        st.builds(Or, inner, inner),
        st.builds(Xor, inner, inner),
        st.builds(Not, inner),
    ),
    max_leaves=4,
)
simple_statements = st.one_of(
    st.builds(Assert, operators),
    st.builds(Assert, operators),
    st.builds(AnywayContinueAfter, changes, reset_abort=st.booleans()),
    st.builds(AnywayContinueAfter, changes),
    st.builds(SelectConstantValue, names, values),
    st.builds(SelectOperatorValue, names, operators),
    st.builds(
        SelectVarValue,
        names,
        tables,
        variables,
        ignore_this_session=st.booleans(),
        abort_if_not_found=st.booleans(),
        select_many=st.booleans(),
    ),
    st.just(Abort()),
)
statements = st.recursive(
    simple_statements,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda items: Block(*items)),
        st.builds(If, operators, inner, st.none() | inner),
    ),
    max_leaves=4,
)
transactions = st.builds(
    Transaction,
    st.sampled_from(NAMESPACES),
    st.lists(statements, max_size=4),
    # Ids are left empty: a repeated id is an idempotent retry (tests/faults cover it), which
    # this model does not describe.
    transaction_id=st.just(""),
    min_uptime=st.sampled_from([0.0, 0.0, 0.0, 5.0]),
    min_trust=st.sampled_from([0.0, 0.0, 0.0, 0.5]),
)

# --- the model ----------------------------------------------------------------------------------

PATH_NAMES = {
    Assert: "AssertOp",
    Abort: "AbortOp",
    Block: "BlockOp",
    If: "IfOp",
    AnywayContinueAfter: "AnywayContinueAfterOp",
    SelectConstantValue: "SelectConstantValueOp",
    SelectOperatorValue: "SelectOperatorValueOp",
    SelectVarValue: "SelectVarValueOp",
}


def same(a: Any, b: Any) -> bool:
    """Strict wire-value equality: same type, and containers equal element by element."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def typed(x: Any) -> Any:
    """A comparable form that keeps types apart (so 1, 1.0 and True never compare equal)."""
    if isinstance(x, dict):
        return ("dict", tuple(sorted((k, typed(v)) for k, v in x.items())))
    if isinstance(x, list | tuple):
        return (type(x).__name__, tuple(typed(i) for i in x))
    return (type(x).__name__, x)


class Aborted(Exception):
    """A statement aborted; ``path`` is the node names from the top down."""

    def __init__(self, path: list[str]) -> None:
        self.path = path


class Refused(Exception):
    """The model's limit refusal (the engine raises EngineError with this code)."""

    def __init__(self, code: ErrorCode) -> None:
        self.code = code


@attrs.define
class MSession:
    max_age: float
    description: str
    last_touch: float


@attrs.define
class Model:
    """The reference: sessions, tables as {(ns, table, var): [entries]}, counters, events."""

    sessions: dict[str, MSession] = attrs.Factory(dict)
    data: dict[Key, list[Entry]] = attrs.Factory(dict)
    fence: int = EPOCH
    outcomes: dict[str, int] = attrs.Factory(dict)
    sessions_expired: int = 0
    entries_expired: int = 0
    events: list[tuple[str, LostReason, tuple[tuple[str, str, str, int], ...]]] = attrs.Factory(
        list
    )

    def owned(self, sid: str) -> list[tuple[Key, Entry]]:
        """Every entry ``sid`` owns, found by a full scan."""
        return [(key, e) for key, es in self.data.items() for e in es if e[0] == sid]

    def remove_session(self, sid: str, reason: LostReason | None) -> int:
        lost = self.owned(sid)
        for key, e in lost:
            self.data[key].remove(e)
            if not self.data[key]:
                del self.data[key]
        del self.sessions[sid]
        if reason is not None:
            self.events.append((sid, reason, tuple(sorted((*k, e[6]) for k, e in lost))))
        return len(lost)

    def expire(self, now: float) -> int:
        """Remove everything due by ``now``, in time order; return the entries removed."""
        due: list[tuple[float, int, Any]] = [
            (s.last_touch + s.max_age, 0, sid)
            for sid, s in self.sessions.items()
            if s.last_touch + s.max_age <= now
        ]
        due += [
            (e[5], 1, (key, e))
            for key, es in self.data.items()
            for e in es
            if e[5] is not None and e[5] <= now
        ]
        removed = 0
        for _, kind, what in sorted(due, key=lambda d: (d[0], d[1])):
            if kind == 0:
                removed += self.remove_session(what, LostReason.EXPIRED)
                self.sessions_expired += 1
            else:
                key, e = what
                if e in self.data.get(key, []):
                    self.data[key].remove(e)
                    if not self.data[key]:
                        del self.data[key]
                    removed += 1
                    self.entries_expired += 1
                    self.events.append((e[0], LostReason.TTL, ((*key, e[6]),)))
        return removed

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def execute(
        self, spec: SessionSpec, tx: Transaction, now: float, trust: float
    ) -> TransactionResult:
        """The model's execute; raises Refused for a limit (changing nothing)."""
        self.expire(now)
        uptime = now - START
        if uptime < tx.min_uptime or trust < tx.min_trust:
            self.count("TransactionError:MinimumRequirements")
            return TransactionResult(
                Status.TRANSACTION_ERROR,
                Cause.MINIMUM_REQUIREMENTS,
                tx.transaction_id,
                HOST,
                uptime,
                trust,
                None,
                (),
                self.fence,
                None,
            )
        sid = spec.session_id
        session = self.sessions.get(sid)
        if session is None:
            if len(self.sessions) >= LIMITS.max_sessions:
                raise Refused(ErrorCode.TOO_MANY_SESSIONS)
            session = MSession(spec.max_age, spec.description, now)
        run = Run(self, sid, tx, now)
        path = run.statements()  # may raise Refused: nothing of this call is kept
        session.last_touch = now
        self.sessions[sid] = session
        valid_until = now + session.max_age - START
        if path is None:
            self.count("TransactionOK")
            self.data = run.data
            if run.changed:
                self.fence += 1
            status, cause = Status.TRANSACTION_OK, Cause.UNSPECIFIED
        else:
            self.count("TransactionError:Statement")
            status, cause = Status.TRANSACTION_ERROR, Cause.STATEMENT
        return TransactionResult(
            status,
            cause,
            tx.transaction_id,
            HOST,
            uptime,
            trust,
            path,
            tuple(run.out),
            self.fence,
            valid_until,
        )


class Run:
    """One transaction evaluated naively on a private copy of the model's tables."""

    def __init__(self, model: Model, sid: str, tx: Transaction, now: float) -> None:
        self.model = model
        self.sid = sid
        self.tx = tx
        self.now = now
        self.ns = tx.namespace
        self.data = {key: list(es) for key, es in model.data.items()}
        self.out: list[tuple[str, Any]] = []
        self.changed = False

    def statements(self) -> str | None:
        for i, node in enumerate(self.tx.statements):
            try:
                self.statement(node, [])
            except Aborted as a:
                return f"{i}:/" + "".join(name + "/" for name in a.path)
        return None

    def visible(self, table: str, var: str, ignore_own: bool) -> list[Entry]:
        return [
            e
            for e in self.data.get((self.ns, table, var), [])
            if not (ignore_own and e[0] == self.sid)
        ]

    def record(self, e: Entry) -> dict[str, Any]:
        return {
            "session": e[0],
            "value": e[1],
            "description": e[2],
            "tx_id": e[3],
            "set_at": e[4] - START,
            "expires_at": None if e[5] is None else e[5] - START,
            "fence": e[6],
        }

    def statement(self, node: Any, path: list[str]) -> None:
        here = [*path, PATH_NAMES[type(node)]]
        t = type(node)
        if t is Assert:
            if not self.op(node.condition):
                raise Aborted(here)
        elif t is Abort:
            raise Aborted(here)
        elif t is Block:
            for child in node.statements:
                self.statement(child, here)
        elif t is If:
            if self.op(node.condition):
                self.statement(node.then, here)
            elif node.else_ is not None:
                self.statement(node.else_, here)
        elif t is AnywayContinueAfter:
            self.op(node.change)
        elif t is SelectConstantValue:
            self.out.append((node.into, node.value))
        elif t is SelectOperatorValue:
            self.out.append((node.into, self.op(node.operator)))
        else:
            assert t is SelectVarValue
            found = self.visible(node.table, node.var, node.ignore_this_session)
            if not found and node.abort_if_not_found:
                raise Aborted(here)
            if not found:
                self.out.append((node.into, None))
            elif node.select_many:
                self.out.append((node.into, [self.record(e) for e in found]))
            else:
                self.out.append((node.into, self.record(found[0])))

    def op(self, node: Any) -> bool:
        t = type(node)
        if t is TrueOp:
            return True
        if t is FalseOp:
            return False
        if t is Not:
            return not self.op(node.operand)
        if t in (And, Or, Xor):
            left = self.op(node.left)  # both sides, left first: no short-circuit
            right = self.op(node.right)
            if t is And:
                return left and right
            if t is Or:
                return left or right
            return left != right
        if t is Exists:
            return any(
                node.value is None or same(e[1], node.value)
                for e in self.visible(node.table, node.var, node.ignore_this_session)
            )
        if t is ArrivedBelow:  # no wait queue here: the sessions holding an entry
            return len({e[0] for e in self.visible(node.table, node.var, False)}) < node.limit
        if t is SetVar:
            return self.setvar(node)
        assert t is DeleteVar
        return self.deletevar(node)

    def setvar(self, node: SetVar) -> bool:
        key = (self.ns, node.table, node.var)
        entries = self.data.get(key, [])
        if entries and not node.allow_duplicates:
            return False
        expires = None if node.ttl is None else self.now + node.ttl
        fence = self.model.fence + 1
        new = (
            self.sid,
            node.value,
            node.description,
            self.tx.transaction_id,
            self.now,
            expires,
            fence,
        )
        for i, e in enumerate(entries):
            if e[0] == self.sid:
                entries[i] = new
                self.changed = True
                return True
        mine = sum(1 for es in self.data.values() for e in es if e[0] == self.sid)
        if mine >= LIMITS.max_entries_per_session:
            raise Refused(ErrorCode.TOO_MANY_ENTRIES)
        if sum(len(es) for es in self.data.values()) >= LIMITS.max_entries:
            raise Refused(ErrorCode.TOO_MANY_ENTRIES)
        self.data[key] = [*entries, new]
        self.changed = True
        return True

    def deletevar(self, node: DeleteVar) -> bool:
        key = (self.ns, node.table, node.var)
        entries = self.data.get(key, [])
        for i, e in enumerate(entries):
            if e[0] == self.sid:
                if node.value is not None and not same(e[1], node.value):
                    return False
                self.data[key] = entries[:i] + entries[i + 1 :]
                if not self.data[key]:
                    del self.data[key]
                self.changed = True
                return True
        return False


# --- the state machine --------------------------------------------------------------------------


def engine_dump(engine: Engine) -> dict[Key, list[Entry]]:
    return {
        (ns, table, var): slot_entries(slot)
        for ns, tbls in engine.namespaces.items()
        for table, vars_ in tbls.items()
        for var, slot in vars_.items()
    }


def events_key(
    events: list[tuple[str, LostReason, tuple[tuple[str, str, str, int], ...]]],
) -> list[Any]:
    return sorted((sid, reason.value, tuple(sorted(entries))) for sid, reason, entries in events)


class EngineVersusModel(RuleBasedStateMachine):
    """Random calls on the engine and the model; every outcome and state must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(started_at=START, host=HOST, fence_epoch=EPOCH, limits=LIMITS)
        self.model = Model()
        self.now = START

    @rule(dt=st.sampled_from(STEPS))
    def advance(self, dt: float) -> None:
        """Time passes (possibly past max ages and TTLs); nobody calls."""
        self.now += dt

    @rule(
        sid=st.sampled_from(SESSION_IDS),
        max_age=st.sampled_from(MAX_AGES),
        description=st.sampled_from(["", "desc"]),
        tx=transactions,
        trust=st.sampled_from([1.0, 1.0, 0.5, 0.3]),
    )
    def execute(
        self, sid: str, max_age: float, description: str, tx: Transaction, trust: float
    ) -> None:
        """A random transaction: same result, or the same limit refusal, from both."""
        self.check(SessionSpec(sid, max_age=max_age, description=description), tx, trust)

    @rule(
        sid=st.sampled_from(SESSION_IDS),
        max_age=st.sampled_from(MAX_AGES),
        ns=st.sampled_from(NAMESPACES),
        lock=setvar,
    )
    def acquire(self, sid: str, max_age: float, ns: str, lock: SetVar) -> None:
        """A typical lock acquire (nobody else holds it, then SetVar), which often succeeds."""
        tx = Transaction(ns, [Assert(Not(Exists(lock.table, lock.var))), Assert(lock)])
        self.check(SessionSpec(sid, max_age=max_age), tx, 1.0)

    @rule(
        sid=st.sampled_from(SESSION_IDS),
        ns=st.sampled_from(NAMESPACES),
        first=setvar,
        ttl=st.sampled_from(TTLS),
        value=values,
    )
    def renew(self, sid: str, ns: str, first: SetVar, ttl: float | None, value: Any) -> None:
        """A lease set and renewed in one transaction (a second SetVar of the same variable
        with allow_duplicates and another TTL): both share the commit fence."""
        second = SetVar(first.table, first.var, value, ttl=ttl, allow_duplicates=True)
        tx = Transaction(ns, [AnywayContinueAfter(first), Assert(second)])
        self.check(SessionSpec(sid, max_age=10.0), tx, 1.0)

    @rule(sid=st.sampled_from(SESSION_IDS), ns=st.sampled_from(NAMESPACES), unlock=deletevar)
    def release(self, sid: str, ns: str, unlock: DeleteVar) -> None:
        """A typical release (AnywayContinueAfter(DeleteVar)), value-filtered or not."""
        self.check(SessionSpec(sid), Transaction(ns, [AnywayContinueAfter(unlock)]), 1.0)

    def check(self, spec: SessionSpec, tx: Transaction, trust: float) -> None:
        """Run ``tx`` on both and compare the outcomes strictly."""
        try:
            expected: TransactionResult | ErrorCode = self.model.execute(spec, tx, self.now, trust)
        except Refused as refused:
            expected = refused.code
        try:
            got: TransactionResult | ErrorCode = self.engine.execute(
                spec, tx, now=self.now, trust=trust
            )
        except EngineError as error:
            got = error.code
        if isinstance(expected, ErrorCode) or isinstance(got, ErrorCode):
            assert got == expected
            return
        assert isinstance(got, TransactionResult)
        assert (got.status, got.cause, got.failed_statement) == (
            expected.status,
            expected.cause,
            expected.failed_statement,
        )
        assert typed(got.data) == typed(expected.data)
        assert (got.transaction_id, got.host, got.uptime, got.trust) == (
            expected.transaction_id,
            expected.host,
            expected.uptime,
            expected.trust,
        )
        assert (got.fence, got.valid_until) == (expected.fence, expected.valid_until)

    @rule(sid=st.sampled_from(SESSION_IDS), notify=st.booleans())
    def end_session(self, sid: str, notify: bool) -> None:
        """Ending a session: same answer, same entries removed."""
        self.model.expire(self.now)
        existed = sid in self.model.sessions
        if existed:
            self.model.remove_session(sid, LostReason.ENDED if notify else None)
        assert self.engine.end_session(sid, now=self.now, notify=notify) is existed

    @rule()
    def sweep(self) -> None:
        """A sweep removes the same number of entries."""
        assert self.engine.sweep(self.now) == self.model.expire(self.now)

    @rule()
    def statistics(self) -> None:
        """The statistics agree with counts taken from the model."""
        self.model.expire(self.now)
        stats = self.engine.statistics(self.now)
        data = self.model.data
        assert stats.uptime == self.now - START
        assert stats.namespaces == len({ns for ns, _, _ in data})
        assert stats.tables == len({(ns, t) for ns, t, _ in data})
        assert stats.entries == sum(len(es) for es in data.values())
        assert stats.sessions == len(self.model.sessions)
        assert stats.fence == self.model.fence
        assert stats.by_outcome == self.model.outcomes
        assert stats.transactions == sum(self.model.outcomes.values())
        assert stats.sessions_expired == self.model.sessions_expired
        assert stats.entries_expired == self.model.entries_expired

    @invariant()
    def same_tables(self) -> None:
        """The engine stores exactly the model's entries, in the same order, and keeps no
        empty containers."""
        assert typed(engine_dump(self.engine)) == typed(self.model.data)
        namespaces = self.engine.namespaces
        assert len(namespaces) == sum(1 for _ in namespaces)  # a sharded form's count is right
        for tbls in namespaces.values():
            assert tbls
            assert len(tbls) == sum(1 for _ in tbls)
            for vars_ in tbls.values():
                assert vars_
                assert all(vars_.values())
                assert len(vars_) == sum(1 for _ in vars_)  # a sharded table's count is right

    @invariant()
    def same_sessions_and_counts(self) -> None:
        """Same sessions (spec kept from first use, last touch), each session's key index is
        what it owns, and entry_count is the sum of held entries."""
        engine, model = self.engine, self.model
        assert set(engine.sessions) == set(model.sessions)
        assert len(engine.sessions) == len(model.sessions)
        for sid, s in engine.sessions.items():
            m = model.sessions[sid]
            assert (s.max_age, s.description, s.last_touch) == (
                m.max_age,
                m.description,
                m.last_touch,
            )
            assert session_keys(engine, sid) == {key for key, _ in model.owned(sid)}
        held = sum(len(es) for es in model.data.values())
        assert engine.entry_count == held
        assert engine.entry_count == sum(s.held for s in engine.sessions.values())
        assert engine.fence == model.fence

    @invariant()
    def bookkeeping_matches_contents(self) -> None:
        """The counts the engine keeps incrementally are what its contents say: the store
        budget's count (entries, sessions, remembered data), the table count, and the
        deadline queues hold no far item of an entry or session that is gone (issue 14:
        memory is freed on release and end, not at the deadline the client chose)."""
        engine = self.engine
        stored = 0
        live_ttls = set()
        for ns, tables in engine.namespaces.items():
            for table, vars_ in tables.items():
                for var, slot in vars_.items():
                    for e in slot_entries(slot):
                        stored += entry_cost(table, var, e[1], e[2])
                        if e[5] is not None:
                            live_ttls.add(((ns, table, var, e[0]), e[5], e[6]))
        for sess in engine.sessions.values():
            stored += sess.cost + sess.retry_bytes
        assert engine.stored == stored
        assert engine.table_count == sum(len(t) for t in engine.namespaces.values())
        for bucket in engine._ttls_due.far.values():
            for key, item in bucket.items():
                assert (key, item[0], item[6]) in live_ttls
        live = set(map(id, engine.sessions.values()))
        for bucket in engine._sessions_due.far.values():
            assert all(id(sess) in live for sess in bucket)

    @invariant()
    def same_events(self) -> None:
        """The same LockLost events (who, why, which entries) were queued."""
        got = [(e.session_id, e.reason, e.entries) for e in self.engine.drain_lost()]
        assert events_key(got) == events_key(self.model.events)
        self.model.events.clear()


EngineVersusModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestEngineVersusModel = EngineVersusModel.TestCase


def test_model_agrees_on_the_seed_story() -> None:
    """Sanity check of the model itself on the seed's first three calls."""
    model = Model()
    enter = Transaction(
        "Clinical",
        [
            Assert(Not(Exists("Month-End", "F"))),
            Assert(Not(Exists("MDS-Review", "F", "P"))),
            Assert(SetVar("MDS-Entry", "F", "P", allow_duplicates=True)),
        ],
    )
    review = Transaction(
        "Clinical",
        [
            Assert(Not(Exists("Month-End", "F"))),
            Assert(Not(Exists("MDS-Entry", "F", "P"))),
            Assert(SetVar("MDS-Review", "F", "P")),
        ],
    )
    assert model.execute(SessionSpec("u1"), enter, START, 1.0).ok
    assert model.execute(SessionSpec("u2"), enter, START, 1.0).ok
    result = model.execute(SessionSpec("u3"), review, START, 1.0)
    assert result.failed_statement == "1:/AssertOp/"


@pytest.mark.parametrize("pair", [(1, 1.0), (1, True), ([1], [1.0]), ("x", b"x")])
def test_model_value_equality_is_strict(pair: tuple[Any, Any]) -> None:
    """The model's equality and typed() comparison keep 1, 1.0 and True apart."""
    a, b = pair
    assert not same(a, b)
    assert typed(a) != typed(b)


def test_model_agrees_with_sharded_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same state machine with every table sharded from its second variable on, every
    namespace from its second table on, the namespaces from the second, a session's groups
    from the second, and every sharded container over 4 shards: the big forms (``BigTable``,
    a ``ShardedDict`` of tables or of namespaces, a ``StableMap`` of groups:
    lockserver/engine/_store.py) must behave exactly like the small ones through every way
    entries come and go."""
    from hypothesis.stateful import run_state_machine_as_test

    from lockserver.engine import _eval, _sharded, _store

    monkeypatch.setattr(_eval, "SHARD_AT", 2)  # inlined by the evaluator
    monkeypatch.setattr(_store, "SHARD_AT", 2)  # used by add_var
    monkeypatch.setattr(_sharded, "SHARDS", 4)  # the sessions get 4 shards too
    seen: list[bool] = []
    big_namespaces: list[bool] = []
    many_namespaces: list[bool] = []
    big_sessions: list[bool] = []

    class Sharded(EngineVersusModel):
        @invariant()
        def note_big_tables(self) -> None:
            seen.extend(
                type(t) is _store.BigTable
                for tbls in self.engine.namespaces.values()
                for t in tbls.values()
            )
            big_namespaces.extend(
                type(tbls) is _sharded.ShardedDict for tbls in self.engine.namespaces.values()
            )
            many_namespaces.append(type(self.engine.namespaces) is _sharded.ShardedDict)
            big_sessions.extend(
                type(s.keys) is _sharded.StableMap for s in self.engine.sessions.values()
            )

    run_state_machine_as_test(
        Sharded,
        settings=settings(
            max_examples=150,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    assert any(seen), "no table was ever sharded: the test did not test the sharded form"
    assert any(big_namespaces), "no namespace's tables were ever sharded"
    assert any(many_namespaces), "the namespaces were never sharded"
    assert any(big_sessions), "no session's groups were ever sharded"
