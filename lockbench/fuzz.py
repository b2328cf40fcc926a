"""The fuzz oracle: mutated request frames that each know their right answers, and a blocking
conversation that checks the server's replies against them (issue #8).

Why: the server must survive anything a peer can send, and answer each frame as the protocol
says. Every frame here is either a valid request with one thing wrong (a field's value, a
missing or extra field, an unknown type or op, a deep or wide tree, extreme numbers, a huge
string, a non-UTF-8 name) or a broken frame (truncated, trailing bytes, random bytes, empty, an
oversized header, a non-str map key). Each :class:`Case` says which error codes are right for
it, whether a normal reply is possible too and whether the server must close the connection;
:func:`check_replies` holds a :class:`Conversation`'s replies to that.

The generator draws only from the ``random.Random`` it is given, so a seed replays a run and a
Hypothesis-controlled Random shrinks a failure. Two drivers share it: tests/fuzz (Hypothesis,
a server in a thread) and the long run ``python -m benchmarks.fuzz_server`` (a spawned server,
millions of frames over several processes). Needs only lockserver's own dependencies.
"""

from __future__ import annotations

import collections
import math
import random
import socket
import struct
from typing import Any

import attrs
import msgpack

from protocol import Connection, ErrorReply, Reply, Role

__all__ = [
    "MAX_FRAME",
    "REQUEST_CODES",
    "CLOSING",
    "Case",
    "make_case",
    "base_message",
    "frame",
    "encode",
    "Conversation",
    "check_replies",
]

_HEADER = struct.Struct(">I")
MAX_FRAME = 1024 * 1024
#: Codes a well-framed invalid request may get (the connection stays open: 313 is a name,
#: text or value past its size limit), and 204.
REQUEST_CODES = frozenset({201, 202, 203, 204, 205, 206, 301, 302, 303, 304, 313})
#: Codes that close the connection.
CLOSING = frozenset({101, 102, 204, 305, 307, 311, 312, 500})
_SENTINEL = "ZQZQZQZQ"  # replaced by invalid UTF-8 bytes of the same length

_WEIRD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**64 - 1,
    2**63,
    -(2**63),
    0.0,
    -0.0,
    1.5,
    1e308,
    math.inf,
    -math.inf,
    math.nan,
    "",
    " ",
    "x",
    "\u00e9\u4e2d\U0001f600",
    b"",
    b"\x00\xff",
    [],
    [1, "a"],
    [[[]]],
    {},
    {"a": 1},
    msgpack.ExtType(5, b"xyz"),
    msgpack.Timestamp(1, 2),
]


@attrs.frozen
class Case:
    """One frame to send: ``data`` (header included); ``codes``: the right error codes;
    ``may_succeed``: a normal reply is right too; ``closes``: the server must close after it;
    ``kind``: the mutation's name (for reports)."""

    data: bytes
    codes: frozenset[int]
    may_succeed: bool
    closes: bool
    kind: str


def frame(payload: bytes) -> bytes:
    """``payload`` behind its 4-byte big-endian length header."""
    return _HEADER.pack(len(payload)) + payload


def _pack(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


def encode(message: Any) -> bytes:
    """``message`` packed with msgpack and framed, unchecked: any value goes on the wire."""
    return frame(_pack(message))


def _execute(rid: int) -> dict[str, Any]:
    return {
        "type": "execute",
        "id": rid,
        "session": "fuzz-s",
        "max_age": 1.0,
        "namespace": "fz",
        "statements": [["SelectConstantValue", "x", 1], ["Assert", ["Not", ["Exists", "t", "v"]]]],
        "tx_id": "",
        "description": "fuzz",
        "min_uptime": 0,
        "min_trust": 0,
    }


def base_message(rng: random.Random, rid: int, session: str = "fuzz-s") -> dict[str, Any]:
    """A valid request (after hello) that is answered at once and stores nothing."""
    kind = rng.randrange(6)
    if kind == 0:
        return {"type": "ping", "id": rid}
    if kind == 1:
        return {"type": "stats", "id": rid}
    if kind == 2:
        return {"type": "end", "id": rid, "session": "fuzz-never-used"}
    if kind == 3:
        return {"type": "cancel", "id": rid, "target": rid + 1}
    if kind == 4:
        return {"type": "hello", "id": rid, "version": 1, "client": "fuzz"}
    return _execute(rid) | {"session": session}


def _weird(rng: random.Random) -> Any:
    r = rng.randrange(10)
    if r < 6:
        return rng.choice(_WEIRD)
    if r == 6:
        return rng.randint(-(2**63), 2**64 - 1)
    if r == 7:
        return rng.uniform(-1e6, 1e6)
    if r == 8:
        return "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(12)))
    return "h" * rng.randrange(1, MAX_FRAME - 1000)  # a huge string within max_frame


def _with_deep_tree(msg: dict[str, Any], depth: int) -> bytes:
    """``msg`` packed with ``statements = [["Assert", Not(Not(...True))]]`` nested ``depth``
    deep (spliced in as bytes: msgpack's packer refuses deep nesting itself)."""
    msg["statements"] = [["Assert", _SENTINEL]]
    deep = (b"\x92" + _pack("Not")) * depth + _pack(["True"])
    return _pack(msg).replace(_pack(_SENTINEL), deep)


_UNKNOWN_OPS = ["Nope", "assert", "SetVar2", "", "Exists ", "ABORT"]


def make_case(rng: random.Random, rid: int, *, huge: bool = True) -> Case:
    """A random mutated frame; ``rid`` is the request id a well-formed one carries.
    ``huge=False`` leaves out the near-1-MiB payloads (for fast runs)."""
    kind = rng.randrange(16)
    msg = base_message(rng, rid)
    if kind <= 3:  # one field's value wrong
        key = rng.choice(list(msg))
        value = _weird(rng)
        if not huge and isinstance(value, str) and len(value) > 1000:
            value = value[:1000]
        msg[key] = value
        return Case(frame(_pack(msg)), REQUEST_CODES, True, False, f"field:{key}")
    if kind == 4:  # a field missing
        key = rng.choice(list(msg))
        del msg[key]
        optional = key in ("client", "max_age", "tx_id", "description", "min_uptime", "min_trust")
        return Case(frame(_pack(msg)), REQUEST_CODES, optional, False, f"drop:{key}")
    if kind == 5:  # an unknown field
        msg[rng.choice(["extra", "Type", "wait2", "ID"])] = _weird(rng)
        return Case(frame(_pack(msg)), frozenset({201}), False, False, "extra")
    if kind == 6:  # an unknown type
        msg["type"] = rng.choice(["pong", "result", "Execute", "", "lost", "welcome", "x" * 300])
        return Case(frame(_pack(msg)), frozenset({201, 202}), False, False, "type")
    if kind == 7:  # an unknown op or a wrong tree shape
        msg = _execute(rid)
        bad = rng.choice(
            [
                [rng.choice(_UNKNOWN_OPS), "t", "v"],
                ["SetVar"],
                ["Assert"],
                ["Assert", ["Abort"]],
                ["True"],
                ["Block", []],
                ["SetVar", "t", "v", None, None, -1],
                ["SetVar", "", "v"],
                ["CountBelow", "t", "v", -1],
                ["If", ["True"]],
                [_weird(rng)],
                _weird(rng),
            ]
        )
        msg["statements"] = [bad] if rng.random() < 0.7 else bad
        return Case(frame(_pack(msg)), frozenset({201, 203}), False, False, "tree")
    if kind == 8:  # deep or wide trees
        msg = _execute(rid)
        if rng.random() < 0.5:
            depth = rng.choice([33, 40, 200, 999, 1200, 5000])
            return Case(
                frame(_with_deep_tree(msg, depth)), frozenset({301, 102}), False, False, "deep"
            )
        msg["statements"] = [["Assert", ["True"]]] * rng.choice([501, 1001, 3000])
        return Case(frame(_pack(msg)), frozenset({302}), False, False, "wide")
    if kind == 9:  # truncated payload
        payload = _pack(msg)
        cut = rng.randrange(len(payload))
        return Case(frame(payload[:cut]), frozenset({102}), False, True, "truncated")
    if kind == 10:  # trailing bytes inside the frame
        payload = _pack(msg) + bytes([rng.randrange(256)]) * rng.randrange(1, 5)
        return Case(frame(payload), frozenset({102}), False, True, "trailing")
    if kind == 11:  # random bytes (may happen to be a valid msgpack scalar: not a map)
        payload = rng.randbytes(rng.randrange(1, 64))
        return Case(frame(payload), frozenset({102, 201}), False, False, "garbage")
    if kind == 12:  # an oversized header (no body follows)
        size = rng.choice([MAX_FRAME + 1, 2**31, 2**32 - 1])
        return Case(_HEADER.pack(size), frozenset({101}), False, True, "oversize")
    if kind == 13:  # empty frame
        return Case(frame(b""), frozenset({102}), False, True, "empty")
    if kind == 14:  # non-UTF-8 in a str
        key = rng.choice([k for k, v in msg.items() if isinstance(v, str)])
        msg[key] = _SENTINEL
        bad = bytes([rng.choice([0x80, 0xC0, 0xFF, 0xED])]) + b"\xa0\x80" + b"Z" * 5
        payload = _pack(msg).replace(_SENTINEL.encode(), bad)
        return Case(frame(payload), frozenset({102}), False, True, f"utf8:{key}")
    # kind 15: a non-str map key, or a bit flip anywhere
    if rng.random() < 0.5:
        bad_key: Any = rng.choice([1, 2.5, None, b"k"])
        payload = _pack({**msg, bad_key: 1})
        if type(bad_key) is bytes:  # a bin key passes msgpack (strict_map_key): an unknown field
            return Case(frame(payload), frozenset({201}), False, False, "key:bin")
        return Case(frame(payload), frozenset({102}), False, True, "key")
    flipped = bytearray(_pack(msg))
    i = rng.randrange(len(flipped))
    flipped[i] ^= 1 << rng.randrange(8)
    return Case(frame(bytes(flipped)), REQUEST_CODES | {102}, True, False, "bitflip")


class Conversation:
    """A blocking socket that sends frames and reads the server's replies in order."""

    def __init__(self, port: int, *, hello: bool = True, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = Connection(Role.CLIENT, max_frame=64 * 1024 * 1024)
        self.inbox: collections.deque[Any] = collections.deque()
        self.eof = False
        if hello:
            self.sock.sendall(encode({"type": "hello", "id": 0, "version": 1}))
            assert isinstance(self.next(), Reply)

    def close(self) -> None:
        self.sock.close()

    def next(self) -> Any | None:
        """The next message from the server, or None at EOF (or a reset)."""
        while not self.inbox:
            if self.eof:
                return None
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                data = b""
            if not data:
                self.eof = True
                return None
            self.proto.receive_data(data)
            while (m := self.proto.next_message()) is not None:
                self.inbox.append(m)
        return self.inbox.popleft()

    def send(self, data: bytes) -> bool:
        """False when the server already closed the connection."""
        try:
            self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True


def check_replies(conv: Conversation, cases: list[Case], ping_id: int) -> tuple[list[int], bool]:
    """Read the replies to ``cases`` (sent in order, then a ping with ``ping_id``) and check
    each against its case. Returns (error codes seen, closed). Raises AssertionError."""
    codes: list[int] = []
    for i, case in enumerate(cases):
        m = conv.next()
        assert m is not None, f"closed without answering case {i} ({case.kind})"
        if isinstance(m, ErrorReply):
            code = int(m.code)
            codes.append(code)
            assert code in case.codes, f"case {i} ({case.kind}): code {code} not in {case.codes}"
            if code in CLOSING:
                assert conv.next() is None, f"case {i} ({case.kind}): not closed after {code}"
                return codes, True
            assert not case.closes, f"case {i} ({case.kind}) should have closed, got {code}"
        else:
            assert isinstance(m, Reply), m
            assert case.may_succeed, f"case {i} ({case.kind}): unexpected success {m!r}"
    m = conv.next()
    assert isinstance(m, Reply) and m.request_id == ping_id, m
    return codes, False
