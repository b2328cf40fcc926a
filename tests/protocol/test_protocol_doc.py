"""PROTOCOL.md stays true: its worked-example hex dumps are exactly what the codec produces,
and its tables name every op, error code and field the codec knows."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from protocol import (
    Assert,
    Cause,
    Connection,
    ErrorCode,
    Execute,
    Exists,
    Hello,
    Not,
    Reply,
    Role,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TransactionResult,
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
        "message", "reason", "entries", "set_at", "expires_at", "value",
    ]  # fmt: skip
    for field in fields:
        assert f"`{field}`" in text, field
