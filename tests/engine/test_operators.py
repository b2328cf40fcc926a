"""Operators: the boolean truth tables without short-circuit, and the rules of Exists, SetVar
and DeleteVar (SEMANTICS.md "Operators"; issue rules T15-T27)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from lockserver.engine import same_value
from protocol import (
    FALSE,
    TRUE,
    And,
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Exists,
    Not,
    Operator,
    Or,
    SelectOperatorValue,
    SetVar,
    Xor,
)

from ._helpers import START, entries, holders, make_engine, run, session_keys

BOOLS = {True: TRUE, False: FALSE}


@pytest.mark.parametrize(("left", "right"), list(itertools.product([True, False], repeat=2)))
@pytest.mark.parametrize(
    ("op", "truth"),
    [(And, lambda a, b: a and b), (Or, lambda a, b: a or b), (Xor, lambda a, b: a != b)],
    ids=["And", "Or", "Xor"],
)
def test_binary_truth_tables(op: Any, truth: Any, left: bool, right: bool) -> None:
    """And / Or / Xor over TRUE / FALSE give the usual truth tables."""
    engine = make_engine()
    result = run(engine, "s", SelectOperatorValue("r", op(BOOLS[left], BOOLS[right])))
    assert result.data == (("r", truth(left, right)),)


@pytest.mark.parametrize("value", [True, False])
def test_not_and_constants(value: bool) -> None:
    """TRUE / FALSE are constants and Not negates."""
    engine = make_engine()
    result = run(
        engine,
        "s",
        SelectOperatorValue("c", BOOLS[value]),
        SelectOperatorValue("n", Not(BOOLS[value])),
        SelectOperatorValue("nn", Not(Not(BOOLS[value]))),
    )
    assert result.data == (("c", value), ("n", not value), ("nn", value))


def test_selected_operator_values_are_real_bools() -> None:
    """SelectOperatorValue appends a bool (not 0/1 or None)."""
    engine = make_engine()
    result = run(engine, "s", SelectOperatorValue("r", And(TRUE, FALSE)))
    assert type(result.data[0][1]) is bool


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda change: Or(TRUE, change), True),
        (lambda change: And(FALSE, change), False),
        (lambda change: Xor(TRUE, change), False),
        (lambda change: Or(change, TRUE), True),
        (lambda change: And(change, FALSE), False),
    ],
    ids=["Or(TRUE,SetVar)", "And(FALSE,SetVar)", "Xor(TRUE,SetVar)", "Or(SetVar,TRUE)", "And"],
)
def test_no_short_circuit_setvar_runs_anyway(make: Any, expected: bool) -> None:
    """Both sides of And / Or / Xor always run: a SetVar whose result cannot change the
    outcome still sets the variable (and the transaction commits it)."""
    engine = make_engine()
    result = run(engine, "s", SelectOperatorValue("r", make(SetVar("T", "k", 1))))
    assert result.ok
    assert result.data == (("r", expected),)
    assert holders(engine, "T", "k") == [("s", 1)]


@pytest.mark.parametrize("op", [And, Or, Xor])
def test_no_short_circuit_deletevar_runs_anyway(op: Any) -> None:
    """A DeleteVar on the right of And(FALSE, ...) / Or(TRUE, ...) / Xor still deletes."""
    engine = make_engine()
    run(engine, "s", Assert(SetVar("T", "k", 1)))
    left = FALSE if op is And else TRUE
    assert run(engine, "s", SelectOperatorValue("r", op(left, DeleteVar("T", "k")))).ok
    assert holders(engine, "T", "k") == []


@pytest.mark.parametrize("op", [And, Or, Xor])
def test_left_side_runs_before_right(op: Any) -> None:
    """The left side is evaluated first: SetVar on the left is seen by Exists on the right,
    and Exists on the left does not see a SetVar on the right."""
    engine = make_engine()
    set_first = op(SetVar("T", "a", 1), Exists("T", "a", ignore_this_session=False))
    exists_first = op(Exists("T", "b", ignore_this_session=False), SetVar("T", "b", 1))
    result = run(
        engine,
        "s",
        SelectOperatorValue("set_first", set_first),
        SelectOperatorValue("exists_first", exists_first),
    )
    expected = {And: (True, False), Or: (True, True), Xor: (False, True)}[op]
    assert tuple(v for _, v in result.data) == expected


def test_nested_operators_all_run_left_to_right() -> None:
    """In a nested tree every change runs, depth first, left to right: the three SetVars of one
    variable under Or/And leave the entry of the last one (allow_duplicates replaces)."""
    engine = make_engine()
    tree = Or(
        And(FALSE, SetVar("T", "k", 1, allow_duplicates=True)),
        Not(
            Or(
                SetVar("T", "k", 2, allow_duplicates=True),
                SetVar("T", "k", 3, allow_duplicates=True),
            )
        ),
    )
    assert run(engine, "s", SelectOperatorValue("r", tree)).data == (("r", False),)
    assert holders(engine, "T", "k") == [("s", 3)]


# --- SetVar -----------------------------------------------------------------------------------


def test_exclusive_setvar_on_a_free_variable_succeeds() -> None:
    """An exclusive SetVar on a variable with no entries creates one entry of the caller, with
    the value, description, transaction id, set time, no expiry and the commit fence."""
    engine = make_engine(fence_epoch=100)
    result = run(
        engine,
        "s",
        Assert(SetVar("T", "k", "v", description="why")),
        now=START + 5,
        transaction_id="t1",
    )
    assert result.ok
    assert entries(engine, "T", "k") == [("s", "v", "why", "t1", START + 5, None, 101)]
    assert session_keys(engine, "s") == {("Clinical", "T", "k")}
    assert engine.entry_count == 1


def test_own_entry_blocks_an_exclusive_setvar() -> None:
    """Exclusive SetVar fails when any entry exists, the caller's own included; the failed
    SetVar changes nothing."""
    engine = make_engine()
    run(engine, "s", Assert(SetVar("T", "k", 1)))
    result = run(engine, "s", Assert(SetVar("T", "k", 2)), transaction_id="again")
    assert result.failed_statement == "0:/AssertOp/"
    assert entries(engine, "T", "k")[0][:4] == ("s", 1, None, "")


def test_other_entry_blocks_an_exclusive_setvar() -> None:
    """Exclusive SetVar fails when another session holds the variable."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    assert run(engine, "b", SelectOperatorValue("r", SetVar("T", "k", 2))).data == (("r", False),)
    assert holders(engine, "T", "k") == [("a", 1)]


def test_exclusive_setvar_fails_when_only_duplicates_exist() -> None:
    """Entries made with allow_duplicates also block an exclusive SetVar."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    result = run(engine, "c", Assert(SetVar("T", "k", 3)))
    assert result.failed_statement == "0:/AssertOp/"
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]


def test_allow_duplicates_replaces_own_entry_in_place() -> None:
    """allow_duplicates with an entry of the caller replaces it at the same position, with the
    new value, description, transaction, time and fence; the entry count is unchanged."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    run(engine, "c", Assert(SetVar("T", "k", 3, allow_duplicates=True)))
    result = run(
        engine,
        "b",
        Assert(SetVar("T", "k", 20, description="d", allow_duplicates=True)),
        now=START + 9,
        transaction_id="re",
    )
    assert result.ok
    assert holders(engine, "T", "k") == [("a", 1), ("b", 20), ("c", 3)]
    assert entries(engine, "T", "k")[1] == ("b", 20, "d", "re", START + 9, None, result.fence)
    assert engine.entry_count == 3


def test_allow_duplicates_appends_beside_other_holders() -> None:
    """allow_duplicates without an entry of the caller appends one after the others."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]


def test_allow_duplicates_appends_even_beside_an_exclusive_holder() -> None:
    """An exclusive holder does not stop a later allow_duplicates SetVar of another session."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    assert run(engine, "b", Assert(SetVar("T", "k", 2, allow_duplicates=True))).ok
    assert holders(engine, "T", "k") == [("a", 1), ("b", 2)]


def test_allow_duplicates_replaces_own_exclusive_entry() -> None:
    """A session that holds a variable exclusively can replace its entry with allow_duplicates
    (the entry keeps its place, no second entry is made)."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    run(engine, "a", Assert(SetVar("T", "k", 2, allow_duplicates=True)))
    assert holders(engine, "T", "k") == [("a", 2)]


def test_setvar_nil_value_is_stored() -> None:
    """SetVar with no value stores nil."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k")))
    assert holders(engine, "T", "k") == [("a", None)]


# --- DeleteVar --------------------------------------------------------------------------------


def test_deletevar_removes_only_the_callers_entry() -> None:
    """DeleteVar removes the caller's own entry and leaves the other holders in order."""
    engine = make_engine()
    for sid, value in [("a", 1), ("b", 2), ("c", 3)]:
        run(engine, sid, Assert(SetVar("T", "k", value, allow_duplicates=True)))
    assert run(engine, "b", Assert(DeleteVar("T", "k"))).ok
    assert holders(engine, "T", "k") == [("a", 1), ("c", 3)]
    assert ("Clinical", "T", "k") not in session_keys(engine, "b")
    assert engine.entry_count == 2


def test_deletevar_false_when_the_caller_holds_nothing() -> None:
    """DeleteVar of a variable held only by others is false and removes nothing; so is a
    DeleteVar of a variable that does not exist at all."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    result = run(
        engine,
        "b",
        SelectOperatorValue("held_by_other", DeleteVar("T", "k")),
        SelectOperatorValue("missing_var", DeleteVar("T", "nope")),
        SelectOperatorValue("missing_table", DeleteVar("Nope", "k")),
    )
    assert result.data == (
        ("held_by_other", False),
        ("missing_var", False),
        ("missing_table", False),
    )
    assert run(engine, "b", SelectOperatorValue("x", DeleteVar("T", "k")), ns="Other").data == (
        ("x", False),
    )
    assert holders(engine, "T", "k") == [("a", 1)]


def test_value_filtered_deletevar() -> None:
    """DeleteVar with a value removes the caller's entry only when its value is equal (strictly:
    1.0 does not match 1); otherwise it is false and the entry stays."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    result = run(
        engine,
        "a",
        SelectOperatorValue("other", DeleteVar("T", "k", 2)),
        SelectOperatorValue("float", DeleteVar("T", "k", 1.0)),
        SelectOperatorValue("bool", DeleteVar("T", "k", True)),
    )
    assert [v for _, v in result.data] == [False, False, False]
    assert holders(engine, "T", "k") == [("a", 1)]
    assert run(engine, "a", SelectOperatorValue("same", DeleteVar("T", "k", 1))).data == (
        ("same", True),
    )
    assert holders(engine, "T", "k") == []


def test_value_filtered_deletevar_ignores_other_sessions_matching_entries() -> None:
    """A value filter never reaches other sessions' entries, even with the same value."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", "x", allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", "y", allow_duplicates=True)))
    assert run(engine, "b", SelectOperatorValue("r", DeleteVar("T", "k", "x"))).data == (
        ("r", False),
    )
    assert holders(engine, "T", "k") == [("a", "x"), ("b", "y")]


def test_deleting_the_last_entry_drops_empty_containers() -> None:
    """When the last entry of a variable goes, empty variable, table and namespace containers
    are dropped (they are invisible to clients anyway)."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)), Assert(SetVar("T", "j", 1)))
    run(engine, "a", Assert(DeleteVar("T", "k")))
    # (a lone entry is stored as the Entry tuple itself: owner, set_at, fence, value)
    assert engine.namespaces == {"Clinical": {"T": {"j": ("a", START, 1, 1)}}}
    run(engine, "a", Assert(DeleteVar("T", "j")))
    assert engine.namespaces == {}


# --- Exists -----------------------------------------------------------------------------------


def _exists_table(engine_ops: list[tuple[str, Operator]], session: str) -> list[Any]:
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1, allow_duplicates=True)))
    run(engine, "b", Assert(SetVar("T", "k", "x", allow_duplicates=True)))
    result = run(engine, session, *(SelectOperatorValue(n, op) for n, op in engine_ops))
    return [v for _, v in result.data]


def test_exists_ignores_the_callers_entries_by_default() -> None:
    """Exists(table, var) sees other sessions' entries; the caller's own are ignored unless
    ignore_this_session=False."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    own = run(
        engine,
        "a",
        SelectOperatorValue("default", Exists("T", "k")),
        SelectOperatorValue("own", Exists("T", "k", ignore_this_session=False)),
    )
    other = run(
        engine,
        "b",
        SelectOperatorValue("default", Exists("T", "k")),
        SelectOperatorValue("own", Exists("T", "k", ignore_this_session=False)),
    )
    assert [v for _, v in own.data] == [False, True]
    assert [v for _, v in other.data] == [True, True]


def test_exists_false_for_missing_namespace_table_and_var() -> None:
    """Exists is false when the namespace, table or variable does not exist."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    ops = [("var", Exists("T", "j")), ("table", Exists("U", "k"))]
    assert [v for _, v in run(engine, "b", *(SelectOperatorValue(n, o) for n, o in ops)).data] == [
        False,
        False,
    ]
    assert run(engine, "b", SelectOperatorValue("ns", Exists("T", "k")), ns="Other").data == (
        ("ns", False),
    )


def test_exists_with_value_matches_only_equal_values() -> None:
    """Exists with a value is true only when some visible entry has an equal value."""
    got = _exists_table(
        [
            ("one", Exists("T", "k", 1)),
            ("x", Exists("T", "k", "x")),
            ("two", Exists("T", "k", 2)),
        ],
        "c",
    )
    assert got == [True, True, False]


def test_exists_with_value_respects_ignore_this_session() -> None:
    """With a value and the default ignore_this_session, the caller's own matching entry does
    not count; with ignore_this_session=False it does."""
    got = _exists_table(
        [
            ("own_ignored", Exists("T", "k", 1)),
            ("own_counted", Exists("T", "k", 1, ignore_this_session=False)),
            ("other", Exists("T", "k", "x")),
        ],
        "a",
    )
    assert got == [False, True, True]


@pytest.mark.parametrize(
    ("stored", "probe", "match"),
    [
        (1, 1, True),
        (1, 1.0, False),
        (1, True, False),
        (1.0, 1, False),
        (True, 1, False),
        (True, True, True),
        (0, False, False),
        ("1", 1, False),
        (b"x", "x", False),
        ([1, 2], [1, 2], True),
        ([1, 2], [1.0, 2], False),
        ([1, 2], [1, 2, 3], False),
        ([1, 2], (1, 2), False),
        ({"a": 1}, {"a": 1}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": 1}, {"b": 1}, False),
        ({"a": [1, {"b": 1.5}]}, {"a": [1, {"b": 1.5}]}, True),
    ],
)
def test_exists_value_equality_is_strict(stored: Any, probe: Any, match: bool) -> None:
    """Value matching compares wire values strictly: 1, 1.0 and True differ, containers are
    compared element-wise with the same rule."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", stored)))
    result = run(engine, "b", SelectOperatorValue("r", Exists("T", "k", probe)))
    assert result.data == (("r", match),)
    assert same_value(stored, probe) is match


def test_exists_without_value_matches_a_nil_entry() -> None:
    """An entry with a nil value exists for Exists without a value (nil means "any value")."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k")))
    assert run(engine, "b", SelectOperatorValue("r", Exists("T", "k"))).data == (("r", True),)


def test_anyway_continue_after_ignores_a_failed_change() -> None:
    """AnywayContinueAfter runs a change and ignores its result: a failing SetVar / DeleteVar
    does not abort, and the statements after it still run."""
    engine = make_engine()
    run(engine, "a", Assert(SetVar("T", "k", 1)))
    result = run(
        engine,
        "b",
        AnywayContinueAfter(SetVar("T", "k", 2)),
        AnywayContinueAfter(DeleteVar("T", "k"), reset_abort=True),
        Assert(SetVar("T", "j", 3)),
        now=START + 1,
    )
    assert result.ok
    assert holders(engine, "T", "k") == [("a", 1)]
    assert holders(engine, "T", "j") == [("b", 3)]
