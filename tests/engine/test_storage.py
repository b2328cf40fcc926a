"""How held entries are stored (lockserver/engine/_store.py, its header): a variable held by
one entry maps to that Entry tuple, by two or more to a list in order, and never to a list of
fewer than two; sessions index their entries by (namespace, table) with a count. The shape
changes (1 -> 2 -> 1 -> 0 entries) and every way an entry leaves (DeleteVar, rollback, session
end, expiry, entry TTL) must keep entry order, ownership and counts exactly as before."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from lockserver.engine import Engine, EngineError, EngineLimits
from protocol import (
    Abort,
    AnywayContinueAfter,
    Assert,
    CountBelow,
    DeleteVar,
    ErrorCode,
    Exists,
    LostReason,
    SelectVarValue,
    SessionSpec,
    SetVar,
)

from ._helpers import NS, START, dump, entries, holders, make_engine, run, session_keys


def slot(engine: Engine, table: str, var: str, ns: str = NS) -> Any:
    """The raw stored slot of one variable (None when it has no entry)."""
    return engine.namespaces.get(ns, {}).get(table, {}).get(var)


def share(table: str, var: str, value: Any) -> Assert:
    """A reader's entry: SetVar with allow_duplicates."""
    return Assert(SetVar(table, var, value, allow_duplicates=True))


def release(table: str, var: str) -> AnywayContinueAfter:
    return AnywayContinueAfter(DeleteVar(table, var))


def test_a_lone_entry_is_stored_bare_and_two_in_a_list() -> None:
    """One holder: the slot is the Entry tuple; a second holder makes it a list of both in
    arrival order; when one leaves the other is stored bare again; the last leaving drops the
    variable."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    assert type(slot(engine, "T", "k")) is tuple
    run(engine, "b", share("T", "k", 2))
    assert type(slot(engine, "T", "k")) is list
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]
    run(engine, "a", release("T", "k"))
    assert type(slot(engine, "T", "k")) is tuple
    assert holders(engine, "T", "k") == [("b", 2)]
    run(engine, "b", release("T", "k"))
    assert slot(engine, "T", "k") is None
    assert engine.namespaces == {}
    assert engine.entry_count == 0


def test_a_holder_that_leaves_and_comes_back_is_last() -> None:
    """Order is arrival order: the first of two leaves and rejoins behind the other (the list
    collapsed to one entry in between)."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    run(engine, "b", share("T", "k", 2))
    run(engine, "a", release("T", "k"))
    run(engine, "a", share("T", "k", 3))
    assert holders(engine, "T", "k") == [("b", 2), ("a", 3)]


def test_one_to_two_to_one_to_zero_in_an_aborted_transaction_restores_the_list() -> None:
    """A transaction that takes a shared variable through every shape (2 -> 1 -> 2 -> 1 -> 0
    entries, bare and listed) and aborts leaves entries, order, ownership and counts exactly as
    before."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    run(engine, "b", share("T", "k", 2))
    before = dump(engine)
    result = run(
        engine,
        "b",
        Assert(DeleteVar("T", "k")),  # 2 -> 1 (a, bare)
        share("T", "k", 20),  # 1 -> 2 (a, b)
        Assert(Exists("T", "k", 20)),
        Assert(DeleteVar("T", "k")),  # 2 -> 1
        Abort(),
    )
    assert not result.ok
    assert dump(engine) == before
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]
    assert session_keys(engine, "a") == session_keys(engine, "b") == {(NS, "T", "k")}
    assert engine.entry_count == 2


def test_aborted_emptying_and_refilling_of_a_lone_entry_restores_it() -> None:
    """A lone entry deleted, the variable taken again by the same session, replaced and
    deleted again, then aborted: the original entry is back, bare."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    before = dump(engine)
    result = run(
        engine,
        "a",
        Assert(DeleteVar("T", "k")),  # 1 -> 0
        Assert(SetVar("T", "k", 2)),  # 0 -> 1
        share("T", "k", 3),  # replaces its own
        Assert(DeleteVar("T", "k")),  # 1 -> 0
        Abort(),
    )
    assert not result.ok
    assert dump(engine) == before
    assert type(slot(engine, "T", "k")) is tuple
    assert session_keys(engine, "a") == {(NS, "T", "k")}
    assert engine.entry_count == 1


def test_aborted_join_of_a_lone_entry_restores_it_bare() -> None:
    """A second holder joining (1 -> 2) and aborting: the first holder is stored bare again
    and the joiner holds nothing."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    before = dump(engine)
    assert not run(engine, "b", share("T", "k", 2), Abort()).ok
    assert dump(engine) == before
    assert type(slot(engine, "T", "k")) is tuple
    assert session_keys(engine, "b") == set()
    assert engine.entry_count == 1


def test_replacing_ones_own_entry_keeps_its_place_and_aborts_cleanly() -> None:
    """allow_duplicates replaces the caller's own entry in place, bare or listed; an abort
    restores the old value."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    assert run(engine, "a", share("T", "k", 2)).ok
    assert holders(engine, "T", "k") == [("a", 2)]
    assert not run(engine, "a", share("T", "k", 3), Abort()).ok
    assert holders(engine, "T", "k") == [("a", 2)]
    run(engine, "b", share("T", "k", 4))
    run(engine, "c", share("T", "k", 5))
    assert run(engine, "b", share("T", "k", 6)).ok
    assert holders(engine, "T", "k") == [("a", 2), ("b", 6), ("c", 5)]
    assert not run(engine, "b", share("T", "k", 7), Abort()).ok
    assert holders(engine, "T", "k") == [("a", 2), ("b", 6), ("c", 5)]
    assert engine.entry_count == 3


def test_value_filtered_delete_of_a_listed_entry_that_does_not_match() -> None:
    """DeleteVar with a value that differs from the caller's listed entry removes nothing."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    run(engine, "b", share("T", "k", 2))
    result = run(engine, "b", Assert(DeleteVar("T", "k", 1)))
    assert not result.ok
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]
    assert not run(engine, "c", Assert(DeleteVar("T", "k"))).ok  # holds nothing there


def test_readers_leave_by_session_end_ttl_and_expiry_keeping_order() -> None:
    """Three readers; the middle one's session is ended (LockLost ENDED), the last one's entry
    TTL runs out (LockLost TTL), the first one's session expires (LockLost EXPIRED): each time
    the others stay in order, and the variable ends up dropped."""
    engine = make_engine()
    ra = run(engine, SessionSpec("a", max_age=30), share("T", "k", 1))
    rb = run(engine, "b", share("T", "k", 2))
    rc = run(engine, "c", Assert(SetVar("T", "k", 3, allow_duplicates=True, ttl=10)))
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2), ("c", 3)]
    assert engine.end_session("b", now=START + 1, notify=True)
    assert holders(engine, "T", "k") == [("a", 1), ("c", 3)]
    engine.sweep(START + 10)
    assert holders(engine, "T", "k") == [("a", 1)]
    assert type(slot(engine, "T", "k")) is tuple
    assert session_keys(engine, "c") == set()
    engine.sweep(START + 30)
    assert slot(engine, "T", "k") is None
    assert engine.namespaces == {}
    assert engine.entry_count == 0
    assert [(e.session_id, e.reason, e.entries) for e in engine.drain_lost()] == [
        ("b", LostReason.ENDED, ((NS, "T", "k", rb.fence),)),
        ("c", LostReason.TTL, ((NS, "T", "k", rc.fence),)),
        ("a", LostReason.EXPIRED, ((NS, "T", "k", ra.fence),)),
    ]


def test_ttl_of_a_listed_entry_that_was_deleted_removes_nothing() -> None:
    """A TTL entry deleted by its holder while others still hold the variable: its queued
    expiry finds no entry of that session there and removes nothing."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True, ttl=5)))
    run(engine, "c", share("T", "k", 3))
    run(engine, "b", release("T", "k"))
    assert engine.sweep(START + 5) == 0
    assert holders(engine, "T", "k") == [("a", 1), ("c", 3)]
    assert engine.drain_lost() == []


def test_session_index_groups_by_table_and_counts() -> None:
    """A session's keys across namespaces and tables: deleting a table's last one drops its
    group, a rollback re-adds what it had, and ending the session removes every entry."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    run(engine, "a", Assert(SetVar("U", "z", 1)))
    run(engine, "a", Assert(SetVar("T", "x", 1)), ns="Other")
    assert session_keys(engine, "a") == {
        (NS, "T", "x"),
        (NS, "T", "y"),
        (NS, "U", "z"),
        ("Other", "T", "x"),
    }
    run(engine, "a", release("U", "z"))
    assert set(engine.sessions["a"].keys) == {(NS, "T"), ("Other", "T")}
    assert not run(engine, "a", release("T", "x"), release("T", "y"), Abort()).ok
    assert session_keys(engine, "a") == {(NS, "T", "x"), (NS, "T", "y"), ("Other", "T", "x")}
    assert engine.entry_count == 3
    engine.end_session("a", now=START)
    assert engine.namespaces == {}
    assert engine.entry_count == 0


def test_per_session_limit_counts_entries_after_deletes_and_rollbacks() -> None:
    """max_entries_per_session counts what the session holds now: deletions free room,
    aborted sets take none, and the refusal names the count."""
    engine = make_engine(limits=EngineLimits(max_entries_per_session=2))
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("U", "y", 1)))
    assert not run(engine, "a", release("T", "x"), Assert(SetVar("T", "z", 1)), Abort()).ok
    with pytest.raises(EngineError, match="already holds 2 entries") as refused:
        run(engine, "a", Assert(SetVar("T", "z", 1)))
    assert refused.value.code is ErrorCode.TOO_MANY_ENTRIES
    assert run(engine, "a", release("T", "x"), Assert(SetVar("T", "z", 1))).ok
    assert session_keys(engine, "a") == {(NS, "T", "z"), (NS, "U", "y")}


def test_reads_of_bare_and_listed_entries() -> None:
    """Exists, CountBelow and SelectVarValue see the same entries in both forms."""
    engine = make_engine()
    run(engine, "a", share("T", "k", 1))
    for form, n in [(tuple, 1), (list, 2)]:
        if n == 2:
            run(engine, "b", share("T", "k", 2))
        assert type(slot(engine, "T", "k")) is form
        data = run(
            engine,
            "b",
            SelectVarValue("all", "T", "k", select_many=True, ignore_this_session=False),
            SelectVarValue("others", "T", "k", select_many=True, ignore_this_session=True),
        ).data
        assert [r["value"] for r in data[0][1]] == [1, 2][:n]
        assert [r["value"] for r in data[1][1]] == [1]
        assert run(engine, "b", Assert(Exists("T", "k", 1, ignore_this_session=True))).ok
        assert run(engine, "b", Assert(CountBelow("T", "k", n + 1))).ok
        assert not run(engine, "b", Assert(CountBelow("T", "k", n))).ok
        assert run(engine, "b", Assert(CountBelow("T", "k", 2, ignore_this_session=True))).ok


# --- the entry tuple: optional fields trimmed, the transaction's stamp shared ------------------


@pytest.mark.parametrize(
    ("setvar", "tx_id", "stored"),
    [
        (SetVar("T", "k"), "", ("a", START, 1)),
        (SetVar("T", "k", 0), "", ("a", START, 1, 0)),
        (SetVar("T", "k", False), "", ("a", START, 1, False)),
        (SetVar("T", "k"), "t1", ("a", START, 1, None, "t1")),
        (SetVar("T", "k", "v"), "t1", ("a", START, 1, "v", "t1")),
        (SetVar("T", "k", ttl=5.0), "", ("a", START, 1, None, "", START + 5.0)),
        (SetVar("T", "k", description="d"), "", ("a", START, 1, None, "", None, "d")),
        (
            SetVar("T", "k", "v", ttl=5.0, description="d"),
            "t1",
            ("a", START, 1, "v", "t1", START + 5.0, "d"),
        ),
    ],
)
def test_an_entry_is_stored_with_its_optional_fields_trimmed(
    setvar: SetVar, tx_id: str, stored: tuple[Any, ...]
) -> None:
    """An entry is (owner, set_at, fence[, value[, tx_id[, expires_at[, description]]]]):
    an optional field is stored only when it or one after it is not its default (None, "",
    None, None), so a plain lock is a 3-tuple; every read gives the same record whatever the
    form (value, tx_id, set_at, expires_at, fence, description)."""
    engine = make_engine()
    assert run(engine, "a", Assert(setvar), transaction_id=tx_id).ok
    assert slot(engine, "T", "k") == stored
    expires = None if setvar.ttl is None else START + setvar.ttl
    assert entries(engine, "T", "k") == [
        ("a", setvar.value, setvar.description, tx_id, START, expires, 1)
    ]
    record = run(engine, "b", SelectVarValue("r", "T", "k")).data[0][1]
    assert (record["value"], record["description"], record["tx_id"]) == (
        setvar.value,
        setvar.description,
        tx_id,
    )
    assert record["expires_at"] == setvar.ttl and record["fence"] == 1
    assert run(engine, "b", Assert(Exists("T", "k", setvar.value))).ok
    assert not run(engine, "b", Assert(Exists("T", "k", "other"))).ok
    assert not run(engine, "a", Assert(DeleteVar("T", "k", "other"))).ok
    assert run(engine, "a", Assert(DeleteVar("T", "k", setvar.value))).ok
    assert slot(engine, "T", "k") is None and engine.entry_count == 0


def test_a_transactions_plain_entries_share_its_stamp() -> None:
    """The entries a transaction sets without a value, TTL or description are one tuple, its
    stamp (owner, now, fence[, None, tx_id]), stored under every such variable; entries with
    any of them, and other transactions, get their own. Releasing or replacing one of the
    sharing entries leaves the others as they were."""
    engine = make_engine()
    run(engine, "a", *(Assert(SetVar("T", f"k{i}")) for i in range(3)), Assert(SetVar("U", "v")))
    run(engine, "a", Assert(SetVar("T", "w", 1)), Assert(SetVar("T", "x")), now=START + 1)
    run(engine, "b", *(Assert(SetVar("T", f"b{i}")) for i in range(2)), transaction_id="t")
    stamp = slot(engine, "T", "k0")
    assert stamp == ("a", START, 1)
    assert all(slot(engine, "T", f"k{i}") is stamp for i in range(3))
    assert slot(engine, "U", "v") is stamp
    assert slot(engine, "T", "w") == ("a", START + 1, 2, 1)
    assert slot(engine, "T", "x") == ("a", START + 1, 2) and slot(engine, "T", "x") is not stamp
    assert slot(engine, "T", "b0") == ("b", START, 3, None, "t") and slot(
        engine, "T", "b1"
    ) is slot(engine, "T", "b0")
    run(engine, "a", release("T", "k1"), Assert(SetVar("T", "k2", 7, allow_duplicates=True)))
    assert slot(engine, "T", "k1") is None
    assert slot(engine, "T", "k2") == ("a", START, 4, 7)
    assert slot(engine, "T", "k0") is stamp and slot(engine, "U", "v") is stamp
    assert engine.end_session("a", now=START + 2)
    assert slot(engine, "T", "k0") is None and engine.entry_count == 2


def test_held_entries_are_not_tracked_by_the_collector() -> None:
    """After a collection, a lone held entry of scalars and a session's index of a table are
    no containers the cyclic collector walks (a million held locks must not make full
    collections slow); the table itself stays tracked, so inserting into it after a full
    collection does not put it back among the young objects (whose collections would then
    walk all its entries)."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", "v")))
    gc.collect()
    assert not gc.is_tracked(slot(engine, "T", "k"))
    assert not gc.is_tracked(engine.sessions["a"].keys[NS, "T"])
    assert gc.is_tracked(engine.namespaces[NS]["T"])


def test_a_big_table_is_sharded_and_goes_away_when_emptied() -> None:
    """At SHARD_AT variables a table moves into a ShardedDict (so a dict rebuild never copies
    a million entries at once); it reads the same, rolls back the same, and is dropped when
    its last entry leaves, by release or by session end."""
    from lockserver.engine import _store

    engine = make_engine()
    n = _store.SHARD_AT
    per_tx = 1000
    for start in range(0, n - 1, per_tx):
        stop = min(start + per_tx, n - 1)
        run(engine, "a", *[Assert(SetVar("T", f"v{i}", i)) for i in range(start, stop)])
    assert type(engine.namespaces[NS]["T"]) is _store.Vars  # one short of the threshold
    # The insert that reaches the threshold shards the table; its rollback keeps it sharded
    # and removes the variable again.
    assert not run(engine, "b", Assert(SetVar("T", "last", 0)), Abort()).ok
    table = engine.namespaces[NS]["T"]
    assert type(table) is _store.BigTable
    assert len(table) == n - 1 and slot(engine, "T", "last") is None
    assert max(len(s) for s in table.shards) < 4 * n // len(table.shards)
    assert run(engine, "b", Assert(SetVar("T", "last", 0))).ok
    assert len(table) == n and engine.entry_count == n
    assert holders(engine, "T", "v7") == [("a", 7)]
    assert not run(engine, "b", Assert(SetVar("T", "v7", 0))).ok  # held: exclusive refuses
    assert run(engine, "b", Assert(Exists("T", "v7"))).ok
    assert run(engine, "b", release("T", "last")).ok
    assert slot(engine, "T", "last") is None and len(table) == n - 1
    assert engine.end_session("a", now=START)
    assert engine.namespaces == {} and engine.entry_count == 0
