"""Golden tables: every message and every tree node next to its exact wire form.

One table drives the encoder (object -> wire map) and the decoder (framed bytes -> object),
the decoder three ways: the frame fed whole, one byte at a time, and followed by the first
bytes of the next frame (which must stay buffered and decode next).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from protocol import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    Block,
    Cancel,
    Cancelled,
    Cause,
    Connection,
    CountBelow,
    DeleteVar,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    Exists,
    FeedEvent,
    FeedKind,
    ForceRelease,
    GetStatistics,
    Hello,
    HolderInfo,
    HoldersPage,
    If,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    LockLost,
    LostReason,
    Node,
    Not,
    Or,
    Ping,
    Pong,
    Released,
    Reply,
    Role,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionEnded,
    SessionInfo,
    SessionsPage,
    SessionSpec,
    SetVar,
    Statistics,
    Status,
    Subscribe,
    Subscribed,
    Transaction,
    TransactionResult,
    Unsubscribe,
    Unsubscribed,
    WaiterInfo,
    WaitersPage,
    Waiting,
    Welcome,
    Xor,
    frame,
    node_from_wire,
    node_to_wire,
    pack,
    request_from_wire,
    request_to_wire,
    server_message_from_wire,
    server_message_to_wire,
    statements_from_wire,
    unpack,
)


def assert_wire_equal(got: Any, want: Any, where: str = "$") -> None:
    """Structural equality that also insists on identical types (1 is not 1.0 is not True)."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if type(want) is dict:
        assert set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_wire_equal(got[k], want[k], f"{where}.{k}")
    elif type(want) is list:
        assert len(got) == len(want), f"{where}: {got!r} != {want!r}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_wire_equal(g, w, f"{where}[{i}]")
    elif type(want) is float and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


# --- trees --------------------------------------------------------------------------------------

TREES: list[tuple[Node, list[Any]]] = [
    # statements
    (Assert(TRUE), ["Assert", ["True"]]),
    (Abort(), ["Abort"]),
    (Block(Abort()), ["Block", [["Abort"]]]),
    (
        Block(Abort(), Assert(FALSE), Block(Abort())),
        ["Block", [["Abort"], ["Assert", ["False"]], ["Block", [["Abort"]]]]],
    ),
    (If(TRUE, Abort()), ["If", ["True"], ["Abort"]]),
    (
        If(SetVar("t", "v"), Abort(), Assert(FALSE)),
        ["If", ["SetVar", "t", "v"], ["Abort"], ["Assert", ["False"]]],
    ),
    (
        AnywayContinueAfter(DeleteVar("t", "v")),
        ["AnywayContinueAfter", ["DeleteVar", "t", "v"]],
    ),
    (
        AnywayContinueAfter(SetVar("t", "v"), reset_abort=True),
        ["AnywayContinueAfter", ["SetVar", "t", "v"], True],
    ),
    # the encoder always writes SelectConstantValue's value, even nil
    (SelectConstantValue("x"), ["SelectConstantValue", "x", None]),
    (
        SelectConstantValue("x", {"a": [1, "b", None, 2.5, b"\x00"]}),
        ["SelectConstantValue", "x", {"a": [1, "b", None, 2.5, b"\x00"]}],
    ),
    (SelectConstantValue("x", False), ["SelectConstantValue", "x", False]),
    (
        SelectOperatorValue("x", Exists("t", "v")),
        ["SelectOperatorValue", "x", ["Exists", "t", "v"]],
    ),
    (SelectVarValue("x", "t", "v"), ["SelectVarValue", "x", "t", "v"]),
    (
        SelectVarValue("x", "t", "v", ignore_this_session=False),
        ["SelectVarValue", "x", "t", "v", False],
    ),
    (
        SelectVarValue("x", "t", "v", abort_if_not_found=True),
        ["SelectVarValue", "x", "t", "v", True, True],
    ),
    (
        SelectVarValue("x", "t", "v", select_many=True),
        ["SelectVarValue", "x", "t", "v", True, False, True],
    ),
    (
        SelectVarValue(
            "x", "t", "v", ignore_this_session=False, abort_if_not_found=True, select_many=True
        ),
        ["SelectVarValue", "x", "t", "v", False, True, True],
    ),
    # operators
    (And(TRUE, FALSE), ["And", ["True"], ["False"]]),
    (Or(FALSE, TRUE), ["Or", ["False"], ["True"]]),
    (Xor(TRUE, TRUE), ["Xor", ["True"], ["True"]]),
    (Not(Not(TRUE)), ["Not", ["Not", ["True"]]]),
    (TRUE, ["True"]),
    (FALSE, ["False"]),
    (Exists("t", "v"), ["Exists", "t", "v"]),
    (Exists("t", "v", "p"), ["Exists", "t", "v", "p"]),
    (Exists("t", "v", 0), ["Exists", "t", "v", 0]),
    (Exists("t", "v", False), ["Exists", "t", "v", False]),
    (Exists("t", "v", ignore_this_session=False), ["Exists", "t", "v", None, False]),
    (
        Exists("t", "v", [1, 2], ignore_this_session=False),
        ["Exists", "t", "v", [1, 2], False],
    ),
    (SetVar("t", "v"), ["SetVar", "t", "v"]),
    (SetVar("t", "v", 1), ["SetVar", "t", "v", 1]),
    (SetVar("t", "v", 1, ttl=5), ["SetVar", "t", "v", 1, None, 5]),
    (SetVar("t", "v", description="d"), ["SetVar", "t", "v", None, "d"]),
    (SetVar("t", "v", ttl=0.5), ["SetVar", "t", "v", None, None, 0.5]),
    (SetVar("t", "v", allow_duplicates=True), ["SetVar", "t", "v", None, None, None, True]),
    (
        SetVar("t", "v", "x", description="d", ttl=2.5, allow_duplicates=True),
        ["SetVar", "t", "v", "x", "d", 2.5, True],
    ),
    (SetVar("t", "v", period=60), ["SetVar", "t", "v", None, None, None, False, 60]),
    (CountBelow("t", "v", 3), ["CountBelow", "t", "v", 3]),
    (
        CountBelow("t", "v", 0, limit_table="permits", limit_var="v:w"),
        ["CountBelow", "t", "v", 0, "permits", "v:w"],
    ),
    (
        CountBelow("t", "v", 2, ignore_this_session=True),
        ["CountBelow", "t", "v", 2, None, None, True],
    ),
    (Waiting("t", "v"), ["Waiting", "t", "v"]),
    (ArrivedBelow("t", "v", 3), ["ArrivedBelow", "t", "v", 3]),
    (ArrivedBelow("t", "v", 0), ["ArrivedBelow", "t", "v", 0]),
    (DeleteVar("t", "v"), ["DeleteVar", "t", "v"]),
    (DeleteVar("t", "v", "p"), ["DeleteVar", "t", "v", "p"]),
    (DeleteVar("t", "v", 0), ["DeleteVar", "t", "v", 0]),
]


def _tree_id(case: tuple[Node, list[Any]]) -> str:
    return repr(case[1])[:60]


@pytest.mark.parametrize(("node", "wire"), TREES, ids=[_tree_id(c) for c in TREES])
def test_tree_encodes_to_golden_wire(node: Node, wire: list[Any]) -> None:
    """node_to_wire writes [op, args...] with trailing default arguments trimmed."""
    assert_wire_equal(node_to_wire(node), wire)


@pytest.mark.parametrize(("node", "wire"), TREES, ids=[_tree_id(c) for c in TREES])
def test_tree_decodes_from_golden_wire(node: Node, wire: list[Any]) -> None:
    """node_from_wire rebuilds the same node from its golden wire form, also after a msgpack
    round trip."""
    assert node_from_wire(wire) == node
    assert node_from_wire(unpack(pack(wire))) == node


def test_every_op_is_in_the_tree_table() -> None:
    """The golden table covers every op name the decoder knows."""
    names = {wire[0] for _, wire in TREES}
    assert names == {
        "Assert",
        "Abort",
        "Block",
        "If",
        "AnywayContinueAfter",
        "SelectConstantValue",
        "SelectOperatorValue",
        "SelectVarValue",
        "CountBelow",
        "Waiting",
        "ArrivedBelow",
        "And",
        "Or",
        "Xor",
        "Not",
        "True",
        "False",
        "Exists",
        "SetVar",
        "DeleteVar",
    }


def test_constants_decode_to_the_singletons() -> None:
    """["True"] and ["False"] decode to the TRUE and FALSE instances themselves."""
    assert node_from_wire(["True"]) is TRUE
    assert node_from_wire(["False"]) is FALSE


# Alternative wire spellings the decoder accepts: omitted trailing args, nil meaning default.
TREE_ALTERNATIVES: list[tuple[list[Any], Node]] = [
    (["SelectConstantValue", "x"], SelectConstantValue("x")),
    (["If", ["True"], ["Abort"], None], If(TRUE, Abort())),
    (
        ["AnywayContinueAfter", ["DeleteVar", "t", "v"], None],
        AnywayContinueAfter(DeleteVar("t", "v")),
    ),
    (
        ["AnywayContinueAfter", ["DeleteVar", "t", "v"], False],
        AnywayContinueAfter(DeleteVar("t", "v")),
    ),
    (["SelectVarValue", "x", "t", "v", None, None, None], SelectVarValue("x", "t", "v")),
    (["SelectVarValue", "x", "t", "v", True, False, False], SelectVarValue("x", "t", "v")),
    (
        ["SelectVarValue", "x", "t", "v", None, None, True],
        SelectVarValue("x", "t", "v", select_many=True),
    ),
    (
        ["SelectVarValue", "x", "t", "v", False, None],
        SelectVarValue("x", "t", "v", ignore_this_session=False),
    ),
    (["Exists", "t", "v", None], Exists("t", "v")),
    (["Exists", "t", "v", None, None], Exists("t", "v")),
    (["Exists", "t", "v", None, True], Exists("t", "v")),
    (["SetVar", "t", "v", None], SetVar("t", "v")),
    (["SetVar", "t", "v", None, None, None, None], SetVar("t", "v")),
    (["SetVar", "t", "v", None, None, None, False], SetVar("t", "v")),
    (["SetVar", "t", "v", 1, None, 5, None], SetVar("t", "v", 1, ttl=5)),
    (["DeleteVar", "t", "v", None], DeleteVar("t", "v")),
]


@pytest.mark.parametrize(
    ("wire", "node"), TREE_ALTERNATIVES, ids=[repr(w) for w, _ in TREE_ALTERNATIVES]
)
def test_tree_decoder_accepts_omitted_args_and_nil_defaults(wire: list[Any], node: Node) -> None:
    """Trailing optional args may be omitted, and nil in a bool flag (or other optional slot)
    means its default."""
    assert node_from_wire(wire) == node


def test_statements_from_wire_decodes_a_top_level_list() -> None:
    """statements_from_wire decodes a list of statements in order; [] is a valid (ping) list."""
    wire = [["Assert", ["True"]], ["Abort"]]
    assert statements_from_wire(wire) == (Assert(TRUE), Abort())
    assert statements_from_wire([]) == ()


def test_node_to_wire_refuses_non_nodes() -> None:
    """Encoding something that is not a tree node is a TypeError (a programming error)."""
    with pytest.raises(TypeError, match="not a tree node"):
        node_to_wire("Abort")  # type: ignore[arg-type]


# --- messages -----------------------------------------------------------------------------------

FULL_EXECUTE = Execute(
    4,
    SessionSpec("sess-1", max_age=30.0, description="worker 7"),
    Transaction(
        "Clinical",
        [
            Assert(Not(Exists("Month-End", "F1"))),
            AnywayContinueAfter(SetVar("MDS-Entry", "F1", "P1", allow_duplicates=True)),
            SelectVarValue("holder", "MDS-Entry", "F1", select_many=True),
        ],
        transaction_id="tx-9",
        description="mds entry",
        min_uptime=120.0,
        min_trust=0.5,
    ),
    wait=2.5,
)

FULL_EXECUTE_WIRE = {
    "type": "execute",
    "id": 4,
    "session": "sess-1",
    "namespace": "Clinical",
    "statements": [
        ["Assert", ["Not", ["Exists", "Month-End", "F1"]]],
        ["AnywayContinueAfter", ["SetVar", "MDS-Entry", "F1", "P1", None, None, True]],
        ["SelectVarValue", "holder", "MDS-Entry", "F1", True, False, True],
    ],
    "max_age": 30.0,
    "session_description": "worker 7",
    "tx_id": "tx-9",
    "description": "mds entry",
    "min_uptime": 120.0,
    "min_trust": 0.5,
    "wait": 2.5,
}

REQUESTS: list[tuple[str, Any, dict[str, Any]]] = [
    ("hello", Hello(0), {"type": "hello", "id": 0, "version": 1, "client": ""}),
    (
        "hello-token",
        Hello(1, version=1, client_name="py-client/1.0", token="s3cret"),
        {"type": "hello", "id": 1, "version": 1, "client": "py-client/1.0", "token": "s3cret"},
    ),
    (
        "execute-minimal",
        Execute(2, SessionSpec("s"), Transaction("ns", [])),
        {"type": "execute", "id": 2, "session": "s", "namespace": "ns", "statements": []},
    ),
    (
        "execute-one-statement",
        Execute(3, SessionSpec("s"), Transaction("ns", [Abort()])),
        {"type": "execute", "id": 3, "session": "s", "namespace": "ns", "statements": [["Abort"]]},
    ),
    ("execute-full", FULL_EXECUTE, FULL_EXECUTE_WIRE),
    (
        "execute-wait-zero",
        Execute(5, SessionSpec("s"), Transaction("ns", []), wait=0),
        {
            "type": "execute",
            "id": 5,
            "session": "s",
            "namespace": "ns",
            "statements": [],
            "wait": 0,
        },
    ),
    ("end", EndSession(6, "sess-1"), {"type": "end", "id": 6, "session": "sess-1"}),
    ("stats", GetStatistics(7), {"type": "stats", "id": 7}),
    ("ping", Ping(8), {"type": "ping", "id": 8}),
    ("ping-max-id", Ping(2**64 - 1), {"type": "ping", "id": 2**64 - 1}),
    ("cancel", Cancel(9, 4), {"type": "cancel", "id": 9, "target": 4}),
    # the operator's requests (PROTOCOL.md "Inspection")
    ("holders-all", ListHolders(10), {"type": "holders", "id": 10}),
    (
        "holders-filtered",
        ListHolders(11, ListQuery("ns", "jobs-", "v", "s1", "worker", "Y3Vy", 1000)),
        {
            "type": "holders",
            "id": 11,
            "namespace": "ns",
            "table": "jobs-",
            "var": "v",
            "session": "s1",
            "match": "worker",
            "cursor": "Y3Vy",
            "limit": 1000,
        },
    ),
    (
        "sessions",
        ListSessions(12, ListQuery(match="pid", limit=5)),
        {"type": "sessions", "id": 12, "match": "pid", "limit": 5},
    ),
    (
        "waiters",
        ListWaiters(13, ListQuery(namespace="ns")),
        {"type": "waiters", "id": 13, "namespace": "ns"},
    ),
    (
        "release",
        ForceRelease(14, "ns", "L", "k"),
        {"type": "release", "id": 14, "namespace": "ns", "table": "L", "var": "k"},
    ),
    (
        "release-session",
        ForceRelease(15, "ns", "L", "k", "s1"),
        {"type": "release", "id": 15, "namespace": "ns", "table": "L", "var": "k", "session": "s1"},
    ),
    ("subscribe", Subscribe(16, "ns"), {"type": "subscribe", "id": 16, "namespace": "ns"}),
    (
        "subscribe-table",
        Subscribe(17, "ns", "L"),
        {"type": "subscribe", "id": 17, "namespace": "ns", "table": "L"},
    ),
    ("unsubscribe", Unsubscribe(18, 16), {"type": "unsubscribe", "id": 18, "target": 16}),
]

HOLDER = HolderInfo(
    "ns", "L", "k", "3f2c", "worker-7 pid 4411", "t-1", None, 1795700000.25, None, 17
)
HOLDER_WIRE = {
    "namespace": "ns",
    "table": "L",
    "var": "k",
    "session": "3f2c",
    "session_description": "worker-7 pid 4411",
    "value": "t-1",
    "description": None,
    "acquired_at": 1795700000.25,
    "expires_at": None,
    "fence": 17,
}

ENTRY_RECORD = {
    "session": "sess-1",
    "value": "P1",
    "description": None,
    "tx_id": "tx-9",
    "set_at": 12.25,
    "expires_at": None,
    "fence": 1732570000000001,
}

SERVER_MESSAGES: list[tuple[str, Any, dict[str, Any]]] = [
    (
        "result-ok",
        Reply(
            4,
            TransactionResult(
                status=Status.TRANSACTION_OK,
                cause=Cause.UNSPECIFIED,
                transaction_id="tx-9",
                host="lock-1",
                uptime=130.5,
                trust=1.0,
                data=(("holder", [ENTRY_RECORD]), ("n", 1), ("n", None)),
                fence=1732570000000002,
                valid_until=160.5,
            ),
        ),
        {
            "type": "result",
            "id": 4,
            "status": 2,
            "cause": 0,
            "tx_id": "tx-9",
            "host": "lock-1",
            "uptime": 130.5,
            "trust": 1.0,
            "failed": None,
            "data": [["holder", [ENTRY_RECORD]], ["n", 1], ["n", None]],
            "fence": 1732570000000002,
            "valid_until": 160.5,
        },
    ),
    (
        "result-error",
        Reply(
            5,
            TransactionResult(
                status=Status.TRANSACTION_ERROR,
                cause=Cause.STATEMENT,
                transaction_id="",
                host="lock-1",
                uptime=131.0,
                trust=0.25,
                failed_statement="1:/IfOp/AssertOp/",
                data=(("before", True),),
                fence=1732570000000002,
                valid_until=161.0,
            ),
        ),
        {
            "type": "result",
            "id": 5,
            "status": 1,
            "cause": 1,
            "tx_id": "",
            "host": "lock-1",
            "uptime": 131.0,
            "trust": 0.25,
            "failed": "1:/IfOp/AssertOp/",
            "data": [["before", True]],
            "fence": 1732570000000002,
            "valid_until": 161.0,
        },
    ),
    (
        "result-refused",
        Reply(
            6,
            TransactionResult(
                status=Status.TRANSACTION_ERROR,
                cause=Cause.MINIMUM_REQUIREMENTS,
                transaction_id="t",
                host="h",
                uptime=1.5,
                trust=0.0,
            ),
        ),
        {
            "type": "result",
            "id": 6,
            "status": 1,
            "cause": 2,
            "tx_id": "t",
            "host": "h",
            "uptime": 1.5,
            "trust": 0.0,
            "failed": None,
            "data": [],
            "fence": 0,
            "valid_until": None,
        },
    ),
    ("ended", Reply(7, SessionEnded(True)), {"type": "ended", "id": 7, "existed": True}),
    ("ended-unknown", Reply(8, SessionEnded(False)), {"type": "ended", "id": 8, "existed": False}),
    ("pong", Reply(9, Pong(12.5, 1.0)), {"type": "pong", "id": 9, "uptime": 12.5, "trust": 1.0}),
    (
        "stats",
        Reply(10, Statistics({"sessions": 3, "namespaces": {"ns": {"tables": 2}}})),
        {"type": "stats", "id": 10, "stats": {"sessions": 3, "namespaces": {"ns": {"tables": 2}}}},
    ),
    (
        "welcome",
        Reply(
            0,
            Welcome(
                1, "lockserver", "lock-1", {"max_frame": 1048576, "max_ops": 1000}, "9f2c41d07a3b"
            ),
        ),
        {
            "type": "welcome",
            "id": 0,
            "version": 1,
            "server": "lockserver",
            "host": "lock-1",
            "limits": {"max_frame": 1048576, "max_ops": 1000},
            "instance": "9f2c41d07a3b",
        },
    ),
    (
        "welcome-replica",
        Reply(
            0,
            Welcome(
                1,
                "lockserver",
                "lock-2",
                {"max_frame": 1048576},
                "5e0b7c11d2aa4f03",
                1700000000.25,
                "orders",
                ("lock-1:7400", "lock-2:7400", "lock-3:7400"),
            ),
        ),
        {
            "type": "welcome",
            "id": 0,
            "version": 1,
            "server": "lockserver",
            "host": "lock-2",
            "limits": {"max_frame": 1048576},
            "instance": "5e0b7c11d2aa4f03",
            "started_at": 1700000000.25,
            "group": "orders",
            "replicas": ["lock-1:7400", "lock-2:7400", "lock-3:7400"],
        },
    ),
    ("cancelled", Reply(11, Cancelled(True)), {"type": "cancelled", "id": 11, "found": True}),
    (
        "error-with-id",
        ErrorReply(12, ErrorCode.INVALID_TRANSACTION, "statements[0]: unknown op 'Nope'"),
        {
            "type": "error",
            "id": 12,
            "code": 203,
            "name": "INVALID_TRANSACTION",
            "message": "statements[0]: unknown op 'Nope'",
        },
    ),
    (
        "error-without-id",
        ErrorReply(None, ErrorCode.MALFORMED_FRAME, "bad frame"),
        {
            "type": "error",
            "id": None,
            "code": 102,
            "name": "MALFORMED_FRAME",
            "message": "bad frame",
        },
    ),
    (
        "lost",
        LockLost(
            "sess-1",
            LostReason.EXPIRED,
            (("Clinical", "MDS-Entry", "F1", 17), ("Clinical", "MDS-Review", "F1", 18)),
        ),
        {
            "type": "lost",
            "session": "sess-1",
            "reason": "expired",
            "entries": [["Clinical", "MDS-Entry", "F1", 17], ["Clinical", "MDS-Review", "F1", 18]],
        },
    ),
    (
        "lost-no-entries",
        LockLost("s", LostReason.ENDED),
        {"type": "lost", "session": "s", "reason": "ended", "entries": []},
    ),
    (
        "lost-released",
        LockLost("s", LostReason.RELEASED, (("ns", "L", "k", 17),)),
        {"type": "lost", "session": "s", "reason": "released", "entries": [["ns", "L", "k", 17]]},
    ),
    (
        "result-denied-with-holders",
        Reply(
            21,
            TransactionResult(
                Status.TRANSACTION_ERROR,
                Cause.STATEMENT,
                "",
                "h",
                2.0,
                1.0,
                "0:/AssertOp/",
                (),
                18,
                62.0,
                (HOLDER,),
            ),
        ),
        {
            "type": "result",
            "id": 21,
            "status": 1,
            "cause": 1,
            "tx_id": "",
            "host": "h",
            "uptime": 2.0,
            "trust": 1.0,
            "failed": "0:/AssertOp/",
            "data": [],
            "fence": 18,
            "valid_until": 62.0,
            "holders": [HOLDER_WIRE],
        },
    ),
    (
        "holders-page",
        Reply(22, HoldersPage((HOLDER,), "Y3Vy")),
        {"type": "holders", "id": 22, "holders": [HOLDER_WIRE], "cursor": "Y3Vy"},
    ),
    (
        "sessions-page",
        Reply(
            23,
            SessionsPage(
                (
                    SessionInfo(
                        "3f2c", "w-7", "alice", ("10.0.0.5:4411",), 1.5, 2.5, 60.0, 62.5, 3, 1
                    ),
                )
            ),
        ),
        {
            "type": "sessions",
            "id": 23,
            "sessions": [
                {
                    "session": "3f2c",
                    "description": "w-7",
                    "principal": "alice",
                    "clients": ["10.0.0.5:4411"],
                    "created": 1.5,
                    "last_touch": 2.5,
                    "max_age": 60.0,
                    "valid_until": 62.5,
                    "entries": 3,
                    "waiters": 1,
                }
            ],
            "cursor": None,
        },
    ),
    (
        "waiters-page",
        Reply(24, WaitersPage((WaiterInfo("w", "ns", "tx", (("L", "k", 0),), 5.0, 15.0),))),
        {
            "type": "waiters",
            "id": 24,
            "waiters": [
                {
                    "session": "w",
                    "namespace": "ns",
                    "description": "tx",
                    "variables": [["L", "k", 0]],
                    "since": 5.0,
                    "deadline": 15.0,
                }
            ],
            "cursor": None,
        },
    ),
    (
        "released",
        Reply(25, Released(2, 19)),
        {"type": "released", "id": 25, "entries": 2, "fence": 19},
    ),
    ("subscribed", Reply(26, Subscribed(26)), {"type": "subscribed", "id": 26, "subscription": 26}),
    (
        "unsubscribed",
        Reply(27, Unsubscribed(True)),
        {"type": "unsubscribed", "id": 27, "found": True},
    ),
    (
        "feed",
        FeedEvent(16, FeedKind.EXPIRED, "ns", "L", "k", "s", 17, 1795700003.5, "ttl", 4),
        {
            "type": "feed",
            "subscription": 16,
            "kind": "expired",
            "namespace": "ns",
            "table": "L",
            "var": "k",
            "session": "s",
            "fence": 17,
            "at": 1795700003.5,
            "reason": "ttl",
            "dropped": 4,
        },
    ),
]

# (role that decodes, message, wire)
MESSAGES = [(Role.SERVER, *case) for case in REQUESTS] + [
    (Role.CLIENT, *case) for case in SERVER_MESSAGES
]
IDS = [f"{role.value}-{name}" for role, name, _, _ in MESSAGES]
# The message following each golden one in the "trailing bytes" test.
NEXT = {Role.SERVER: Ping(99), Role.CLIENT: Reply(99, Pong(1.0, 1.0))}


def sender(role: Role) -> Connection:
    """The connection on the other side of ``role``."""
    return Connection(Role.CLIENT if role is Role.SERVER else Role.SERVER)


def to_wire(role: Role, message: Any) -> dict[str, Any]:
    """Encode ``message`` for a peer of ``role``."""
    return request_to_wire(message) if role is Role.SERVER else server_message_to_wire(message)


def test_every_request_and_server_message_kind_is_covered() -> None:
    """The golden table holds every request type and every server message type."""
    assert {w["type"] for _, _, w in REQUESTS} == {
        "hello",
        "execute",
        "end",
        "stats",
        "ping",
        "cancel",
        "holders",
        "sessions",
        "waiters",
        "release",
        "subscribe",
        "unsubscribe",
    }
    assert {w["type"] for _, _, w in SERVER_MESSAGES} == {
        "result",
        "ended",
        "pong",
        "stats",
        "welcome",
        "cancelled",
        "error",
        "lost",
        "holders",
        "sessions",
        "waiters",
        "released",
        "subscribed",
        "unsubscribed",
        "feed",
    }


@pytest.mark.parametrize(("role", "name", "message", "wire"), MESSAGES, ids=IDS)
def test_encoder_produces_golden_wire(role: Role, name: str, message: Any, wire: Any) -> None:
    """The encoder writes exactly the golden map (same keys, same types), and send() frames
    its msgpack encoding."""
    assert_wire_equal(to_wire(role, message), wire)
    framed = sender(role).send(message)
    assert framed == frame(pack(to_wire(role, message)))
    assert_wire_equal(unpack(framed[4:]), wire)


@pytest.mark.parametrize(("role", "name", "message", "wire"), MESSAGES, ids=IDS)
def test_decoder_whole_frame(role: Role, name: str, message: Any, wire: Any) -> None:
    """The golden map, framed and fed in one piece, decodes to the message."""
    conn = Connection(role)
    conn.receive_data(frame(pack(wire)))
    assert conn.next_message() == message
    assert conn.next_message() is None
    assert conn.buffered == 0


@pytest.mark.parametrize(("role", "name", "message", "wire"), MESSAGES, ids=IDS)
def test_decoder_one_byte_at_a_time(role: Role, name: str, message: Any, wire: Any) -> None:
    """Fed one byte at a time, the message appears exactly when its last byte arrives."""
    conn = Connection(role)
    data = frame(pack(wire))
    for i in range(len(data) - 1):
        conn.receive_data(data[i : i + 1])
        assert conn.next_message() is None
    conn.receive_data(data[-1:])
    assert conn.next_message() == message
    assert conn.next_message() is None


@pytest.mark.parametrize(("role", "name", "message", "wire"), MESSAGES, ids=IDS)
def test_decoder_with_trailing_bytes(role: Role, name: str, message: Any, wire: Any) -> None:
    """Followed by part of the next frame, the message decodes; the partial next frame stays
    buffered and decodes once completed."""
    conn = Connection(role)
    nxt = sender(role).send(NEXT[role])
    for cut in (1, 4, 5, len(nxt) - 1):
        conn.receive_data(frame(pack(wire)) + nxt[:cut])
        assert conn.next_message() == message
        assert conn.next_message() is None
        assert conn.buffered == cut
        conn.receive_data(nxt[cut:])
        assert conn.next_message() == NEXT[role]
        assert conn.next_message() is None


@pytest.mark.parametrize(("name", "message", "wire"), REQUESTS, ids=[n for n, _, _ in REQUESTS])
def test_request_from_wire_direct(name: str, message: Any, wire: Any) -> None:
    """request_from_wire decodes the golden map without framing."""
    assert request_from_wire(wire) == message


@pytest.mark.parametrize(
    ("name", "message", "wire"), SERVER_MESSAGES, ids=[n for n, _, _ in SERVER_MESSAGES]
)
def test_server_message_from_wire_direct(name: str, message: Any, wire: Any) -> None:
    """server_message_from_wire decodes the golden map without framing."""
    assert server_message_from_wire(wire) == message


def test_decoded_enums_are_enum_members() -> None:
    """Decoded status, cause, error code and lost reason are the enum members, not bare
    ints or strings."""
    wire = SERVER_MESSAGES[1][2]
    got = server_message_from_wire(wire)
    assert got.body.status is Status.TRANSACTION_ERROR
    assert got.body.cause is Cause.STATEMENT
    assert not got.body.ok
    assert server_message_from_wire(SERVER_MESSAGES[0][2]).body.ok
    err = server_message_from_wire({"type": "error", "id": 1, "code": 301, "message": "m"})
    assert err.code is ErrorCode.TREE_TOO_DEEP
    lost = server_message_from_wire(
        {"type": "lost", "session": "s", "reason": "ttl", "entries": []}
    )
    assert lost.reason is LostReason.TTL


def test_request_optional_fields_nil_means_default() -> None:
    """In a request, an optional field sent as nil is the same as the field left out."""
    wire = {
        "type": "execute",
        "id": 1,
        "session": "s",
        "namespace": "ns",
        "statements": [],
        "max_age": None,
        "session_description": None,
        "tx_id": None,
        "description": None,
        "min_uptime": None,
        "min_trust": None,
        "wait": None,
    }
    assert request_from_wire(wire) == Execute(1, SessionSpec("s"), Transaction("ns", []))
    hello = {"type": "hello", "id": 1, "version": 1, "client": None, "token": None}
    assert request_from_wire(hello) == Hello(1)
    assert request_from_wire({"type": "hello", "id": 1, "version": 1}) == Hello(1)


def test_integer_numbers_accepted_for_float_fields() -> None:
    """Numeric fields accept msgpack integers as well as floats."""
    wire = {
        "type": "execute",
        "id": 1,
        "session": "s",
        "namespace": "ns",
        "statements": [],
        "max_age": 30,
        "min_uptime": 5,
        "min_trust": 1,
        "wait": 3,
    }
    got = request_from_wire(wire)
    assert got.session.max_age == 30
    assert got.transaction.min_uptime == 5
    assert got.transaction.min_trust == 1
    assert got.wait == 3


def test_default_max_age_is_omitted_on_the_wire() -> None:
    """A session max age equal to the default (60 s) is not written."""
    wire = request_to_wire(Execute(1, SessionSpec("s", max_age=60), Transaction("ns", [])))
    assert "max_age" not in wire


def test_client_ignores_unknown_fields_in_server_messages() -> None:
    """A client accepts (and ignores) extra fields in server messages, so a newer server may
    add fields without breaking older clients."""
    wire = {"type": "pong", "id": 1, "uptime": 1.0, "trust": 1.0, "load": 0.5}
    assert server_message_from_wire(wire) == Reply(1, Pong(1.0, 1.0))


def test_unknown_error_code_from_server_becomes_internal_error() -> None:
    """An error code the client does not know is kept as INTERNAL_ERROR with its message."""
    got = server_message_from_wire({"type": "error", "id": 3, "code": 999, "message": "new"})
    assert got == ErrorReply(3, ErrorCode.INTERNAL_ERROR, "new")


def test_encoders_refuse_wrong_objects() -> None:
    """Encoding an object of the wrong kind is a TypeError (a programming error)."""
    with pytest.raises(TypeError, match="not a request"):
        request_to_wire(Pong(1.0, 1.0))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a server message"):
        server_message_to_wire(Ping(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a reply body"):
        server_message_to_wire(Reply(1, Ping(1)))  # type: ignore[arg-type]
