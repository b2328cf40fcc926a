"""PROTOCOL.md stays true: its worked-example hex dumps are exactly what the codec produces,
its tables name every op, error code and field the codec knows, its lifecycle table is
protocol.LIFECYCLE, its whitespace list is what "blank" means, and its limits table has every
key a real server's welcome carries (the one test here that starts a server)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from support import start_server

from lockserver import ServerConfig
from protocol import (
    CLOSING_ERROR,
    LIFECYCLE,
    Assert,
    Cause,
    Connection,
    EndSession,
    ErrorCode,
    Execute,
    Exists,
    Hello,
    Not,
    ProtocolError,
    Reply,
    Role,
    SessionSpec,
    SetVar,
    State,
    Status,
    Transaction,
    TransactionResult,
    Welcome,
    request_from_wire,
)

DOC = Path(__file__).resolve().parents[2] / "PROTOCOL.md"

EXAMPLES: dict[str, tuple[Role, Any]] = {
    "execute-request": (
        Role.CLIENT,
        Execute(
            7,
            SessionSpec("user-3"),
            Transaction(
                "Clinical",
                [
                    Assert(Not(Exists("Month-End", "F1"))),
                    Assert(Not(Exists("MDS-Entry", "F1", "P1"))),
                    Assert(SetVar("MDS-Review", "F1", "P1")),
                ],
                transaction_id="review-1",
            ),
        ),
    ),
    "execute-reply": (
        Role.SERVER,
        Reply(
            7,
            TransactionResult(
                Status.TRANSACTION_ERROR,
                Cause.STATEMENT,
                "review-1",
                "lock-1",
                73.25,
                1.0,
                "1:/AssertOp/",
                (),
                1732579200000002,
                133.25,
            ),
        ),
    ),
    "hello": (Role.CLIENT, Hello(0, client_name="demo")),
}


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def hex_block(name: str) -> bytes:
    """The bytes of the hex dump that follows ``<!-- example: name -->`` in PROTOCOL.md."""
    match = re.search(rf"<!-- example: {re.escape(name)} -->\n```\n(.*?)```", doc_text(), re.S)
    assert match, f"example {name!r} missing from PROTOCOL.md"
    data = bytearray()
    for line in match.group(1).splitlines():
        offset, rest = line[:4], line[6:]
        assert int(offset, 16) == len(data), line
        data += bytes.fromhex(rest[:47])
    return bytes(data)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_worked_example_bytes_match_the_codec(name: str) -> None:
    """Each hex dump in PROTOCOL.md is byte for byte what send() produces, and decodes back
    to the same message on the other side."""
    role, message = EXAMPLES[name]
    data = hex_block(name)
    assert Connection(role).send(message) == data
    peer = Connection(Role.SERVER if role is Role.CLIENT else Role.CLIENT)
    peer.receive_data(data)
    assert peer.next_message() == message


def test_doc_lists_every_error_code_with_its_number_and_closing_rule() -> None:
    """The error table has one row per ErrorCode, with the right number and "closes" value."""
    text = doc_text()
    for code in ErrorCode:
        row = re.search(rf"^\| {int(code)} \| `{code.name}` \| (yes|no) \|", text, re.M)
        assert row, code
        assert (row.group(1) == "yes") is code.closes_connection, code


def test_doc_names_every_op_and_path_name() -> None:
    """Every wire op and every failed-path name appears in PROTOCOL.md."""
    text = doc_text()
    ops = [
        "Assert", "Abort", "Block", "If", "AnywayContinueAfter", "SelectConstantValue",
        "SelectOperatorValue", "SelectVarValue", "And", "Or", "Xor", "Not", "True", "False",
        "Exists", "SetVar", "DeleteVar",
    ]  # fmt: skip
    for op in ops:
        assert f"`{op}`" in text, op
        assert f"`{op}Op`" in text or op in ("True", "False"), op
    assert "`TrueOp`" in text
    assert "`FalseOp`" in text


def test_doc_names_every_wire_field() -> None:
    """Every field name the codec reads or writes is documented."""
    text = doc_text()
    fields = [
        "type", "id", "version", "client", "token", "session", "max_age", "session_description",
        "namespace", "statements", "tx_id", "description", "min_uptime", "min_trust", "wait",
        "target", "status", "cause", "host", "uptime", "trust", "failed", "data", "fence",
        "valid_until", "existed", "stats", "server", "limits", "found", "code", "name",
        "message", "reason", "entries", "set_at", "expires_at", "value", "instance",
        "started_at", "group", "replicas",
    ]  # fmt: skip
    for field in fields:
        assert f"`{field}`" in text, field


def test_no_stale_later_markers() -> None:
    """Every feature PROTOCOL.md describes exists: no "(later)" marker is left."""
    assert "(later)" not in doc_text()


def test_lifecycle_table_is_the_code_s() -> None:
    """The lifecycle table of §2 lists, per state, exactly the kinds protocol.LIFECYCLE allows
    each side to send ("closing `error`" is CLOSING_ERROR)."""
    text = doc_text()
    for state in State:
        row = re.search(rf"^\| `{state.name}` \| (.*?) \| (.*?) \| .* \|$", text, re.M)
        assert row, state
        for column, sender in ((1, Role.CLIENT), (2, Role.SERVER)):
            kinds = {
                CLOSING_ERROR if closing else kind
                for closing, kind in re.findall(r"(closing )?`(\w+)`", row.group(column))
            }
            assert kinds == LIFECYCLE.allowed(sender, state), (state, sender)


def test_whitespace_list_is_exactly_what_blank_means() -> None:
    """The code points §1 calls whitespace are exactly those the codec strips when it decides
    that a name is blank (str.isspace / str.strip)."""
    match = re.search(r"which is exactly (.*?) \(U\+200B", doc_text(), re.S)
    assert match
    listed: set[int] = set()
    for item in re.findall(r"U\+([0-9A-F]{4})(?:\u2013U\+([0-9A-F]{4}))?", match.group(1)):
        first, last = int(item[0], 16), int(item[1] or item[0], 16)
        listed.update(range(first, last + 1))
    assert listed == {c for c in range(sys.maxunicode + 1) if chr(c).isspace()}
    assert all(not chr(c).strip() for c in listed)
    for c in listed:
        wire = {"type": "end", "id": 1, "session": chr(c) * 2}
        with pytest.raises(ProtocolError, match="end: session must not be blank"):
            request_from_wire(wire)
    assert request_from_wire({"type": "end", "id": 1, "session": "\u200b"}) == EndSession(
        1, "\u200b"
    )


async def test_every_welcome_limit_is_documented_with_a_unit() -> None:
    """The limits table of §4 has one row per key of a real server's welcome (and no other),
    each with a unit, a meaning and the default that server (default settings) announces."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            defaults = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING")
            server = await start_server(nursery, config=defaults)
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            proto = Connection(Role.CLIENT, require_hello=True)
            await stream.send_all(proto.send(Hello(0)))
            reply = None
            while reply is None:
                proto.receive_data(await stream.receive_some(1 << 16))
                reply = proto.next_message()
            await stream.aclose()
            nursery.cancel_scope.cancel()
    assert isinstance(reply, Reply) and isinstance(reply.body, Welcome)
    assert proto.state is State.READY
    table = doc_text().split("The `limits` map", 1)[1].split("### `result`", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \| ([^|]*) \|$", table, re.M)
    assert {key for key, _, _ in rows} == set(reply.body.limits)
    assert len(rows) == len(reply.body.limits)
    for key, unit, meaning in rows:
        assert unit.strip() and meaning.strip(), key
        # The default in parentheses is the value a default-configured server announces.
        default = re.search(r"\((\d[\d,]*)(?: = [^)]*)?\)", meaning)
        assert default, key
        assert float(default.group(1).replace(",", "")) == reply.body.limits[key], key
