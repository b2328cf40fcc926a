"""Fuzz a running lock server with random and mutated frames (issue #8), and the frame
generator the fuzz tests share (tests/fuzz drive it with a Hypothesis-controlled Random).

Why: the server must survive anything a peer can send. Every frame here is either a valid
request with one thing wrong (a field's value, a missing or extra field, an unknown type or
op, a deep or wide tree, extreme numbers, a huge string, a non-UTF-8 name) or a broken frame
(truncated, trailing bytes, random bytes, empty, an oversized header, a non-str map key). Each
:class:`Case` says which error codes are right for it and whether a valid reply is possible.

The command spawns ``python -m lockserver --port 0``, blasts mutated frames over several
connections (separate processes), reconnecting after each close, then checks that the server
is alive and answers a correct request, and reports frames sent, errors by code, closes,
internal errors (from the server's statistics) and the server's RSS before and after.

    python -m benchmarks.fuzz_server --frames 1000000 --connections 4
"""

from __future__ import annotations

import argparse
import collections
import math
import multiprocessing
import random
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs
import msgpack

from protocol import Connection, ErrorReply, Reply, Role

__all__ = ["Case", "Conversation", "make_case", "main"]

_HEADER = struct.Struct(">I")
MAX_FRAME = 1024 * 1024
#: Codes a well-framed invalid request may get (the connection stays open), and 204.
REQUEST_CODES = frozenset({201, 202, 203, 204, 205, 206, 301, 302, 303, 304})
#: Codes that close the connection.
CLOSING = frozenset({101, 102, 204, 305, 307, 311, 312, 500})
SENTINEL = "ZQZQZQZQ"  # replaced by invalid UTF-8 bytes of the same length

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
    return _HEADER.pack(len(payload)) + payload


def _pack(message: Any) -> bytes:
    return msgpack.packb(message, use_bin_type=True)  # type: ignore[no-any-return]


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
    msg["statements"] = [["Assert", SENTINEL]]
    deep = (b"\x92" + _pack("Not")) * depth + _pack(["True"])
    return _pack(msg).replace(_pack(SENTINEL), deep)


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
        msg[key] = SENTINEL
        bad = bytes([rng.choice([0x80, 0xC0, 0xFF, 0xED])]) + b"\xa0\x80" + b"Z" * 5
        payload = _pack(msg).replace(SENTINEL.encode(), bad)
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
            self.sock.sendall(frame(_pack({"type": "hello", "id": 0, "version": 1})))
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


# --- the long run ---------------------------------------------------------------------------


def _worker(port: int, frames: int, seed: int, batch: int, out: Any) -> None:
    counts: collections.Counter[str] = collections.Counter()
    try:
        _blast(port, frames, seed, batch, counts)
    except BaseException as exc:
        counts[f"worker_failed:{type(exc).__name__}: {exc}"] += 1
        raise
    finally:
        out.put(dict(counts))


def _blast(port: int, frames: int, seed: int, batch: int, counts: collections.Counter[str]) -> None:
    rng = random.Random(seed)
    sent = 0
    conv = Conversation(port)
    rid = 1
    while sent < frames:
        chunk = []
        data = bytearray()
        for _ in range(min(batch, frames - sent)):
            case = make_case(rng, rid)
            rid += 1
            chunk.append(case)
            data += case.data
            if case.closes:
                break
        sent += len(chunk)
        data += frame(_pack({"type": "ping", "id": 2**63 + rid}))
        if not conv.send(bytes(data)):
            counts["send_failed"] += 1
        closed = False
        while True:
            m = conv.next()
            if m is None:
                closed = True
                break
            if isinstance(m, ErrorReply):
                counts[f"error:{int(m.code)}"] += 1
            else:
                counts["reply"] += 1
                if getattr(m, "request_id", None) == 2**63 + rid:
                    break
        if closed:
            counts["closes"] += 1
            conv.close()
            conv = Conversation(port)
    conv.close()
    counts["frames"] = sent


def _stats(port: int) -> dict[str, Any]:
    conv = Conversation(port)
    conv.send(frame(_pack({"type": "stats", "id": 7})))
    m = conv.next()
    conv.close()
    assert isinstance(m, Reply)
    return dict(m.body.values)  # type: ignore[union-attr]


def _correct_request(port: int) -> bool:
    """A lock, a conflicting lock and a release, with the right answers."""
    from client import Assert, DeleteVar, LockClient, SetVar

    with LockClient("127.0.0.1", port, timeout=5.0) as c:
        a, b = c.session(keepalive=False), c.session(keepalive=False)
        ok = a.execute("fz-check", [Assert(SetVar("t", "v", 1))]).ok
        conflict = not b.execute("fz-check", [Assert(SetVar("t", "v", 2))]).ok
        released = a.execute("fz-check", [Assert(DeleteVar("t", "v"))]).ok
        a.end()
        b.end()
    return ok and conflict and released


def main(argv: list[str] | None = None) -> int:
    from benchmarks.lockbench._spawn import spawned
    from benchmarks.lockbench._targets import Backend

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--connections", type=int, default=4, help="worker processes")
    p.add_argument("--batch", type=int, default=64, help="frames per write")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--port", type=int, default=0, help="fuzz a running server instead")
    args = p.parse_args(argv)

    def run(port: int, rss: Callable[[], int | None]) -> int:
        rss_before = rss()
        t0 = time.monotonic()
        q: Any = multiprocessing.get_context("spawn").Queue()
        per = args.frames // args.connections
        procs = [
            multiprocessing.get_context("spawn").Process(
                target=_worker, args=(port, per, args.seed + i, args.batch, q)
            )
            for i in range(args.connections)
        ]
        for proc in procs:
            proc.start()
        totals: collections.Counter[str] = collections.Counter()
        for _ in procs:
            totals.update(q.get())
        for proc in procs:
            proc.join()
        elapsed = time.monotonic() - t0
        alive = _correct_request(port)
        stats = _stats(port)
        rss_after = rss()
        server = stats["server"]
        engine = stats["engine"]
        print(f"frames sent:      {totals['frames']:,} in {elapsed:.1f} s")
        print(f"replies (ok):     {totals['reply']:,}")
        print(f"closes:           {totals['closes']:,}")
        for key in sorted(k for k in totals if k.startswith(("error:", "worker_failed"))):
            print(f"  {key}: {totals[key]:,}")
        print(f"internal errors:  {server['internal_errors']}")
        print(f"protocol errors:  {server['protocol_errors']:,}")
        print(f"engine: sessions={engine['sessions']} entries={engine['entries']}")
        print(f"RSS before/after: {rss_before} / {rss_after} bytes")
        print(f"correct request answered at the end: {alive}")
        good = alive and server["internal_errors"] == 0 and worker_ok(procs)
        print("OK" if good else "FAILED")
        return 0 if good else 1

    def worker_ok(procs: list[Any]) -> bool:
        return all(proc.exitcode == 0 for proc in procs)

    if args.port:
        return run(args.port, lambda: None)
    with spawned(Backend.LOCKSERVER) as server:
        proc = server.process()

        def rss() -> int | None:
            return None if proc is None else int(proc.memory_info().rss)

        return run(server.port, rss)


if __name__ == "__main__":
    sys.exit(main())
