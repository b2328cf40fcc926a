"""The wait queue (lockserver.engine._waiting), driven directly with explicit ``now``: parking,
re-runs only on changes of the variables read, arrival order without barging, cascades,
deadlines, cancels, ended sessions, limits and statistics (docs/waiting.md)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest

from lockserver.engine import (
    EngineError,
    EngineLimits,
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
    Cause,
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
    Status,
    Transaction,
    TransactionResult,
    Xor,
)

from ._helpers import NS, START, holders, make_engine

LOCK = Assert(SetVar("locks", "printer", "ticket"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))
KEY = (NS, "locks", "printer")


def tx(*statements: Statement, **fields: Any) -> Transaction:
    return Transaction(NS, statements, **fields)


class Harness:
    """A wait queue over a fresh engine; ``call`` submits and returns {token: result}, or
    raises the EngineError that answers the submitted request itself (a refusal), once it has
    checked that it is the only answer (a refusal decided nothing else)."""

    def __init__(self, wait_limits: WaitLimits | None = None, **engine_kwargs: Any) -> None:
        self.engine = make_engine(**engine_kwargs)
        self.queue = WaitQueue(self.engine, wait_limits)

    def call(
        self,
        token: Hashable,
        session: str | SessionSpec,
        *statements: Statement,
        now: float = START,
        wait: float | None = None,
        owner: Hashable = "conn",
        trust: float = 1.0,
        **fields: Any,
    ) -> dict[Hashable, TransactionResult]:
        spec = session if isinstance(session, SessionSpec) else SessionSpec(session)
        answers = self.queue.submit(
            owner, token, spec, tx(*statements, **fields), now=now, trust=trust, wait=wait
        )
        tokens = [t for t, _ in answers]
        assert len(tokens) == len(set(tokens)), "a request was answered twice"
        got = dict(answers)
        own = got.get(token)
        if isinstance(own, EngineError):
            assert list(got) == [token], "a refusal came with other answers"
            raise own
        return got  # type: ignore[return-value]

    def order(self, answers: list[tuple[Hashable, TransactionResult]]) -> list[Hashable]:
        return [t for t, _ in answers]


# --- dependencies -------------------------------------------------------------------------------


def test_dependencies_cover_every_keyed_node_in_every_branch() -> None:
    """Exists, SetVar, DeleteVar and SelectVarValue anywhere in the tree (nested operators,
    Block, both If branches) are dependencies; constants and selects of constants are not."""
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


# --- submitting -------------------------------------------------------------------------------


def test_without_wait_answers_at_once() -> None:
    """A request without wait (or wait 0) is answered at once, failure or not; nothing parks."""
    h = Harness()
    assert h.call(1, "a", LOCK)[1].ok
    for token, wait in [(2, None), (3, 0.0)]:
        answer = h.call(token, "b", LOCK, wait=wait)
        assert answer[token].failed_statement == "0:/AssertOp/"
    assert len(h.queue) == 0
    assert not h.engine.track_changes


def test_a_failed_waiting_request_parks_and_is_granted_on_release() -> None:
    """A waiting request that fails with a Statement error parks (no answer); the holder's
    release grants it in the same call, answered after the releaser's own answer."""
    h = Harness()
    h.call(1, "a", LOCK)
    assert h.call(2, "b", LOCK, wait=30) == {}
    assert len(h.queue) == 1
    assert h.engine.track_changes
    assert list(h.queue.waiting_on(KEY)) == [2]
    answers = h.queue.submit(
        "conn", 3, SessionSpec("a"), tx(UNLOCK), now=START + 1, trust=1.0, wait=None
    )
    assert h.order(answers) == [3, 2]
    assert answers[1][1].ok
    assert holders(h.engine, "locks", "printer") == [("b", "ticket")]
    assert len(h.queue) == 0
    stats = h.queue.statistics()
    assert (stats.parked_total, stats.granted_total, stats.waiters) == (1, 1, 0)
    assert stats.wait_time_histogram["1"] == 1


def test_a_waiting_request_that_succeeds_is_answered_at_once() -> None:
    """wait only matters on failure: a request that succeeds is answered and not parked."""
    h = Harness()
    assert h.call(1, "a", LOCK, wait=30)[1].ok
    assert len(h.queue) == 0


def test_minimum_requirements_refusal_is_answered_not_parked() -> None:
    """A refused call (MinimumRequirements) is answered at once even with wait."""
    h = Harness()
    h.call(1, "a", LOCK)
    answer = h.call(2, "b", LOCK, wait=30, min_trust=0.9, trust=0.5)
    assert answer[2].cause is Cause.MINIMUM_REQUIREMENTS
    assert len(h.queue) == 0


def test_waiters_are_granted_in_arrival_order_one_at_a_time() -> None:
    """A mutex goes to the oldest waiter; each release grants exactly the next one."""
    h = Harness()
    h.call("h", "s0", LOCK)
    for i in range(1, 5):
        assert h.call(i, f"s{i}", LOCK, wait=60, now=START + i) == {}
    current = "s0"
    for i in range(1, 5):
        answers = h.call(f"rel{i}", current, UNLOCK, now=START + 10 + i)
        assert list(answers) == [f"rel{i}", i]
        assert answers[i].ok
        current = f"s{i}"
    assert len(h.queue) == 0


def test_no_barging_a_newcomer_cannot_take_a_released_lock() -> None:
    """A lock freed by a TTL expiry goes to the parked waiter before a newcomer's transaction
    runs: the newcomer fails (and parks behind) although the lock was free when it arrived."""
    h = Harness()
    h.call(1, SessionSpec("a", max_age=1000), Assert(SetVar("locks", "printer", "t", ttl=5)))
    assert h.call(2, "b", LOCK, wait=60, now=START + 1) == {}
    answers = h.call(3, "c", LOCK, wait=60, now=START + 6)
    assert list(answers) == [2]
    assert answers[2].ok
    assert list(h.queue.waiting_on(KEY)) == [3]


def test_a_blocked_older_waiter_does_not_block_a_younger_one() -> None:
    """A waiter whose condition is still false does not stop a younger waiter of the same
    variable whose condition is now true (readers behind a blocked writer)."""
    h = Harness()
    writer = Assert(Not(Exists("locks", "printer")))
    reader = Assert(Not(Exists("locks", "printer", "writer")))
    h.call(1, "w0", Assert(SetVar("locks", "printer", "writer")))
    h.call(2, "r0", Assert(SetVar("locks", "printer", "reader", allow_duplicates=True)))
    assert h.call(3, "w1", writer, wait=60) == {}
    assert (
        h.call(
            4,
            "r1",
            reader,
            Assert(SetVar("locks", "printer", "reader", allow_duplicates=True)),
            wait=60,
        )
        == {}
    )
    answers = h.call(5, "w0", UNLOCK, now=START + 1)
    assert list(answers) == [5, 4]
    assert list(h.queue.waiting_on(KEY)) == [3]


def test_a_grant_cascades_to_later_waiters() -> None:
    """A grant is a change: waiters of the variables it changed are re-run in the same call
    (here B waits for A's grant, which waits for the release)."""
    h = Harness()
    h.call(1, "x", LOCK)
    assert h.call(2, "a", LOCK, Assert(SetVar("locks", "second", 1)), wait=60) == {}
    assert h.call(3, "b", Assert(Exists("locks", "second")), wait=60) == {}
    answers = h.call(4, "x", UNLOCK, now=START + 1)
    assert list(answers) == [4, 2, 3]
    assert answers[3].ok


def test_waiters_are_rerun_only_when_their_variables_change() -> None:
    """Changes to other variables, and calls that change nothing, do not re-run a waiter."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    h.call(3, "c", Assert(SetVar("locks", "other", 1)))
    h.call(4, "c", Assert(Exists("locks", "printer")))
    assert h.queue.statistics().reevaluations_total == 0
    h.call(5, "a", Assert(SetVar("locks", "printer", "again", allow_duplicates=True)))
    stats = h.queue.statistics()
    assert stats.reevaluations_total == 1
    assert stats.waiters == 1


def test_a_rerun_that_still_fails_keeps_the_latest_failure() -> None:
    """A waiter re-run without success stays parked with its latest failure, which is what its
    deadline answers with."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", Assert(Not(Exists("locks", "printer"))), Assert(FALSE), wait=10)
    h.call(3, "a", UNLOCK, now=START + 1)  # first assert now passes, the second fails
    answers = h.queue.process(now=START + 10, trust=0.8)
    assert [t for t, _ in answers] == [2]
    last = answers[0][1]
    assert last.failed_statement == "1:/AssertOp/"
    assert last.uptime == 10
    assert h.queue.statistics().timed_out_total == 1


# --- deadlines and cancelling -------------------------------------------------------------------


def test_deadline_answers_with_the_last_failure_not_earlier() -> None:
    """Before its deadline a waiter is not answered; at it, it is answered with its last
    failure (uptime of the answer time) and leaves the queue."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=5, now=START + 1)
    assert h.queue.next_deadline() == START + 6
    assert h.queue.process(now=START + 5.5, trust=1.0) == []
    (answer,) = h.queue.process(now=START + 6, trust=1.0)
    assert answer[0] == 2
    assert answer[1].status is Status.TRANSACTION_ERROR
    assert answer[1].failed_statement == "0:/AssertOp/"
    assert answer[1].uptime == 6
    assert h.queue.next_deadline() is None
    assert not h.engine.track_changes


def test_cancel_returns_the_last_failure_once() -> None:
    """cancel removes a parked request and returns its last failure; None when not parked."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    last = h.queue.cancel(2)
    assert last is not None and last.failed_statement == "0:/AssertOp/"
    assert h.queue.cancel(2) is None
    assert h.queue.next_deadline() is None  # the cancelled deadline is skipped
    assert h.queue.statistics().cancelled_total == 1
    assert list(h.call(3, "a", UNLOCK)) == [3]  # nobody left to grant


def test_cancel_owner_drops_its_waiters_silently() -> None:
    """cancel_owner drops every waiter of one owner (connection) and returns how many; other
    owners' waiters stay."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60, owner="c1")
    h.call(3, "c", LOCK, wait=60, owner="c1")
    h.call(4, "d", LOCK, wait=60, owner="c2")
    assert h.queue.cancel_owner("c1") == 2
    assert h.queue.cancel_owner("c1") == 0
    assert h.queue.cancel_owner("nobody") == 0
    assert list(h.queue.waiting_on(KEY)) == [4]
    assert h.queue.statistics().cancelled_total == 2


def test_waiters_of_an_ended_or_expired_session_are_answered_session_expired() -> None:
    """When a waiter's session ends or expires its waiters are answered with cause
    SessionExpired (no failed path, no valid_until)."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, SessionSpec("b", max_age=5), LOCK, wait=60)
    h.call(3, "c", LOCK, wait=60)
    h.engine.end_session("c", now=START + 1)
    answers = dict(h.queue.process(now=START + 1, trust=1.0))
    assert list(answers) == [3]
    assert answers[3].cause is Cause.SESSION_EXPIRED
    assert answers[3].failed_statement is None and answers[3].valid_until is None
    answers = dict(h.queue.process(now=START + 5, trust=1.0))
    assert list(answers) == [2]
    assert answers[2].cause is Cause.SESSION_EXPIRED


# --- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (WaitLimits(max_waiters=2), "max_waiters=2"),
        (WaitLimits(max_waiters_per_session=2), "max_waiters_per_session"),
        (WaitLimits(max_waiters_per_owner=2), "max_waiters_per_connection"),
    ],
)
def test_wait_limits_refuse_with_too_many_waiters(limits: WaitLimits, message: str) -> None:
    """Past a wait limit a waiting request is refused (EngineError TOO_MANY_WAITERS) before it
    runs; nothing is parked or changed."""
    h = Harness(limits)
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    h.call(3, "b", LOCK, wait=60)
    with pytest.raises(EngineError) as info:
        h.call(4, "b", LOCK, wait=60)
    assert info.value.code is ErrorCode.TOO_MANY_WAITERS
    assert message in info.value.message
    assert len(h.queue) == 2
    assert h.call(5, "b", LOCK)[5].failed_statement == "0:/AssertOp/"  # no wait: no limit


def test_a_token_already_waiting_is_refused() -> None:
    """A second waiting request with the token of a parked one: DUPLICATE_REQUEST_ID."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    with pytest.raises(EngineError) as info:
        h.call(2, "c", LOCK, wait=60)
    assert info.value.code is ErrorCode.DUPLICATE_REQUEST_ID
    assert list(h.queue.waiting_on(KEY)) == [2]


def test_engine_limit_on_a_rerun_answers_with_the_last_failure() -> None:
    """When a re-run hits an engine limit the waiter is answered with its last failure and
    removed, and the engine is unchanged."""
    h = Harness(limits=EngineLimits(max_entries=1))
    h.call(1, "a", LOCK)
    h.call(
        2,
        "b",
        Assert(Not(Exists("locks", "printer"))),
        Assert(SetVar("x", "y", 1)),
        Assert(SetVar("x", "z", 1)),
        wait=60,
    )
    answers = h.call(3, "a", UNLOCK, now=START + 1)
    assert list(answers) == [3, 2]
    assert answers[2].failed_statement == "0:/AssertOp/"
    assert len(h.queue) == 0
    assert h.engine.entry_count == 0


def test_process_with_no_waiters_stops_tracking() -> None:
    """With no waiter, process answers nothing, drops collected changes and stops tracking."""
    h = Harness()
    h.engine.track_changes = True
    h.call(1, "a", LOCK)
    assert h.queue.process(now=START, trust=1.0) == []
    assert not h.engine.track_changes
    assert h.engine.drain_changes() == set()


def test_statistics_histogram_buckets() -> None:
    """Finished waits (granted or timed out) are counted in wait-time buckets."""
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


@pytest.mark.parametrize(
    "field", ["max_waiters", "max_waiters_per_session", "max_waiters_per_owner"]
)
def test_wait_limits_must_be_positive_integers(field: str) -> None:
    """WaitLimits refuses bounds that are not integers >= 1."""
    with pytest.raises(ValueError, match=field):
        WaitLimits(**{field: 0})


def test_a_granted_waiters_old_deadline_answers_nothing() -> None:
    """Once granted, a waiter's deadline surfacing later from the heap answers nothing."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=5)
    h.call(3, "c", Assert(SetVar("other", "k", 1)), wait=5)  # succeeds at once
    h.call(4, "a", UNLOCK, now=START + 1)
    h.call(5, "x", Assert(SetVar("more", "k", 1)), wait=50)  # keeps the queue non-empty
    h.call(6, "x", Assert(Exists("more", "never")), wait=50)
    assert h.queue.process(now=START + 10, trust=1.0) == []
    assert h.queue.statistics().timed_out_total == 0
    assert h.queue.next_deadline() == START + 50


def test_several_waiters_of_one_session_and_owner() -> None:
    """Waiters of one session (and connection) are tracked each on its own: granting one
    keeps the others parked."""
    h = Harness()
    h.call(1, "a", LOCK)
    h.call(2, "b", LOCK, wait=60)
    h.call(3, "b", Assert(Exists("locks", "never")), wait=60)
    answers = h.call(4, "a", UNLOCK, now=START + 1)
    assert list(answers) == [4, 2]
    assert len(h.queue) == 1
    h.engine.end_session("b", now=START + 2)
    assert [t for t, _ in h.queue.process(now=START + 2, trust=1.0)] == [3]
