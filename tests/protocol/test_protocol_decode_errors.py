"""Decoder errors: everything wrong with received bytes or maps becomes a ProtocolError with the
right wire code, a message naming the field or node at fault, and the request id when it could
be read."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import pytest

from protocol import (
    TRUE,
    Abort,
    Assert,
    Block,
    Connection,
    ErrorCode,
    Execute,
    If,
    Not,
    ProtocolError,
    Role,
    SessionSpec,
    Transaction,
    TreeLimits,
    frame,
    node_from_wire,
    pack,
    request_from_wire,
    server_message_from_wire,
    statements_from_wire,
    unpack,
)

E = ErrorCode


def execute(statements: Any, rid: int = 7, **extra: Any) -> dict[str, Any]:
    """An execute request map around ``statements``."""
    wire = {"type": "execute", "id": rid, "session": "s", "namespace": "ns"}
    wire["statements"] = statements
    wire.update(extra)
    return wire


def server_error(wire: Any, limits: TreeLimits | None = None) -> ProtocolError:
    """Feed ``wire`` framed to a server-role Connection and return the error it raises."""
    conn = Connection(Role.SERVER) if limits is None else Connection(Role.SERVER, limits=limits)
    conn.receive_data(frame(pack(wire)))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    return info.value


def chain(depth: int) -> list[Any]:
    """An Assert(Not(Not(...TRUE))) wire tree exactly ``depth`` levels deep (depth >= 2)."""
    node: list[Any] = ["True"]
    for _ in range(depth - 2):
        node = ["Not", node]
    return ["Assert", node]


# --- request maps -------------------------------------------------------------------------------

REQUEST_CASES: list[tuple[str, Any, ErrorCode, str, int | None]] = [
    # the operator's requests (PROTOCOL.md "Inspection")
    (
        "holders-limit-past-max",
        {"type": "holders", "id": 3, "limit": 1001},
        E.INVALID_MESSAGE,
        "holders: limit must be an integer in 1..1000 (MAX_PAGE), got 1001",
        3,
    ),
    (
        "holders-limit-zero",
        {"type": "holders", "id": 3, "limit": 0},
        E.INVALID_MESSAGE,
        "limit must be an integer in 1..1000",
        3,
    ),
    (
        "holders-limit-bool",
        {"type": "holders", "id": 3, "limit": True},
        E.INVALID_MESSAGE,
        "holders: field 'limit' must be an integer, got bool",
        3,
    ),
    (
        "sessions-cursor-too-long",
        {"type": "sessions", "id": 3, "cursor": "c" * 16_385},
        E.TOO_LARGE,
        "sessions: field 'cursor' is 16385 characters long, the limit is 16384 (MAX_CURSOR)",
        3,
    ),
    (
        "waiters-blank-namespace",
        {"type": "waiters", "id": 3, "namespace": " "},
        E.INVALID_MESSAGE,
        "waiters: namespace must not be blank",
        3,
    ),
    (
        "holders-unknown-field",
        {"type": "holders", "id": 3, "prefix": "x"},
        E.INVALID_MESSAGE,
        "holders: unknown field(s) 'prefix'",
        3,
    ),
    (
        "release-missing-var",
        {"type": "release", "id": 3, "namespace": "ns", "table": "L"},
        E.INVALID_MESSAGE,
        "release: missing field 'var'",
        3,
    ),
    (
        "subscribe-namespace-number",
        {"type": "subscribe", "id": 3, "namespace": 5},
        E.INVALID_MESSAGE,
        "subscribe: field 'namespace' must be a string, got int",
        3,
    ),
    (
        "unsubscribe-target-missing",
        {"type": "unsubscribe", "id": 3},
        E.INVALID_MESSAGE,
        "unsubscribe: missing field 'target'",
        3,
    ),
    ("array", [1, 2], E.INVALID_MESSAGE, "a request must be a map, got array", None),
    ("string", "ping", E.INVALID_MESSAGE, "a request must be a map, got string", None),
    ("nil", None, E.INVALID_MESSAGE, "a request must be a map, got nil", None),
    (
        "missing-id",
        {"type": "ping"},
        E.INVALID_MESSAGE,
        "request field 'id' must be an integer in 0..2**64-1 (missing)",
        None,
    ),
    (
        "str-id",
        {"type": "ping", "id": "1"},
        E.INVALID_MESSAGE,
        "request field 'id' must be an integer in 0..2**64-1",
        None,
    ),
    ("negative-id", {"type": "ping", "id": -1}, E.INVALID_MESSAGE, "'id' must be an integer", None),
    ("bool-id", {"type": "ping", "id": True}, E.INVALID_MESSAGE, "'id' must be an integer", None),
    ("float-id", {"type": "ping", "id": 1.0}, E.INVALID_MESSAGE, "'id' must be an integer", None),
    ("nil-id", {"type": "ping", "id": None}, E.INVALID_MESSAGE, "'id' must be an integer", None),
    (
        "unknown-type",
        {"type": "pong", "id": 3},
        E.UNKNOWN_MESSAGE_TYPE,
        "unknown request type 'pong' (known: cancel, end, execute, hello, holders, ping, "
        "release, sessions, stats, subscribe, unsubscribe, waiters)",
        3,
    ),
    ("missing-type", {"id": 3}, E.UNKNOWN_MESSAGE_TYPE, "unknown request type None", 3),
    ("int-type", {"type": 5, "id": 3}, E.UNKNOWN_MESSAGE_TYPE, "unknown request type 5", 3),
    (
        "array-type",
        {"type": [["ping"]], "id": 3},
        E.UNKNOWN_MESSAGE_TYPE,
        "unknown request type <array>",
        3,
    ),
    (
        "long-type",
        {"type": "x" * 10000, "id": 3},
        E.UNKNOWN_MESSAGE_TYPE,
        "unknown request type '" + "x" * 64 + "'...",
        3,
    ),
    # missing fields
    (
        "end-no-session",
        {"type": "end", "id": 4},
        E.INVALID_MESSAGE,
        "end: missing field 'session'",
        4,
    ),
    (
        "hello-no-version",
        {"type": "hello", "id": 4},
        E.INVALID_MESSAGE,
        "hello: missing field 'version'",
        4,
    ),
    (
        "cancel-no-target",
        {"type": "cancel", "id": 4},
        E.INVALID_MESSAGE,
        "cancel: missing field 'target'",
        4,
    ),
    (
        "execute-no-session",
        {"type": "execute", "id": 4, "namespace": "n", "statements": []},
        E.INVALID_MESSAGE,
        "execute: missing field 'session'",
        4,
    ),
    (
        "execute-no-namespace",
        {"type": "execute", "id": 4, "session": "s", "statements": []},
        E.INVALID_MESSAGE,
        "execute: missing field 'namespace'",
        4,
    ),
    (
        "execute-no-statements",
        {"type": "execute", "id": 4, "session": "s", "namespace": "n"},
        E.INVALID_MESSAGE,
        "execute: missing field 'statements'",
        4,
    ),
    # wrong field types
    (
        "end-int-session",
        {"type": "end", "id": 4, "session": 1},
        E.INVALID_MESSAGE,
        "end: field 'session' must be a string, got integer",
        4,
    ),
    (
        "required-nil",
        {"type": "end", "id": 4, "session": None},
        E.INVALID_MESSAGE,
        "end: field 'session' must be a string, got nil",
        4,
    ),
    (
        "hello-str-version",
        {"type": "hello", "id": 4, "version": "1"},
        E.INVALID_MESSAGE,
        "hello: field 'version' must be integer, got string",
        4,
    ),
    (
        "hello-bool-version",
        {"type": "hello", "id": 4, "version": True},
        E.INVALID_MESSAGE,
        "field 'version' must be integer, got bool",
        4,
    ),
    (
        "hello-negative-version",
        {"type": "hello", "id": 4, "version": -1},
        E.INVALID_MESSAGE,
        "hello: version must be an integer in 0..2**64-1",
        4,
    ),
    (
        "hello-bin-token",
        {"type": "hello", "id": 4, "version": 1, "token": b"t"},
        E.INVALID_MESSAGE,
        "field 'token' must be a string, got binary",
        4,
    ),
    (
        "cancel-str-target",
        {"type": "cancel", "id": 4, "target": "1"},
        E.INVALID_MESSAGE,
        "cancel: field 'target' must be an integer, got string",
        4,
    ),
    (
        "cancel-negative-target",
        {"type": "cancel", "id": 4, "target": -1},
        E.INVALID_MESSAGE,
        "cancel: target_id must be an integer in 0..2**64-1",
        4,
    ),
    (
        "statements-map",
        execute({}),
        E.INVALID_MESSAGE,
        "execute: field 'statements' must be an array, got map",
        7,
    ),
    (
        "max-age-str",
        execute([], max_age="60"),
        E.INVALID_MESSAGE,
        "execute: field 'max_age' must be a number, got string",
        7,
    ),
    (
        "min-trust-bool",
        execute([], min_trust=True),
        E.INVALID_MESSAGE,
        "field 'min_trust' must be a number, got bool",
        7,
    ),
    (
        "session-ext",
        execute([], session=msgpack.ExtType(1, b"s")),
        E.INVALID_MESSAGE,
        "field 'session' must be a string, got ExtType",
        7,
    ),
    # unknown extra fields
    (
        "ping-extra",
        {"type": "ping", "id": 1, "extra": 1},
        E.INVALID_MESSAGE,
        "ping: unknown field(s) 'extra'",
        1,
    ),
    (
        "stats-extra",
        {"type": "stats", "id": 1, "b": 1, "a": 2},
        E.INVALID_MESSAGE,
        "stats: unknown field(s) 'a', 'b'",
        1,
    ),
    (
        "end-extra",
        {"type": "end", "id": 1, "session": "s", "sesion": "s"},
        E.INVALID_MESSAGE,
        "end: unknown field(s) 'sesion'",
        1,
    ),
    (
        "hello-extra",
        {"type": "hello", "id": 1, "version": 1, "user": "u"},
        E.INVALID_MESSAGE,
        "hello: unknown field(s) 'user'",
        1,
    ),
    (
        "cancel-extra",
        {"type": "cancel", "id": 1, "target": 2, "x": None},
        E.INVALID_MESSAGE,
        "cancel: unknown field(s) 'x'",
        1,
    ),
    ("execute-extra", execute([], ttl=5), E.INVALID_MESSAGE, "execute: unknown field(s) 'ttl'", 7),
    (
        "bytes-and-str-keys",
        {"type": "ping", "id": 1, "x": 1, b"y": 2},
        E.INVALID_MESSAGE,
        "ping: unknown field(s) 'x', b'y'",
        1,
    ),
    (
        "long-extra-key",
        {"type": "ping", "id": 1, "k" * 500: 1},
        E.INVALID_MESSAGE,
        "unknown field(s) '" + "k" * 64 + "'...",
        1,
    ),
    # field values the classes refuse
    (
        "blank-session",
        execute([], session=" "),
        E.INVALID_MESSAGE,
        "execute: session must not be blank",
        7,
    ),
    (
        "blank-namespace",
        execute([], namespace=""),
        E.INVALID_MESSAGE,
        "execute: namespace must not be blank",
        7,
    ),
    (
        "end-blank-session",
        {"type": "end", "id": 4, "session": ""},
        E.INVALID_MESSAGE,
        "end: session must not be blank",
        4,
    ),
    (
        "trust-above-1",
        execute([], min_trust=2),
        E.INVALID_MESSAGE,
        "execute: min_trust must be a number in 0..1, got 2",
        7,
    ),
    (
        "max-age-zero",
        execute([], max_age=0),
        E.INVALID_MESSAGE,
        "execute: max_age must be a finite number of seconds >= 0.001, got 0",
        7,
    ),
    (
        "max-age-inf",
        execute([], max_age=math.inf),
        E.INVALID_MESSAGE,
        "max_age must be a finite number of seconds >= 0.001, got inf",
        7,
    ),
    (
        "min-uptime-negative",
        execute([], min_uptime=-1.0),
        E.INVALID_MESSAGE,
        "min_uptime must be a finite number >= 0",
        7,
    ),
    (
        "wait-negative",
        execute([], wait=-0.5),
        E.INVALID_MESSAGE,
        "wait must be a finite number >= 0, got -0.5",
        7,
    ),
    (
        "wait-inf",
        execute([], wait=-math.inf),
        E.INVALID_MESSAGE,
        "wait must be a finite number >= 0",
        7,
    ),
    # NaN in numeric fields
    (
        "max-age-nan",
        execute([], max_age=math.nan),
        E.INVALID_MESSAGE,
        "execute: field 'max_age' must be a number, got NaN",
        7,
    ),
    (
        "min-uptime-nan",
        execute([], min_uptime=math.nan),
        E.INVALID_MESSAGE,
        "field 'min_uptime' must be a number, got NaN",
        7,
    ),
    (
        "min-trust-nan",
        execute([], min_trust=math.nan),
        E.INVALID_MESSAGE,
        "field 'min_trust' must be a number, got NaN",
        7,
    ),
    (
        "wait-nan",
        execute([], wait=math.nan),
        E.INVALID_MESSAGE,
        "field 'wait' must be a number, got NaN",
        7,
    ),
]


@pytest.mark.parametrize(
    ("name", "wire", "code", "message", "rid"), REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES]
)
def test_request_decode_error(
    name: str, wire: Any, code: ErrorCode, message: str, rid: int | None
) -> None:
    """An invalid request map raises ProtocolError with the right code, a message naming the
    field, and the request id whenever it could be read (framed and direct alike)."""
    for err in (server_error(wire), _direct(wire)):
        assert err.code is code
        assert message in err.message, err.message
        assert err.request_id == rid
        assert len(err.message) < 300


def _direct(wire: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        request_from_wire(wire)
    return info.value


# --- trees --------------------------------------------------------------------------------------

OP_NAMES = (
    "Abort, And, AnywayContinueAfter, ArrivedBelow, Assert, Block, CountBelow, DeleteVar, "
    "Exists, False, If, Not, Or, SelectConstantValue, SelectOperatorValue, SelectVarValue, "
    "SetVar, True, Waiting, Xor"
)
WRAP = "wrap operators in Assert, If, SelectOperatorValue or AnywayContinueAfter"

TREE_CASES: list[tuple[str, Any, str]] = [
    (
        "setvar-ttl-and-period",
        [["Assert", ["SetVar", "t", "v", 1, None, 5, False, 60]]],
        "SetVar takes ttl or period, not both",
    ),
    (
        "countbelow-negative",
        [["Assert", ["CountBelow", "t", "v", -1]]],
        "CountBelow.limit must be an integer >= 0, got -1",
    ),
    (
        "countbelow-half-limit-source",
        [["Assert", ["CountBelow", "t", "v", 1, "limits"]]],
        "CountBelow takes limit_table and limit_var together",
    ),
    (
        "countbelow-float",
        [["Assert", ["CountBelow", "t", "v", 1.5]]],
        "CountBelow.limit must be an integer >= 0, got float",
    ),
    ("waiting-blank", [["Assert", ["Waiting", "t", " "]]], "Waiting.var must not be blank"),
    (
        "arrived-negative",
        [["Assert", ["ArrivedBelow", "t", "v", -1]]],
        "ArrivedBelow.limit must be an integer >= 0, got -1",
    ),
    (
        "arrived-bool-limit",
        [["Assert", ["ArrivedBelow", "t", "v", True]]],
        "ArrivedBelow.limit must be an integer >= 0, got bool",
    ),
    (
        "arrived-no-limit",
        [["Assert", ["ArrivedBelow", "t", "v"]]],
        "statements[0]/Assert: ArrivedBelow takes 3 arguments, got 2",
    ),
    (
        "arrived-blank-table",
        [["Assert", ["ArrivedBelow", "", "v", 2]]],
        "ArrivedBelow.table must not be blank",
    ),
    ("unknown-op", [["Nope"]], f"statements[0]: unknown op 'Nope' (known: {OP_NAMES})"),
    ("lowercase-op", [["Abort"], ["assert", ["True"]]], "statements[1]: unknown op 'assert'"),
    ("int-op", [[5]], "statements[0]: unknown op 5"),
    ("nil-op", [[None]], "statements[0]: unknown op None"),
    ("list-op", [[["Abort"]]], "statements[0]: unknown op <array>"),
    ("long-op", [["Z" * 5000]], "statements[0]: unknown op '" + "Z" * 64 + "'..."),
    (
        "empty-node",
        [[]],
        "statements[0]: a node must be a non-empty array [op, args...], got array",
    ),
    (
        "string-node",
        ["Abort"],
        "statements[0]: a node must be a non-empty array [op, args...], got string",
    ),
    ("map-node", [{"op": "Abort"}], "got map"),
    (
        "nested-bad-node",
        [["Assert", "True"]],
        "statements[0]/Assert: a node must be a non-empty array [op, args...], got string",
    ),
    # argument counts
    ("abort-args", [["Abort", 1]], "statements[0]: Abort takes 0 arguments, got 1"),
    ("assert-no-args", [["Assert"]], "statements[0]: Assert takes 1 arguments, got 0"),
    ("true-args", [["Assert", ["True", 1]]], "statements[0]/Assert: True takes 0 arguments, got 1"),
    (
        "setvar-few",
        [["Assert", ["SetVar", "t"]]],
        "statements[0]/Assert: SetVar takes 2 to 7 arguments, got 1",
    ),
    (
        "setvar-many",
        [["Assert", ["SetVar", "t", "v", 1, "d", None, True, 60, 0]]],
        "SetVar takes 2 to 7 arguments, got 8",
    ),
    ("if-few", [["If", ["True"]]], "statements[0]: If takes 2 to 3 arguments, got 1"),
    (
        "select-var-few",
        [["SelectVarValue", "x", "t"]],
        "SelectVarValue takes 3 to 6 arguments, got 2",
    ),
    ("and-one", [["Assert", ["And", ["True"]]]], "And takes 2 arguments, got 1"),
    (
        "exists-five",
        [["Assert", ["Exists", "t", "v", 1, True, 2]]],
        "Exists takes 2 to 4 arguments, got 5",
    ),
    (
        "delete-four",
        [["Assert", ["DeleteVar", "t", "v", 1, 2]]],
        "DeleteVar takes 2 to 3 arguments, got 4",
    ),
    # child kinds
    (
        "operator-top-level",
        [["True"]],
        f"statements[0]: expected a statement, got operator TrueOp; {WRAP}",
    ),
    (
        "change-top-level",
        [["Abort"], ["SetVar", "t", "v"]],
        "statements[1]: expected a statement, got operator SetVar",
    ),
    (
        "statement-in-and",
        [["Assert", ["And", ["True"], ["Abort"]]]],
        "statements[0]/Assert/And.right: expected an operator, got statement Abort",
    ),
    (
        "statement-in-or-left",
        [["Assert", ["Or", ["Abort"], ["True"]]]],
        "statements[0]/Assert/Or.left: expected an operator, got statement Abort",
    ),
    (
        "statement-in-assert",
        [["Assert", ["Abort"]]],
        "statements[0]/Assert: expected an operator, got statement Abort",
    ),
    (
        "statement-in-not",
        [["Assert", ["Not", ["Abort"]]]],
        "statements[0]/Assert/Not: expected an operator",
    ),
    (
        "statement-in-if-cond",
        [["If", ["Abort"], ["Abort"]]],
        "statements[0]/If.condition: expected an operator",
    ),
    (
        "operator-in-if-then",
        [["If", ["True"], ["True"]]],
        "statements[0]/If.then: expected a statement, got operator TrueOp",
    ),
    (
        "operator-in-if-else",
        [["If", ["True"], ["Abort"], ["False"]]],
        "statements[0]/If.else: expected a statement, got operator FalseOp",
    ),
    (
        "operator-in-block",
        [["Block", [["Abort"], ["True"]]]],
        "statements[0]/Block[1]: expected a statement, got operator TrueOp",
    ),
    (
        "statement-in-select-op",
        [["SelectOperatorValue", "x", ["Abort"]]],
        "statements[0]/SelectOperatorValue: expected an operator",
    ),
    (
        "plain-op-in-anyway",
        [["AnywayContinueAfter", ["True"]]],
        "statements[0]/AnywayContinueAfter: AnywayContinueAfter.change must be SetVar or "
        "DeleteVar, got operator TrueOp",
    ),
    (
        "statement-in-anyway",
        [["AnywayContinueAfter", ["Abort"]]],
        "statements[0]/AnywayContinueAfter: expected an operator, got statement Abort",
    ),
    (
        "empty-block",
        [["Block", []]],
        "statements[0]/Block: Block takes a non-empty array of statements",
    ),
    (
        "block-not-array",
        [["Block", ["Abort"]]],
        "statements[0]/Block[0]: a node must be a non-empty array",
    ),
    (
        "block-map",
        [["Block", {"a": 1}]],
        "statements[0]/Block: Block takes a non-empty array of statements",
    ),
    # argument values
    (
        "blank-table",
        [["Assert", ["Exists", "", "v"]]],
        "statements[0]/Assert/Exists: Exists.table must not be blank",
    ),
    (
        "int-var",
        [["Assert", ["Exists", "t", 5]]],
        "statements[0]/Assert/Exists: Exists.var must be a str, got int",
    ),
    (
        "nil-into",
        [["SelectConstantValue", None]],
        "SelectConstantValue.into must be a str, got NoneType",
    ),
    (
        "int-flag",
        [["Assert", ["Exists", "t", "v", None, 1]]],
        "Exists.ignore_this_session must be a bool, got int",
    ),
    (
        "str-flag",
        [["SelectVarValue", "x", "t", "v", True, "no"]],
        "SelectVarValue.abort_if_not_found must be a bool, got str",
    ),
    (
        "reset-abort-int",
        [["AnywayContinueAfter", ["DeleteVar", "t", "v"], 1]],
        "AnywayContinueAfter.reset_abort must be a bool, got int",
    ),
    (
        "setvar-flag-str",
        [["Assert", ["SetVar", "t", "v", None, None, None, "y"]]],
        "SetVar.allow_duplicates must be a bool, got str",
    ),
    (
        "description-int",
        [["Assert", ["SetVar", "t", "v", None, 5]]],
        "SetVar.description must be a str or None, got int",
    ),
    (
        "ttl-zero",
        [["Assert", ["SetVar", "t", "v", None, None, 0]]],
        "SetVar.ttl must be a finite number of seconds >= 0.001 or None, got 0",
    ),
    (
        "ttl-nan",
        [["Assert", ["SetVar", "t", "v", None, None, math.nan]]],
        "SetVar.ttl must be a finite number of seconds >= 0.001 or None, got nan",
    ),
    ("ttl-inf", [["Assert", ["SetVar", "t", "v", None, None, math.inf]]], "got inf"),
    (
        "ttl-str",
        [["Assert", ["SetVar", "t", "v", None, None, "5"]]],
        "SetVar.ttl must be a finite number of seconds >= 0.001 or None, got str",
    ),
    ("ttl-bool", [["Assert", ["SetVar", "t", "v", None, None, True]]], "got bool"),
    (
        "ext-value",
        [["SelectConstantValue", "x", msgpack.ExtType(5, b"x")]],
        "SelectConstantValue.value: ExtType is not a wire value",
    ),
    (
        "timestamp-value",
        [["Assert", ["SetVar", "t", "v", msgpack.Timestamp(1, 0)]]],
        "SetVar.value: Timestamp is not a wire value",
    ),
    (
        "nested-ext-value",
        [["Assert", ["Exists", "t", "v", {"a": [msgpack.ExtType(1, b"")]}]]],
        "Exists.value['a'][0]: ExtType is not a wire value",
    ),
    (
        "bytes-key-value",
        [["Assert", ["DeleteVar", "t", "v", {b"k": 1}]]],
        "DeleteVar.value: map keys must be strings, got bytes",
    ),
    (
        "deep-value",
        [
            [
                "SelectConstantValue",
                "x",
                [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
            ]
        ],
        "nested deeper than 32 levels",
    ),
]


@pytest.mark.parametrize(
    ("name", "statements", "message"), TREE_CASES, ids=[c[0] for c in TREE_CASES]
)
def test_tree_decode_error(name: str, statements: Any, message: str) -> None:
    """An invalid tree is INVALID_TRANSACTION, the message names the node's position, and
    the request id is set."""
    err = server_error(execute(statements))
    assert err.code is ErrorCode.INVALID_TRANSACTION
    assert message in err.message, err.message
    assert err.request_id == 7
    assert len(err.message) < 400


def test_statements_from_wire_needs_an_array() -> None:
    """statements_from_wire refuses a non-array with INVALID_TRANSACTION."""
    with pytest.raises(ProtocolError) as info:
        statements_from_wire({"a": 1})
    assert info.value.code is ErrorCode.INVALID_TRANSACTION
    assert info.value.message == "statements must be an array, got map"


def test_node_from_wire_errors_start_at_node() -> None:
    """node_from_wire names positions from "node"."""
    with pytest.raises(ProtocolError) as info:
        node_from_wire(["Not", ["Abort"]])
    assert info.value.code is ErrorCode.INVALID_TRANSACTION
    assert info.value.message.startswith("node/Not: expected an operator")


# --- limits -------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_depth", [2, 5, 32])
def test_depth_exactly_at_limit_accepted_and_one_more_refused(max_depth: int) -> None:
    """A tree exactly max_depth levels deep decodes; one level more is TREE_TOO_DEEP with the
    request id set. Top-level statements are level 1."""
    limits = TreeLimits(max_depth=max_depth)
    conn = Connection(Role.SERVER, limits=limits)
    conn.receive_data(frame(pack(execute([chain(max_depth)]))))
    got = conn.next_message()
    assert isinstance(got, Execute)
    err = server_error(execute([["Abort"], chain(max_depth + 1)]), limits)
    assert err.code is ErrorCode.TREE_TOO_DEEP
    assert err.request_id == 7
    assert f"limit of {max_depth} levels" in err.message
    assert err.message.startswith("statements[1]/Assert")


def test_default_depth_limit_is_32() -> None:
    """The default limits allow 32 levels and refuse 33."""
    assert len(statements_from_wire([chain(32)])) == 1
    with pytest.raises(ProtocolError) as info:
        statements_from_wire([chain(33)])
    assert info.value.code is ErrorCode.TREE_TOO_DEEP


def test_depth_counts_through_block_and_if() -> None:
    """Depth counts every nesting level, through Block items and If branches alike."""
    limits = TreeLimits(max_depth=4)
    ok = [["Block", [["If", ["True"], ["Abort"]]]]]  # Block 1, If 2, True/Abort 3
    assert statements_from_wire(ok, limits) == (Block(If(TRUE, Abort())),)
    deep = [["Block", [["If", ["True"], ["Block", [["Assert", ["True"]]]]]]]]  # 5 levels
    with pytest.raises(ProtocolError) as info:
        statements_from_wire(deep, limits)
    assert info.value.code is ErrorCode.TREE_TOO_DEEP


def test_node_from_wire_depth() -> None:
    """node_from_wire counts the given node as level 1."""
    limits = TreeLimits(max_depth=3)
    assert node_from_wire(["Not", ["Not", ["True"]]], limits) == Not(Not(TRUE))
    with pytest.raises(ProtocolError) as info:
        node_from_wire(["Not", ["Not", ["Not", ["True"]]]], limits)
    assert info.value.code is ErrorCode.TREE_TOO_DEEP


@pytest.mark.parametrize("max_ops", [1, 10, 1000])
def test_op_count_exactly_at_limit_accepted_and_one_more_refused(max_ops: int) -> None:
    """A transaction of exactly max_ops nodes decodes; one node more is TOO_MANY_OPS with the
    request id set. Nodes are counted over all top-level statements."""
    limits = TreeLimits(max_ops=max_ops)
    exact = [["Abort"]] * max_ops
    conn = Connection(Role.SERVER, limits=limits)
    conn.receive_data(frame(pack(execute(exact))))
    got = conn.next_message()
    assert isinstance(got, Execute)
    assert len(got.transaction.statements) == max_ops
    err = server_error(execute([["Abort"]] * (max_ops + 1)), limits)
    assert err.code is ErrorCode.TOO_MANY_OPS
    assert err.request_id == 7
    assert f"limit of {max_ops} ops" in err.message


def test_op_count_includes_nested_nodes() -> None:
    """Every node counts, nested ones included: Assert(And(True, Not(False))) is 5 ops."""
    tree = [["Assert", ["And", ["True"], ["Not", ["False"]]]]]
    assert statements_from_wire(tree, TreeLimits(max_ops=5))
    with pytest.raises(ProtocolError) as info:
        statements_from_wire(tree, TreeLimits(max_ops=4))
    assert info.value.code is ErrorCode.TOO_MANY_OPS


def test_default_op_limit_is_1000() -> None:
    """The default limits allow 1000 nodes and refuse 1001 (a Block of 999 / 1000 Aborts)."""
    assert statements_from_wire([["Block", [["Abort"]] * 999]])
    with pytest.raises(ProtocolError) as info:
        statements_from_wire([["Block", [["Abort"]] * 1000]])
    assert info.value.code is ErrorCode.TOO_MANY_OPS


def test_op_limit_stops_the_walk_early() -> None:
    """A hostile tree is refused after at most max_ops node visits, before later garbage is
    even looked at."""
    tree = [["Abort"]] * 3 + ["not a node"]
    with pytest.raises(ProtocolError) as info:
        statements_from_wire(tree, TreeLimits(max_ops=4))
    assert info.value.code is ErrorCode.INVALID_TRANSACTION  # the 4th node is looked at
    with pytest.raises(ProtocolError) as info:
        statements_from_wire(tree, TreeLimits(max_ops=3))
    assert info.value.code is ErrorCode.TOO_MANY_OPS  # counted before it is looked at


def test_deeply_nested_received_values_are_refused_cleanly() -> None:
    """Arrays nested close to msgpack's own nesting limit, in any field or argument, give a
    ProtocolError (never RecursionError), with a short message."""
    deep: Any = 0
    for _ in range(1000):
        deep = [deep]
    cases = [
        execute([["Assert", ["SetVar", "t", "v", None, None, deep]]]),
        execute([["SelectConstantValue", "x", deep]]),
        execute([[deep]]),
        {"type": deep, "id": 1},
        execute(deep),
        execute([], session=deep),
    ]
    for wire in cases:
        err = server_error(wire)
        assert err.code in (
            ErrorCode.INVALID_MESSAGE,
            ErrorCode.INVALID_TRANSACTION,
            ErrorCode.UNKNOWN_MESSAGE_TYPE,
        )
        assert len(err.message) < 400


# --- frame payloads -----------------------------------------------------------------------------

PAYLOAD_CASES: list[tuple[str, bytes, str]] = [
    (
        "invalid-utf8",
        pack({"type": "ping"})[:-4] + b"\xa4p\xffng",
        "a string in the frame is not valid UTF-8",
    ),
    ("invalid-utf8-key", b"\x81\xa2\xc3\x28\x01", "not valid UTF-8"),
    (
        "trailing-bytes",
        pack({"type": "ping", "id": 1}) + b"\xc0",
        "frame holds trailing bytes after one msgpack document",
    ),
    ("two-documents", pack({"type": "ping", "id": 1}) * 2, "trailing bytes"),
    ("never-used-byte", b"\xc1", "frame is not a valid msgpack document (FormatError)"),
    ("empty", b"", "frame is not a valid msgpack document"),
    ("truncated", pack({"type": "ping", "id": 1})[:-1], "frame is not a valid msgpack document"),
    (
        "int-map-key",
        pack({"type": "ping", "id": 1})[:1].replace(b"\x82", b"\x83")
        + pack({"type": "ping", "id": 1})[1:]
        + b"\x01\x02",
        "int is not allowed for map key",
    ),
    (
        "bad-timestamp",
        b"\x93" + pack("SelectConstantValue") + pack("x") + b"\xc7\x03\xff\x00\x00\x01",
        "invalid timestamp",
    ),
    ("bad-timestamp-alone", b"\xc7\x03\xff\x00\x00\x01", "invalid timestamp"),
    ("huge-array-header", b"\xdd\xff\xff\xff\xff", "frame is not a valid msgpack document"),
    ("nesting-too-deep", b"\x91" * 5000 + b"\xc0", "frame is not a valid msgpack document"),
]


@pytest.mark.parametrize(
    ("name", "payload", "message"), PAYLOAD_CASES, ids=[c[0] for c in PAYLOAD_CASES]
)
@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_bad_payload_is_malformed_frame(
    role: Role, name: str, payload: bytes, message: str
) -> None:
    """A frame that is not exactly one valid msgpack document (with UTF-8 strings and string
    map keys) is MALFORMED_FRAME, with no request id, for both roles."""
    conn = Connection(role)
    conn.receive_data(frame(payload))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.MALFORMED_FRAME
    assert message in info.value.message, info.value.message
    assert info.value.request_id is None
    with pytest.raises(ProtocolError) as again:
        unpack(payload)
    assert again.value.code is ErrorCode.MALFORMED_FRAME


def test_unpack_decodes_one_document() -> None:
    """unpack returns the single document; strings as str, binaries as bytes, arrays as
    lists; pack is its inverse."""
    value = {"s": "é", "b": b"\x00", "l": [1, -1, 2**64 - 1, -(2**63), 1.5, None, True]}
    assert unpack(pack(value)) == value
    assert type(unpack(pack((1, 2)))) is list


# --- server messages (the client's decoder) -----------------------------------------------------

RESULT = {
    "type": "result",
    "id": 4,
    "status": 2,
    "cause": 0,
    "tx_id": "",
    "host": "h",
    "uptime": 1.0,
    "trust": 1.0,
    "failed": None,
    "data": [],
    "fence": 1,
    "valid_until": None,
}

CLIENT_CASES: list[tuple[str, Any, ErrorCode, str, int | None]] = [
    ("array", [], E.INVALID_MESSAGE, "a server message must be a map, got array", None),
    (
        "unknown-type",
        {"type": "execute", "id": 3},
        E.UNKNOWN_MESSAGE_TYPE,
        "unknown server message 'execute'",
        3,
    ),
    ("missing-type", {"id": 3}, E.UNKNOWN_MESSAGE_TYPE, "unknown server message None", 3),
    (
        "map-type",
        {"type": {}, "id": "x"},
        E.UNKNOWN_MESSAGE_TYPE,
        "unknown server message <map>",
        None,
    ),
    (
        "result-missing-fence",
        {k: v for k, v in RESULT.items() if k != "fence"},
        E.INVALID_MESSAGE,
        "result: missing field 'fence'",
        4,
    ),
    (
        "result-bad-status",
        {**RESULT, "status": 7},
        E.INVALID_MESSAGE,
        "result: 7 is not a valid Status",
        4,
    ),
    (
        "result-bad-cause",
        {**RESULT, "cause": 9},
        E.INVALID_MESSAGE,
        "result: 9 is not a valid Cause",
        4,
    ),
    (
        "result-str-status",
        {**RESULT, "status": "ok"},
        E.INVALID_MESSAGE,
        "result: field 'status' must be integer, got string",
        4,
    ),
    (
        "result-data-not-pair",
        {**RESULT, "data": [["a"]]},
        E.INVALID_MESSAGE,
        "result: data items must be [name, value] pairs",
        4,
    ),
    (
        "result-data-int-name",
        {**RESULT, "data": [[1, 2]]},
        E.INVALID_MESSAGE,
        "data items must be [name, value] pairs",
        4,
    ),
    (
        "result-data-map",
        {**RESULT, "data": {}},
        E.INVALID_MESSAGE,
        "field 'data' must be array, got map",
        4,
    ),
    (
        "result-uptime-nan",
        {**RESULT, "uptime": math.nan},
        E.INVALID_MESSAGE,
        "field 'uptime' must be a number, got NaN",
        4,
    ),
    (
        "result-failed-int",
        {**RESULT, "failed": 0},
        E.INVALID_MESSAGE,
        "field 'failed' must be a string, got integer",
        4,
    ),
    (
        "result-str-id",
        {**RESULT, "id": "4"},
        E.INVALID_MESSAGE,
        "result: field 'id' must be integer, got string",
        None,
    ),
    (
        "ended-int",
        {"type": "ended", "id": 1, "existed": 1},
        E.INVALID_MESSAGE,
        "ended: field 'existed' must be bool, got integer",
        1,
    ),
    (
        "pong-missing-trust",
        {"type": "pong", "id": 1, "uptime": 1.0},
        E.INVALID_MESSAGE,
        "pong: missing field 'trust'",
        1,
    ),
    (
        "stats-list",
        {"type": "stats", "id": 1, "stats": []},
        E.INVALID_MESSAGE,
        "stats: field 'stats' must be map, got array",
        1,
    ),
    (
        "welcome-limits",
        {"type": "welcome", "id": 0, "version": 1, "server": "s", "host": "h", "limits": None},
        E.INVALID_MESSAGE,
        "welcome: field 'limits' must be map, got nil",
        0,
    ),
    (
        "welcome-group-number",
        {
            "type": "welcome",
            "id": 0,
            "version": 1,
            "server": "s",
            "host": "h",
            "limits": {},
            "group": 7,
        },
        E.INVALID_MESSAGE,
        "welcome: field 'group' must be a string, got int",
        0,
    ),
    (
        "welcome-replicas-map",
        {
            "type": "welcome",
            "id": 0,
            "version": 1,
            "server": "s",
            "host": "h",
            "limits": {},
            "replicas": {"h": 1},
        },
        E.INVALID_MESSAGE,
        "welcome: field 'replicas' must be array, got map",
        0,
    ),
    (
        "welcome-replicas-item",
        {
            "type": "welcome",
            "id": 0,
            "version": 1,
            "server": "s",
            "host": "h",
            "limits": {},
            "replicas": ["h:1", 7400],
        },
        E.INVALID_MESSAGE,
        "welcome: replicas must be host:port strings, got int",
        0,
    ),
    (
        "cancelled-missing",
        {"type": "cancelled", "id": 1},
        E.INVALID_MESSAGE,
        "cancelled: missing field 'found'",
        1,
    ),
    (
        "error-str-id",
        {"type": "error", "id": "1", "code": 201, "message": "m"},
        E.INVALID_MESSAGE,
        "error: field 'id' must be integer or nil, got string",
        None,
    ),
    (
        "error-no-id",
        {"type": "error", "code": 201, "message": "m"},
        E.INVALID_MESSAGE,
        "error: missing field 'id'",
        None,
    ),
    (
        "error-str-code",
        {"type": "error", "id": 1, "code": "201", "message": "m"},
        E.INVALID_MESSAGE,
        "field 'code' must be integer, got string",
        1,
    ),
    (
        "lost-bad-entry",
        {"type": "lost", "session": "s", "reason": "ttl", "entries": [["n", "t", "v"]]},
        E.INVALID_MESSAGE,
        "lost: entries must be [namespace, table, var, fence] arrays",
        None,
    ),
]


@pytest.mark.parametrize(
    ("name", "wire", "code", "message", "rid"), CLIENT_CASES, ids=[c[0] for c in CLIENT_CASES]
)
def test_server_message_decode_error(
    name: str, wire: Any, code: ErrorCode, message: str, rid: int | None
) -> None:
    """An invalid server message raises ProtocolError on the client side with the right code,
    a message naming the field, and the reply's id when it is a readable integer."""
    conn = Connection(Role.CLIENT)
    conn.receive_data(frame(pack(wire)))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is code
    assert message in info.value.message, info.value.message
    assert info.value.request_id == rid
    with pytest.raises(ProtocolError):
        server_message_from_wire(wire)


def test_valid_execute_still_decodes_beside_these_cases() -> None:
    """Sanity: the execute() helper builds a valid request when given valid statements."""
    assert request_from_wire(execute([["Abort"]])) == Execute(
        7, SessionSpec("s"), Transaction("ns", [Abort()])
    )
    assert request_from_wire(execute([chain(2)])).transaction.statements == (Assert(TRUE),)


def test_an_unknown_lost_reason_decodes_as_unknown() -> None:
    """A ``lost`` event with a reason this client does not know (a newer server's) is not a
    broken stream: it decodes with reason UNKNOWN, its entries intact."""
    from protocol import LockLost, LostReason, server_message_from_wire

    wire = {"type": "lost", "session": "s", "reason": "evicted", "entries": [["n", "t", "v", 3]]}
    assert server_message_from_wire(wire) == LockLost(
        "s", LostReason.UNKNOWN, (("n", "t", "v", 3),)
    )


def test_a_cursor_at_its_length_limit_is_read() -> None:
    """A cursor of exactly MAX_CURSOR characters decodes (whether it is a valid cursor is the
    server's question); one more is TOO_LARGE (the table above)."""
    from protocol import MAX_CURSOR, ListQuery, ListSessions

    wire = {"type": "sessions", "id": 3, "cursor": "c" * MAX_CURSOR}
    assert request_from_wire(wire) == ListSessions(3, ListQuery(cursor="c" * MAX_CURSOR))
