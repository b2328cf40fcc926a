"""Construction validation: a malformed tree or message is refused where it is built, with an
error naming the class, the field and what is wrong."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from protocol import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    Assert,
    Block,
    Cancel,
    DeleteVar,
    EndSession,
    Execute,
    Exists,
    GetStatistics,
    Hello,
    If,
    Not,
    Or,
    Ping,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Transaction,
    TreeLimits,
    Xor,
    check_value,
)

OP_LIST = "(And, Or, Xor, Not, TRUE, FALSE, Exists, SetVar, DeleteVar)"
WRAP_CHANGE = "wrap it in Assert, If, SelectOperatorValue or AnywayContinueAfter"
WRAP_PLAIN = "wrap it in Assert, If or SelectOperatorValue)"
STMT_LIST = "(Assert, Abort, Block, If, AnywayContinueAfter, Select*)"
WRAP_TOP = "wrap operators in Assert, If, SelectOperatorValue or AnywayContinueAfter"


def nested(depth: int) -> Any:
    """A value nested ``depth`` lists deep."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    # names: blank and non-str
    ("blank-table", lambda: Exists("", "v"), ValueError, "Exists.table must not be blank"),
    ("blank-var", lambda: SetVar("t", "  "), ValueError, "SetVar.var must not be blank"),
    (
        "blank-into",
        lambda: SelectConstantValue("\t"),
        ValueError,
        "SelectConstantValue.into must not be blank",
    ),
    ("int-table", lambda: DeleteVar(1, "v"), TypeError, "DeleteVar.table must be a str, got int"),
    ("bytes-var", lambda: Exists("t", b"v"), TypeError, "Exists.var must be a str, got bytes"),
    (
        "none-into",
        lambda: SelectVarValue(None, "t", "v"),
        TypeError,
        "SelectVarValue.into must be a str, got NoneType",
    ),
    (
        "int-description",
        lambda: SetVar("t", "v", description=5),
        TypeError,
        "SetVar.description must be a str or None, got int",
    ),
    # wrong child kinds
    (
        "stmt-in-assert",
        lambda: Assert(Abort()),
        TypeError,
        f"Assert.condition must be an operator {OP_LIST}, got statement Abort",
    ),
    ("stmt-in-and", lambda: And(TRUE, Abort()), TypeError, "And.right must be an operator"),
    ("stmt-in-or", lambda: Or(Assert(TRUE), TRUE), TypeError, "Or.left must be an operator"),
    ("stmt-in-xor", lambda: Xor(TRUE, Abort()), TypeError, "Xor.right must be an operator"),
    ("stmt-in-not", lambda: Not(Abort()), TypeError, "Not.operand must be an operator"),
    (
        "stmt-in-if-cond",
        lambda: If(Abort(), Abort()),
        TypeError,
        "If.condition must be an operator",
    ),
    (
        "stmt-in-select-op",
        lambda: SelectOperatorValue("x", Abort()),
        TypeError,
        "SelectOperatorValue.operator must be an operator",
    ),
    (
        "str-as-operator",
        lambda: Not("TRUE"),
        TypeError,
        "Not.operand must be an operator " + OP_LIST + ", got str",
    ),
    (
        "op-as-then",
        lambda: If(TRUE, TRUE),
        TypeError,
        f"If.then must be a statement {STMT_LIST}, got operator TrueOp ({WRAP_PLAIN}",
    ),
    (
        "change-as-then",
        lambda: If(TRUE, SetVar("t", "v")),
        TypeError,
        f"If.then must be a statement {STMT_LIST}, got operator SetVar ({WRAP_CHANGE})",
    ),
    ("op-as-else", lambda: If(TRUE, Abort(), FALSE), TypeError, "If.else_ must be a statement"),
    (
        "none-as-then",
        lambda: If(TRUE, None),
        TypeError,
        f"If.then must be a statement {STMT_LIST}, got NoneType",
    ),
    (
        "op-in-block",
        lambda: Block(Abort(), Exists("t", "v")),
        TypeError,
        "Block.statements[1] must be a statement, got operator Exists (" + WRAP_PLAIN,
    ),
    (
        "change-in-block",
        lambda: Block(DeleteVar("t", "v")),
        TypeError,
        f"Block.statements[0] must be a statement, got operator DeleteVar ({WRAP_CHANGE})",
    ),
    (
        "plain-op-in-anyway",
        lambda: AnywayContinueAfter(TRUE),
        TypeError,
        "AnywayContinueAfter.change must be SetVar or DeleteVar, got operator TrueOp",
    ),
    (
        "stmt-in-anyway",
        lambda: AnywayContinueAfter(Abort()),
        TypeError,
        "AnywayContinueAfter.change must be SetVar or DeleteVar, got statement Abort",
    ),
    (
        "operator-top-level",
        lambda: Transaction("ns", [Abort(), SetVar("t", "v")]),
        TypeError,
        f"statements[1] must be a statement {STMT_LIST}, got SetVar; {WRAP_TOP}",
    ),
    ("empty-block", Block, ValueError, "Block needs at least one statement"),
    # ttl
    (
        "ttl-zero",
        lambda: SetVar("t", "v", ttl=0),
        ValueError,
        "SetVar.ttl must be a finite number of seconds >= 0.001 or None, got 0",
    ),
    ("ttl-negative", lambda: SetVar("t", "v", ttl=-1.5), ValueError, "got -1.5"),
    ("ttl-inf", lambda: SetVar("t", "v", ttl=math.inf), ValueError, "got inf"),
    ("ttl-nan", lambda: SetVar("t", "v", ttl=math.nan), ValueError, "got nan"),
    (
        "ttl-str",
        lambda: SetVar("t", "v", ttl="5"),
        ValueError,
        "SetVar.ttl must be a finite number of seconds >= 0.001 or None, got str",
    ),
    ("ttl-bool", lambda: SetVar("t", "v", ttl=True), ValueError, "got bool"),
    ("ttl-list", lambda: SetVar("t", "v", ttl=nested(5000)), ValueError, "got list"),
    # flags
    (
        "flag-int",
        lambda: SetVar("t", "v", allow_duplicates=1),
        TypeError,
        "SetVar.allow_duplicates must be a bool, got int",
    ),
    (
        "flag-none",
        lambda: Exists("t", "v", ignore_this_session=None),
        TypeError,
        "Exists.ignore_this_session must be a bool, got NoneType",
    ),
    (
        "flag-str",
        lambda: SelectVarValue("x", "t", "v", select_many="yes"),
        TypeError,
        "SelectVarValue.select_many must be a bool, got str",
    ),
    (
        "flag-abort",
        lambda: SelectVarValue("x", "t", "v", abort_if_not_found=0),
        TypeError,
        "SelectVarValue.abort_if_not_found must be a bool",
    ),
    (
        "flag-reset",
        lambda: AnywayContinueAfter(DeleteVar("t", "v"), reset_abort="no"),
        TypeError,
        "AnywayContinueAfter.reset_abort must be a bool",
    ),
    # values
    (
        "value-set",
        lambda: SetVar("t", "v", {1, 2}),
        ValueError,
        "SetVar.value: set is not a wire value",
    ),
    (
        "value-object",
        lambda: SelectConstantValue("x", object()),
        ValueError,
        "SelectConstantValue.value: object is not a wire value",
    ),
    (
        "value-int-keys",
        lambda: Exists("t", "v", {1: "a"}),
        ValueError,
        "Exists.value: map keys must be strings, got int",
    ),
    (
        "value-nested-bad",
        lambda: DeleteVar("t", "v", {"a": [1, {"b": {3}}]}),
        ValueError,
        "DeleteVar.value['a'][1]['b']: set is not a wire value",
    ),
    (
        "value-too-deep",
        lambda: SetVar("t", "v", nested(33)),
        ValueError,
        "nested deeper than 32 levels",
    ),
    (
        "value-too-big",
        lambda: SetVar("t", "v", 2**64),
        ValueError,
        f"SetVar.value: integer {2**64} does not fit in 64 bits",
    ),
    (
        "value-too-small",
        lambda: SetVar("t", "v", -(2**63) - 1),
        ValueError,
        "does not fit in 64 bits",
    ),
    # transaction and session
    ("blank-namespace", lambda: Transaction(" ", []), ValueError, "namespace must not be blank"),
    ("int-namespace", lambda: Transaction(1, []), TypeError, "namespace must be a str, got int"),
    (
        "trust-above-1",
        lambda: Transaction("ns", [], min_trust=1.01),
        ValueError,
        "min_trust must be a number in 0..1, got 1.01",
    ),
    (
        "trust-negative",
        lambda: Transaction("ns", [], min_trust=-0.1),
        ValueError,
        "min_trust must be a number in 0..1",
    ),
    (
        "trust-nan",
        lambda: Transaction("ns", [], min_trust=math.nan),
        ValueError,
        "min_trust must be a number in 0..1",
    ),
    (
        "trust-str",
        lambda: Transaction("ns", [], min_trust="1"),
        ValueError,
        "min_trust must be a number in 0..1",
    ),
    (
        "uptime-negative",
        lambda: Transaction("ns", [], min_uptime=-1),
        ValueError,
        "min_uptime must be a finite number >= 0, got -1",
    ),
    (
        "uptime-inf",
        lambda: Transaction("ns", [], min_uptime=math.inf),
        ValueError,
        "min_uptime must be a finite number >= 0",
    ),
    (
        "tx-id-none",
        lambda: Transaction("ns", [], transaction_id=None),
        TypeError,
        "transaction_id must be a str, got NoneType",
    ),
    (
        "description-int",
        lambda: Transaction("ns", [], description=3),
        TypeError,
        "description must be a str, got int",
    ),
    (
        "max-age-zero",
        lambda: SessionSpec("s", max_age=0),
        ValueError,
        "max_age must be a finite number of seconds >= 0.001, got 0",
    ),
    (
        "max-age-negative",
        lambda: SessionSpec("s", max_age=-5.0),
        ValueError,
        "max_age must be a finite number of seconds >= 0.001",
    ),
    (
        "max-age-nan",
        lambda: SessionSpec("s", max_age=math.nan),
        ValueError,
        "max_age must be a finite number of seconds >= 0.001",
    ),
    ("blank-session", lambda: SessionSpec(""), ValueError, "session_id must not be blank"),
    (
        "session-description-none",
        lambda: SessionSpec("s", description=None),
        TypeError,
        "description must be a str, got NoneType",
    ),
    (
        "wait-negative",
        lambda: Execute(1, SessionSpec("s"), Transaction("ns", []), wait=-1),
        ValueError,
        "wait must be a finite number >= 0, got -1",
    ),
    (
        "wait-inf",
        lambda: Execute(1, SessionSpec("s"), Transaction("ns", []), wait=math.inf),
        ValueError,
        "wait must be a finite number >= 0",
    ),
    # request ids
    (
        "id-negative",
        lambda: Ping(-1),
        ValueError,
        "request_id must be an integer in 0..2**64-1, got -1",
    ),
    (
        "id-too-big",
        lambda: GetStatistics(2**64),
        ValueError,
        "request_id must be an integer in 0..2**64-1",
    ),
    (
        "id-bool",
        lambda: Ping(True),
        ValueError,
        "request_id must be an integer in 0..2**64-1, got True",
    ),
    ("id-float", lambda: EndSession(1.0, "s"), ValueError, "request_id must be an integer"),
    (
        "target-negative",
        lambda: Cancel(1, -2),
        ValueError,
        "target_id must be an integer in 0..2**64-1",
    ),
    ("end-blank-session", lambda: EndSession(1, ""), ValueError, "session_id must not be blank"),
    (
        "hello-version-str",
        lambda: Hello(1, version="1"),
        ValueError,
        "version must be an integer in 0..2**64-1",
    ),
    (
        "hello-version-bool",
        lambda: Hello(1, version=True),
        ValueError,
        "version must be an integer",
    ),
    (
        "hello-client-none",
        lambda: Hello(1, client_name=None),
        TypeError,
        "client_name must be a str, got NoneType",
    ),
    (
        "hello-token-int",
        lambda: Hello(1, token=5),
        TypeError,
        "token must be a str or None, got int",
    ),
    # tree limits
    ("limits-depth", lambda: TreeLimits(max_depth=0), ValueError, "tree limits must be >= 1"),
    ("limits-ops", lambda: TreeLimits(max_ops=0), ValueError, "tree limits must be >= 1"),
]


@pytest.mark.parametrize(("name", "build", "exc", "message"), CASES, ids=[c[0] for c in CASES])
def test_construction_refuses(
    name: str, build: Callable[[], object], exc: type[Exception], message: str
) -> None:
    """Building an invalid node or message raises the documented exception type with a
    message that names the class/field and the problem."""
    with pytest.raises(exc) as info:
        build()
    assert type(info.value) is exc
    assert message in str(info.value)


VALID_VALUES = [
    None,
    True,
    0,
    -(2**63),
    2**64 - 1,
    1.5,
    math.inf,
    "",
    "naïve ✓",
    b"\x00\xff",
    [],
    [1, [2, [3]]],
    (1, 2),
    {},
    {"a": {"b": [None, b"x"]}},
    nested(32),
]


@pytest.mark.parametrize("value", VALID_VALUES, ids=[repr(v)[:30] for v in VALID_VALUES])
def test_check_value_accepts_wire_values(value: Any) -> None:
    """check_value accepts nil, bool, 64-bit ints, floats (also infinite), str, bytes, and
    lists/tuples/str-keyed maps of those up to 32 levels deep."""
    check_value(value)
    SetVar("t", "v", value)


def test_check_value_names_the_value() -> None:
    """check_value's error starts with the caller's name for the value."""
    with pytest.raises(ValueError, match=r"^payload\[0\]: frozenset is not a wire value"):
        check_value([frozenset()], "payload")
    with pytest.raises(ValueError, match=r"^value: map keys must be strings, got bytes"):
        check_value({b"k": 1})


def test_valid_nodes_build() -> None:
    """Every node type builds with valid arguments, and flags keep their values."""
    s = SetVar("t", "v", 1, description="d", ttl=1, allow_duplicates=True)
    assert (s.table, s.var, s.value, s.description, s.ttl, s.allow_duplicates) == (
        "t",
        "v",
        1,
        "d",
        1,
        True,
    )
    b = Block(Abort(), Assert(And(TRUE, Or(FALSE, Xor(TRUE, Not(FALSE))))))
    assert len(b.statements) == 2
    assert If(SetVar("t", "v"), Abort(), Abort()).else_ == Abort()
    assert AnywayContinueAfter(DeleteVar("t", "v"), reset_abort=True).reset_abort
    assert SelectVarValue("x", "t", "v").ignore_this_session


def test_transaction_accepts_any_iterable_of_statements() -> None:
    """Transaction statements may be given as any iterable; they are stored as a tuple, and
    an empty list (a ping) is fine."""
    tx = Transaction("ns", (s for s in [Abort(), Assert(TRUE)]))
    assert tx.statements == (Abort(), Assert(TRUE))
    assert Transaction("ns", []).statements == ()


def test_path_and_wire_names() -> None:
    """Every node class carries its failed-statement path name and wire op name."""
    table = {
        Assert: ("AssertOp", "Assert"),
        Abort: ("AbortOp", "Abort"),
        Block: ("BlockOp", "Block"),
        If: ("IfOp", "If"),
        AnywayContinueAfter: ("AnywayContinueAfterOp", "AnywayContinueAfter"),
        SelectConstantValue: ("SelectConstantValueOp", "SelectConstantValue"),
        SelectOperatorValue: ("SelectOperatorValueOp", "SelectOperatorValue"),
        SelectVarValue: ("SelectVarValueOp", "SelectVarValue"),
        And: ("AndOp", "And"),
        Or: ("OrOp", "Or"),
        Xor: ("XorOp", "Xor"),
        Not: ("NotOp", "Not"),
        type(TRUE): ("TrueOp", "True"),
        type(FALSE): ("FalseOp", "False"),
        Exists: ("ExistsOp", "Exists"),
        SetVar: ("SetVarOp", "SetVar"),
        DeleteVar: ("DeleteVarOp", "DeleteVar"),
    }
    for cls, (path_name, wire_name) in table.items():
        assert (path_name, wire_name) == (cls.PATH_NAME, cls.WIRE_NAME), cls


def test_nodes_are_frozen() -> None:
    """Nodes and messages are immutable values."""
    node = SetVar("t", "v")
    with pytest.raises(AttributeError):
        node.table = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        Ping(1).request_id = 2  # type: ignore[misc]
