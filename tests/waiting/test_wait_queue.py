"""Server-side waiting in the pure engine layer (lockserver.engine._waiting).

Time is data: every call takes an explicit ``now``."""

from __future__ import annotations

from typing import Any

from lockserver.engine import Engine, EngineError, EngineLimits
from lockserver.engine._waiting import WaitLimits, WaitQueue, dependencies
from protocol import (
    Abort,
    AnywayContinueAfter,
    Assert,
    Block,
    Cause,
    DeleteVar,
    ErrorCode,
    Exists,
    If,
    Not,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
)

NS = "ns"


def acquire(ticket: str, var: str = "k", ttl: float | None = None) -> Transaction:
    return Transaction(NS, [Assert(SetVar("L", var, ticket, ttl=ttl))])


def release(var: str = "k") -> Transaction:
    return Transaction(NS, [AnywayContinueAfter(DeleteVar("L", var))])


def s(name: str, max_age: float = 60.0) -> SessionSpec:
    return SessionSpec(name, max_age)


def make() -> tuple[Engine, WaitQueue]:
    engine = Engine(started_at=0.0)
    return engine, WaitQueue(engine)


def tokens(answers: list[tuple[object, object]]) -> list[object]:
    return [t for t, _ in answers]


def test_dependencies_cover_every_branch() -> None:
    """Every keyed node counts, in any branch of If/Block and under operators."""
    tx = Transaction(
        NS,
        [
            If(
                Exists("A", "a"),
                Block(Assert(Not(SetVar("B", "b")))),
                AnywayContinueAfter(DeleteVar("C", "c")),
            ),
            SelectVarValue("x", "D", "d"),
        ],
    )
    assert dependencies(tx) == {(NS, "A", "a"), (NS, "B", "b"), (NS, "C", "c"), (NS, "D", "d")}


def test_free_lock_answers_at_once_and_nothing_parks() -> None:
    """A transaction that succeeds is answered immediately even when it may wait."""
    _, q = make()
    answers = q.submit("c", 1, s("s1"), acquire("a"), now=0, trust=1, wait=5)
    assert tokens(answers) == [1]
    assert answers[0][1].ok
    assert len(q) == 0


def test_no_wait_failure_is_answered_not_parked() -> None:
    """Without ``wait`` a failing transaction is answered with its failure."""
    _, q = make()
    q.submit("c", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    answers = q.submit("c", 2, s("s2"), acquire("b"), now=0, trust=1, wait=0)
    assert tokens(answers) == [2]
    assert answers[0][1].failed_statement == "0:/AssertOp/"
    assert len(q) == 0


def test_waiter_woken_by_release() -> None:
    """A parked acquire runs the moment the holder releases, in the same step."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    assert q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10) == []
    answers = q.submit("c1", 3, s("s1"), release(), now=1, trust=1, wait=None)
    assert tokens(answers) == [3, 2]
    assert answers[1][1].ok


def test_waiter_woken_by_holder_session_end() -> None:
    """Ending the holder's session wakes the waiter when the queue processes the change."""
    engine, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10)
    assert engine.end_session("s1", now=1)
    answers = q.process(now=1, trust=1)
    assert tokens(answers) == [2] and answers[0][1].ok


def test_waiter_woken_by_holder_expiry() -> None:
    """The holder's session expires at its max age; the waiter (kept alive) gets the lock."""
    _, q = make()
    q.submit("c1", 1, s("s1", max_age=5), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2", max_age=60), acquire("b"), now=0, trust=1, wait=30)
    assert q.process(now=4.9, trust=1) == []
    answers = q.process(now=5.0, trust=1)
    assert tokens(answers) == [2] and answers[0][1].ok


def test_waiter_woken_by_ttl_expiry() -> None:
    """An entry's TTL running out wakes its waiters."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a", ttl=2), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=30)
    assert q.process(now=1.5, trust=1) == []
    assert tokens(q.process(now=2.0, trust=1)) == [2]


def test_fifo_among_fifty_waiters() -> None:
    """Fifty waiters on one mutex get it in arrival order, one per release."""
    _, q = make()
    q.submit("c0", 0, s("s0"), acquire("t0"), now=0, trust=1, wait=None)
    for i in range(1, 51):
        assert (
            q.submit(f"c{i}", i, s(f"s{i}"), acquire(f"t{i}"), now=i * 0.01, trust=1, wait=100)
            == []
        )
    order = []
    holder = "s0"
    for step in range(50):
        answers = q.submit(
            "rel", 1000 + step, s(holder), release(), now=1 + step, trust=1, wait=None
        )
        granted = [t for t, r in answers if t != 1000 + step and r.ok]
        assert len(granted) == 1
        order.append(granted[0])
        holder = f"s{granted[0]}"
    assert order == list(range(1, 51))


def test_newcomer_cannot_barge_after_release() -> None:
    """A release grants the oldest waiter before any later request is looked at."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10)
    q.submit("c1", 3, s("s1"), release(), now=1, trust=1, wait=None)
    late = q.submit("c3", 4, s("s3"), acquire("c"), now=1, trust=1, wait=None)
    assert late[0][1].status is Status.TRANSACTION_ERROR


def test_newcomer_cannot_barge_after_unswept_expiry() -> None:
    """Even when no sweep ran since the holder expired, the older waiter is served before a
    newcomer arriving after the expiry."""
    _, q = make()
    q.submit("c1", 1, s("s1", max_age=5), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=1, trust=1, wait=30)
    answers = q.submit("c3", 3, s("s3"), acquire("c"), now=6, trust=1, wait=None)
    assert [(t, r.ok) for t, r in answers] == [(2, True), (3, False)]


def test_blocked_older_waiter_does_not_block_a_younger_one_that_can_run() -> None:
    """Order is among waiters that could run: a waiter blocked for its own reason does not
    hold back a younger waiter whose condition is met."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a", var="x"), now=0, trust=1, wait=None)
    q.submit("c1", 2, s("s1"), acquire("a", var="y"), now=0, trust=1, wait=None)
    # Waiter 3 needs both x and y; waiter 4 needs only y.
    both = Transaction(NS, [Assert(Not(Exists("L", "x"))), Assert(SetVar("L", "y", "b"))])
    q.submit("c2", 3, s("s2"), both, now=1, trust=1, wait=30)
    q.submit("c3", 4, s("s3"), acquire("c", var="y"), now=2, trust=1, wait=30)
    answers = q.submit("c1", 5, s("s1"), release("y"), now=3, trust=1, wait=None)
    assert [(t, r.ok) for t, r in answers] == [(5, True), (4, True)]


def test_deadline_answered_exactly_with_last_failure() -> None:
    """At its deadline a waiter is answered with its last failure, not a moment before."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=1, trust=1, wait=2.5)
    assert q.next_deadline() == 3.5
    assert q.process(now=3.49, trust=1) == []
    answers = q.process(now=3.5, trust=1)
    assert tokens(answers) == [2]
    result = answers[0][1]
    assert result.status is Status.TRANSACTION_ERROR and result.cause is Cause.STATEMENT
    assert result.failed_statement == "0:/AssertOp/"
    assert result.uptime == 3.5
    assert q.statistics().timed_out_total == 1


def test_disconnect_cancels_without_answer() -> None:
    """Closing a connection drops its waiters; later releases do not grant them."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10)
    q.submit("c2", 3, s("s2"), acquire("b", var="z2"), now=0, trust=1, wait=10)
    assert q.cancel_owner("c2") == 1  # token 3 succeeded at once (z2 was free)
    assert tokens(q.submit("c1", 4, s("s1"), release(), now=1, trust=1, wait=None)) == [4]
    assert q.cancel_owner("nobody") == 0


def test_cancel_one_returns_last_failure() -> None:
    """Explicit cancel answers with the last failure; cancelling twice finds nothing."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10)
    last = q.cancel(2)
    assert last is not None and last.failed_statement == "0:/AssertOp/"
    assert q.cancel(2) is None
    assert len(q) == 0


def test_waiter_session_end_answers_session_expired() -> None:
    """When the waiter's own session ends or expires, it is answered with SessionExpired."""
    engine, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2", max_age=5), acquire("b"), now=0, trust=1, wait=30)
    answers = q.process(now=5, trust=1)
    assert tokens(answers) == [2]
    assert answers[0][1].cause is Cause.SESSION_EXPIRED
    assert answers[0][1].failed_statement is None
    q.submit("c3", 3, s("s3"), acquire("c"), now=6, trust=1, wait=30)
    engine.end_session("s3", now=7)
    assert [r.cause for _, r in q.process(now=7, trust=1)] == [Cause.SESSION_EXPIRED]


def test_abort_only_transactions_are_parked_and_time_out() -> None:
    """A transaction with no dependencies can only end by deadline (nothing can change)."""
    _, q = make()
    q.submit("c", 1, s("s1"), Transaction(NS, [Abort()]), now=0, trust=1, wait=1)
    assert len(q) == 1
    assert tokens(q.process(now=1, trust=1)) == [1]


def test_qos_refusal_is_answered_not_parked() -> None:
    """A refusal of the reliability contract is final for this call: never parked."""
    _, q = make()
    tx = Transaction(NS, [Assert(SetVar("L", "k", 1))], min_uptime=100)
    answers = q.submit("c", 1, s("s1"), tx, now=0, trust=1, wait=10)
    assert answers[0][1].cause is Cause.MINIMUM_REQUIREMENTS
    assert len(q) == 0


def test_limits_refuse_with_too_many_waiters() -> None:
    """Each waiter limit refuses the next parked request with TOO_MANY_WAITERS."""
    engine = Engine(started_at=0.0)
    q = WaitQueue(
        engine, WaitLimits(max_waiters=3, max_waiters_per_session=2, max_waiters_per_owner=2)
    )
    q.submit("h", 0, s("holder"), acquire("x"), now=0, trust=1, wait=None)
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=10)
    q.submit("c1", 2, s("s1"), acquire("a"), now=0, trust=1, wait=10)

    def refusal(*args: Any) -> EngineError:
        ((token, err),) = q.submit(*args, now=0, trust=1, wait=10)
        assert token == args[1] and isinstance(err, EngineError)
        return err

    e = refusal("c2", 3, s("s1"), acquire("a"))
    assert e.code is ErrorCode.TOO_MANY_WAITERS and "per_session" in e.message
    assert "connection" in refusal("c1", 4, s("s2"), acquire("a")).message
    q.submit("c2", 5, s("s2"), acquire("a"), now=0, trust=1, wait=10)
    assert "max_waiters=3" in refusal("c3", 6, s("s3"), acquire("a")).message
    assert refusal("c1", 1, s("s1"), acquire("a")).code is ErrorCode.DUPLICATE_REQUEST_ID
    assert len(q) == 3


def test_limit_on_rerun_answers_last_failure() -> None:
    """If the server is full when a waiter finally could run, it is answered, not retried."""
    engine = Engine(started_at=0.0, limits=EngineLimits(max_entries=1))
    q = WaitQueue(engine)
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=10)
    # The holder swaps its entry for another var in one transaction: the server stays full.
    swap = Transaction(
        NS, [AnywayContinueAfter(DeleteVar("L", "k")), Assert(SetVar("L", "other", 1))]
    )
    answers = q.submit("c1", 3, s("s1"), swap, now=1, trust=1, wait=None)
    assert [(t, r.ok) for t, r in answers] == [(3, True), (2, False)]
    assert len(q) == 0


def test_ten_thousand_waiters_on_different_keys_cost_o1_per_release() -> None:
    """A release re-evaluates only the waiters of the released variable."""
    _, q = make()
    n = 10_000
    for i in range(n):
        q.submit("h", ("h", i), s("holder"), acquire("h", var=f"k{i}"), now=0, trust=1, wait=None)
    for i in range(n):
        q.submit("w", ("w", i), s(f"w{i}"), acquire("w", var=f"k{i}"), now=0, trust=1, wait=100)
    before = q.statistics().reevaluations_total
    for i in range(0, n, 1000):
        q.submit("h", ("r", i), s("holder"), release(f"k{i}"), now=1, trust=1, wait=None)
    assert q.statistics().reevaluations_total - before == n // 1000
    assert q.statistics().granted_total == n // 1000


def test_cascade_costs_one_evaluation_per_waiter_per_release() -> None:
    """With N waiters on one mutex a release costs N evaluations, not 2N."""
    _, q = make()
    q.submit("c0", 0, s("s0"), acquire("t0"), now=0, trust=1, wait=None)
    for i in range(1, 21):
        q.submit(f"c{i}", i, s(f"s{i}"), acquire(f"t{i}"), now=0, trust=1, wait=100)
    before = q.statistics().reevaluations_total
    q.submit("c0", 100, s("s0"), release(), now=1, trust=1, wait=None)
    assert q.statistics().reevaluations_total - before == 20


def test_readers_cascade_after_writer_release() -> None:
    """Shared holders (allow_duplicates) all get in when the exclusive holder leaves."""
    _, q = make()
    write = Transaction(NS, [Assert(Not(Exists("R", "doc"))), Assert(SetVar("W", "doc", "w"))])
    read = Transaction(
        NS,
        [Assert(Not(Exists("W", "doc"))), Assert(SetVar("R", "doc", "r", allow_duplicates=True))],
    )
    q.submit("cw", 1, s("writer"), write, now=0, trust=1, wait=None)
    for i in range(2, 6):
        q.submit(f"c{i}", i, s(f"r{i}"), read, now=0, trust=1, wait=10)
    unlock = Transaction(NS, [AnywayContinueAfter(DeleteVar("W", "doc"))])
    answers = q.submit("cw", 9, s("writer"), unlock, now=1, trust=1, wait=None)
    assert [(t, r.ok) for t, r in answers] == [
        (9, True),
        (2, True),
        (3, True),
        (4, True),
        (5, True),
    ]


def test_statistics_histogram() -> None:
    """Finished waits land in the wait-time histogram by duration."""
    _, q = make()
    q.submit("c1", 1, s("s1"), acquire("a"), now=0, trust=1, wait=None)
    q.submit("c2", 2, s("s2"), acquire("b"), now=0, trust=1, wait=100)
    q.submit("c1", 3, s("s1"), release(), now=0.5, trust=1, wait=None)
    st = q.statistics()
    assert st.granted_total == 1 and st.waiters == 0 and st.parked_total == 1
    assert st.wait_time_histogram["1"] == 1
    assert sum(st.wait_time_histogram.values()) == 1
    assert st.to_wire()["granted_total"] == 1
