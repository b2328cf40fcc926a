"""The QoS gate (minimum uptime / trust), fences, and the memory limits (SEMANTICS.md
"Reliability contract"; issue: fences and EngineLimits)."""

from __future__ import annotations

import pytest

from lockserver.engine import EngineError, EngineLimits
from protocol import (
    FALSE,
    Abort,
    AnywayContinueAfter,
    Assert,
    Cause,
    DeleteVar,
    ErrorCode,
    Exists,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Status,
)

from ._helpers import START, dump, holders, make_engine, run, session_keys

# --- QoS gate -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uptime", "trust", "min_uptime", "min_trust"),
    [(5.0, 1.0, 10.0, 0.0), (9.75, 1.0, 10.0, 0.0), (100.0, 0.49, 0.0, 0.5), (0.0, 0.0, 1, 0.1)],
)
def test_gate_refuses_below_minimum_uptime_or_trust(
    uptime: float, trust: float, min_uptime: float, min_trust: float
) -> None:
    """uptime < min_uptime or trust < min_trust: TransactionError / MinimumRequirements, no
    data, no path, no valid_until, the current fence; uptime and trust echoed; the statements
    did not run and the session was not created."""
    engine = make_engine(fence_epoch=3)
    result = run(
        engine,
        "s",
        Assert(SetVar("T", "k", 1)),
        SelectVarValue("x", "T", "k"),
        now=START + uptime,
        trust=trust,
        min_uptime=min_uptime,
        min_trust=min_trust,
        transaction_id="gated",
    )
    assert result.status is Status.TRANSACTION_ERROR
    assert result.cause is Cause.MINIMUM_REQUIREMENTS
    assert result.failed_statement is None
    assert result.data == ()
    assert result.valid_until is None
    assert result.fence == 3
    assert (result.uptime, result.trust) == (uptime, trust)
    assert (result.transaction_id, result.host) == ("gated", "test-host")
    assert engine.sessions == {}
    assert dump(engine) == {}
    stats = engine.statistics(START + uptime)
    assert stats.by_outcome == {"TransactionError:MinimumRequirements": 1}
    assert stats.sessions == 0


def test_gate_accepts_exactly_the_minimum() -> None:
    """uptime == min_uptime and trust == min_trust pass the gate."""
    engine = make_engine()
    result = run(engine, "s", now=START + 10, trust=0.5, min_uptime=10, min_trust=0.5)
    assert result.ok


def test_gate_refusal_does_not_touch_an_existing_session() -> None:
    """A refused call neither refreshes the caller's session nor changes its entries."""
    engine = make_engine()
    run(engine, SessionSpec("s", max_age=10), Assert(SetVar("T", "k", 1)))
    refused = run(engine, "s", Assert(DeleteVar("T", "k")), now=START + 9, min_trust=1, trust=0.9)
    assert refused.cause is Cause.MINIMUM_REQUIREMENTS
    assert engine.sessions["s"].last_touch == START
    assert holders(engine, "T", "k") == [("s", 1)]


def test_gate_makes_a_restarted_server_safe() -> None:
    """A client demanding min_uptime >= the longest session max age is never granted a lock by
    a freshly restarted server that may have forgotten earlier holders."""
    engine = make_engine()
    for t in [0, 30, 59.9]:
        result = run(engine, "s", Assert(SetVar("T", "k", 1)), now=START + t, min_uptime=60.0)
        assert result.cause is Cause.MINIMUM_REQUIREMENTS
    assert run(engine, "s", Assert(SetVar("T", "k", 1)), now=START + 60, min_uptime=60.0).ok


# --- fences -------------------------------------------------------------------------------------


def test_fences_start_from_the_epoch_and_increase_per_changing_commit() -> None:
    """The first changing commit gets fence_epoch + 1, each later one the next integer."""
    engine = make_engine(fence_epoch=1_700_000_000_000_000)
    fences = [
        run(engine, "s", Assert(SetVar("T", f"k{i}", i)), now=START + i).fence for i in range(5)
    ]
    assert fences == [1_700_000_000_000_000 + i for i in range(1, 6)]
    assert engine.statistics(START + 5).fence == fences[-1]


def test_fence_unchanged_by_failed_read_only_and_ping_transactions() -> None:
    """Failed, read-only, ping, refused and no-op (AnywayContinueAfter of a failing change)
    transactions leave the fence alone and report the current one."""
    engine = make_engine()
    base = run(engine, "s", Assert(SetVar("T", "k", 1))).fence
    assert base == 1
    results = [
        run(engine, "s", Assert(SetVar("T", "j", 1)), Abort()),
        run(engine, "s", Assert(Exists("T", "k", ignore_this_session=False))),
        run(engine, "s"),
        run(engine, "s", Assert(SetVar("T", "j", 1)), min_trust=1, trust=0),
        run(engine, "t", AnywayContinueAfter(DeleteVar("T", "k"))),
        run(engine, "t", AnywayContinueAfter(SetVar("T", "k", 2))),
    ]
    assert [r.fence for r in results] == [base] * len(results)
    assert run(engine, "s", Assert(SetVar("T", "j", 1))).fence == base + 1


def test_a_delete_advances_the_fence() -> None:
    """A commit that only deletes also changed data and takes the next fence."""
    engine = make_engine()
    run(engine, "s", Assert(SetVar("T", "k", 1)))
    assert run(engine, "s", Assert(DeleteVar("T", "k"))).fence == 2


def test_entries_carry_the_fence_of_their_commit() -> None:
    """Every entry set by one transaction carries that commit's fence, shown by SelectVarValue;
    a replacement carries the replacing commit's fence."""
    engine = make_engine(fence_epoch=50)
    first = run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    second = run(engine, "a", Assert(SetVar("T", "y", 2, allow_duplicates=True)))
    result = run(
        engine,
        "b",
        SelectVarValue("x", "T", "x"),
        SelectVarValue("y", "T", "y"),
    )
    values = dict(result.data)
    assert (first.fence, second.fence) == (51, 52)
    assert values["x"]["fence"] == 51
    assert values["y"]["fence"] == 52
    assert result.fence == 52


def test_fence_selected_inside_the_changing_transaction_is_its_commit_fence() -> None:
    """An entry read back inside its own transaction already shows the fence it commits at."""
    engine = make_engine(fence_epoch=9)
    result = run(
        engine,
        "a",
        Assert(SetVar("T", "k", 1)),
        SelectVarValue("r", "T", "k", ignore_this_session=False),
    )
    assert result.data[0][1]["fence"] == result.fence == 10


# --- limits -------------------------------------------------------------------------------------


def test_max_sessions_at_and_past_the_bound() -> None:
    """max_sessions=2: the second session is accepted, a third raises EngineError
    TOO_MANY_SESSIONS and changes nothing; existing sessions keep working; after an end a new
    session fits again."""
    engine = make_engine(limits=EngineLimits(max_sessions=2))
    assert run(engine, "a", Assert(SetVar("T", "a", 1))).ok
    assert run(engine, "b").ok
    before = dump(engine)
    with pytest.raises(EngineError) as info:
        run(engine, "c", Assert(SetVar("T", "c", 1)))
    assert info.value.code is ErrorCode.TOO_MANY_SESSIONS
    assert "max_sessions=2" in info.value.message
    assert sorted(engine.sessions) == ["a", "b"]
    assert dump(engine) == before
    assert run(engine, "a", Assert(SetVar("T", "a2", 1))).ok
    engine.end_session("b", now=START)
    assert run(engine, "c").ok


def test_max_entries_per_session_at_and_past_the_bound() -> None:
    """max_entries_per_session=2: two entries fit; a transaction adding a third raises
    TOO_MANY_ENTRIES and rolls back its earlier changes; replacing in place at the bound and
    other sessions are fine."""
    engine = make_engine(limits=EngineLimits(max_entries_per_session=2))
    assert run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1))).ok
    before = dump(engine)
    with pytest.raises(EngineError) as info:
        run(
            engine,
            "a",
            Assert(DeleteVar("T", "x")),
            Assert(SetVar("T", "x", 2)),
            Assert(SetVar("T", "y", 2, allow_duplicates=True)),
            Assert(SetVar("T", "z", 1)),
        )
    assert info.value.code is ErrorCode.TOO_MANY_ENTRIES
    assert "max_entries_per_session=2" in str(info.value)
    assert dump(engine) == before
    assert engine.entry_count == 2
    assert session_keys(engine, "a") == {("Clinical", "T", "x"), ("Clinical", "T", "y")}
    assert run(engine, "a", Assert(SetVar("T", "y", 3, allow_duplicates=True))).ok
    assert run(engine, "b", Assert(SetVar("T", "z", 1))).ok


def test_max_entries_at_and_past_the_bound() -> None:
    """max_entries=3 over all sessions: the third entry fits, a fourth (any session) raises
    TOO_MANY_ENTRIES with nothing changed; after a delete there is room again."""
    engine = make_engine(limits=EngineLimits(max_entries=3))
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    assert run(engine, "b", Assert(SetVar("T", "z", 1))).ok
    before = dump(engine)
    with pytest.raises(EngineError) as info:
        run(
            engine,
            "b",
            Assert(DeleteVar("T", "z")),
            Assert(SetVar("U", "a", 1)),
            Assert(SetVar("U", "b", 1)),
        )
    assert info.value.code is ErrorCode.TOO_MANY_ENTRIES
    assert "max_entries=3" in info.value.message
    assert dump(engine) == before
    assert engine.entry_count == 3
    assert engine.statistics(START).entries == 3
    run(engine, "a", Assert(DeleteVar("T", "x")))
    assert run(engine, "c", Assert(SetVar("U", "a", 1))).ok


def test_limit_error_does_not_create_or_refresh_the_session() -> None:
    """A refused call (EngineError) is not an accepted call: a new session is not left behind
    and an existing session's idle timer is not refreshed."""
    engine = make_engine(limits=EngineLimits(max_entries=1))
    run(engine, SessionSpec("a", max_age=10), Assert(SetVar("T", "x", 1)))
    with pytest.raises(EngineError):
        run(engine, "new", Assert(SetVar("T", "y", 1)), now=START + 1)
    assert sorted(engine.sessions) == ["a"]
    with pytest.raises(EngineError):
        run(engine, "a", Assert(SetVar("T", "y", 1)), now=START + 9)
    assert engine.session_valid_until("a") == 10
    assert engine.statistics(START + 9).transactions == 1
    engine.sweep(START + 10)
    assert engine.sessions == {}
    assert engine.drain_lost()[0].session_id == "a"


def test_limit_error_leaves_the_fence_and_outcomes_alone() -> None:
    """A refused transaction takes no fence and is not counted as a transaction outcome."""
    engine = make_engine(limits=EngineLimits(max_entries=1))
    run(engine, "a", Assert(SetVar("T", "x", 1)))
    with pytest.raises(EngineError):
        run(engine, "a", Assert(SetVar("T", "y", 1)))
    stats = engine.statistics(START)
    assert (stats.fence, stats.transactions) == (1, 1)


@pytest.mark.parametrize("field", ["max_sessions", "max_entries", "max_entries_per_session"])
@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_limits_must_be_positive_integers(field: str, bad: object) -> None:
    """EngineLimits refuses a bound that is not an integer >= 1."""
    with pytest.raises(ValueError, match=field):
        EngineLimits(**{field: bad})  # type: ignore[arg-type]


def test_failed_statement_after_a_change_keeps_counts() -> None:
    """A Statement failure is an outcome, not a refusal: counted, session touched, nothing
    stored."""
    engine = make_engine()
    result = run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(FALSE))
    assert result.cause is Cause.STATEMENT
    stats = engine.statistics(START)
    assert stats.by_outcome == {"TransactionError:Statement": 1}
    assert (stats.entries, stats.sessions) == (0, 1)
