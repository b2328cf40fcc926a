"""Wire numbers and the public surface: both are contracts, so they are pinned here."""

from __future__ import annotations

import types

import pytest

import protocol
from protocol import Cause, ErrorCode, LostReason, ProtocolError, Role, Status


def test_status_values() -> None:
    """Status wire values are exactly those of SEMANTICS.md."""
    assert {s.name: int(s) for s in Status} == {
        "CALL_FAILED": 0,
        "TRANSACTION_ERROR": 1,
        "TRANSACTION_OK": 2,
    }


def test_cause_values() -> None:
    """Cause wire values are exactly those of SEMANTICS.md."""
    assert {c.name: int(c) for c in Cause} == {
        "UNSPECIFIED": 0,
        "STATEMENT": 1,
        "MINIMUM_REQUIREMENTS": 2,
        "SESSION_EXPIRED": 3,
    }


def test_lost_reason_values() -> None:
    """LockLost reasons travel as these strings."""
    assert {r.name: r.value for r in LostReason} == {
        "EXPIRED": "expired",
        "TTL": "ttl",
        "ENDED": "ended",
        "RESTARTED": "restarted",
        "RELEASED": "released",
        "UNKNOWN": "unknown",
    }


# code -> (value, closes the connection)
ERROR_CODES = {
    "FRAME_TOO_LARGE": (101, True),
    "MALFORMED_FRAME": (102, True),
    "INVALID_MESSAGE": (201, False),
    "UNKNOWN_MESSAGE_TYPE": (202, False),
    "INVALID_TRANSACTION": (203, False),
    "UNSUPPORTED_VERSION": (204, True),
    "HANDSHAKE_REQUIRED": (205, False),
    "DUPLICATE_REQUEST_ID": (206, False),
    "TREE_TOO_DEEP": (301, False),
    "TOO_MANY_OPS": (302, False),
    "TOO_MANY_SESSIONS": (303, False),
    "TOO_MANY_ENTRIES": (304, False),
    "TOO_MANY_CONNECTIONS": (305, True),
    "TOO_MANY_WAITERS": (306, False),
    "UNAUTHORIZED": (307, True),
    "FORBIDDEN": (308, False),
    "SESSION_CONFLICT": (309, False),
    "NOT_FOUND": (310, False),
    "SHUTTING_DOWN": (311, True),
    "SLOW_CONSUMER": (312, True),
    "TOO_LARGE": (313, False),
    "STORE_FULL": (314, False),
    "OVERLOADED": (315, True),
    "UNAVAILABLE": (316, True),
    "INTERNAL_ERROR": (500, True),
}


def test_error_code_values() -> None:
    """Every ErrorCode and its number is pinned (never renumber a wire code)."""
    assert {c.name: int(c) for c in ErrorCode} == {n: v for n, (v, _) in ERROR_CODES.items()}


@pytest.mark.parametrize("name", list(ERROR_CODES))
def test_error_code_closes_connection(name: str) -> None:
    """closes_connection: all 1xx, plus UNSUPPORTED_VERSION, TOO_MANY_CONNECTIONS,
    UNAUTHORIZED, SHUTTING_DOWN, SLOW_CONSUMER, OVERLOADED, UNAVAILABLE and INTERNAL_ERROR."""
    assert ErrorCode[name].closes_connection is ERROR_CODES[name][1]


def test_protocol_error_fields_and_text() -> None:
    """ProtocolError carries code, message and request_id; str() shows name, number and
    message."""
    err = ProtocolError(ErrorCode.TOO_MANY_OPS, "too many", request_id=4)
    assert (err.code, err.message, err.request_id) == (ErrorCode.TOO_MANY_OPS, "too many", 4)
    assert str(err) == "TOO_MANY_OPS (302): too many"
    assert ProtocolError(ErrorCode.MALFORMED_FRAME, "m").request_id is None
    assert isinstance(err, Exception)


def test_role_values() -> None:
    """Role has exactly the two sides."""
    assert {r.name: r.value for r in Role} == {"CLIENT": "client", "SERVER": "server"}


def test_state_values() -> None:
    """The lifecycle has exactly three states."""
    assert {s.name: s.value for s in protocol.State} == {
        "AWAITING_HELLO": "awaiting_hello",
        "READY": "ready",
        "CLOSED": "closed",
    }


def test_protocol_constants() -> None:
    """Version, default session max age, default frame limit and header size."""
    assert protocol.PROTOCOL_VERSION == 1
    assert protocol.DEFAULT_SESSION_MAX_AGE == 60.0
    assert protocol.DEFAULT_MAX_FRAME == 1048576
    assert protocol.HEADER_SIZE == 4
    assert protocol.TreeLimits(max_depth=32, max_ops=1000) == protocol.DEFAULT_TREE_LIMITS


PUBLIC = {
    # inspection and operations
    "DEFAULT_PAGE",
    "MAX_CURSOR",
    "MAX_HOLDERS",
    "MAX_PAGE",
    "PAGE_BYTES",
    "PAGE_SCAN",
    "FeedEvent",
    "FeedKind",
    "ForceRelease",
    "HolderInfo",
    "HoldersPage",
    "ListHolders",
    "ListQuery",
    "ListSessions",
    "ListWaiters",
    "Released",
    "SessionInfo",
    "SessionsPage",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "WaiterInfo",
    "WaitersPage",
    "make_holder",
    # JSON rendering of the records
    "iso_utc",
    "json_value",
    "record_to_json",
    # framing and connection
    "DEFAULT_MAX_FRAME",
    "HEADER_SIZE",
    "FrameBuffer",
    "frame",
    "Connection",
    "Role",
    # lifecycle
    "State",
    "Lifecycle",
    "LifecycleError",
    "LIFECYCLE",
    "CLOSING_ERROR",
    "message_kind",
    # errors
    "ErrorCode",
    "ProtocolError",
    # codec
    "DEFAULT_TREE_LIMITS",
    "TreeLimits",
    "pack",
    "unpack",
    "node_to_wire",
    "node_from_wire",
    "statements_from_wire",
    "request_to_wire",
    "encode_execute",
    "request_from_wire",
    "server_message_to_wire",
    "server_message_from_wire",
    # messages
    "PROTOCOL_VERSION",
    "DEFAULT_SESSION_MAX_AGE",
    "Status",
    "Cause",
    "LostReason",
    "SessionSpec",
    "Transaction",
    "Hello",
    "Execute",
    "EndSession",
    "GetStatistics",
    "Ping",
    "Cancel",
    "Request",
    "Welcome",
    "TransactionResult",
    "SessionEnded",
    "Statistics",
    "Pong",
    "Cancelled",
    "ReplyBody",
    "Reply",
    "ErrorReply",
    "LockLost",
    "Event",
    "ServerMessage",
    # tree
    "Node",
    "Operator",
    "ChangeOperator",
    "Statement",
    "Assert",
    "Abort",
    "Block",
    "If",
    "AnywayContinueAfter",
    "SelectConstantValue",
    "SelectOperatorValue",
    "SelectVarValue",
    "And",
    "Or",
    "Xor",
    "Not",
    "TrueOp",
    "FalseOp",
    "TRUE",
    "FALSE",
    "Exists",
    "CountBelow",
    "Waiting",
    "ArrivedBelow",
    "SetVar",
    "DeleteVar",
    "check_value",
    "value_size",
    "new_transaction_result",
    "ELEMENT_SIZE",
    "MIN_SECONDS",
    "MAX_HELLO_FRAME",
}


def test_all_is_exactly_the_public_surface() -> None:
    """protocol.__all__ lists exactly the documented public names, once each, and every name
    exists."""
    assert len(protocol.__all__) == len(set(protocol.__all__))
    assert set(protocol.__all__) == PUBLIC
    for name in protocol.__all__:
        assert hasattr(protocol, name), name


def test_nothing_private_leaks() -> None:
    """No private name is exported, and every public attribute of the package (other than
    its private submodules) is in __all__; star-import gives exactly __all__."""
    assert not [n for n in protocol.__all__ if n.startswith("_")]
    public_attrs = {
        n
        for n in dir(protocol)
        if not n.startswith("_") and not isinstance(getattr(protocol, n), types.ModuleType)
    }
    assert public_attrs == set(protocol.__all__)
    namespace: dict[str, object] = {}
    exec("from protocol import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(protocol.__all__)


def test_exported_objects_come_from_private_modules() -> None:
    """Every exported class and function is defined in one of protocol's private modules
    (the package __init__ only re-exports)."""
    for name in protocol.__all__:
        obj = getattr(protocol, name)
        module = getattr(obj, "__module__", None)
        if isinstance(obj, type | types.FunctionType):
            assert module is not None
            assert module.startswith("protocol._"), (name, module)
