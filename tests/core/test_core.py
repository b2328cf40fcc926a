"""The door (``lockserver.engine.LockCore``) with explicit ``now``, no sockets, no trio: what
each call answers, to whom (the address of every output), in which order (the module
docstring's rules), how lost-lock events are routed to the owners that used a session, and
ownership of sessions by principals. Owners are strings; see ``test_core_waiting.py`` for the
waiting behaviours and ``test_core_determinism.py`` for replays."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest

from lockserver.engine import (
    CoreStatistics,
    EngineLimits,
    EngineStatistics,
    Output,
    WaitStatistics,
)
from protocol import (
    Cancelled,
    Cause,
    ErrorCode,
    LostReason,
    SessionEnded,
    Status,
    TransactionResult,
)

from ._door import (
    NS,
    READ,
    START,
    WRITE,
    Door,
    acquire,
    addresses,
    granted,
    lost,
    only,
    refusal,
    release,
    spec,
    tx,
)

EXPIRED, ENDED, TTL = LostReason.EXPIRED, LostReason.ENDED, LostReason.TTL
PING = tx()  # no statements: it only creates or touches the session


def fence_of(outs: list[Output]) -> int:
    """The fence of the one successful result among ``outs``."""
    (fence,) = [p.fence for _, p in outs if isinstance(p, TransactionResult) and p.ok]
    return fence


# --- execute --------------------------------------------------------------------------------


def test_execute_is_answered_at_once_to_its_own_address() -> None:
    """An execute that succeeds, and one that fails without ``wait``, are each answered in
    the same call with exactly one output addressed (owner, request id); the result carries
    the uptime at ``now`` and the host."""
    d = Door()
    address, result = only(d.execute("A", 7, "sA", acquire(), now=START + 2))
    assert address == ("A", 7)
    assert isinstance(result, TransactionResult) and result.ok
    assert (result.uptime, result.host) == (2.0, "test-host")
    address, result = only(d.execute("B", 7, "sB", acquire(), now=START + 3))
    assert address == ("B", 7)
    assert isinstance(result, TransactionResult)
    assert result.status is Status.TRANSACTION_ERROR
    assert result.failed_statement == "0:/AssertOp/"
    assert len(d.core.waits) == 0


def test_a_parked_execute_is_answered_later_at_the_waiters_address() -> None:
    """A failing execute with ``wait`` parks (the call returns nothing); another owner's
    release answers the releaser first, then the waiter, addressed (waiter's owner, waiter's
    request id), not the releaser's."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    assert d.execute("B", 5, "sB", acquire(), now=START + 1, wait=30) == []
    assert d.waiting() == [("B", 5)]
    outs = d.execute("A", 2, "sA", release(), now=START + 2)
    assert addresses(outs) == [("A", 2), ("B", 5)]
    assert all(granted(p) for _, p in outs)
    assert len(d.core.waits) == 0


def test_execute_sends_the_losses_it_caused_before_the_answers() -> None:
    """An execute that expires a session (due by ``now``, no advance in between) sends the
    loss first, then the waiter the expiry let run, then its own answer."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sA", 5), acquire(), now=START))
    d.execute("B", 1, spec("sB", 600), acquire(), now=START + 1, wait=300)
    outs = d.execute("C", 1, "sC", acquire("other"), now=START + 10)
    assert addresses(outs) == [("A", None), ("B", 1), ("C", 1)]
    assert outs[0][1] == lost("sA", EXPIRED, (NS, "L", "k", fence))
    assert granted(outs[1][1]) and granted(outs[2][1])


def test_an_execute_that_recreates_its_expired_session_reports_the_loss_first() -> None:
    """An owner whose session expired and who uses it again gets the old session's loss,
    then the answer of the call that started the new session."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sA", 5), acquire(), now=START))
    outs = d.execute("A", 2, spec("sA", 5), acquire(), now=START + 10)
    assert addresses(outs) == [("A", None), ("A", 2)]
    assert outs[0][1] == lost("sA", EXPIRED, (NS, "L", "k", fence))
    assert granted(outs[1][1])


def test_regression_a_grant_freed_by_an_unswept_expiry_goes_to_the_waiter_not_the_caller() -> None:
    """The old shell's bug: A holds the mutex in a short session and is gone; B parks on it
    with a long wait; after A's session expired (no advance in between) C sends the same
    acquire with wait. The call grants B, addressed (B, B's request id); C gets nothing (it
    parks behind B), and is granted later at its own address."""
    d = Door()
    d.execute("A", 1, spec("sA", 5), acquire(), now=START)
    assert d.owner_gone("A", now=START + 1) == []
    assert d.execute("B", 11, spec("sB", 600), acquire(), now=START + 1, wait=300) == []
    outs = d.execute("C", 21, spec("sC", 600), acquire(), now=START + 10, wait=300)
    assert addresses(outs) == [("B", 11)]
    assert granted(outs[0][1])
    assert d.waiting() == [("C", 21)]
    outs = d.execute("B", 12, spec("sB", 600), release(), now=START + 11)
    assert addresses(outs) == [("B", 12), ("C", 21)]
    assert granted(outs[1][1])


def test_a_refusal_is_an_engine_error_value_for_that_request_only() -> None:
    """A limit is answered with an EngineError value addressed to the request (not raised),
    and nothing was created: the refused owner is not routed to the session."""
    d = Door(limits=EngineLimits(max_sessions=1))
    d.execute("A", 1, "sA", acquire(), now=START)
    address, payload = only(d.execute("B", 1, "sB", acquire("j"), now=START))
    assert address == ("B", 1)
    assert refusal(payload).code is ErrorCode.TOO_MANY_SESSIONS
    assert "sB" not in d.core.engine.sessions
    assert d.core.statistics(START, trust=1.0)[0].sessions_routed == 1


# --- end_session ----------------------------------------------------------------------------


def test_end_session_answers_waiters_then_losses_then_session_ended() -> None:
    """Ending a session: the waiters it let run are answered first, then its other owners get
    LockLost(ENDED), then the ender gets SessionEnded(True), last. The ender gets no loss."""
    d = Door()
    fence = fence_of(d.execute("A", 1, "sX", acquire(), now=START))
    d.execute("B", 1, "sX", PING, now=START)  # B uses sX too
    d.execute("C", 1, "sC", acquire(), now=START, wait=60)
    outs = d.end_session("A", 2, "sX", now=START + 1)
    assert addresses(outs) == [("C", 1), ("B", None), ("A", 2)]
    assert granted(outs[0][1])
    assert outs[1][1] == lost("sX", ENDED, (NS, "L", "k", fence))
    assert outs[2][1] == SessionEnded(True)
    assert "sX" not in d.core.engine.sessions


def test_end_session_by_its_only_owner_sends_no_loss() -> None:
    """The owner that ends its own session gets SessionEnded(True) and no LockLost event."""
    d = Door()
    d.execute("A", 1, "sX", acquire(), now=START)
    assert d.end_session("A", 2, "sX", now=START + 1) == [(("A", 2), SessionEnded(True))]


def test_end_of_an_unknown_session_answers_session_ended_false() -> None:
    """Ending a session that does not exist answers SessionEnded(False) and nothing else."""
    d = Door()
    assert d.end_session("A", 3, "nope", now=START) == [(("A", 3), SessionEnded(False))]


def test_end_session_ends_the_routing() -> None:
    """After an end, a session reusing the id is a new one: its loss reaches only the owners
    that used the new one."""
    d = Door()
    d.execute("A", 1, "sX", acquire(), now=START)
    d.execute("B", 1, "sX", PING, now=START)
    d.end_session("A", 2, "sX", now=START + 1)
    d.execute("C", 1, spec("sX", 5), acquire(), now=START + 2)
    outs = d.advance(START + 7)
    assert addresses(outs) == [("C", None)]


# --- cancel ---------------------------------------------------------------------------------


def test_cancel_answers_the_target_then_cancelled_then_waiters_it_let_run() -> None:
    """Cancelling a parked writer: the writer's request gets its last failure, then the
    cancel gets Cancelled(True), then the reader that gave way to the writer runs."""
    d = Door()
    d.execute("R1", 1, "r1", READ, now=START)
    assert d.execute("W", 1, "w", WRITE, now=START, wait=60) == []
    assert d.execute("R2", 1, "r2", READ, now=START + 1, wait=60) == []  # gives way
    outs = d.cancel("W", 2, 1, now=START + 2)
    assert addresses(outs) == [("W", 1), ("W", 2), ("R2", 1)]
    last = outs[0][1]
    assert isinstance(last, TransactionResult)
    assert (last.status, last.cause) == (Status.TRANSACTION_ERROR, Cause.STATEMENT)
    assert last.failed_statement == "0:/AssertOp/"
    assert outs[1][1] == Cancelled(True)
    assert granted(outs[2][1])


def test_cancel_of_a_request_not_parked_is_cancelled_false_alone() -> None:
    """Cancelled(False) and nothing else when the target is not parked: unknown, answered
    already, or parked by another owner (request ids are per owner)."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    assert d.cancel("A", 2, 1, now=START) == [(("A", 2), Cancelled(False))]  # answered
    assert d.cancel("A", 3, 99, now=START) == [(("A", 3), Cancelled(False))]  # unknown
    assert d.cancel("C", 1, 1, now=START) == [(("C", 1), Cancelled(False))]  # B's, not C's
    assert d.waiting() == [("B", 1)]
    outs = d.cancel("B", 2, 1, now=START + 1)
    assert addresses(outs) == [("B", 1), ("B", 2)]
    assert d.cancel("B", 3, 1, now=START + 1) == [(("B", 3), Cancelled(False))]  # only once


# --- owner_gone -----------------------------------------------------------------------------


def test_owner_gone_drops_its_parked_requests_unanswered() -> None:
    """A gone owner's parked requests are dropped with no answer, now or later (a release
    grants nobody); another owner's waiter stays and is granted."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 1, "sB", acquire(), now=START, wait=60)
    d.execute("B", 2, "sB2", acquire(), now=START, wait=60)
    d.execute("C", 1, "sC", acquire(), now=START + 1, wait=60)
    assert d.owner_gone("B", now=START + 2) == []
    assert d.waiting() == [("C", 1)]
    outs = d.execute("A", 2, "sA", release(), now=START + 3)
    assert addresses(outs) == [("A", 2), ("C", 1)]
    assert d.owner_gone("nobody", now=START + 3) == []


def test_owner_gone_lets_waiters_it_held_back_run() -> None:
    """A gone owner's parked writer was a pending setter (``Waiting``): the reader that gave
    way to it runs in the owner_gone call, the writer is not answered."""
    d = Door()
    d.execute("R1", 1, "r1", READ, now=START)
    d.execute("W", 1, "w", WRITE, now=START, wait=60)
    d.execute("R2", 1, "r2", READ, now=START + 1, wait=60)
    outs = d.owner_gone("W", now=START + 2)
    assert addresses(outs) == [("R2", 1)]
    assert granted(outs[0][1])


def test_sessions_outlive_their_owners_and_gone_owners_hear_no_losses() -> None:
    """A gone owner's session lives on (a reconnecting client keeps it); its later loss goes
    to the owners still there, never to the gone one."""
    d = Door()
    d.execute("A", 1, spec("sX", 5), acquire(), now=START)
    d.execute("B", 1, spec("sX", 5), PING, now=START)
    d.owner_gone("A", now=START + 1)
    assert "sX" in d.core.engine.sessions
    assert addresses(d.advance(START + 6)) == [("B", None)]


# --- advance and next_deadline --------------------------------------------------------------


def test_advance_at_a_wait_deadline_answers_the_last_failure() -> None:
    """Before its deadline a waiter is not answered; advance at the deadline answers it with
    its last failure, at the uptime of the deadline."""
    d = Door()
    d.execute("A", 1, "sA", acquire(), now=START)
    d.execute("B", 4, "sB", acquire(), now=START + 1, wait=5)
    assert d.advance(START + 5.9) == []
    address, result = only(d.advance(START + 6))
    assert address == ("B", 4)
    assert isinstance(result, TransactionResult)
    assert (result.status, result.cause) == (Status.TRANSACTION_ERROR, Cause.STATEMENT)
    assert result.failed_statement == "0:/AssertOp/"
    assert result.uptime == 6.0
    assert len(d.core.waits) == 0


def test_advance_answers_the_waiters_an_expiry_let_run_then_the_losses() -> None:
    """An expiry found by advance: the waiters it let run are answered, the losses go last."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sA", 5), acquire(), now=START))
    d.execute("B", 1, spec("sB", 600), acquire(), now=START + 1, wait=60)
    assert d.advance(START + 4.9) == []
    outs = d.advance(START + 5)
    assert addresses(outs) == [("B", 1), ("A", None)]
    assert granted(outs[0][1])
    assert outs[1][1] == lost("sA", EXPIRED, (NS, "L", "k", fence))


def test_next_deadline_is_the_earliest_of_the_engines_and_the_wait_queues() -> None:
    """None when nothing is due; an expiry or an entry TTL (the engine's) or a wait deadline
    (the queue's), whichever is first; None again once everything ended and was swept."""
    d = Door()
    assert d.core.next_deadline() is None
    d.execute("A", 1, spec("sA", 100), acquire(), now=START)
    assert d.core.next_deadline() == START + 100  # the session's expiry
    d.execute("B", 1, spec("sB", 100), acquire(), now=START + 1, wait=20)
    assert d.core.next_deadline() == START + 21  # the wait deadline
    d.execute("C", 1, spec("sC", 100), acquire("j", ttl=3), now=START + 2)
    assert d.core.next_deadline() == START + 5  # the entry's TTL
    d.advance(START + 5)
    assert d.core.next_deadline() == START + 21
    d.cancel("B", 2, 1, now=START + 6)
    assert d.core.next_deadline() == START + 100
    for owner, sid in [("A", "sA"), ("B", "sB"), ("C", "sC")]:
        d.end_session(owner, 9, sid, now=START + 7)
    # An ended session's deadline may still show (forgotten lazily: a spurious wake-up, never
    # a late one); advance at it does nothing, and then nothing is due.
    stale = d.core.next_deadline()
    assert stale is None or stale == START + 100
    assert d.advance(START + 100) == []
    assert d.core.next_deadline() is None


# --- statistics and uptime ------------------------------------------------------------------


def test_statistics_is_a_frozen_record_and_returns_the_losses_due() -> None:
    """statistics(now) expires what is due by ``now`` first: the counts leave it out and the
    losses come back with the record; the record is a frozen CoreStatistics."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sA", 5), acquire(), now=START))
    d.execute("B", 1, spec("sB", 600), acquire("j"), now=START)
    d.execute("B", 2, spec("sB", 600), acquire(), now=START + 1, wait=2)
    stats, outs = d.statistics(START + 1)
    assert outs == []
    assert isinstance(stats, CoreStatistics)
    assert isinstance(stats.engine, EngineStatistics)
    assert isinstance(stats.waiting, WaitStatistics)
    assert (stats.engine.sessions, stats.engine.entries, stats.sessions_routed) == (2, 2, 2)
    assert (stats.waiting.waiters, stats.waiting.parked_total) == (1, 1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.sessions_routed = 0  # type: ignore[misc]
    stats, outs = d.statistics(START + 5)
    # B's wait ran out at START + 3: answered with its last failure, then A's loss.
    assert addresses(outs) == [("B", 2), ("A", None)]
    assert not granted(outs[0][1])
    assert outs[1] == (("A", None), lost("sA", EXPIRED, (NS, "L", "k", fence)))
    assert (stats.engine.sessions, stats.engine.sessions_expired) == (1, 1)
    _, outs = d.statistics(START + 5)
    assert outs == []  # told once


def test_sessions_routed_never_counts_a_session_statistics_just_expired() -> None:
    """statistics(now) leaves out what is gone by ``now``: a session it expired is not
    counted in ``sessions_routed`` either (its routing ended with the loss it returned)."""
    d = Door()
    d.execute("A", 1, spec("sA", 5), acquire(), now=START)
    d.execute("B", 1, spec("sB", 600), acquire("j"), now=START)
    stats, outs = d.statistics(START + 5)
    assert addresses(outs) == [("A", None)]
    assert (stats.engine.sessions, stats.sessions_routed) == (1, 1)


def test_uptime_counts_from_the_start() -> None:
    """uptime(now) is the seconds since started_at."""
    d = Door()
    assert d.core.uptime(START + 12.5) == 12.5


# --- LockLost routing -----------------------------------------------------------------------


def test_every_owner_that_used_the_session_hears_its_loss_in_order_of_first_use() -> None:
    """A loss goes to each owner that used the session (once each, in the order they first
    used it), and to no other owner."""
    d = Door()
    d.execute("B", 1, spec("sX", 5), PING, now=START)
    d.execute("A", 1, spec("sX", 5), acquire(), now=START)
    d.execute("B", 2, spec("sX", 5), acquire("j"), now=START)
    d.execute("C", 1, spec("sX", 5), PING, now=START)
    d.execute("D", 1, spec("other", 600), PING, now=START)
    outs = d.advance(START + 5)
    assert addresses(outs) == [("B", None), ("A", None), ("C", None)]
    assert len({p for _, p in outs}) == 1  # the same event for each


def test_an_owner_registered_after_an_expire_and_recreate_does_not_hear_the_old_loss() -> None:
    """B's call expires A's session and re-creates it under the same id: A hears the old
    session's loss, B does not; the new session's loss later reaches B only."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sX", 5), acquire(), now=START))
    outs = d.execute("B", 1, spec("sX", 5), acquire("j"), now=START + 10)
    assert addresses(outs) == [("A", None), ("B", 1)]
    assert outs[0][1] == lost("sX", EXPIRED, (NS, "L", "k", fence))
    new_fence = fence_of(outs)
    outs = d.advance(START + 15)
    assert outs == [(("B", None), lost("sX", EXPIRED, (NS, "L", "j", new_fence)))]


def test_a_ttl_loss_keeps_the_routing_an_expiry_ends_it() -> None:
    """An entry's TTL running out is told to every owner of the session, and they stay its
    owners: its expiry is told to them again. After the expiry the routing is gone: the id's
    next session is heard of only by its own owners."""
    d = Door()
    fence = fence_of(d.execute("A", 1, spec("sX", 10), acquire(ttl=2), now=START))
    d.execute("B", 1, spec("sX", 10), acquire("j"), now=START)
    outs = d.advance(START + 2)
    assert addresses(outs) == [("A", None), ("B", None)]
    assert outs[0][1] == lost("sX", TTL, (NS, "L", "k", fence))
    assert addresses(d.advance(START + 10)) == [("A", None), ("B", None)]
    assert d.core.statistics(START + 10, trust=1.0)[0].sessions_routed == 0
    d.execute("C", 1, spec("sX", 5), PING, now=START + 11)
    assert addresses(d.advance(START + 16)) == [("C", None)]


def test_a_call_that_created_nothing_registers_no_owner() -> None:
    """A call refused before its session exists (MinimumRequirements) does not make its
    owner a user of the session: the session's later loss is not sent to it."""
    d = Door()
    demanding = tx(*acquire().statements, min_trust=0.5)
    refused = only(d.execute("A", 1, spec("sX", 5), demanding, now=START, trust=0.1))[1]
    assert isinstance(refused, TransactionResult)
    assert refused.cause is Cause.MINIMUM_REQUIREMENTS
    d.execute("B", 1, spec("sX", 5), acquire(), now=START + 1)
    assert addresses(d.advance(START + 6)) == [("B", None)]


# --- ownership (authenticated) --------------------------------------------------------------


def test_another_principals_execute_on_an_owned_session_is_refused_and_changes_nothing() -> None:
    """With ``authenticated``, a session belongs to the first principal that used it; another
    principal's execute on it is answered SESSION_CONFLICT: the transaction does not run, the
    session is not touched (its expiry stays) and the refused owner is not routed to it."""
    d = Door(authenticated=True)
    d.execute("A", 1, spec("sX", 5), acquire(), now=START, principal="p1")
    address, payload = only(
        d.execute("B", 1, spec("sX", 5), release(), now=START + 1, principal="p2")
    )
    assert address == ("B", 1)
    assert refusal(payload).code is ErrorCode.SESSION_CONFLICT
    assert d.core.engine.session_valid_until("sX") == 5.0
    assert d.core.engine.entry_count == 1
    # the same principal through another owner is welcome
    assert granted(only(d.execute("C", 1, "sX", acquire("j"), now=START, principal="p1"))[1])
    assert addresses(d.advance(START + 5)) == [("A", None), ("C", None)]


def test_another_principals_end_of_an_owned_session_is_refused_and_changes_nothing() -> None:
    """With ``authenticated``, another (non-admin) principal's end of an owned session is
    answered FORBIDDEN (issue 16): the session and its entries stay; its owner can still end
    it."""
    d = Door(authenticated=True)
    d.execute("A", 1, "sX", acquire(), now=START, principal="p1")
    address, payload = only(d.end_session("B", 1, "sX", now=START + 1, principal="p2"))
    assert address == ("B", 1)
    assert refusal(payload).code is ErrorCode.FORBIDDEN
    assert "sX" in d.core.engine.sessions
    assert d.core.engine.entry_count == 1
    assert d.end_session("A", 2, "sX", now=START + 1, principal="p1") == [
        (("A", 2), SessionEnded(True))
    ]


def test_ownership_ends_with_the_session_and_losses_follow_the_principal() -> None:
    """Once p1's session expired, p2 may re-create the id: p1's owner hears the old loss, p2's
    owner only the new session's; unauthenticated owners of the same ids behave alike."""
    d = Door(authenticated=True)
    fence = fence_of(d.execute("A", 1, spec("sX", 5), acquire(), now=START, principal="p1"))
    outs = d.execute("B", 1, spec("sX", 5), acquire("j"), now=START + 10, principal="p2")
    assert addresses(outs) == [("A", None), ("B", 1)]
    assert outs[0][1] == lost("sX", EXPIRED, (NS, "L", "k", fence))
    assert d.core.engine.session_tag("sX") == "p2"
    # p1 is now the other principal
    assert refusal(
        only(d.execute("A", 2, spec("sX", 5), PING, now=START + 11, principal="p1"))[1]
    ).code is (ErrorCode.SESSION_CONFLICT)
    assert addresses(d.advance(START + 15)) == [("B", None)]


# --- found while writing these: the door's calls that expire but do not settle ---------------


def test_end_of_a_session_that_expired_within_the_call_tells_every_owner() -> None:
    """A and B used sX; sX's max age passed but nothing expired it yet. A's end finds it
    expired: the loss is a loss of every owner, A included (as when an advance ran first),
    then A gets SessionEnded(False)."""
    d = Door()
    d.execute("A", 1, spec("sX", 5), acquire(), now=START)
    d.execute("B", 1, spec("sX", 5), PING, now=START)
    outs = d.end_session("A", 2, "sX", now=START + 10)
    assert addresses(outs) == [("A", None), ("B", None), ("A", 2)]
    assert outs[2][1] == SessionEnded(False)


def _conflict_call(d: Door) -> list[Output]:
    return d.execute("C", 1, spec("sB", 600), acquire("z"), now=START + 10, principal="p2")


def _end_unknown_call(d: Door) -> list[Output]:
    return d.end_session("C", 1, "nope", now=START + 10, principal="p2")


def _statistics_call(d: Door) -> list[Output]:
    return d.statistics(START + 10)[1]


@pytest.mark.parametrize(
    "call",
    [_conflict_call, _end_unknown_call, _statistics_call],
    ids=["conflict-refusal", "end-unknown", "statistics"],
)
def test_a_call_that_expires_a_holder_sends_the_loss_and_the_grant_it_allows(
    call: Callable[[Door], list[Output]],
) -> None:
    """A's session expired (nothing swept it); a call that expires it must send A's loss and
    grant the parked B in that call, as an execute or an advance does. Otherwise B is
    answered only at the next call, and by a timeout if that is its deadline."""
    d = Door(authenticated=True)
    d.execute("A", 1, spec("sA", 5), acquire(), now=START, principal="p1")
    d.execute("B", 1, spec("sB", 600), acquire(), now=START + 1, wait=100, principal="p1")
    outs = call(d)
    assert ("A", None) in addresses(outs)
    assert [granted(p) for a, p in outs if a == ("B", 1)] == [True]
