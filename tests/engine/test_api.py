"""The engine's public surface: statistics, change tracking, uptime, container clean-up on
session end, and the package's exports."""

from __future__ import annotations

import lockserver.engine as engine_pkg
from lockserver.engine import Engine, EngineStatistics
from lockserver.engine._store import ENTRY_BASE, SESSION_BASE
from protocol import (
    ELEMENT_SIZE,
    FALSE,
    Assert,
    DeleteVar,
    SessionSpec,
    SetVar,
)

from ._helpers import START, dump, holders, make_engine, run


def test_package_exports() -> None:
    """lockserver.engine exports exactly its public names."""
    assert sorted(engine_pkg.__all__) == sorted(
        [
            "BigTable",
            "BusyTable",
            "CoreStatistics",
            "Door",
            "Engine",
            "EngineError",
            "EngineLimits",
            "EngineStatistics",
            "Listed",
            "LockCore",
            "Output",
            "SessionsListing",
            "ShardedDict",
            "Visibility",
            "VisibleCounts",
            "same_value",
            "WaitLimits",
            "WaitQueue",
            "WaitStatistics",
            "dependencies",
        ]
    )
    for name in engine_pkg.__all__:
        if name in ("Output", "Listed"):  # type aliases: see LockCore
            continue
        assert getattr(engine_pkg, name).__module__.startswith("lockserver.engine")


def test_statistics_snapshot() -> None:
    """statistics(now) reports uptime, namespace / table / entry / session counts, the fence,
    the number of transactions and outcomes by name, and expiry counters."""
    engine = make_engine(fence_epoch=40)
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("U", "y", 1)))
    run(engine, "b", Assert(SetVar("T", "x", 1, allow_duplicates=True)), ns="Other")
    run(engine, "b", Assert(FALSE))
    run(engine, "c", min_trust=1, trust=0)
    run(engine, SessionSpec("d", max_age=1), now=START + 1)
    stats = engine.statistics(START + 2.5)
    assert stats == EngineStatistics(
        uptime=2.5,
        namespaces=2,
        tables=3,
        entries=3,
        sessions=2,
        fence=42,
        transactions=5,
        by_outcome={
            "TransactionOK": 3,
            "TransactionError:Statement": 1,
            "TransactionError:MinimumRequirements": 1,
        },
        sessions_expired=1,
        entries_expired=0,
        retries_answered=0,
        # three entries of 2-character names and the value 1; two live 1-character ids
        stored_bytes=3 * (ENTRY_BASE + 2 + ELEMENT_SIZE) + 2 * (SESSION_BASE + 1),
    )
    wire = stats.to_wire()
    assert wire["entries"] == 3
    assert wire["by_outcome"]["TransactionOK"] == 3
    assert set(wire) == {
        "uptime",
        "namespaces",
        "tables",
        "entries",
        "sessions",
        "fence",
        "transactions",
        "by_outcome",
        "sessions_expired",
        "entries_expired",
        "retries_answered",
        "stored_bytes",
    }


def test_fresh_engine_statistics() -> None:
    """A fresh engine reports zeros, the epoch as fence and no outcomes."""
    stats = make_engine(fence_epoch=5).statistics(START)
    assert (stats.entries, stats.sessions, stats.fence, stats.transactions) == (0, 0, 5, 0)
    assert stats.by_outcome == {}


def test_uptime_is_never_negative() -> None:
    """uptime(now) is seconds since started_at, clamped at zero."""
    engine = make_engine()
    assert engine.uptime(START + 3) == 3
    assert engine.uptime(START - 3) == 0.0


def test_change_tracking_collects_changed_variables() -> None:
    """With track_changes, committed sets and deletes, expiries and session ends record their
    (namespace, table, var); rolled-back and read-only transactions record nothing; draining
    empties the set."""
    engine = make_engine(track_changes=True)
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1, ttl=5)))
    assert engine.drain_changes() == {("Clinical", "T", "x"), ("Clinical", "T", "y")}
    assert engine.drain_changes() == set()
    run(engine, "a", Assert(SetVar("T", "z", 1)), Assert(FALSE))
    run(engine, "b", Assert(SetVar("T", "x", 2)))  # fails: held
    assert engine.drain_changes() == set()
    engine.sweep(START + 5)
    assert engine.drain_changes() == {("Clinical", "T", "y")}
    run(engine, "a", Assert(DeleteVar("T", "x")), ns="Clinical")
    assert engine.drain_changes() == {("Clinical", "T", "x")}
    run(engine, "b", Assert(SetVar("U", "w", 1)))
    engine.drain_changes()
    engine.end_session("b", now=START + 6)
    assert engine.drain_changes() == {("Clinical", "U", "w")}


def test_change_tracking_off_by_default() -> None:
    """Without track_changes nothing is collected."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "x", 1)))
    engine.end_session("a", now=START)
    assert engine.drain_changes() == set()


def test_session_end_drops_only_the_containers_it_empties() -> None:
    """Ending a session removes its entries wherever they stand in their lists, drops the
    variables, tables and namespaces left empty, and keeps those still in use."""
    engine = make_engine()
    run(engine, "b", Assert(SetVar("T", "x", "b")), Assert(SetVar("Keep", "k", "b")))
    run(
        engine,
        "a",
        Assert(SetVar("T", "x", "a", allow_duplicates=True)),  # second in its list
        Assert(SetVar("T", "only_a", "a")),
        Assert(SetVar("Gone", "g", "a")),  # a table of its own
    )
    run(engine, "a", Assert(SetVar("G", "g", "a")), ns="Solo")  # a namespace of its own
    engine.end_session("a", now=START)
    assert dump(engine).keys() == {("Clinical", "T", "x"), ("Clinical", "Keep", "k")}
    assert holders(engine, "T", "x") == [("b", "b")]
    assert set(engine.namespaces) == {"Clinical"}


def test_engine_defaults() -> None:
    """An engine made with only started_at has the default limits, fence 0 and no host."""
    engine = Engine(started_at=0.0)
    assert engine.host == ""
    assert engine.fence == 0
    assert engine.limits.max_sessions == 1_000_000
    assert engine.limits.max_entries == 10_000_000
    assert engine.limits.max_entries_per_session == 100_000
