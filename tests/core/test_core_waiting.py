"""Server-side waiting as a user sees it, through the door (``LockCore``) with explicit
``now`` (docs/waiting.md): a parked request is woken by a release, a session end, an expiry
or a TTL; waiters are served in arrival order with no barging, yet a blocked older waiter
does not block a younger one; grants cascade; a wait ends at its deadline with the last
failure, by cancel, by its owner going away, or with SessionExpired when its own session
goes; limits refuse with TOO_MANY_WAITERS. The queue's internals (dependencies, costs,
histogram buckets, change tracking) are unit-tested in tests/engine/test_waiting.py."""

from __future__ import annotations

import pytest

from lockserver.engine import EngineLimits, WaitLimits
from protocol import (
    FALSE,
    Abort,
    AnywayContinueAfter,
    Assert,
    Cause,
    DeleteVar,
    ErrorCode,
    Exists,
    Not,
    SetVar,
    Status,
    TransactionResult,
)

from ._door import (
    START,
    Door,
    acquire,
    addresses,
    granted,
    only,
    refusal,
    release,
    spec,
    tx,
)


def result(payload: object) -> TransactionResult:
    assert isinstance(payload, TransactionResult), payload
    return payload


# --- answered at once or parked --------------------------------------------------------------


def test_without_wait_a_failure_is_answered_at_once() -> None:
    """Without ``wait`` (None or 0) a failing request is answered with its failure in the
    same call; nothing parks."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    for rid, wait in [(1, None), (2, 0.0)]:
        address, payload = only(d.execute("B", rid, "sB", acquire(), now=START, wait=wait))
        assert address == ("B", rid)
        assert result(payload).failed_statement == "0:/AssertOp/"
    assert len(d.core.waits) == 0
    assert d.core.next_deadline() == START + 60  # the sessions', no wait deadline


def test_a_waiting_request_that_succeeds_is_answered_at_once() -> None:
    """``wait`` only matters on failure: a request that succeeds is answered, not parked."""
    d = Door()
    assert granted(only(d.execute("A", 1, "sA", acquire(), now=START, wait=30))[1])
    assert len(d.core.waits) == 0


@pytest.mark.parametrize("demand", [{"min_trust": 0.9}, {"min_uptime": 100}])
def test_a_minimum_requirements_refusal_is_answered_not_parked(demand: dict[str, float]) -> None:
    """A call refused by the reliability contract (trust or uptime below the transaction's
    minimum) is answered at once even with ``wait``: it is final, never parked."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    demanding = tx(*acquire().statements, **demand)
    payload = only(d.execute("B", 1, "sB", demanding, now=START, wait=30, trust=0.5))[1]
    assert result(payload).cause is Cause.MINIMUM_REQUIREMENTS
    assert len(d.core.waits) == 0


def test_a_transaction_that_depends_on_nothing_parks_until_its_deadline() -> None:
    """An Abort-only transaction reads no variable: nothing can wake it, its deadline ends
    it with its failure."""
    d = Door()
    assert d.execute("A", 1, "sA", tx(Abort()), now=START, wait=1) == []
    assert len(d.core.waits) == 1
    address, payload = only(d.advance(START + 1))
    assert address == ("A", 1)
    assert result(payload).failed_statement == "0:/AbortOp/"


# --- waking -------------------------------------------------------------------------------------


def test_a_release_wakes_the_waiter_in_the_same_call() -> None:
    """The holder's release grants the parked acquire in the release's own call, after the
    release's answer; the waiter now holds the lock."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=10)
    outs = d.execute("A", 2, "sA", release(), now=START + 0.5)
    assert addresses(outs) == [("A", 2), ("B", 1)]
    assert granted(outs[1][1])
    assert not granted(only(d.execute("C", 1, "sC", acquire(), now=START + 1))[1])
    stats = d.statistics(START + 1)[0].waiting
    assert (stats.parked_total, stats.granted_total, stats.waiters) == (1, 1, 0)


def test_the_holders_session_end_wakes_the_waiter() -> None:
    """Ending the holder's session grants the waiter in the end's call, before its
    SessionEnded answer."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=10)
    outs = d.end_session("A", 2, "sA", now=START + 1)
    assert addresses(outs) == [("B", 1), ("A", 2)]
    assert granted(outs[0][1])


def test_the_holders_expiry_wakes_the_waiter() -> None:
    """The holder's session expires at its max age (advance); the waiter gets the lock then,
    not before."""
    d = Door()
    d.execute("A", 1, spec("sA", 5), acquire(), now=START)
    d.execute("B", 1, spec("sB", 60), acquire(), now=START, wait=30)
    assert d.advance(START + 4.9) == []
    outs = d.advance(START + 5)
    assert addresses(outs) == [("B", 1), ("A", None)]
    assert granted(outs[0][1])


def test_an_entry_ttl_wakes_the_waiter() -> None:
    """An entry's TTL running out wakes its waiters."""
    d = Door()
    d.execute("A", 1, "sA", acquire(ttl=2), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=30)
    assert d.advance(START + 1.5) == []
    outs = d.advance(START + 2)
    assert addresses(outs) == [("B", 1), ("A", None)]
    assert granted(outs[0][1])


def test_waiters_rerun_only_when_their_variables_change() -> None:
    """Changes to other variables, and calls that change nothing, do not re-run a waiter;
    a change of its variable does (once)."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    d.execute("C", 1, "sC", tx(Assert(SetVar("L", "other", 1))), now=START)
    d.execute("C", 2, "sC", tx(Assert(Exists("L", "k"))), now=START)
    assert d.statistics(START)[0].waiting.reevaluations_total == 0
    share = tx(Assert(SetVar("L", "k", "again", allow_duplicates=True)))
    assert addresses(d.execute("A", 2, "sA", share, now=START)) == [("A", 2)]
    stats = d.statistics(START)[0].waiting
    assert (stats.reevaluations_total, stats.waiters) == (1, 1)


# --- order ----------------------------------------------------------------------------------


def test_fifty_waiters_get_the_mutex_in_arrival_order_one_per_release() -> None:
    """Fifty waiters on one mutex: each release grants exactly the oldest remaining one."""
    d = Door()
    d.execute("O0", 1, "s0", acquire(), now=START)
    for i in range(1, 51):
        assert d.execute(f"O{i}", 1, f"s{i}", acquire(), now=START + i * 0.01, wait=100) == []
    holder = 0
    for step in range(50):
        outs = d.execute(f"O{holder}", 2, f"s{holder}", release(), now=START + 1 + step)
        assert addresses(outs)[0] == (f"O{holder}", 2)
        (grant,) = outs[1:]
        assert grant[0] == (f"O{step + 1}", 1) and granted(grant[1])
        holder = step + 1
    assert len(d.core.waits) == 0


def test_no_barging_after_a_release() -> None:
    """A release grants the oldest waiter before any later request runs: a newcomer's
    acquire right after it fails."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=10)
    d.execute("A", 2, "sA", release(), now=START + 1)
    late = only(d.execute("C", 1, "sC", acquire(), now=START + 1))[1]
    assert result(late).status is Status.TRANSACTION_ERROR


@pytest.mark.parametrize("freed_by", ["session expiry", "entry ttl"])
def test_no_barging_after_an_unswept_expiry(freed_by: str) -> None:
    """The lock was freed by an expiry nothing processed yet: the newcomer's own call first
    grants the older waiter, then the newcomer fails (and, waiting, parks behind it)."""
    d = Door()
    if freed_by == "session expiry":
        d.execute("A", 1, spec("sA", 5), acquire(), now=START)
    else:
        d.execute("A", 1, spec("sA", 1000), acquire(ttl=5), now=START)
    d.execute("B", 1, spec("sB", 600), acquire(), now=START + 1, wait=60)
    outs = d.execute("C", 1, spec("sC", 600), acquire(), now=START + 6)
    assert addresses(outs) == [("A", None), ("B", 1), ("C", 1)]
    assert granted(outs[1][1]) and not granted(outs[2][1])
    assert d.execute("C", 2, spec("sC", 600), acquire(), now=START + 6, wait=60) == []
    assert d.waiting() == [("C", 2)]


def test_a_blocked_older_waiter_does_not_block_a_younger_one() -> None:
    """Readers behind a blocked writer: the writer (older) still cannot run when a reader
    leaves, the younger reader whose condition is now met is granted."""
    d = Door()
    writer = tx(Assert(Not(Exists("L", "k"))))
    reader = tx(
        Assert(Not(Exists("L", "k", "writer"))),
        Assert(SetVar("L", "k", "reader", allow_duplicates=True)),
    )
    d.execute("W0", 1, "w0", tx(Assert(SetVar("L", "k", "writer"))), now=START)
    share = tx(Assert(SetVar("L", "k", "reader", allow_duplicates=True)))
    d.execute("R0", 1, "r0", share, now=START)
    assert d.execute("W1", 1, "w1", writer, now=START, wait=60) == []
    assert d.execute("R1", 1, "r1", reader, now=START, wait=60) == []
    outs = d.execute("W0", 2, "w0", release(), now=START + 1)
    assert addresses(outs) == [("W0", 2), ("R1", 1)]
    assert d.waiting() == [("W1", 1)]


def test_a_waiter_blocked_on_another_variable_does_not_block_a_younger_one() -> None:
    """Order is among the waiters that can run: an older waiter that also needs x (held)
    does not hold back a younger one that needs only the y just released."""
    d = Door()
    d.execute("A", 1, "sA", acquire("x"), now=START)
    d.execute("A", 2, "sA", acquire("y"), now=START)
    both = tx(Assert(Not(Exists("L", "x"))), Assert(SetVar("L", "y", "b")))
    d.execute("B", 1, "sB", both, now=START + 1, wait=30)
    d.execute("C", 1, "sC", acquire("y"), now=START + 2, wait=30)
    outs = d.execute("A", 3, "sA", release("y"), now=START + 3)
    assert addresses(outs) == [("A", 3), ("C", 1)]
    assert all(granted(p) for _, p in outs)


def test_a_grant_cascades_to_later_waiters() -> None:
    """A grant is a change: B waits for what A's grant sets, A waits for the release; the
    release answers the releaser, A, then B, in one call."""
    d = Door()
    d.execute("X", 1, "sX", acquire(), now=START)
    both = tx(Assert(SetVar("L", "k", "t")), Assert(SetVar("L", "second", 1)))
    d.execute("A", 1, "sA", both, now=START, wait=60)
    d.execute("B", 1, "sB", tx(Assert(Exists("L", "second"))), now=START, wait=60)
    outs = d.execute("X", 2, "sX", release(), now=START + 1)
    assert addresses(outs) == [("X", 2), ("A", 1), ("B", 1)]
    assert all(granted(p) for _, p in outs)


def test_readers_all_get_in_when_the_writer_leaves() -> None:
    """Shared holders (allow_duplicates) parked behind an exclusive holder are all granted,
    in arrival order, by its release."""
    d = Door()
    write = tx(Assert(Not(Exists("R", "doc"))), Assert(SetVar("W", "doc", "w")))
    read = tx(
        Assert(Not(Exists("W", "doc"))), Assert(SetVar("R", "doc", "r", allow_duplicates=True))
    )
    d.execute("Wr", 1, "writer", write, now=START)
    for i in range(2, 6):
        d.execute(f"R{i}", 1, f"r{i}", read, now=START, wait=10)
    unlock = tx(AnywayContinueAfter(DeleteVar("W", "doc")))
    outs = d.execute("Wr", 2, "writer", unlock, now=START + 1)
    assert addresses(outs) == [("Wr", 2), ("R2", 1), ("R3", 1), ("R4", 1), ("R5", 1)]
    assert all(granted(p) for _, p in outs)


# --- deadlines --------------------------------------------------------------------------------


def test_a_deadline_answers_with_the_last_failure_not_earlier() -> None:
    """Before its deadline a waiter is not answered; at it, advance answers it with its last
    failure at the uptime of the deadline, and the wait deadline is no longer due."""
    d = Door()
    d.execute("A", 1, spec("sA", 600), acquire(), now=START)
    d.execute("B", 1, spec("sB", 600), acquire(), now=START + 1, wait=2.5)
    assert d.core.next_deadline() == START + 3.5
    assert d.advance(START + 3.49) == []
    address, payload = only(d.advance(START + 3.5))
    assert address == ("B", 1)
    last = result(payload)
    assert (last.status, last.cause) == (Status.TRANSACTION_ERROR, Cause.STATEMENT)
    assert last.failed_statement == "0:/AssertOp/"
    assert last.uptime == 3.5
    assert d.core.next_deadline() == START + 600  # the sessions' only
    assert d.statistics(START + 4)[0].waiting.timed_out_total == 1


def test_a_rerun_that_still_fails_keeps_the_latest_failure_for_the_deadline() -> None:
    """A waiter re-run without success stays parked with its latest failure: its deadline
    answers with that one (here the second assert, at trust 0.8 of the answer time), not the
    first."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", tx(Assert(Not(Exists("L", "k"))), Assert(FALSE)), now=START, wait=10)
    outs = d.execute("A", 2, "sA", release(), now=START + 1)
    assert addresses(outs) == [("A", 2)]  # B re-ran and failed again: still parked
    address, payload = only(d.core.advance(START + 10, trust=0.8))
    assert address == ("B", 1)
    last = result(payload)
    assert last.failed_statement == "1:/AssertOp/"
    assert last.uptime == 10
    assert d.statistics(START + 10)[0].waiting.timed_out_total == 1


def test_a_granted_waiters_old_deadline_answers_nothing() -> None:
    """Once granted, a waiter's deadline coming later answers nothing and counts no
    timeout; the next deadline is the remaining waiter's."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=5)
    d.execute("A", 2, "sA", release(), now=START + 1)
    d.execute("C", 1, "sC", tx(Assert(Exists("more", "never"))), now=START + 1, wait=50)
    assert d.advance(START + 10) == []
    assert d.statistics(START + 10)[0].waiting.timed_out_total == 0
    assert d.core.next_deadline() == START + 51


# --- cancel ----------------------------------------------------------------------------------


def test_cancel_answers_the_last_failure_once_and_forgets_the_deadline() -> None:
    """A cancelled waiter is answered with its last failure (then Cancelled(True)); a
    second cancel finds nothing; its deadline is no longer due; a release grants nobody."""
    d = Door()
    d.execute("A", 1, spec("sA", 600), acquire(), now=START)
    d.execute("B", 1, spec("sB", 600), acquire(), now=START, wait=60)
    outs = d.cancel("B", 2, 1, now=START + 1)
    assert addresses(outs) == [("B", 1), ("B", 2)]
    assert result(outs[0][1]).failed_statement == "0:/AssertOp/"
    assert addresses(d.cancel("B", 3, 1, now=START + 1)) == [("B", 3)]
    assert d.core.next_deadline() == START + 600
    assert d.statistics(START + 1)[0].waiting.cancelled_total == 1
    assert addresses(d.execute("A", 2, spec("sA", 600), release(), now=START + 2)) == [("A", 2)]


# --- disconnect -------------------------------------------------------------------------------


def test_an_owner_going_away_drops_its_waiters_silently() -> None:
    """owner_gone drops every waiter of that owner with no answer; other owners' waiters
    stay, and the release goes to them."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("C1", 1, "b", acquire(), now=START, wait=60)
    d.execute("C1", 2, "c", acquire(), now=START, wait=60)
    d.execute("C2", 1, "d", acquire(), now=START, wait=60)
    assert d.owner_gone("C1", now=START + 1) == []
    assert d.waiting() == [("C2", 1)]
    assert d.statistics(START + 1)[0].waiting.cancelled_total == 2
    assert addresses(d.execute("A", 2, "sA", release(), now=START + 2)) == [("A", 2), ("C2", 1)]


# --- the waiter's own session ------------------------------------------------------------------


def test_a_waiter_whose_session_ends_is_answered_session_expired() -> None:
    """Ending the waiter's own session answers it first, with cause SessionExpired (no
    failed statement, no valid_until), then the end's SessionEnded(True)."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    outs = d.end_session("B", 2, "sB", now=START + 1)
    assert addresses(outs) == [("B", 1), ("B", 2)]
    gone = result(outs[0][1])
    assert (gone.status, gone.cause) == (Status.TRANSACTION_ERROR, Cause.SESSION_EXPIRED)
    assert gone.failed_statement is None and gone.valid_until is None


def test_a_waiter_whose_session_expires_is_answered_session_expired() -> None:
    """Waiting does not keep a session alive: at its max age the waiter is answered with
    cause SessionExpired, then its session's loss is told (a waiter holds nothing)."""
    d = Door()
    d.execute("A", 1, spec("sA", 600), acquire(), now=START)
    d.execute("B", 1, spec("sB", 5), acquire(), now=START, wait=60)
    assert d.advance(START + 4.9) == []
    outs = d.advance(START + 5)
    assert addresses(outs) == [("B", 1), ("B", None)]
    assert result(outs[0][1]).cause is Cause.SESSION_EXPIRED


def test_several_waiters_of_one_session_are_tracked_each_on_its_own() -> None:
    """Two waiters of one session (and owner): granting one keeps the other parked; the
    session's end answers the other."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    d.execute("B", 2, "sB", tx(Assert(Exists("L", "never"))), now=START, wait=60)
    assert addresses(d.execute("A", 2, "sA", release(), now=START + 1)) == [("A", 2), ("B", 1)]
    assert len(d.core.waits) == 1
    outs = d.end_session("B", 3, "sB", now=START + 2)
    assert addresses(outs) == [("B", 2), ("B", 3)]
    assert result(outs[0][1]).cause is Cause.SESSION_EXPIRED


# --- limits -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (WaitLimits(max_waiters=2), "max_waiters=2"),
        (WaitLimits(max_waiters_per_session=2), "max_waiters_per_session"),
        (WaitLimits(max_waiters_per_owner=2), "max_waiters_per_connection"),
    ],
)
def test_past_a_wait_limit_a_waiting_request_is_refused(limits: WaitLimits, message: str) -> None:
    """Past a limit on parked requests (server, session, owner) the next waiting request is
    answered with an EngineError TOO_MANY_WAITERS naming the setting, before it runs: nothing
    parked or changed. Without ``wait`` the same request runs (no limit applies)."""
    d = Door(wait_limits=limits)
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    d.execute("B", 2, "sB", acquire(), now=START, wait=60)
    address, payload = only(d.execute("B", 3, "sB", acquire(), now=START, wait=60))
    assert address == ("B", 3)
    err = refusal(payload)
    assert err.code is ErrorCode.TOO_MANY_WAITERS and message in err.message
    assert len(d.core.waits) == 2
    assert result(only(d.execute("B", 4, "sB", acquire(), now=START))[1]).failed_statement == (
        "0:/AssertOp/"
    )


def test_each_wait_limit_counts_its_own_scope() -> None:
    """With all three limits set, each refuses when its own scope is full: the session's
    (another owner, same session), the owner's (same owner, another session), the server's
    (a third owner and session); the refused requests leave three parked."""
    d = Door(
        wait_limits=WaitLimits(max_waiters=3, max_waiters_per_session=2, max_waiters_per_owner=2)
    )
    d.execute("H", 1, "holder", acquire(), now=START)
    d.execute("C1", 1, "s1", acquire(), now=START, wait=10)
    d.execute("C1", 2, "s1", acquire(), now=START, wait=10)
    per_session = refusal(only(d.execute("C2", 3, "s1", acquire(), now=START, wait=10))[1])
    assert per_session.code is ErrorCode.TOO_MANY_WAITERS and "per_session" in per_session.message
    per_owner = refusal(only(d.execute("C1", 4, "s2", acquire(), now=START, wait=10))[1])
    assert "connection" in per_owner.message
    assert d.execute("C2", 5, "s2", acquire(), now=START, wait=10) == []
    server = refusal(only(d.execute("C3", 6, "s3", acquire(), now=START, wait=10))[1])
    assert "max_waiters=3" in server.message
    assert len(d.core.waits) == 3


def test_an_engine_limit_on_a_rerun_answers_the_last_failure() -> None:
    """When a waiter could finally run but the server is full (an engine limit on the
    re-run), it is answered with its last failure and removed, not retried; the engine is
    unchanged by it."""
    d = Door(limits=EngineLimits(max_entries=1))
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=10)
    # The holder swaps its entry for another variable in one transaction: still full.
    swap = tx(AnywayContinueAfter(DeleteVar("L", "k")), Assert(SetVar("L", "other", 1)))
    outs = d.execute("A", 2, "sA", swap, now=START + 1)
    assert addresses(outs) == [("A", 2), ("B", 1)]
    assert granted(outs[0][1])
    assert result(outs[1][1]).failed_statement == "0:/AssertOp/"
    assert len(d.core.waits) == 0
    assert d.core.engine.entry_count == 1


def test_an_engine_limit_on_a_rerun_leaves_no_trace() -> None:
    """A re-run that passes its first statement and then hits max_entries is rolled back:
    the waiter gets its last failure and the engine holds nothing of it."""
    d = Door(limits=EngineLimits(max_entries=1))
    d.execute("A", 1, "sA", acquire(), now=START)
    many = tx(
        Assert(Not(Exists("L", "k"))), Assert(SetVar("x", "y", 1)), Assert(SetVar("x", "z", 1))
    )
    d.execute("B", 1, "sB", many, now=START, wait=60)
    outs = d.execute("A", 2, "sA", release(), now=START + 1)
    assert addresses(outs) == [("A", 2), ("B", 1)]
    assert result(outs[1][1]).failed_statement == "0:/AssertOp/"
    assert len(d.core.waits) == 0
    assert d.core.engine.entry_count == 0


def test_request_ids_are_per_owner_while_waiting() -> None:
    """A parked request is known by (owner, request id): the owner reusing the id while it
    waits is refused (DUPLICATE_REQUEST_ID, nothing changed), another owner's request with
    the same id is another request and parks behind it."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 2, "sB", acquire(), now=START, wait=60)
    core = d.core  # past the Door: the refusal answers (B, 2) a second time on purpose
    ((address, payload),) = core.execute(
        "B", 2, spec("sC"), acquire(), wait=60, now=START, trust=1.0, principal=""
    )
    assert address == ("B", 2)
    assert refusal(payload).code is ErrorCode.DUPLICATE_REQUEST_ID
    assert d.execute("C", 2, "sC", acquire(), now=START, wait=60) == []
    assert d.waiting() == [("B", 2), ("C", 2)]


# --- a session's parked requests follow it to another site (replicated groups) --------------


def test_a_sessions_parked_requests_follow_it_to_another_site() -> None:
    """``execute`` with ``site`` (a replicated group: owners are ``(site, conn)``) answers
    first, with their last failure, the session's requests parked through other sites, then
    the request itself, in one call; the session's requests parked through the same site and
    the other sessions' waiters stay parked, and the waiter that was behind a dropped one
    moves up. Without ``site`` (a single server) nothing is dropped."""
    d = Door()
    d.execute(("r1", 1), 1, "holder", acquire("k"), now=START)
    d.execute(("r1", 1), 2, "holder", acquire("j"), now=START)
    assert d.execute(("r1", 2), 3, "s", acquire("k", ticket="s"), now=START, wait=30.0) == []
    assert d.execute(("r2", 1), 4, "s", acquire("j", ticket="s"), now=START, wait=30.0) == []
    assert d.execute(("r3", 1), 5, "o", acquire("k", ticket="o"), now=START, wait=30.0) == []
    core = d.core
    plain = core.execute(("r2", 9), 6, spec("s"), acquire("m", ticket="s"), None, START, 1.0, "")
    assert addresses(plain) == [(("r2", 9), 6)]  # no site: nothing else answered
    assert core.waits.parked_count("s") == 2
    outs = core.execute(
        ("r2", 9), 7, spec("s"), acquire("n", ticket="s"), None, START + 1, 1.0, "", site="r2"
    )
    assert addresses(outs) == [(("r1", 2), 3), (("r2", 9), 7)]
    assert result(outs[0][1]).failed_statement == "0:/AssertOp/"
    assert granted(outs[1][1])
    assert core.waits.owners_of_session("s") == [(("r2", 1), (("r2", 1), 4))]
    assert core.waits.parked_count("o") == 1
    # the holder releases k: the waiter that was behind the dropped one gets it
    outs = d.execute(("r1", 1), 8, "holder", release("k"), now=START + 2)
    assert (("r3", 1), 5) in addresses(outs)
