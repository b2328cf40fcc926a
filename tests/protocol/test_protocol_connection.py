"""The sans-I/O Connection: roles, and the error model (1xx poisons the stream, 2xx/3xx raise
once and the next frame still decodes)."""

from __future__ import annotations

import pytest

from protocol import (
    DEFAULT_MAX_FRAME,
    DEFAULT_TREE_LIMITS,
    Abort,
    Connection,
    ErrorCode,
    ErrorReply,
    Execute,
    Hello,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Role,
    SessionSpec,
    Transaction,
    TreeLimits,
    frame,
    pack,
)


def framed(wire: object) -> bytes:
    return frame(pack(wire))


PING = framed({"type": "ping", "id": 1})


def test_roles_decode_their_direction() -> None:
    """A server-role Connection decodes requests and sends server messages; a client-role
    Connection decodes server messages and sends requests."""
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    server.receive_data(client.send(Hello(0, client_name="c")))
    assert server.next_message() == Hello(0, client_name="c")
    client.receive_data(server.send(Reply(0, Pong(1.0, 0.5))))
    assert client.next_message() == Reply(0, Pong(1.0, 0.5))
    assert server.role is Role.SERVER
    assert client.role is Role.CLIENT


def test_send_refuses_the_wrong_direction() -> None:
    """A client cannot send a server message nor a server a request (TypeError)."""
    with pytest.raises(TypeError):
        Connection(Role.CLIENT).send(Reply(1, Pong(1.0, 1.0)))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Connection(Role.SERVER).send(Ping(1))  # type: ignore[arg-type]


def test_defaults_and_properties() -> None:
    """A Connection exposes its frame limit, tree limits and buffered byte count."""
    conn = Connection(Role.SERVER)
    assert conn.max_frame == DEFAULT_MAX_FRAME
    assert conn.limits == DEFAULT_TREE_LIMITS == TreeLimits(max_depth=32, max_ops=1000)
    conn = Connection(Role.SERVER, max_frame=10, limits=TreeLimits(max_depth=3, max_ops=7))
    assert conn.max_frame == 10
    assert conn.limits.max_ops == 7
    conn.receive_data(b"\x00\x00")
    assert conn.buffered == 2


def test_next_message_none_until_complete() -> None:
    """next_message returns None while a frame is incomplete (and on an empty buffer)."""
    conn = Connection(Role.SERVER)
    assert conn.next_message() is None
    conn.receive_data(PING[:-1])
    assert conn.next_message() is None
    conn.receive_data(PING[-1:])
    assert conn.next_message() == Ping(1)


def test_pipelined_requests_come_out_in_order() -> None:
    """Many requests in one read come out one per next_message, in order."""
    conn = Connection(Role.SERVER)
    conn.receive_data(b"".join(framed({"type": "ping", "id": i}) for i in range(50)))
    assert [conn.next_message() for _ in range(50)] == [Ping(i) for i in range(50)]
    assert conn.next_message() is None


def test_next_frame_returns_raw_payloads() -> None:
    """next_frame returns undecoded payloads; decode turns an unpacked structure into a
    message for the role."""
    conn = Connection(Role.SERVER)
    conn.receive_data(PING + PING)
    assert conn.next_frame() == pack({"type": "ping", "id": 1})
    assert conn.decode({"type": "ping", "id": 5}) == Ping(5)
    assert conn.next_message() == Ping(1)
    assert conn.next_frame() is None


def test_frame_too_large_poisons_the_connection() -> None:
    """After FRAME_TOO_LARGE every later call raises that same error again, even when valid
    bytes follow."""
    conn = Connection(Role.SERVER, max_frame=16)
    with pytest.raises(ProtocolError) as info:
        conn.receive_data((17).to_bytes(4, "big"))
    err = info.value
    assert err.code is ErrorCode.FRAME_TOO_LARGE
    assert err.code.closes_connection
    for call in (conn.next_message, conn.next_frame, lambda: conn.receive_data(PING)):
        with pytest.raises(ProtocolError) as again:
            call()
        assert (again.value.code, again.value.message) == (err.code, err.message)


def test_frame_too_large_found_by_next_message_poisons() -> None:
    """An oversized header behind a valid frame: the valid frame still decodes, then
    next_message raises FRAME_TOO_LARGE and keeps raising it."""
    conn = Connection(Role.SERVER, max_frame=64)
    conn.receive_data(PING + (65).to_bytes(4, "big"))
    assert conn.next_message() == Ping(1)
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    with pytest.raises(ProtocolError) as again:
        conn.next_message()
    assert (again.value.code, again.value.message) == (info.value.code, info.value.message)


@pytest.mark.parametrize("role", [Role.SERVER, Role.CLIENT])
def test_malformed_frame_poisons_the_connection(role: Role) -> None:
    """After MALFORMED_FRAME the next call raises the same error again, whatever follows."""
    conn = Connection(role)
    conn.receive_data(frame(b"\xc1") + PING)
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    err = info.value
    assert err.code is ErrorCode.MALFORMED_FRAME
    assert err.code.closes_connection
    for call in (conn.next_message, conn.next_frame, lambda: conn.receive_data(PING)):
        with pytest.raises(ProtocolError) as again:
            call()
        assert (again.value.code, again.value.message) == (err.code, err.message)


@pytest.mark.parametrize(
    ("bad", "code"),
    [
        ({"type": "ping"}, ErrorCode.INVALID_MESSAGE),
        ({"type": "nope", "id": 2}, ErrorCode.UNKNOWN_MESSAGE_TYPE),
        ({"type": "ping", "id": 2, "x": 1}, ErrorCode.INVALID_MESSAGE),
        (
            {"type": "execute", "id": 2, "session": "s", "namespace": "n", "statements": [["T"]]},
            ErrorCode.INVALID_TRANSACTION,
        ),
        (
            {
                "type": "execute",
                "id": 2,
                "session": "s",
                "namespace": "n",
                "statements": [["Abort"]] * 1001,
            },
            ErrorCode.TOO_MANY_OPS,
        ),
        ([1, 2, 3], ErrorCode.INVALID_MESSAGE),
    ],
)
def test_invalid_request_raises_once_and_stream_continues(bad: object, code: ErrorCode) -> None:
    """A well-framed but invalid request raises once (a 2xx/3xx code that does not close the
    connection) and the next valid frame decodes normally."""
    conn = Connection(Role.SERVER)
    conn.receive_data(framed(bad) + PING)
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is code
    assert not info.value.code.closes_connection
    assert conn.next_message() == Ping(1)
    assert conn.next_message() is None
    conn.receive_data(framed(bad))
    with pytest.raises(ProtocolError):
        conn.next_message()
    conn.receive_data(PING)
    assert conn.next_message() == Ping(1)


def test_invalid_server_message_raises_once_on_the_client() -> None:
    """On the client side too, an invalid (but well-framed) server message raises once and
    the next one decodes."""
    conn = Connection(Role.CLIENT)
    good = Connection(Role.SERVER).send(ErrorReply(None, ErrorCode.SHUTTING_DOWN, "bye"))
    conn.receive_data(framed({"type": "pong", "id": 3}) + good)
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    assert info.value.request_id == 3
    assert conn.next_message() == ErrorReply(None, ErrorCode.SHUTTING_DOWN, "bye")


def test_send_output_decodes_on_the_other_side() -> None:
    """What send() returns is exactly one frame that the peer decodes to the same message."""
    req = Execute(9, SessionSpec("s", max_age=5), Transaction("ns", [], min_trust=0.5), wait=1)
    data = Connection(Role.CLIENT).send(req)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    server = Connection(Role.SERVER)
    server.receive_data(data)
    assert server.next_message() == req


def test_interned_session_specs_stay_small() -> None:
    """Decoding reuses SessionSpec objects for repeated sessions, but the cache is bounded in
    size too: executes with long session descriptions decode correctly and leave at most
    _MAX_INTERNED_CHARS characters per cached spec (a peer cannot park megabytes in it)."""
    from protocol import _codec

    server = Connection(Role.SERVER)
    client = Connection(Role.CLIENT)
    tx = Transaction("ns", [Abort()])
    for i in range(300):
        spec = SessionSpec(f"s{i}", description="d" * 4_000)
        server.receive_data(client.send(Execute(i, spec, tx)))
        got = server.next_message()
        assert isinstance(got, Execute) and got.session == spec
    short = SessionSpec("short")
    server.receive_data(client.send(Execute(1, short, tx)) * 2)
    first, second = server.next_message(), server.next_message()
    assert isinstance(first, Execute) and isinstance(second, Execute)
    assert first.session is second.session  # short specs are still interned
    cached = _codec._SESSIONS
    assert all(len(sid) + len(desc) <= _codec._MAX_INTERNED_CHARS for sid, _, desc in cached)


def test_a_broken_stream_leaves_no_reference_cycle() -> None:
    """A stream broken by a framing error raises the same error on every later call, but
    keeps no exception (and so no traceback frames) of its own: a server that closes such a
    connection frees it at once, not at the next full collection (issue 14: the fuzzer's
    closed connections piled up as cyclic garbage, ~40 objects each)."""
    import gc

    def break_one() -> None:
        conn = Connection(Role.SERVER)
        seen = []
        for call in (lambda: conn.receive_data(b"\xff\xff\xff\xff"), conn.next_message):
            try:
                call()
            except ProtocolError as exc:
                seen.append((exc.code, exc.message))
        assert len(seen) == 2 and seen[0] == seen[1]

    gc.collect()
    gc.disable()
    try:
        for _ in range(10):
            break_one()
        assert gc.collect() == 0
    finally:
        gc.enable()
