"""Statements and whole transactions: selects, If/Block, failed statement paths, rollback of
every change on abort, reads of the transaction's own changes, pings (SEMANTICS.md
"Transaction", "Statements", "Failed statement path")."""

from __future__ import annotations

import pytest

from protocol import (
    FALSE,
    TRUE,
    Abort,
    AnywayContinueAfter,
    Assert,
    Block,
    Cause,
    DeleteVar,
    Exists,
    If,
    Not,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Statement,
    Status,
)

from ._helpers import START, dump, entries, holders, make_engine, run, session_keys


def record(
    session: str,
    value: object,
    fence: int,
    *,
    description: str | None = None,
    tx_id: str = "",
    set_at: float = 0.0,
    expires_at: float | None = None,
) -> dict[str, object]:
    """An entry record as SelectVarValue returns it (times are server uptimes)."""
    return {
        "session": session,
        "value": value,
        "description": description,
        "tx_id": tx_id,
        "set_at": set_at,
        "expires_at": expires_at,
        "fence": fence,
    }


# --- selects ----------------------------------------------------------------------------------


def test_select_constant_value_appends_in_order_with_duplicate_names() -> None:
    """SelectConstantValue appends (into, value) pairs in statement order; names may repeat."""
    engine = make_engine()
    result = run(
        engine,
        "s",
        SelectConstantValue("a", 1),
        SelectConstantValue("b", [1, "x", None]),
        SelectConstantValue("a", None),
        SelectConstantValue("c"),
    )
    assert result.data == (("a", 1), ("b", [1, "x", None]), ("a", None), ("c", None))


def test_select_var_value_single_record() -> None:
    """SelectVarValue returns the first visible entry as a record: owner, value, description,
    transaction id, set time and expiry as server uptimes, fence."""
    engine = make_engine(fence_epoch=10)
    run(
        engine,
        "a",
        Assert(SetVar("T", "k", "v", description="desc", ttl=30, allow_duplicates=True)),
        now=START + 2,
        transaction_id="t-a",
    )
    run(engine, "b", Assert(SetVar("T", "k", "w", allow_duplicates=True)), now=START + 3)
    result = run(engine, "c", SelectVarValue("r", "T", "k"), now=START + 4)
    assert result.data == (
        ("r", record("a", "v", 11, description="desc", tx_id="t-a", set_at=2, expires_at=32)),
    )


def test_select_var_value_many_records_in_entry_order() -> None:
    """select_many returns a list of every visible entry's record, in entry order."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)), now=START + 1)
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)), now=START + 2)
    result = run(engine, "c", SelectVarValue("r", "T", "k", select_many=True))
    assert result.data == (("r", [record("a", 1, 1, set_at=1), record("b", 2, 2, set_at=2)]),)


def test_select_var_value_none_found_is_nil_not_empty_list() -> None:
    """With nothing visible SelectVarValue appends nil, with select_many too (never [])."""
    engine = make_engine()
    result = run(
        engine,
        "c",
        SelectVarValue("one", "T", "k"),
        SelectVarValue("many", "T", "k", select_many=True),
    )
    assert result.ok
    assert result.data == (("one", None), ("many", None))


def test_select_var_value_ignore_this_session_both_ways() -> None:
    """By default the caller's own entry is skipped (so the first *other* holder is returned,
    or nil); ignore_this_session=False includes it."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    result = run(
        engine,
        "a",
        SelectVarValue("default", "T", "k"),
        SelectVarValue("own", "T", "k", ignore_this_session=False),
        SelectVarValue("many", "T", "k", select_many=True),
        SelectVarValue("many_own", "T", "k", ignore_this_session=False, select_many=True),
        SelectVarValue("j", "T", "j"),
    )
    values = dict(result.data)
    assert values["default"]["session"] == "b"
    assert values["own"]["session"] == "a"
    assert [r["session"] for r in values["many"]] == ["b"]
    assert [r["session"] for r in values["many_own"]] == ["a", "b"]
    assert values["j"] is None
    run(engine, "b", Assert(DeleteVar("T", "k")))
    result = run(engine, "a", SelectVarValue("only_own", "T", "k"))
    assert result.data == (("only_own", None),)


def test_select_var_value_abort_if_not_found() -> None:
    """abort_if_not_found aborts with path "i:/SelectVarValueOp/" when nothing is visible
    (the caller's own entry does not count by default), and does not abort when found."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    own = run(
        engine,
        "a",
        SelectConstantValue("before", 0),
        SelectVarValue("r", "T", "k", abort_if_not_found=True),
    )
    assert own.status is Status.TRANSACTION_ERROR
    assert own.cause is Cause.STATEMENT
    assert own.failed_statement == "1:/SelectVarValueOp/"
    assert own.data == (("before", 0),)
    other = run(engine, "b", SelectVarValue("r", "T", "k", abort_if_not_found=True))
    assert other.ok
    assert other.data[0][1]["value"] == 1


def test_select_operator_value_with_a_change_commits_it() -> None:
    """SelectOperatorValue of a SetVar appends its bool and keeps its change."""
    engine = make_engine()
    result = run(
        engine,
        "a",
        SelectOperatorValue("first", SetVar("T", "k", 1)),
        SelectOperatorValue("second", SetVar("T", "k", 2)),
    )
    assert result.data == (("first", True), ("second", False))
    assert holders(engine, "T", "k") == [("a", 1)]


def test_data_selected_before_an_abort_is_still_returned() -> None:
    """Data appended before the failing statement is returned with the error; nothing after
    it is evaluated; the selected change itself is rolled back."""
    engine = make_engine()
    result = run(
        engine,
        "a",
        SelectConstantValue("x", 1),
        SelectOperatorValue("set", SetVar("T", "k", 1)),
        SelectVarValue("see", "T", "k", ignore_this_session=False),
        Abort(),
        SelectConstantValue("never", 2),
    )
    assert result.status is Status.TRANSACTION_ERROR
    assert result.failed_statement == "3:/AbortOp/"
    assert [name for name, _ in result.data] == ["x", "set", "see"]
    assert result.data[2][1]["value"] == 1
    assert dump(engine) == {}


# --- If / Block -------------------------------------------------------------------------------


def test_if_with_setvar_condition_try_lock_and_branch() -> None:
    """If(SetVar(...), then, else): the first caller takes the lock and runs `then`; a second
    caller's SetVar fails (changing nothing) and it runs `else`."""
    engine = make_engine()
    try_lock = If(
        SetVar("T", "k", "mine"),
        SelectConstantValue("got", True),
        SelectVarValue("holder", "T", "k"),
    )
    first = run(engine, "a", try_lock)
    second = run(engine, "b", try_lock)
    assert first.ok
    assert first.data == (("got", True),)
    assert second.ok
    assert second.data[0][0] == "holder"
    assert second.data[0][1]["session"] == "a"
    assert holders(engine, "T", "k") == [("a", "mine")]


def test_if_without_else_does_nothing_when_false() -> None:
    """If with a false condition and no else runs nothing and does not abort."""
    engine = make_engine()
    result = run(engine, "a", If(FALSE, Abort()), SelectConstantValue("after", 1))
    assert result.ok
    assert result.data == (("after", 1),)


def test_if_true_with_else_runs_only_then() -> None:
    """If with a true condition runs `then` and not `else`."""
    engine = make_engine()
    result = run(engine, "a", If(TRUE, SelectConstantValue("then", 1), Abort()))
    assert result.ok
    assert result.data == (("then", 1),)


def test_block_runs_in_order_and_stops_at_abort() -> None:
    """Block runs its statements in order and stops at the first abort."""
    engine = make_engine()
    result = run(
        engine,
        "a",
        Block(SelectConstantValue("1", 1), SelectConstantValue("2", 2)),
        Block(SelectConstantValue("3", 3), Abort(), SelectConstantValue("4", 4)),
    )
    assert result.failed_statement == "1:/BlockOp/AbortOp/"
    assert [n for n, _ in result.data] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("statements", "path"),
    [
        ([Assert(FALSE)], "0:/AssertOp/"),
        ([SelectConstantValue("x", i) for i in range(7)] + [Assert(FALSE)], "7:/AssertOp/"),
        ([Block(If(TRUE, Abort()))], "0:/BlockOp/IfOp/AbortOp/"),
        ([Assert(TRUE), If(TRUE, Assert(Exists("T", "k")))], "1:/IfOp/AssertOp/"),
        ([If(FALSE, Abort(), Block(Assert(TRUE), Abort()))], "0:/IfOp/BlockOp/AbortOp/"),
        (
            [If(TRUE, Block(SelectVarValue("v", "T", "k", abort_if_not_found=True)))],
            "0:/IfOp/BlockOp/SelectVarValueOp/",
        ),
        ([Block(Block(Block(Assert(Not(TRUE)))))], "0:/BlockOp/BlockOp/BlockOp/AssertOp/"),
    ],
    ids=["top-assert", "eighth", "block-if-abort", "if-assert", "else", "select", "deep"],
)
def test_failed_statement_paths(statements: list[Statement], path: str) -> None:
    """The failed path is "<i>:/" then each node's class-style name and "/", with no child
    positions: exactly the seed's "0:/AssertOp/", "7:/AssertOp/", "0:/BlockOp/IfOp/AbortOp/",
    "1:/IfOp/AssertOp/" and deeper variants."""
    engine = make_engine()
    result = run(engine, "a", *statements)
    assert result.status is Status.TRANSACTION_ERROR
    assert result.cause is Cause.STATEMENT
    assert result.failed_statement == path


def test_abort_in_if_condition_change_still_rolled_back() -> None:
    """A change made in an If condition is rolled back when the branch aborts."""
    engine = make_engine()
    result = run(engine, "a", If(SetVar("T", "k", 1), Abort()))
    assert result.failed_statement == "0:/IfOp/AbortOp/"
    assert dump(engine) == {}
    assert engine.entry_count == 0


# --- reads see own changes, rollback ----------------------------------------------------------


def test_reads_see_the_transactions_own_uncommitted_changes() -> None:
    """Within one transaction Exists and SelectVarValue see its own earlier sets and deletes."""
    engine = make_engine()
    run(engine, "b", Assert(SetVar("T", "j", "other")))
    result = run(
        engine,
        "a",
        Assert(SetVar("T", "k", 1)),
        SelectOperatorValue("exists", Exists("T", "k", ignore_this_session=False)),
        SelectVarValue("value", "T", "k", ignore_this_session=False),
        Assert(DeleteVar("T", "k")),
        SelectOperatorValue("gone", Exists("T", "k", ignore_this_session=False)),
        Assert(SetVar("T", "j", "mine", allow_duplicates=True)),
        SelectVarValue("both", "T", "j", ignore_this_session=False, select_many=True),
    )
    values = dict(result.data)
    assert values["exists"] is True
    assert values["value"]["value"] == 1
    assert values["gone"] is False
    assert [r["value"] for r in values["both"]] == ["other", "mine"]


def test_rollback_restores_sets_and_deletes_in_order() -> None:
    """A failed transaction restores every variable it changed: deleted entries come back at
    their original position, replaced entries get their old value and fence, new entries
    vanish, and the entry count is unchanged."""
    engine = make_engine()
    for sid in ["a", "b", "c"]:
        run(engine, sid, Assert(SetVar("T", "k", sid, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "own", 1)), Assert(SetVar("T", "rep", 1)))
    before = dump(engine)
    count = engine.entry_count
    keys_b = session_keys(engine, "b")
    result = run(
        engine,
        "b",
        Assert(DeleteVar("T", "k")),
        Assert(SetVar("T", "k", "again", allow_duplicates=True)),  # appended at the end
        Assert(DeleteVar("T", "own")),
        Assert(SetVar("T", "rep", 2, allow_duplicates=True)),
        Assert(SetVar("T", "new", 3)),
        Assert(SetVar("U", "new", 3)),
        Assert(SetVar("T", "k2", 3, ttl=5)),
        Assert(FALSE),
        transaction_id="doomed",
    )
    assert result.failed_statement == "7:/AssertOp/"
    assert dump(engine) == before
    assert holders(engine, "T", "k") == [("a", "a"), ("b", "b"), ("c", "c")]
    assert engine.entry_count == count
    assert session_keys(engine, "b") == keys_b
    assert engine.next_deadline() == START + 60  # the rolled-back TTL was never queued


def test_rollback_restores_session_ownership() -> None:
    """After a rollback, ending the session removes exactly the entries it held before the
    failed transaction: restored ones included, rolled-back new ones never counted."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "x", 1)), Assert(SetVar("T", "y", 1)))
    run(engine, "b", Assert(SetVar("T", "x", 2, allow_duplicates=True)))
    result = run(
        engine,
        "a",
        Assert(DeleteVar("T", "x")),
        Assert(DeleteVar("T", "y")),
        Assert(SetVar("T", "z", 1)),
        Abort(),
    )
    assert not result.ok
    assert session_keys(engine, "a") == {("Clinical", "T", "x"), ("Clinical", "T", "y")}
    assert engine.end_session("a", now=START + 1)
    assert dump(engine) == {("Clinical", "T", "x"): entries(engine, "T", "x")}
    assert holders(engine, "T", "x") == [("b", 2)]
    assert engine.entry_count == 1


def test_rollback_of_a_fresh_namespace_leaves_nothing() -> None:
    """A failed transaction that created the namespace, table and variable leaves no trace."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)), Assert(SetVar("U", "k", 1)), Abort(), ns="New")
    assert engine.namespaces == {}
    assert engine.entry_count == 0
    assert session_keys(engine, "a") == set()


def test_rollback_after_emptying_an_existing_namespace() -> None:
    """A failed transaction that deleted the only entries of a namespace and then created and
    deleted others restores exactly the original contents."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    before = dump(engine)
    stored = engine.namespaces["Clinical"]["T"]["k"]
    result = run(
        engine,
        "a",
        Assert(DeleteVar("T", "k")),
        Assert(SetVar("T", "j", 1)),
        Assert(SetVar("U", "j", 1)),
        Assert(DeleteVar("U", "j")),
        Abort(),
    )
    assert not result.ok
    assert dump(engine) == before
    # (a lone entry is stored as the Entry tuple itself)
    assert engine.namespaces == {"Clinical": {"T": {"k": stored}}}


def test_commit_that_empties_the_namespace_drops_it() -> None:
    """A committed transaction that deletes the last entries of a namespace drops it."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    assert run(engine, "a", Assert(DeleteVar("T", "k"))).ok
    assert engine.namespaces == {}


def test_replace_then_delete_in_one_transaction_commits() -> None:
    """Several changes of one variable in one transaction commit as the last one left it."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    run(
        engine,
        "a",
        Assert(SetVar("T", "k", 2, allow_duplicates=True)),
        Assert(DeleteVar("T", "k", 2)),
        Assert(SetVar("T", "k", 3)),
    )
    assert holders(engine, "T", "k") == [("a", 3)]
    assert engine.entry_count == 1


def test_failed_transaction_keeps_the_other_sessions_untouched() -> None:
    """Rollback restores only what the transaction changed; other variables are untouched."""
    engine = make_engine()
    run(engine, "b", Assert(SetVar("T", "other", 1)))
    run(engine, "a", Assert(SetVar("T", "k", 1)), Assert(Exists("T", "missing")))
    assert holders(engine, "T", "other") == [("b", 1)]
    assert holders(engine, "T", "k") == []


# --- ping ---------------------------------------------------------------------------------------


def test_empty_transaction_is_a_ping() -> None:
    """A transaction with no statements creates (or touches) the session and returns OK with
    no data, no path, the current fence, and the session's valid-until uptime."""
    engine = make_engine(fence_epoch=7)
    result = run(engine, SessionSpec("p", max_age=30), now=START + 5)
    assert result.status is Status.TRANSACTION_OK
    assert result.cause is Cause.UNSPECIFIED
    assert result.failed_statement is None
    assert result.data == ()
    assert result.fence == 7
    assert result.valid_until == 35
    assert "p" in engine.sessions
    again = run(engine, "p", now=START + 20)
    assert again.valid_until == 50


def test_anyway_continue_after_reset_abort_flag_changes_nothing() -> None:
    """reset_abort is accepted and has no effect on the outcome."""
    engine = make_engine()
    result = run(engine, "a", AnywayContinueAfter(SetVar("T", "k", 1), reset_abort=True))
    assert result.ok
    assert holders(engine, "T", "k") == [("a", 1)]
