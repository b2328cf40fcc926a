"""The extension ops at engine level: CountBelow, Waiting, ArrivedBelow, SetVar(period=)."""

from __future__ import annotations

from lockserver.engine import Engine, WaitQueue, dependencies
from protocol import (
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    CountBelow,
    DeleteVar,
    Exists,
    Not,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Transaction,
    Waiting,
)

NS = "ns"


def tx(*statements: object) -> Transaction:
    return Transaction(NS, statements)  # type: ignore[arg-type]


def s(name: str) -> SessionSpec:
    return SessionSpec(name)


def acquire_permit(limit: int, **kw: object) -> Transaction:
    return tx(
        Assert(CountBelow("sem", "x", limit, **kw)),  # type: ignore[arg-type]
        Assert(SetVar("sem", "x", 1, allow_duplicates=True)),
    )


def test_countbelow_admits_at_most_limit_holders() -> None:
    """A semaphore of 3: the fourth session is refused at CountBelow; a release admits it."""
    e = Engine(started_at=0.0)
    results = [e.execute(s(f"s{i}"), acquire_permit(3), now=0).ok for i in range(4)]
    assert results == [True, True, True, False]
    e.execute(s("s0"), tx(AnywayContinueAfter(DeleteVar("sem", "x"))), now=1)
    assert e.execute(s("s3"), acquire_permit(3), now=1).ok


def test_countbelow_zero_limit_and_ignore_this_session() -> None:
    """limit 0 is never below; ignore_this_session does not count the caller's own entry."""
    e = Engine(started_at=0.0)
    assert not e.execute(s("a"), acquire_permit(0), now=0).ok
    assert e.execute(s("a"), acquire_permit(1), now=0).ok
    assert not e.execute(s("a"), tx(Assert(CountBelow("sem", "x", 1))), now=0).ok
    assert e.execute(
        s("a"), tx(Assert(CountBelow("sem", "x", 1, ignore_this_session=True))), now=0
    ).ok


def test_countbelow_reads_the_configured_limit() -> None:
    """With limit_table/limit_var the limit comes from the configured entry (an int >= 0);
    anything else falls back to the literal limit."""
    e = Engine(started_at=0.0)
    conf = {"limit_table": "permits", "limit_var": "x"}
    assert e.execute(s("admin"), tx(Assert(SetVar("permits", "x", 2))), now=0).ok
    got = [e.execute(s(f"s{i}"), acquire_permit(10, **conf), now=0).ok for i in range(3)]
    assert got == [True, True, False]
    e.execute(s("admin"), tx(AnywayContinueAfter(DeleteVar("permits", "x"))), now=0)
    e.execute(s("admin"), tx(Assert(SetVar("permits", "x", "three"))), now=0)
    assert e.execute(s("s2"), acquire_permit(3, **conf), now=0).ok  # bad value: default 3


def test_countbelow_limit_from_the_first_configured_entry_or_the_default() -> None:
    """With no configured entry the literal limit applies; with several the first one's value
    (in arrival order) is the limit."""
    e = Engine(started_at=0.0)
    conf = {"limit_table": "permits", "limit_var": "x"}
    got = [e.execute(s(f"s{i}"), acquire_permit(2, **conf), now=0).ok for i in range(3)]
    assert got == [True, True, False]  # nothing configured: 2
    share = tx(Assert(SetVar("permits", "x", 3, allow_duplicates=True)))
    assert e.execute(s("admin1"), share, now=0).ok
    share = tx(Assert(SetVar("permits", "x", 1, allow_duplicates=True)))
    assert e.execute(s("admin2"), share, now=0).ok
    assert e.execute(s("s2"), acquire_permit(2, **conf), now=0).ok  # the first says 3
    assert not e.execute(s("s3"), acquire_permit(2, **conf), now=0).ok


def test_period_entry_expires_at_the_window_end() -> None:
    """SetVar(period=60) expires at the next multiple of 60 s of the wall clock: once per
    window. The engine's wall clock is fence_epoch (µs) + uptime."""
    e = Engine(started_at=100.0, fence_epoch=1_000_000 * 1_000_030)  # wall 1,000,030 s at start
    lock = tx(Assert(SetVar("tw", "report", "a", period=60)))
    assert e.execute(s("a"), lock, now=100.0).ok
    rec = e.execute(s("b"), tx(SelectVarValue("r", "tw", "report")), now=100.0).data[0][1]
    assert rec["expires_at"] == 50.0  # next window starts at wall 1,000,080 = uptime 50
    assert not e.execute(s("b"), lock, now=149.9).ok
    assert e.execute(s("b"), lock, now=150.0).ok


def test_waiting_sees_parked_setters_of_other_sessions() -> None:
    """Waiting(t, v) is true while another session's parked transaction would SetVar it;
    false for the setter's own session and after the waiter leaves."""
    e = Engine(started_at=0.0)
    q = WaitQueue(e)
    write = tx(Assert(Not(Exists("r", "doc"))), Assert(SetVar("w", "doc", 1)))
    read = tx(
        Assert(Not(Waiting("w", "doc"))), Assert(SetVar("r", "doc", 1, allow_duplicates=True))
    )
    assert q.submit("c", 1, s("reader1"), read, now=0, trust=1, wait=None)[0][1].ok
    assert q.submit("c", 2, s("writer"), write, now=0, trust=1, wait=10) == []
    late = q.submit("c", 3, s("reader2"), read, now=1, trust=1, wait=None)
    assert late[0][1].failed_statement == "0:/AssertOp/"  # gives way to the waiting writer
    assert e.execute(s("writer"), read, now=1).ok  # its own pending write does not count
    assert q.cancel(2) is not None
    assert q.submit("c", 4, s("reader2"), read, now=2, trust=1, wait=None)[0][1].ok


def test_waiting_reader_runs_when_writer_gives_up() -> None:
    """A reader parked behind a waiting writer is re-run when the writer's wait ends."""
    e = Engine(started_at=0.0)
    q = WaitQueue(e)
    write = tx(Assert(Not(Exists("r", "doc"))), Assert(SetVar("w", "doc", 1)))
    read = tx(
        Assert(Not(Waiting("w", "doc"))), Assert(SetVar("r", "doc", 1, allow_duplicates=True))
    )
    q.submit("c", 1, s("reader1"), read, now=0, trust=1, wait=None)
    q.submit("c", 2, s("writer"), write, now=0, trust=1, wait=5)
    assert q.submit("c", 3, s("reader2"), read, now=1, trust=1, wait=30) == []
    answers = q.process(now=5, trust=1)
    assert [(t, r.ok) for t, r in answers] == [(2, False), (3, True)]


def test_dependencies_include_extension_ops() -> None:
    """CountBelow (and its limit variable), Waiting and ArrivedBelow are dependencies of a
    waiter."""
    t = tx(
        Assert(CountBelow("sem", "x", 2, limit_table="permits", limit_var="x")),
        Assert(Not(Waiting("w", "doc"))),
        Assert(ArrivedBelow("b", "round", 3)),
    )
    assert dependencies(t) == {
        (NS, "sem", "x"),
        (NS, "permits", "x"),
        (NS, "w", "doc"),
        (NS, "b", "round"),
    }


def enter(parties: int) -> Transaction:
    """A barrier party's one transaction: arrive (an entry) and pass when ``parties`` have."""
    return tx(
        Assert(SetVar("b", "round", "in", allow_duplicates=True)),
        Assert(Not(ArrivedBelow("b", "round", parties))),
    )


def test_arrivedbelow_counts_entries_one_per_session() -> None:
    """Without parked transactions ArrivedBelow counts the sessions holding an entry of the
    variable, the caller's own (and its uncommitted SetVar) included; limit 0 is never
    below."""
    e = Engine(started_at=0.0)
    join = tx(Assert(SetVar("b", "round", "in", allow_duplicates=True)))
    assert e.execute(s("a"), tx(Assert(ArrivedBelow("b", "round", 1))), now=0).ok  # nobody
    assert not e.execute(s("a"), tx(Assert(ArrivedBelow("b", "round", 0))), now=0).ok
    assert e.execute(s("a"), join, now=0).ok
    assert e.execute(s("a"), join, now=0).ok  # replaced in place: still one session
    assert not e.execute(s("b"), tx(Assert(ArrivedBelow("b", "round", 1))), now=0).ok
    assert e.execute(s("b"), tx(Assert(ArrivedBelow("b", "round", 2))), now=0).ok
    assert e.execute(s("b"), enter(2), now=0).ok  # its own SetVar makes the second
    assert not e.execute(s("c"), enter(4), now=0).ok  # three of four: rolled back
    assert e.execute(s("c"), tx(Assert(ArrivedBelow("b", "round", 3))), now=0).ok


def test_arrivedbelow_counts_parked_setters_and_the_last_party_lets_all_pass() -> None:
    """Three parties, one transaction each: the first two park (one and two arrived); the
    third counts them (their parked SetVars), passes, and its commit lets both parked ones
    run in the same step, oldest first. Nobody passed before the third arrived."""
    e = Engine(started_at=0.0)
    q = WaitQueue(e)
    assert q.submit("c", 1, s("p1"), enter(3), now=0, trust=1, wait=60) == []
    assert q.submit("c", 2, s("p2"), enter(3), now=1, trust=1, wait=60) == []
    assert e.pending_sets[(NS, "b", "round")] == {"p1": 1, "p2": 1}
    answers = q.submit("c", 3, s("p3"), enter(3), now=2, trust=1, wait=60)
    assert [(token, r.ok) for token, r in answers] == [(3, True), (1, True), (2, True)]
    assert len(q) == 0 and (NS, "b", "round") not in e.pending_sets
    fences = [r.fence for _, r in answers]
    assert fences == sorted(fences)


def test_arrivedbelow_a_party_that_leaves_the_queue_is_not_counted() -> None:
    """A parked party that gives up (cancelled, its wait ran out, its session ended) no longer
    counts: the next party to arrive does not pass on its account."""
    e = Engine(started_at=0.0)
    q = WaitQueue(e)
    assert q.submit("c", 1, s("p1"), enter(2), now=0, trust=1, wait=60) == []
    assert q.cancel(1) is not None
    assert q.submit("c", 2, s("p2"), enter(2), now=1, trust=1, wait=5) == []
    [(token, result)] = q.process(now=6, trust=1)  # p2's wait runs out
    assert token == 2 and not result.ok
    assert q.submit("c", 3, s("p3"), enter(2), now=7, trust=1, wait=60) == []
    assert e.end_session("p3", now=8)
    assert q.process(now=8, trust=1)[0][0] == 3  # answered: its session ended
    assert q.submit("c", 4, s("p4"), enter(2), now=9, trust=1, wait=None)[0][1].ok is False


def test_arrivedbelow_waiter_looks_again_when_a_setter_parks_or_goes() -> None:
    """A parked ArrivedBelow is re-evaluated when a pending setter of its variable parks (a
    party parked for another reason still counts as arrived) or goes (``fewer than`` may
    become true): the count includes setters, which no commit announces."""
    e = Engine(started_at=0.0)
    q = WaitQueue(e)
    # A watcher that waits until two have arrived, without arriving itself.
    watch = tx(Assert(Not(ArrivedBelow("b", "round", 2))))
    # Parties that park on another condition (a gate entry held by "gate") but would set.
    blocked = tx(
        Assert(Not(Exists("g", "gate"))), Assert(SetVar("b", "round", 1, allow_duplicates=True))
    )
    assert e.execute(s("gate"), tx(Assert(SetVar("g", "gate"))), now=0).ok
    assert q.submit("c", 1, s("w"), watch, now=0, trust=1, wait=60) == []
    assert q.submit("c", 2, s("x"), blocked, now=1, trust=1, wait=60) == []
    answers = q.submit("c", 3, s("y"), blocked, now=2, trust=1, wait=60)
    assert [(token, r.ok) for token, r in answers] == [(1, True)]  # two setters parked
    # and the other way: "fewer than two arrived" becomes true when a setter goes
    few = tx(Assert(ArrivedBelow("b", "round", 2)))
    assert q.submit("c", 4, s("w2"), few, now=3, trust=1, wait=60) == []
    assert q.cancel(3) is not None
    assert [(token, r.ok) for token, r in q.process(now=4, trust=1)] == [(4, True)]
