"""Malformed frames close the connection after an error reply; invalid requests are answered
and the connection stays usable; an internal error closes only the connection it hit."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import trio
from support import PoisoningDoor, poisoned_setvar

from lockserver import RunningServer
from protocol import (
    Assert,
    ErrorCode,
    ErrorReply,
    Ping,
    Pong,
    Reply,
    SetVar,
    frame,
    pack,
)

from ._wire import WireClient, wait_for

LOCK = Assert(SetVar("locks", "printer"))


def transactions(server: RunningServer) -> int:
    return server.engine.statistics(trio.current_time()).transactions


async def assert_server_still_serves(server: RunningServer) -> None:
    async with await WireClient.connect(server) as other:
        await other.ping()


# --- malformed frames: error, then close ----------------------------------------------------


def _valid_ping(rid: int) -> dict[str, Any]:
    return {"type": "ping", "id": rid}


MALFORMED = {
    "bad msgpack": frame(b"\xc1"),
    "truncated msgpack": frame(b"\x82\xa4type"),
    "trailing bytes": frame(pack(_valid_ping(9)) + b"\x00"),
    "invalid utf-8": frame(b"\x82\xa4type\xa4\xff\xfe\xfd\xfc\xa2id\x01"),
}


@pytest.mark.parametrize("data", list(MALFORMED.values()), ids=list(MALFORMED))
async def test_malformed_frame_gets_error_then_close(server: RunningServer, data: bytes) -> None:
    """A frame that is not exactly one msgpack document: requests before it are answered,
    then MALFORMED_FRAME (no request id), then a clean close; the server carries on."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            before = Ping(c.rid())
            await c.send_raw(c.proto.send(before) + data + c.proto.send(Ping(c.rid())))
            messages = await c.read_until_closed()
        assert messages[0] == Reply(before.request_id, messages[0].body)  # type: ignore[union-attr]
        assert isinstance(messages[0].body, Pong)  # type: ignore[union-attr]
        assert len(messages) == 2
        err = messages[1]
        assert isinstance(err, ErrorReply)
        assert err.code is ErrorCode.MALFORMED_FRAME
        assert err.request_id is None
        await assert_server_still_serves(server)
    assert server.statistics()["server"]["protocol_errors"] == 1


async def test_oversized_header_gets_error_then_close(server: RunningServer) -> None:
    """A header announcing more than max_frame: FRAME_TOO_LARGE at once (the body is never
    buffered), then a clean close even though the client had sent more bytes (lingering
    close: no reset destroys the error reply)."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            size = server.config.max_frame + 1
            await c.send_raw(size.to_bytes(4, "big") + b"\x00" * 50_000)
            messages = await c.read_until_closed()
        assert len(messages) == 1
        assert isinstance(messages[0], ErrorReply)
        assert messages[0].code is ErrorCode.FRAME_TOO_LARGE
        assert str(server.config.max_frame) in messages[0].message
        await assert_server_still_serves(server)


async def test_oversized_header_alone(server: RunningServer) -> None:
    """Only the 4-byte header of a too-large frame is enough to be refused."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            await c.send_raw(b"\xff\xff\xff\xff")
            messages = await c.read_until_closed()
    assert [m.code for m in messages] == [ErrorCode.FRAME_TOO_LARGE]  # type: ignore[union-attr]


# --- invalid requests: error, connection stays -----------------------------------------------

INVALID: dict[str, tuple[Any, ErrorCode, bool]] = {
    # name: (wire map, expected code, whether the error carries the request id)
    "not a map": ([1, 2, 3], ErrorCode.INVALID_MESSAGE, False),
    "missing id": ({"type": "ping"}, ErrorCode.INVALID_MESSAGE, False),
    "negative id": ({"type": "ping", "id": -1}, ErrorCode.INVALID_MESSAGE, False),
    "unknown type": ({"type": "frobnicate", "id": 77}, ErrorCode.UNKNOWN_MESSAGE_TYPE, True),
    "missing field": (
        {"type": "execute", "id": 77, "namespace": "ns", "statements": []},
        ErrorCode.INVALID_MESSAGE,
        True,
    ),
    "wrong type": (
        {"type": "execute", "id": 77, "session": 5, "namespace": "ns", "statements": []},
        ErrorCode.INVALID_MESSAGE,
        True,
    ),
    "extra field": ({"type": "ping", "id": 77, "bogus": 1}, ErrorCode.INVALID_MESSAGE, True),
    "blank session": (
        {"type": "execute", "id": 77, "session": " ", "namespace": "ns", "statements": []},
        ErrorCode.INVALID_MESSAGE,
        True,
    ),
    "unknown op": (
        {
            "type": "execute",
            "id": 77,
            "session": "s",
            "namespace": "ns",
            "statements": [["Frobnicate", 1]],
        },
        ErrorCode.INVALID_TRANSACTION,
        True,
    ),
    "operator as statement": (
        {
            "type": "execute",
            "id": 77,
            "session": "s",
            "namespace": "ns",
            "statements": [["SetVar", "t", "v"]],
        },
        ErrorCode.INVALID_TRANSACTION,
        True,
    ),
    "statements not an array": (
        {"type": "execute", "id": 77, "session": "s", "namespace": "ns", "statements": 3},
        ErrorCode.INVALID_MESSAGE,
        True,
    ),
}


@pytest.mark.parametrize("case", list(INVALID.values()), ids=list(INVALID))
async def test_invalid_request_is_answered_and_connection_stays(
    server: RunningServer, case: tuple[Any, ErrorCode, bool]
) -> None:
    """A well-framed but invalid request gets an error with its code (and its id when it
    could be read); nothing changes in the engine; the same connection keeps working."""
    wire, code, has_id = case
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            await c.send_raw(frame(pack(wire)))
            err = await c.receive()
            assert isinstance(err, ErrorReply)
            assert err.code is code, err.message
            assert err.request_id == (77 if has_id else None)
            assert err.message
            assert transactions(server) == 0
            await c.ping()
            assert (await c.execute("s", LOCK)).ok


async def test_invalid_request_among_pipelined_ones(server: RunningServer) -> None:
    """An invalid request in a pipelined batch fails alone: the ones around it are served."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            first, last = Ping(c.rid()), Ping(c.rid())
            await c.send_raw(
                c.proto.send(first) + frame(pack({"type": "nope", "id": 500})) + c.proto.send(last)
            )
            assert isinstance(await c.reply(first.request_id), Reply)
            err = await c.reply(500)
            assert isinstance(err, ErrorReply)
            assert err.code is ErrorCode.UNKNOWN_MESSAGE_TYPE
            assert isinstance(await c.reply(last.request_id), Reply)


# --- internal errors ---------------------------------------------------------------------------


async def test_internal_error_closes_only_that_connection(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected exception while serving a request: INTERNAL_ERROR with the request id,
    the traceback logged, that connection closed, every other connection unaffected."""
    door = server._shell.requests.core
    poisoned = PoisoningDoor(door, "boom", [Assert(poisoned_setvar())])
    monkeypatch.setattr(server._shell.requests, "core", poisoned)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as bystander:
            assert (await bystander.execute("calm", LOCK)).ok
            async with await WireClient.connect(server) as c:
                bad = c.execute_message("boom", [LOCK])
                await c.send(bad, Ping(c.rid()))
                messages = await c.read_until_closed()
            assert len(messages) == 1
            assert isinstance(messages[0], ErrorReply)
            assert messages[0].code is ErrorCode.INTERNAL_ERROR
            assert messages[0].request_id == bad.request_id
            await bystander.ping()
            assert not (await bystander.execute("calm2", LOCK)).ok
    assert server.statistics()["server"]["internal_errors"] == 1
    records = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert records and records[0].exc_info is not None
    assert "cannot convert float infinity to integer" in str(records[0].exc_info[1])


async def test_error_outside_any_request_closes_only_that_connection(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An unexpected exception in the reading machinery itself (not while serving one
    request): that connection is closed and the traceback logged; the shared poller goes on
    reading every other connection."""
    reader: Any = server._shell.reader
    real_process = reader._process

    def process(c: Any, data: Any, send: bool) -> bool:
        if b"boom" in bytes(data):
            raise RuntimeError("simulated reader bug")
        return bool(real_process(c, data, send))

    monkeypatch.setattr(reader, "_process", process)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as bystander:
            assert (await bystander.execute("calm", LOCK)).ok
            async with await WireClient.connect(server) as c:
                await c.send(c.execute_message("boom", [LOCK]))
                assert await c.read_until_closed() == []
            await bystander.ping()
            assert (await bystander.execute("calm2", LOCK)).ok is False  # still held by calm
            await wait_for(lambda: server.statistics()["server"]["connections"] == 1)
    assert server.statistics()["server"]["internal_errors"] == 1
    assert server.statistics()["engine"]["sessions"] == 2  # boom never reached the engine
    assert [r.levelno for r in caplog.records if r.levelno >= logging.ERROR] == [logging.ERROR]
    assert "simulated reader bug" in caplog.text  # the traceback is in the log


async def test_peer_reset_does_not_disturb_the_server(server: RunningServer) -> None:
    """A client that vanishes abruptly (RST) is forgotten; others carry on."""
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        await c.execute("gone", LOCK)
        import socket
        import struct

        c.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await c.aclose()
        await wait_for(lambda: server.statistics()["server"]["connections"] == 0)
        await assert_server_still_serves(server)
    assert server.statistics()["server"]["sessions_tracked"] == 0
