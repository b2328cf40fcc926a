"""The socket-free core: reply matching, error mapping, retry rules, event dispatch, Result,
the error hierarchy and the public surface. No sockets, no trio."""

from __future__ import annotations

from typing import Any

import pytest

import client
import protocol
from client._core import ClientCore
from client._session_state import SessionState
from client._wire import (
    CANCEL,
    END,
    EXECUTE,
    HELLO,
    KEEPALIVE,
    PING,
    RETRY,
    STATS,
    Batch,
    Wire,
)
from protocol import (
    Cause,
    Connection,
    ErrorCode,
    ErrorReply,
    LockLost,
    LostReason,
    Pong,
    Reply,
    Role,
    SessionEnded,
    Statistics,
    Status,
    TransactionResult,
    Welcome,
)

_server = Connection(Role.SERVER)


def encode(*messages: Any) -> bytes:
    return b"".join(_server.send(m) for m in messages)


def tx_result(*data: tuple[str, Any], ok: bool = True, failed: str | None = None) -> Any:
    return TransactionResult(
        Status.TRANSACTION_OK if ok else Status.TRANSACTION_ERROR,
        Cause.UNSPECIFIED if ok else Cause.STATEMENT,
        "tx",
        "host",
        1.5,
        0.75,
        failed,
        data,
        42,
        61.5,
    )


def make_wire() -> tuple[ClientCore, Wire[str]]:
    core = ClientCore("test")
    return core, Wire(core)


def test_replies_are_matched_by_id_in_any_order() -> None:
    """Replies arriving in reverse order each reach the waiter of their own request id."""
    _core, wire = make_wire()
    for rid in (1, 2, 3):
        wire.register(rid, EXECUTE, f"w{rid}")
    data = encode(*(Reply(rid, tx_result(("v", rid))) for rid in (3, 1, 2)))
    resolved, events = wire.feed(data)
    assert events == []
    assert [(w, v["v"], e) for w, v, e in resolved] == [
        ("w3", 3, None),
        ("w1", 1, None),
        ("w2", 2, None),
    ]
    assert wire.pending == {}


def test_bytes_split_anywhere_still_decode() -> None:
    """Feeding one byte at a time resolves the request exactly once, at its last byte."""
    _core, wire = make_wire()
    wire.register(7, PING, "p")
    data = encode(Reply(7, Pong(3.0, 1.0)))
    seen = []
    for i in range(len(data)):
        resolved, _ = wire.feed(data[i : i + 1])
        seen.extend(resolved)
    assert seen == [("p", Pong(3.0, 1.0), None)]


def test_late_reply_of_an_abandoned_request_is_dropped() -> None:
    """A reply whose caller gave up is dropped by id and counted; nobody else gets it."""
    core, wire = make_wire()
    wire.register(1, EXECUTE, "gone")
    wire.register(2, EXECUTE, "here")
    assert wire.abandon(1)
    assert not wire.abandon(1)
    resolved, _ = wire.feed(encode(Reply(1, tx_result()), Reply(2, tx_result(("x", 2)))))
    assert [w for w, _, _ in resolved] == ["here"]
    assert core.replies_dropped == 1


@pytest.mark.parametrize(
    ("kind", "body", "expected"),
    [
        (HELLO, Welcome(1, "srv", "h", {"max_ops": 5}), Welcome(1, "srv", "h", {"max_ops": 5})),
        (END, SessionEnded(True), True),
        (STATS, Statistics({"a": {"b": 1}}), {"a": {"b": 1}}),
        (PING, Pong(1.0, 0.5), Pong(1.0, 0.5)),
        (CANCEL, protocol.Cancelled(False), False),
    ],
)
def test_reply_bodies_become_client_values(kind: int, body: Any, expected: Any) -> None:
    """Each request kind's reply body is converted to the value the API promises."""
    _core, wire = make_wire()
    wire.register(1, kind, "w")
    [(waiter, value, error)] = wire.feed(encode(Reply(1, body)))[0]
    assert (waiter, value, error) == ("w", expected, None)


def test_execute_reply_becomes_a_result() -> None:
    """An Execute's TransactionResult arrives as a client Result wrapping it."""
    _core, wire = make_wire()
    wire.register(1, EXECUTE, "w")
    [(_, value, _)] = wire.feed(encode(Reply(1, tx_result(("a", 1)))))[0]
    assert isinstance(value, client.Result)
    assert value.ok and value["a"] == 1


def test_a_reply_body_of_the_wrong_kind_fails_that_request() -> None:
    """A Pong answering an Execute is the server's bug: that request fails, clearly."""
    _core, wire = make_wire()
    wire.register(1, EXECUTE, "w")
    [(_, _, error)] = wire.feed(encode(Reply(1, Pong(1.0, 1.0))))[0]
    assert isinstance(error, client.LockClientError)
    assert "execute request with Pong" in str(error)


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (ErrorCode.TREE_TOO_DEEP, client.LimitExceeded),
        (ErrorCode.TOO_MANY_OPS, client.LimitExceeded),
        (ErrorCode.TOO_MANY_SESSIONS, client.LimitExceeded),
        (ErrorCode.TOO_MANY_ENTRIES, client.LimitExceeded),
        (ErrorCode.TOO_MANY_WAITERS, client.LimitExceeded),
        (ErrorCode.TOO_LARGE, client.LimitExceeded),
        (ErrorCode.STORE_FULL, client.LimitExceeded),
        (ErrorCode.OVERLOADED, client.ServerError),
        (ErrorCode.UNAUTHORIZED, client.AccessDenied),
        (ErrorCode.FORBIDDEN, client.AccessDenied),
        (ErrorCode.SESSION_CONFLICT, client.AccessDenied),
        (ErrorCode.INVALID_TRANSACTION, client.ServerError),
        (ErrorCode.INTERNAL_ERROR, client.ServerError),
    ],
)
def test_error_replies_map_to_the_hierarchy(code: ErrorCode, cls: type[Exception]) -> None:
    """An error reply fails its request with the most precise ServerError subclass,
    carrying the code and the server's message."""
    _core, wire = make_wire()
    wire.register(9, EXECUTE, "w")
    [(_, _, error)] = wire.feed(encode(ErrorReply(9, code, "because")))[0]
    assert type(error) is cls
    assert isinstance(error, client.ServerError)
    assert error.code is code
    assert error.message == "because"
    assert error.request_id == 9
    assert code.name in str(error)


def test_connection_level_error_is_quoted_when_the_connection_drops() -> None:
    """An error reply without a request id resolves nothing by itself; a closing one (here
    INTERNAL_ERROR) marks the wire closing, and the ConnectionLost of what is in flight names
    it as the cause (its outcome stays unknown)."""
    _core, wire = make_wire()
    wire.register(1, EXECUTE, "w")
    resolved, _ = wire.feed(encode(ErrorReply(None, ErrorCode.INTERNAL_ERROR, "oops")))
    assert resolved == [] and wire.closing
    [(_, _, error)] = wire.fail_all("the server closed the connection")
    assert isinstance(error, client.ConnectionLost)
    assert "INTERNAL_ERROR" in str(error) and "outcome is unknown" in str(error)
    assert isinstance(error.__cause__, client.ServerError)


def test_a_connection_level_error_that_does_not_close_leaves_the_wire_open() -> None:
    """A non-closing error without a request id is remembered, but the connection goes on."""
    _core, wire = make_wire()
    wire.register(1, EXECUTE, "w")
    resolved, _ = wire.feed(encode(ErrorReply(None, ErrorCode.INVALID_MESSAGE, "what?")))
    assert resolved == [] and not wire.closing
    assert isinstance(wire.closing_error, client.ServerError)
    assert wire.pending


def test_requests_unanswered_at_shutting_down_were_not_executed() -> None:
    """Issue 14, item 11 (core): the server answers every request it read before it stops
    reading, then sends SHUTTING_DOWN; what is still in flight then was not executed. It
    fails with ServerError(SHUTTING_DOWN) saying so (not ConnectionLost "outcome unknown"),
    a batch call too; idempotent requests are re-sent on a new connection (RETRY)."""
    core, wire = make_wire()
    wire.register(1, EXECUTE, "answered")
    wire.register(2, EXECUTE, "w")
    wire.register(3, PING, "p")
    batch: Batch[str] = Batch([4, 5], "b")
    wire.register_batch(batch)
    resolved, _ = wire.feed(
        encode(Reply(1, tx_result()), ErrorReply(None, ErrorCode.SHUTTING_DOWN, "bye"))
    )
    assert [w for w, _, _ in resolved] == ["answered"]
    assert wire.closing
    out = {w: (v, e) for w, v, e in wire.fail_all("the server ended the connection")}
    value, error = out["w"]
    assert value is None and type(error) is client.ServerError
    assert error.code is ErrorCode.SHUTTING_DOWN and error.request_id == 2
    assert "was not executed" in str(error) and "unknown" not in str(error)
    assert out["p"] == (RETRY, None)
    calls, _ = out["b"]
    assert [type(c) for c in calls] == [client.ServerError, client.ServerError]
    batch_error = client.BatchError(calls)
    assert not batch_error.outcome_unknown
    assert core.requests_sent == 5


def test_fail_all_retries_idempotent_requests_only() -> None:
    """When the connection dies, pings, statistics, keepalives and session ends may be
    re-sent (RETRY); an Execute fails with ConnectionLost saying its outcome is unknown."""
    _core, wire = make_wire()
    for rid, kind in enumerate((EXECUTE, KEEPALIVE, END, STATS, PING), start=1):
        wire.register(rid, kind, f"w{rid}")
    out = {w: (v, e) for w, v, e in wire.fail_all("gone")}
    assert wire.pending == {}
    value, error = out["w1"]
    assert value is None
    assert isinstance(error, client.ConnectionLost)
    assert "outcome is unknown" in str(error)
    for w in ("w2", "w3", "w4", "w5"):
        assert out[w] == (RETRY, None)
    assert repr(RETRY) == "RETRY"


def test_garbage_from_the_server_is_a_connection_loss() -> None:
    """Bytes that are not a valid frame poison the stream: feed still returns the replies
    decoded before them and marks the wire closing; what is in flight is then a
    ConnectionLost quoting the invalid message."""
    _core, wire = make_wire()
    wire.register(1, PING, "answered")
    wire.register(2, EXECUTE, "w")
    resolved, _ = wire.feed(encode(Reply(1, Pong(1.0, 1.0))) + b"\x00\x00\x00\x01\xc1")
    assert resolved == [("answered", Pong(1.0, 1.0), None)]  # 0xc1 is never valid msgpack
    assert wire.closing and isinstance(wire.closing_error, client.ConnectionLost)
    [(_, _, error)] = wire.fail_all("the server ended the connection")
    assert isinstance(error, client.ConnectionLost) and "invalid message" in str(error)


def test_lock_lost_events_reach_every_session_with_that_id() -> None:
    """Events are returned in order; dispatch hands them to the open sessions with that id
    (listeners first-added first) and counts the unclaimed ones."""
    core, wire = make_wire()
    a = SessionState(core, "s1", 60.0, "", True)
    b = SessionState(core, "s1", 60.0, "", True)
    got: list[tuple[str, LockLost]] = []
    a.add_lost_listener(lambda ev: got.append(("a", ev)))
    b.add_lost_listener(lambda ev: got.append(("b", ev)))
    ev1 = LockLost("s1", LostReason.EXPIRED, (("ns", "t", "v", 5),))
    ev2 = LockLost("other", LostReason.TTL, ())
    resolved, events = wire.feed(encode(ev1, ev2))
    assert resolved == [] and events == [ev1, ev2]
    core.dispatch(events)
    assert got == [("a", ev1), ("b", ev1)]
    assert a.lost and a.lost_events == (ev1,)
    assert core.events == 2 and core.events_unclaimed == 1


def test_a_failing_listener_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    """A listener that raises is logged; the next listener still runs."""
    core = ClientCore("test")
    s = SessionState(core, "s1", 60.0, "", True)
    got = []

    def bad(ev: LockLost) -> None:
        raise RuntimeError("boom")

    s.add_lost_listener(bad)
    s.add_lost_listener(got.append)
    core.dispatch([LockLost("s1", LostReason.ENDED)])
    assert len(got) == 1
    assert "boom" in caplog.text
    s.remove_lost_listener(bad)
    with pytest.raises(ValueError):
        s.remove_lost_listener(bad)
    with pytest.raises(TypeError):
        s.add_lost_listener("not callable")  # type: ignore[arg-type]


def test_ended_sessions_get_no_events_and_refuse_calls() -> None:
    """After end, a session is unregistered (its events are unclaimed) and building another
    Execute raises ClientClosed."""
    core = ClientCore("test")
    s = SessionState(core, None, 60.0, "", True)
    assert len(s.id) == 32  # uuid4 hex
    s._mark_ended()
    assert s.ended
    core.dispatch([LockLost(s.id, LostReason.ENDED)])
    assert not s.lost and core.events_unclaimed == 1
    with pytest.raises(client.ClientClosed, match="has ended"):
        s._build_execute("ns", [], 0.0, 0.0, "", None, None)


def test_session_arguments_are_validated_by_the_protocol() -> None:
    """Bad session arguments raise TypeError/ValueError where the session is made."""
    core = ClientCore("test")
    with pytest.raises(ValueError):
        SessionState(core, None, 0.0, "", True)
    with pytest.raises(ValueError):
        SessionState(core, "  ", 60.0, "", True)
    with pytest.raises(TypeError):
        SessionState(core, None, 60.0, 5, True)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SessionState(core, None, 60.0, "", "yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ClientCore(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ClientCore("x", token=5)  # type: ignore[arg-type]


def test_keepalive_pings_the_last_namespace_with_no_statements() -> None:
    """Before any call there is nothing to keep alive; after one, the keepalive is an Execute
    with no statements in the namespace last used."""
    core = ClientCore("test")
    s = SessionState(core, "sid", 9.0, "d", True)
    assert s._build_keepalive() is None
    assert core.keepalives() == []
    s._build_execute("Clinical", [client.Abort()], 0.0, 0.0, "", None, None)
    built = s._build_keepalive()
    assert built is not None
    decoded = Connection(Role.SERVER)
    decoded.receive_data(built[1])
    msg = decoded.next_message()
    assert isinstance(msg, protocol.Execute)
    assert msg.transaction.namespace == "Clinical"
    assert msg.transaction.statements == ()
    assert msg.session == protocol.SessionSpec("sid", 9.0, "d")
    assert len(core.keepalives()) == 1
    assert s.keepalive_interval == 3.0


def test_execute_building_validates_and_encodes_every_field() -> None:
    """Every execute option reaches the wire; bad statements raise TypeError at once."""
    core = ClientCore("test")
    s = SessionState(core, "sid", 60.0, "", True)
    with pytest.raises(TypeError, match="statement"):
        s._build_execute("ns", [client.TRUE], 0.0, 0.0, "", None, None)  # type: ignore[list-item]
    with pytest.raises(ValueError):
        s._build_execute("ns", [], 0.0, 1.5, "", None, None)
    rid, data = s._build_execute("ns", [client.Abort()], 5.0, 0.5, "why", "tx-1", 2.5)
    decoded = Connection(Role.SERVER)
    decoded.receive_data(data)
    msg = decoded.next_message()
    assert isinstance(msg, protocol.Execute)
    assert msg.request_id == rid
    assert msg.wait == 2.5
    tx = msg.transaction
    assert (tx.min_uptime, tx.min_trust, tx.description, tx.transaction_id) == (
        5.0,
        0.5,
        "why",
        "tx-1",
    )


def test_request_ids_are_unique_across_requests() -> None:
    """One counter numbers every request of a client."""
    core = ClientCore("test")
    ids = [core.ping()[0], core.get_statistics()[0], core.cancel(1)[0], core.hello()[0]]
    ids.append(core.end_session("s")[0])
    assert len(set(ids)) == len(ids)


def test_result_lookup_by_name() -> None:
    """result[name] is the first value, get() has a default, all() every value in order;
    the wire fields are exposed under client names."""
    r = client.Result(tx_result(("a", 1), ("b", None), ("a", 2)))
    assert r["a"] == 1
    assert r["b"] is None
    with pytest.raises(KeyError):
        r["zzz"]
    assert r.get("a") == 1 and r.get("zzz") is None and r.get("zzz", 7) == 7
    assert r.all("a") == [1, 2] and r.all("zzz") == []
    assert "b" in r and "zzz" not in r
    assert list(r.names()) == ["a", "b", "a"]
    assert r.ok and r.status is Status.TRANSACTION_OK and r.cause is Cause.UNSPECIFIED
    assert (r.fence, r.server_uptime, r.server_trust, r.valid_until) == (42, 1.5, 0.75, 61.5)
    assert (r.transaction_id, r.server_host, r.failed_statement) == ("tx", "host", None)
    assert r.data == (("a", 1), ("b", None), ("a", 2))
    assert "TRANSACTION_OK" in repr(r)


def test_a_failed_result_and_its_truth_value() -> None:
    """A refused transaction is a value; a Result has no truth value (``if result:`` would
    silently read a refused lock as granted)."""
    r = client.Result(tx_result(ok=False, failed="1:/AssertOp/"))
    assert not r.ok
    assert r.failed_statement == "1:/AssertOp/"
    assert "1:/AssertOp/" in repr(r) and "STATEMENT" in repr(r)
    with pytest.raises(TypeError, match=r"result\.ok"):
        bool(r)


def test_error_hierarchy() -> None:
    """One base class; the subclasses say what is known about the request."""
    for cls in (
        client.ServerError,
        client.LimitExceeded,
        client.AccessDenied,
        client.TransportError,
        client.ConnectionLost,
        client.ServerUnavailable,
        client.ClientTimeout,
        client.ClientClosed,
    ):
        assert issubclass(cls, client.LockClientError)
    assert issubclass(client.LimitExceeded, client.ServerError)
    assert issubclass(client.ConnectionLost, client.TransportError)
    assert issubclass(client.ServerUnavailable, client.TransportError)
    assert issubclass(client.ClientTimeout, TimeoutError)


def test_public_surface() -> None:
    """client re-exports exactly its __all__, and the tree vocabulary is protocol's own."""
    assert sorted(client.__all__) == sorted(n for n in vars(client) if not n.startswith("_"))
    for name in (
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
        "TRUE",
        "FALSE",
        "Exists",
        "SetVar",
        "DeleteVar",
        "Status",
        "Cause",
        "ErrorCode",
    ):
        assert getattr(client, name) is getattr(protocol, name)


def test_client_statistics_record() -> None:
    """local statistics are a frozen record of the core's counters."""
    core = ClientCore("test")
    SessionState(core, "a", 60.0, "", True)
    stats = core.statistics(in_flight=3)
    assert stats.in_flight == 3 and stats.open_sessions == 1 and stats.requests_sent == 0
    with pytest.raises(AttributeError):
        stats.in_flight = 4  # type: ignore[misc]
