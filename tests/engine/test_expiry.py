"""Entry TTLs: expired entries are invisible at once, reclaimed by the heap, reported as
LockLost(TTL); a replaced entry's old TTL never removes its successor (SEMANTICS.md
"Expiry of entries")."""

from __future__ import annotations

import pytest

from protocol import (
    Assert,
    DeleteVar,
    Exists,
    LockLost,
    LostReason,
    SelectOperatorValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
)

from ._helpers import START, dump, entries, holders, make_engine, run

LONG = SessionSpec("a", max_age=10_000)
PROBE = SelectOperatorValue("held", Exists("T", "k"))


def test_ttl_entry_is_invisible_exactly_at_its_expiry() -> None:
    """Decision pinned: an entry with a TTL expires when now >= set_at + ttl. Just before it is
    visible; at that instant the next transaction neither sees it nor is blocked by it."""
    engine = make_engine()
    r = run(engine, LONG, Assert(SetVar("T", "k", 1, ttl=5)), now=START + 1)
    assert entries(engine, "T", "k")[0][5] == START + 6
    assert run(engine, "b", PROBE, now=START + 5.999).data == (("held", True),)
    result = run(engine, "b", PROBE, Assert(SetVar("T", "k", 2)), now=START + 6)
    assert result.ok
    assert result.data == (("held", False),)
    assert holders(engine, "T", "k") == [("b", 2)]
    assert engine.drain_lost() == [
        LockLost("a", LostReason.TTL, (("Clinical", "T", "k", r.fence),))
    ]
    assert "a" in engine.sessions
    assert engine.sessions["a"].keys == {}


def test_ttl_expiry_is_counted_and_reported_by_sweep() -> None:
    """sweep removes the entries due and returns how many; statistics counts expired entries
    and the entry count drops."""
    engine = make_engine()
    run(
        engine,
        LONG,
        Assert(SetVar("T", "k", 1, ttl=1)),
        Assert(SetVar("T", "j", 1, ttl=2)),
        Assert(SetVar("T", "i", 1, ttl=3)),
    )
    assert engine.sweep(START + 0.5) == 0
    assert engine.sweep(START + 2) == 2
    assert engine.entry_count == 1
    stats = engine.statistics(START + 2)
    assert stats.entries_expired == 2
    assert stats.entries == 1
    assert engine.sweep(START + 3) == 1
    assert engine.statistics(START + 3).entries_expired == 3
    assert dump(engine) == {}


def test_replaced_entrys_old_ttl_does_not_remove_the_new_entry() -> None:
    """Replacing a TTL entry (allow_duplicates, a later transaction) gives it a new fence; the
    old TTL surfacing from the heap finds a different fence and removes nothing."""
    engine = make_engine()
    run(engine, LONG, Assert(SetVar("T", "k", 1, ttl=5)))
    run(engine, LONG, Assert(SetVar("T", "k", 2, allow_duplicates=True)), now=START + 1)
    assert engine.sweep(START + 100) == 0
    assert holders(engine, "T", "k") == [("a", 2)]
    assert engine.drain_lost() == []


def test_replaced_entrys_old_ttl_is_ignored_and_the_new_ttl_applies() -> None:
    """A replacement with a longer TTL lives until its own expiry."""
    engine = make_engine()
    run(engine, LONG, Assert(SetVar("T", "k", 1, ttl=5)))
    r = run(engine, LONG, Assert(SetVar("T", "k", 2, ttl=10, allow_duplicates=True)), now=START + 1)
    assert engine.sweep(START + 5) == 0
    assert engine.sweep(START + 11) == 1
    assert engine.drain_lost() == [
        LockLost("a", LostReason.TTL, (("Clinical", "T", "k", r.fence),))
    ]


def test_ttl_replaced_in_the_same_transaction_by_no_ttl() -> None:
    """Within one transaction a TTL SetVar replaced by a SetVar without TTL leaves an entry
    that never expires (both share the commit fence; the queued expiry must not remove it)."""
    engine = make_engine()
    run(
        engine,
        LONG,
        Assert(SetVar("T", "k", 1, ttl=5)),
        Assert(SetVar("T", "k", 2, allow_duplicates=True)),
    )
    assert entries(engine, "T", "k")[0][5] is None
    assert engine.sweep(START + 5) == 0
    assert holders(engine, "T", "k") == [("a", 2)]
    assert engine.drain_lost() == []


def test_ttl_replaced_in_the_same_transaction_by_a_longer_ttl() -> None:
    """Within one transaction the last SetVar's TTL is the entry's TTL."""
    engine = make_engine()
    run(
        engine,
        LONG,
        Assert(SetVar("T", "k", 1, ttl=5)),
        Assert(SetVar("T", "k", 2, ttl=10, allow_duplicates=True)),
    )
    assert engine.sweep(START + 5) == 0
    assert holders(engine, "T", "k") == [("a", 2)]
    assert engine.sweep(START + 10) == 1


def test_ttl_entry_deleted_then_reset_without_ttl_in_one_transaction() -> None:
    """Delete and re-set in one transaction: the new entry (no TTL) survives the queued one."""
    engine = make_engine()
    run(
        engine,
        LONG,
        Assert(SetVar("T", "k", 1, ttl=5)),
        Assert(DeleteVar("T", "k")),
        Assert(SetVar("T", "k", 2)),
    )
    assert engine.sweep(START + 6) == 0
    assert holders(engine, "T", "k") == [("a", 2)]


@pytest.mark.parametrize(
    "cleanup",
    ["namespace", "table", "var", "other-holder", "session-ended"],
)
def test_ttl_of_an_entry_already_gone_does_nothing(cleanup: str) -> None:
    """When the TTL entry was removed before its expiry (deleted, its session ended; possibly
    with its variable, table or namespace gone, or another session now holding the variable),
    the queued expiry removes nothing and reports nothing."""
    engine = make_engine()
    run(engine, LONG, Assert(SetVar("T", "k", 1, ttl=5)))
    if cleanup == "table":
        run(engine, "b", Assert(SetVar("Other", "k", 1)))
    if cleanup == "var":
        run(engine, "b", Assert(SetVar("T", "j", 1)))
    if cleanup == "other-holder":
        run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    if cleanup == "session-ended":
        engine.end_session("a", now=START + 1)
    else:
        run(engine, LONG, Assert(DeleteVar("T", "k")), now=START + 1)
    before = dump(engine)
    assert engine.sweep(START + 5) == 0
    assert dump(engine) == before
    assert engine.drain_lost() == []
    assert engine.statistics(START + 5).entries_expired == 0


def test_ttl_entry_among_duplicates_leaves_the_others() -> None:
    """A TTL entry expiring between other holders' entries leaves them in order."""
    engine = make_engine()
    run(engine, "b", Assert(SetVar("T", "k", "b", allow_duplicates=True)))
    run(engine, LONG, Assert(SetVar("T", "k", "a", ttl=1, allow_duplicates=True)))
    run(engine, "c", Assert(SetVar("T", "k", "c", allow_duplicates=True)))
    engine.sweep(START + 1)
    assert holders(engine, "T", "k") == [("b", "b"), ("c", "c")]


def test_select_var_value_reports_expiry_as_uptime() -> None:
    """A TTL entry's record carries expires_at as a server uptime."""
    engine = make_engine()
    run(engine, LONG, Assert(SetVar("T", "k", 1, ttl=2.5)), now=START + 4)
    result = run(engine, "b", SelectVarValue("r", "T", "k"), now=START + 5)
    assert result.data[0][1]["expires_at"] == 6.5


def test_entry_ttl_before_session_expiry_is_reported_as_ttl() -> None:
    """Expiries are processed in time order: an entry whose TTL ran out before its session
    expired is reported as TTL, then the session as EXPIRED without it, even when one late
    sweep handles both."""
    engine = make_engine()
    r = run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1, ttl=5)))
    assert engine.sweep(START + 20) == 1
    assert engine.drain_lost() == [
        LockLost("a", LostReason.TTL, (("Clinical", "T", "k", r.fence),)),
        LockLost("a", LostReason.EXPIRED, ()),
    ]


def test_session_expiry_before_entry_ttl_is_reported_as_expired() -> None:
    """A session that expired before its entry's TTL loses the entry with the session."""
    engine = make_engine()
    r = run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1, ttl=15)))
    assert engine.sweep(START + 20) == 1
    assert engine.drain_lost() == [
        LockLost("a", LostReason.EXPIRED, (("Clinical", "T", "k", r.fence),)),
    ]
    assert engine.statistics(START + 20).entries_expired == 0


def test_session_expiry_and_ttl_at_the_same_instant() -> None:
    """When a session's deadline and its entry's TTL fall on the same instant the session goes
    first and lists the entry (ties favour the session)."""
    engine = make_engine()
    r = run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1, ttl=10)))
    engine.sweep(START + 10)
    assert engine.drain_lost() == [
        LockLost("a", LostReason.EXPIRED, (("Clinical", "T", "k", r.fence),)),
    ]


def test_next_deadline_reports_the_earliest_ttl_or_session() -> None:
    """next_deadline is the earliest queued expiry of either kind, or None when none."""
    engine = make_engine()
    assert engine.next_deadline() is None
    run(engine, SessionSpec("a", max_age=30), Assert(SetVar("T", "k", 1, ttl=7)))
    assert engine.next_deadline() == START + 7
    engine.sweep(START + 7)
    assert engine.next_deadline() == START + 30


def test_ttl_before_a_moved_session_deadline_is_processed_first() -> None:
    """A touched session's stale heap deadline must not let the session jump ahead of an entry
    TTL that falls before its real deadline: the TTL is reported first, then the session."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=3), Assert(SetVar("T", "k", 1)))  # queued at +3
    r = run(
        engine, "a", Assert(SetVar("T", "k", 2, ttl=2.5, allow_duplicates=True)), now=START + 0.5
    )  # entry expires at +3, session now at +3.5
    assert engine.sweep(START + 3.5) == 1
    assert engine.drain_lost() == [
        LockLost("a", LostReason.TTL, (("Clinical", "T", "k", r.fence),)),
        LockLost("a", LostReason.EXPIRED, ()),
    ]
    assert engine.statistics(START + 3.5).entries_expired == 1
