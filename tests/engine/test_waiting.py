"""The wait queue's own unit tests (lockserver.engine._waiting), driven directly with explicit
``now``: what a transaction depends on, what waking costs (evaluations per change), change
tracking, the queue's cancel API and token check, WaitLimits validation and the statistics
histogram. Waiting as users see it (waking, order, no barging, deadlines, cancel,
disconnect, session end, limits) is tested once, through the door, in
tests/core/test_core_waiting.py."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from lockserver.engine import (
    EngineError,
    WaitLimits,
    WaitQueue,
    WaitStatistics,
    dependencies,
)
from protocol import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    Assert,
    Block,
    DeleteVar,
    ErrorCode,
    Exists,
    If,
    Not,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Statement,
    Transaction,
    TransactionResult,
    Xor,
)

from ._helpers import NS, START, make_engine

LOCK = Assert(SetVar("locks", "printer", "ticket"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))
KEY = (NS, "locks", "printer")


def tx(*statements: Statement) -> Transaction:
    return Transaction(NS, statements)


class Harness:
    """A wait queue over a fresh engine; ``call`` submits one request and returns the
    answers as (token, payload) pairs, after checking none is answered twice."""

    def __init__(self, wait_limits: WaitLimits | None = None) -> None:
        self.engine = make_engine()
        self.queue = WaitQueue(self.engine, wait_limits)

    def call(
        self,
        token: Hashable,
        session: str | SessionSpec,
        *statements: Statement,
        now: float = START,
        wait: float | None = None,
        owner: Hashable = "conn",
    ) -> list[tuple[Hashable, TransactionResult | EngineError]]:
        spec = session if isinstance(session, SessionSpec) else SessionSpec(session)
        answers = self.queue.submit(
            owner, token, spec, tx(*statements), now=now, trust=1.0, wait=wait
        )
        tokens = [t for t, _ in answers]
        assert len(tokens) == len(set(tokens)), "a request was answered twice"
        return answers


# --- dependencies -------------------------------------------------------------------------------


def test_dependencies_cover_every_keyed_node_in_every_branch() -> None:
    """Exists, SetVar, DeleteVar and SelectVarValue anywhere in the tree (nested operators,
    Block, both If branches) are dependencies; constants and selects of constants are not.
    (CountBelow and Waiting: tests/engine/test_extension_ops.py.)"""
    t = Transaction(
        "N",
        [
            Assert(Not(Exists("T", "a"))),
            If(
                Or(SetVar("T", "b"), Xor(TRUE, DeleteVar("U", "c"))),
                Block(SelectVarValue("x", "T", "d"), Abort()),
                Block(SelectOperatorValue("y", And(FALSE, Exists("V", "e")))),
            ),
            AnywayContinueAfter(DeleteVar("T", "f")),
            SelectConstantValue("z", 1),
        ],
    )
    assert dependencies(t) == {
        ("N", "T", "a"),
        ("N", "T", "b"),
        ("N", "U", "c"),
        ("N", "T", "d"),
        ("N", "V", "e"),
        ("N", "T", "f"),
    }
    assert dependencies(Transaction("N", [])) == frozenset()


# --- what waking costs ------------------------------------------------------------------------


def test_a_release_reevaluates_only_the_waiters_of_the_released_variable() -> None:
    """2,000 waiters on 2,000 different variables: each release re-runs one waiter (the one
    of its variable), not all of them (counts, not time)."""
    h = Harness()
    n = 2_000
    lock = [Assert(SetVar("locks", f"k{i}", "t")) for i in range(n)]
    for i in range(n):
        h.call(("h", i), "holder", lock[i])
    for i in range(n):
        h.call(("w", i), f"w{i}", lock[i], wait=100)
    before = h.queue.statistics().reevaluations_total
    for i in range(0, n, 200):
        h.call(("r", i), "holder", AnywayContinueAfter(DeleteVar("locks", f"k{i}")), now=START + 1)
    stats = h.queue.statistics()
    assert stats.reevaluations_total - before == n // 200
    assert stats.granted_total == n // 200


def test_a_pass_looks_only_at_sessions_that_ended_not_at_every_session_with_a_waiter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With 2,000 waiters in 2,000 sessions, an unrelated call asks the engine about no
    session of theirs (it asked about every one of them, on every pass: ~1 ms per request
    with 1,000 parked); when one of those sessions ends, only its waiter is answered."""
    h = Harness()
    n = 2_000
    h.call("hold", "holder", LOCK)
    for i in range(n):
        h.call(("w", i), f"w{i}", LOCK, wait=100)
    asked: list[object] = []
    contains = type(h.engine.sessions).__contains__

    def counting(self: Any, key: object) -> bool:
        asked.append(key)
        return contains(self, key)

    monkeypatch.setattr(type(h.engine.sessions), "__contains__", counting)
    h.call("other", "other", Assert(SetVar("locks", "elsewhere", "t")), now=START + 1)
    assert not [k for k in asked if str(k).startswith("w")]
    assert h.engine.end_session("w7", now=START + 2)
    answers = h.queue.process(now=START + 2, trust=1.0)
    assert [token for token, _ in answers] == [("w", 7)]
    assert len(h.queue) == n - 1


@pytest.mark.pure_only("counts the queue's sweeps by patching Engine.sweep")
def test_a_change_of_what_no_waiter_reads_runs_no_pass() -> None:
    """While a waiter is parked, transactions on other variables run no pass of the queue (no
    sweep, no re-run): a pass is for a change of what a waiter reads, an ended session, an
    expiry or a deadline. A release of the waiter's variable still grants it at once."""
    h = Harness()
    h.call("hold", "holder", LOCK)
    h.call("wait", "waiter", LOCK, wait=100)
    sweeps: list[float] = []
    sweep = h.engine.sweep

    def counting(now: float) -> int:
        sweeps.append(now)
        return sweep(now)

    h.engine.sweep = counting  # type: ignore[method-assign]
    for i in range(10):
        assert h.call(("o", i), "other", Assert(SetVar("locks", f"elsewhere{i}", "t")))
    assert sweeps == []
    assert h.queue.statistics().reevaluations_total == 0
    answers = h.call("release", "holder", UNLOCK, now=START + 1)
    assert [token for token, _ in answers] == ["release", "wait"]
    assert sweeps  # the release ran a pass


def test_a_cascade_costs_one_evaluation_per_waiter_per_release() -> None:
    """With 20 waiters on one mutex a release costs 20 evaluations (each sees the release
    and the grant together), not 40."""
    h = Harness()
    h.call(0, "s0", LOCK)
    for i in range(1, 21):
        h.call(i, f"s{i}", LOCK, wait=100)
    before = h.queue.statistics().reevaluations_total
    h.call(100, "s0", UNLOCK, now=START + 1)
    assert h.queue.statistics().reevaluations_total - before == 20


# --- change tracking ----------------------------------------------------------------------------


def test_the_engine_tracks_changes_only_while_something_waits() -> None:
    """Changes are collected from the first park until the queue is empty again at the end
    of a pass (grant, deadline); nothing is collected while nobody waits."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=None)
    assert not h.engine.track_changes
    h.call(3, "b", LOCK, wait=30)
    assert h.engine.track_changes
    h.call(4, "a", UNLOCK, now=START + 1)  # grants 3
    assert not h.engine.track_changes
    h.call(5, "c", LOCK, wait=5, now=START + 1)
    assert h.engine.track_changes
    assert [t for t, _ in h.queue.process(now=START + 6, trust=1.0)] == [5]
    assert not h.engine.track_changes


def test_process_with_no_waiters_stops_tracking() -> None:
    """With no waiter, process answers nothing, drops collected changes and stops tracking."""
    h = Harness()
    h.engine.watch_changes()
    h.call(1, "a", LOCK)
    assert h.queue.process(now=START, trust=1.0) == []
    assert not h.engine.track_changes
    assert h.engine.drain_changes() == set()


# --- the cancel API and tokens ------------------------------------------------------------------


def test_cancel_and_cancel_owner_report_what_they_dropped() -> None:
    """cancel returns the parked request's last failure, None when it is not parked;
    cancel_owner returns how many of the owner's waiters it dropped (0 for none) and leaves
    other owners' waiters; both count in cancelled_total."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60, owner="c1")
    h.call(3, "c", LOCK, wait=60, owner="c1")
    h.call(4, "d", LOCK, wait=60, owner="c2")
    h.call(5, "e", LOCK, wait=60, owner="c2")
    last = h.queue.cancel(5)
    assert isinstance(last, TransactionResult) and last.failed_statement == "0:/AssertOp/"
    assert h.queue.cancel(5) is None
    assert h.queue.cancel("never") is None
    assert h.queue.cancel_owner("c1") == 2
    assert h.queue.cancel_owner("c1") == 0
    assert h.queue.cancel_owner("nobody") == 0
    assert list(h.queue.waiting_on(KEY)) == [4]
    assert h.queue.statistics().cancelled_total == 3


def test_a_token_already_waiting_is_refused() -> None:
    """A second waiting request with the token of a parked one is answered, alone, with
    DUPLICATE_REQUEST_ID: it did not run and the parked one is untouched."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    ((token, err),) = h.call(2, "c", LOCK, wait=60)
    assert token == 2
    assert isinstance(err, EngineError) and err.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert list(h.queue.waiting_on(KEY)) == [2]
    assert "c" not in h.engine.sessions


# --- limits and statistics ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "max_waiters",
        "max_waiters_per_session",
        "max_waiters_per_owner",
        "max_waiting_ops_per_variable",
        "max_waiting_ops_per_session",
        "max_waiting_ops_per_principal",
    ],
)
@pytest.mark.parametrize("bad", [0, -1, 1.5, "3"])
def test_wait_limits_must_be_positive_integers(field: str, bad: Any) -> None:
    """WaitLimits refuses bounds that are not integers >= 1, naming the field."""
    with pytest.raises(ValueError, match=field):
        WaitLimits(**{field: bad})


def test_statistics_histogram_buckets() -> None:
    """Finished waits (granted or timed out) are counted in wait-time buckets by how long
    they waited (upper bounds 0.001 ... 60 s, then "+inf"), as a frozen record that also
    reads as a plain map."""
    h = Harness()
    long = {f"s{i}": SessionSpec(f"s{i}", max_age=1e6) for i in range(8)}
    h.call(0, long["s0"], LOCK)
    waits = {1: 0.0005, 2: 0.005, 3: 0.05, 4: 0.5, 5: 5.0, 6: 50.0, 7: 500.0}
    for token in waits:
        h.call(token, long[f"s{token}"], LOCK, wait=1000)
    holder = "s0"
    for token, waited in waits.items():
        h.call(f"rel{token}", long[holder], UNLOCK, now=START + waited)
        holder = f"s{token}"
    stats = h.queue.statistics()
    assert stats == WaitStatistics(
        waiters=0,
        parked_total=7,
        granted_total=7,
        timed_out_total=0,
        cancelled_total=0,
        # each release re-runs every remaining waiter of the key once: 7 + 6 + ... + 1
        reevaluations_total=28,
        wait_time_histogram={
            "0.001": 1,
            "0.01": 1,
            "0.1": 1,
            "1": 1,
            "10": 1,
            "60": 1,
            "+inf": 1,
        },
    )
    assert stats.to_wire()["granted_total"] == 7
    assert stats.to_wire()["wait_time_histogram"]["+inf"] == 1
