"""Sessions: creation on first use, idle max age, touches, atomic expiry and ending, LockLost
events, reuse of ended ids (SEMANTICS.md "Sessions")."""

from __future__ import annotations

from protocol import (
    FALSE,
    Assert,
    Exists,
    LockLost,
    LostReason,
    SelectOperatorValue,
    SessionSpec,
    SetVar,
)

from ._helpers import START, dump, holders, make_engine, run


def lost(
    engine_lost: list[LockLost],
) -> list[tuple[str, LostReason, set[tuple[str, str, str, int]]]]:
    """Events as (session, reason, set of lost entries) for order-free comparison of entries."""
    return [(e.session_id, e.reason, set(e.entries)) for e in engine_lost]


def test_first_use_creates_the_session_with_its_spec() -> None:
    """The first call with an id creates the session with that call's description and max age."""
    engine = make_engine()
    run(engine, SessionSpec("s", max_age=12.5, description="first"), now=START + 1)
    s = engine.sessions["s"]
    assert (s.session_id, s.description, s.max_age, s.last_touch) == ("s", "first", 12.5, START + 1)
    assert engine.session_valid_until("s") == 13.5


def test_first_seen_description_and_max_age_are_kept() -> None:
    """Later calls with another description or max age do not change the session's."""
    engine = make_engine()
    run(engine, SessionSpec("s", max_age=10, description="first"))
    run(engine, SessionSpec("s", max_age=100, description="second"), now=START + 5)
    s = engine.sessions["s"]
    assert (s.description, s.max_age) == ("first", 10)
    assert engine.session_valid_until("s") == 15


def test_session_expires_after_max_age_idle_exactly_at_the_deadline() -> None:
    """Max age is idle time. Decision pinned: a session is expired when now >= last touch +
    max age; just before that it and its entries are alive and visible to others."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1)))
    probe = SelectOperatorValue("held", Exists("T", "k"))
    assert run(engine, "b", probe, now=START + 9.999).data == (("held", True),)
    assert "a" in engine.sessions
    assert run(engine, "b", probe, now=START + 10).data == (("held", False),)
    assert "a" not in engine.sessions
    assert engine.entry_count == 0


def test_default_max_age_is_sixty_seconds() -> None:
    """Without an explicit max age a session lives 60 s idle."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    engine.sweep(START + 59.5)
    assert "a" in engine.sessions
    engine.sweep(START + 60)
    assert "a" not in engine.sessions


def test_every_accepted_call_refreshes_the_idle_timer() -> None:
    """OK transactions, pings and Statement failures all refresh the idle timer."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1)))
    run(engine, "a", now=START + 8)  # ping
    engine.sweep(START + 17)
    assert "a" in engine.sessions
    failed = run(engine, "a", Assert(FALSE), now=START + 17)  # a Statement failure
    assert not failed.ok
    assert failed.valid_until == 27
    engine.sweep(START + 26.5)
    assert holders(engine, "T", "k") == [("a", 1)]
    engine.sweep(START + 27)
    assert engine.sessions == {}
    assert dump(engine) == {}


def test_minimum_requirements_refusal_does_not_refresh_or_create() -> None:
    """A call refused for MinimumRequirements neither creates its session nor refreshes an
    existing session's idle timer."""
    engine = make_engine()
    refused = run(engine, "new", Assert(SetVar("T", "k", 1)), min_trust=0.9, trust=0.5)
    assert refused.valid_until is None
    assert engine.sessions == {}
    run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "k", 1)))
    run(engine, "a", now=START + 9, min_uptime=1000)
    assert engine.session_valid_until("a") == 10
    engine.sweep(START + 10)
    assert engine.sessions == {}


def test_expiry_removes_all_entries_at_once_and_queues_lock_lost() -> None:
    """When a session expires every entry it owns (in any namespace) goes at once, other
    sessions' entries stay, and one LockLost(EXPIRED) lists (namespace, table, var, fence)."""
    engine = make_engine()
    a = SessionSpec("a", max_age=5)
    r1 = run(engine, a, Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    r2 = run(engine, a, Assert(SetVar("U", "z", 1)), ns="Other", now=START + 1)
    run(engine, "b", Assert(SetVar("T", "x", 2, allow_duplicates=True)), now=START + 1)
    assert engine.drain_lost() == []
    assert engine.sweep(START + 6) == 3
    assert holders(engine, "T", "x") == [("b", 2)]
    assert set(dump(engine)) == {("Clinical", "T", "x")}
    assert lost(engine.drain_lost()) == [
        (
            "a",
            LostReason.EXPIRED,
            {
                ("Clinical", "T", "x", r1.fence),
                ("Clinical", "T", "y", r1.fence),
                ("Other", "U", "z", r2.fence),
            },
        )
    ]
    assert engine.drain_lost() == []
    assert engine.entry_count == 1
    assert engine.statistics(START + 6).sessions_expired == 1


def test_expiry_of_an_empty_session_is_reported_with_no_entries() -> None:
    """A session that held nothing still expires and queues LockLost(EXPIRED) with no entries
    (the holder learns the session itself is gone)."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=1))
    assert engine.sweep(START + 1) == 0
    assert engine.drain_lost() == [LockLost("a", LostReason.EXPIRED, ())]


def test_end_session_removes_its_entries_and_returns_true() -> None:
    """end_session removes every entry the session owns and returns True; without notify no
    event is queued."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    run(engine, "b", Assert(SetVar("T", "x", 2, allow_duplicates=True)))
    assert engine.end_session("a", now=START + 1) is True
    assert holders(engine, "T", "x") == [("b", 2)]
    assert holders(engine, "T", "y") == []
    assert "a" not in engine.sessions
    assert engine.drain_lost() == []
    assert engine.entry_count == 1


def test_end_session_unknown_id_returns_false() -> None:
    """Ending an unknown session (never seen, or already ended) returns False."""
    engine = make_engine()
    assert engine.end_session("nobody", now=START) is False
    run(engine, "a")
    assert engine.end_session("a", now=START) is True
    assert engine.end_session("a", now=START) is False


def test_end_session_of_an_already_expired_session_returns_false() -> None:
    """A session past its max age is expired before end_session looks: False, and the
    LockLost(EXPIRED) event is queued instead of ENDED."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=5), Assert(SetVar("T", "k", 1)))
    assert engine.end_session("a", now=START + 5, notify=True) is False
    events = engine.drain_lost()
    assert [(e.session_id, e.reason) for e in events] == [("a", LostReason.EXPIRED)]


def test_end_session_notify_queues_lock_lost_ended() -> None:
    """end_session(notify=True) queues LockLost(ENDED) listing the removed entries."""
    engine = make_engine()
    r = run(engine, "a", Assert(SetVar("T", "x", 1)))
    assert engine.end_session("a", now=START + 1, notify=True)
    assert engine.drain_lost() == [
        LockLost("a", LostReason.ENDED, (("Clinical", "T", "x", r.fence),))
    ]


def test_reusing_an_ended_id_starts_a_new_empty_session() -> None:
    """After an end, the same id creates a new session: empty, with the new call's spec, and
    the old session's heap deadline does not expire the new one."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=5, description="old"), Assert(SetVar("T", "k", 1)))
    engine.end_session("a", now=START + 1)
    run(engine, SessionSpec("a", max_age=50, description="new"), now=START + 2)
    s = engine.sessions["a"]
    assert (s.description, s.max_age, dict(s.keys)) == ("new", 50, {})
    assert holders(engine, "T", "k") == []
    engine.sweep(START + 10)
    assert "a" in engine.sessions
    assert engine.drain_lost() == []


def test_reusing_an_expired_id_starts_a_new_empty_session() -> None:
    """A call with the id of an expired session creates a fresh session (its old entries are
    gone and not visible to the new one)."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=5), Assert(SetVar("T", "k", 1)))
    result = run(
        engine,
        "a",
        SelectOperatorValue("own", Exists("T", "k", ignore_this_session=False)),
        now=START + 7,
    )
    assert result.data == (("own", False),)
    assert engine.sessions["a"].max_age == 60
    assert result.valid_until == 67


def test_touch_moves_the_deadline_lazily() -> None:
    """A touched session survives its first queued deadline (re-queued lazily) and expires at
    the moved one; next_deadline may report the stale earlier time."""
    engine = make_engine()
    run(engine, SessionSpec("a", max_age=10))
    run(engine, "a", now=START + 6)
    assert engine.next_deadline() == START + 10
    assert engine.sweep(START + 10) == 0
    assert "a" in engine.sessions
    assert engine.next_deadline() == START + 16
    engine.sweep(START + 16)
    assert engine.sessions == {}
    assert engine.next_deadline() is None


def test_session_valid_until_unknown_is_none() -> None:
    """session_valid_until is None for an unknown session."""
    assert make_engine().session_valid_until("x") is None


def test_many_sessions_expire_in_deadline_order() -> None:
    """Sessions with different max ages expire each at its own deadline."""
    engine = make_engine()
    for i, age in enumerate([3, 1, 2]):
        run(engine, SessionSpec(f"s{i}", max_age=age), Assert(SetVar("T", f"k{i}", i)))
    engine.sweep(START + 1)
    assert sorted(engine.sessions) == ["s0", "s2"]
    engine.sweep(START + 2.5)
    assert sorted(engine.sessions) == ["s0"]
    engine.sweep(START + 3)
    assert engine.sessions == {}
    assert [e.session_id for e in engine.drain_lost()] == ["s1", "s2", "s0"]


def test_a_session_tag_is_set_once_and_ends_with_the_session() -> None:
    """tag_session labels a live session once (the shell's owner); an unknown session cannot be
    tagged; the tag is gone when the session ends or expires, and a new session with the same
    id starts untagged."""
    engine = make_engine()
    engine.tag_session("s", "alice")  # no such session yet: nothing to tag
    run(engine, SessionSpec("s", max_age=10))
    assert engine.session_tag("s") is None
    engine.tag_session("s", "alice")
    engine.tag_session("s", "bob")  # the first tag stays
    assert engine.session_tag("s") == "alice"
    assert engine.end_session("s", now=START)
    assert engine.session_tag("s") is None
    run(engine, SessionSpec("s", max_age=10), now=START + 1)
    assert engine.session_tag("s") is None
    engine.tag_session("s", "bob")
    assert engine.session_tag("s") == "bob"
    assert engine.session_tag("s", START + 12) is None  # due: expired first, gone with its tag
    assert "s" not in engine.sessions
