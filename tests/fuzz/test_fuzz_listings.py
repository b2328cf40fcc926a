"""Malformed listing requests against a real server (issue 30): no request reaches
``internal_errors`` by its shape. A cursor of 5,000 nested JSON arrays was an HTTP 500, a
binary ``INTERNAL_ERROR`` that closed the connection and a traceback logged per request.

Pinned down: whatever the cursor (text, base64 of anything, JSON nested past the
interpreter's recursion limit, huge numbers, one of ours with a field of another type or
value, too long) and whatever the other listing parameters (wrong types, blank, too long,
out of range), a binary listing is answered with a page or ``INVALID_MESSAGE`` /
``TOO_LARGE`` on a connection that stays open, and ``GET /v1/<listing>`` with 200 or a 400
naming the reason (431 when the query passes the request head's limit); the server counts
no internal error. The server (module-wide, in a thread) holds entries, sessions and
parked waiters, so real cursors exist to mutate.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ThreadedServer

from client import Assert, LockClient, SetVar
from lockbench.fuzz import Conversation, encode
from lockserver import RunningServer, ServerConfig
from protocol import MAX_CURSOR, ErrorCode, ErrorReply, Reply

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

KINDS = ("holders", "sessions", "waiters")
PING_ID = 2**64 - 1
ACCEPTED = {int(ErrorCode.INVALID_MESSAGE), int(ErrorCode.TOO_LARGE)}
HTTP_MAX_HEADER = ServerConfig().http_max_header


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def nested(depth: int, inner: str = "") -> str:
    """``depth`` JSON arrays nested, ``inner`` in the middle."""
    return "[" * depth + inner + "]" * depth


def internal_errors(thread_server: ThreadedServer[RunningServer]) -> int:
    """The server's ``internal_errors`` count (0 while no request has reached one: each
    example checks it, whichever xdist worker runs it)."""
    stats = thread_server.call(thread_server.server.statistics)
    return int(stats["server"]["internal_errors"])


@pytest.fixture(scope="module")
def populated(thread_server: ThreadedServer[RunningServer]) -> Iterator[dict[str, str]]:
    """Entries in a few tables, sessions, two parked waiters (their client kept open); and one
    real cursor of each listing (a page of one), to mutate."""
    port = thread_server.port
    with LockClient("127.0.0.1", port, timeout=5.0) as c:
        s = c.session(max_age=600.0, keepalive=False)
        for i in range(5):
            assert s.execute("fz", [Assert(SetVar(f"t{i}", "v", i))]).ok
        waiter = Conversation(port)  # parks: t0/v is held
        parked = {
            "type": "execute",
            "id": 1,
            "session": "fz-waiter",
            "max_age": 600.0,
            "namespace": "fz",
            "statements": [["Assert", ["SetVar", "t0", "v"]]],
            "wait": 300.0,
        }
        waiter.send(encode(parked) + encode({**parked, "id": 2, "session": "fz-waiter2"}))
        other = c.session(max_age=600.0, keepalive=False)
        assert other.execute("fz", [Assert(SetVar("u", "v"))]).ok
        cursors: dict[str, str] = {}
        conv = Conversation(port)
        try:
            deadline = time.monotonic() + 10.0
            while len(cursors) < len(KINDS):  # (until both waiters are parked)
                assert time.monotonic() < deadline, cursors
                for rid, kind in enumerate(KINDS, 1):
                    conv.send(encode({"type": kind, "id": rid, "limit": 1}))
                    reply = conv.next()
                    assert isinstance(reply, Reply), reply
                    if reply.body.cursor is not None:
                        cursors[kind] = reply.body.cursor
                time.sleep(0.01)
            yield cursors
        finally:
            conv.close()
            waiter.close()


# --- cursors and parameters -----------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**30, max_value=10**40)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def mutated_cursor(draw: st.DrawFn, good: str) -> str:
    """One of ours (run and filters right) with one field replaced, cut, or extended."""
    fields = json.loads(base64.urlsafe_b64decode(good))
    how = draw(st.sampled_from(["replace", "cut", "extend", "negative", "huge"]))
    i = draw(st.integers(0, len(fields) - 1))
    if how == "replace":
        fields[i] = draw(json_values)
    elif how == "cut":
        fields = fields[:i]
    elif how == "extend":
        fields.append(draw(json_values))
    elif how == "negative":
        fields[i] = -draw(st.integers(1, 10**6))
    else:
        fields[i] = draw(st.integers(10**18, 10**60))
    return b64(json.dumps(fields).encode())


#: JSON nesting depths: around the interpreter's recursion limit (1,000) and far past it.
DEPTHS = st.one_of(st.sampled_from([999, 1000, 1001, 2000, 5000, 6000]), st.integers(1, 6000))


def cursors(good: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(min_size=1, max_size=60),
        st.binary(min_size=1, max_size=200).map(b64),
        json_values.map(lambda v: b64(json.dumps(v).encode())),
        DEPTHS.map(lambda d: b64(nested(d).encode())),
        DEPTHS.map(lambda d: b64(('["holders",1,2,' + nested(d) + "]").encode())),
        st.integers(4000, 5000).map(lambda n: b64(("[" + "9" * n + "]").encode())),
        mutated_cursor(good),
        st.just(good[:-3]),
        st.just("A" * (MAX_CURSOR + 1)),
    )


wire_ints = st.integers(-(2**63), 2**64 - 1)  # what msgpack carries
wire_values = st.one_of(
    st.text(max_size=300),
    st.just(""),
    st.just("   "),
    wire_ints,
    st.floats(),
    st.booleans(),
    st.binary(max_size=10),
    st.lists(wire_ints, max_size=3),
    st.dictionaries(st.text(max_size=3), wire_ints, max_size=2),
)
limits = st.one_of(
    st.integers(-5, 1005), wire_ints, st.floats(), st.text(max_size=5), st.booleans()
)
NAMES = ("namespace", "table", "var", "session", "match")
GOOD_NAMES = st.sampled_from(["fz", "t", "v", "t1", "fz-waiter"])


@st.composite
def requests(draw: st.DrawFn, good: dict[str, str]) -> dict[str, Any]:
    """A listing request's fields: mostly a fuzzed cursor with the other parameters absent
    or well-formed (so that it reaches the cursor's decoding), else one parameter
    malformed, else anything in any field."""
    kind = draw(st.sampled_from(KINDS))
    mode = draw(st.sampled_from(["cursor", "cursor", "one", "any"]))
    bad = draw(st.sampled_from([*NAMES, "limit"])) if mode == "one" else None
    fields: dict[str, Any] = {"type": kind}
    for name in (*NAMES, "limit"):
        if name != bad and not draw(st.booleans()):
            continue
        if name == bad or mode == "any":
            fields[name] = draw(limits if name == "limit" else wire_values)
        else:
            fields[name] = draw(st.integers(1, 1000) if name == "limit" else GOOD_NAMES)
    if mode == "cursor" or draw(st.booleans()):
        fields["cursor"] = draw(
            cursors(good[kind]) if mode != "any" else st.one_of(cursors(good[kind]), wire_values)
        )
    return fields


# --- the binary protocol ------------------------------------------------------------------------


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(data=st.data())
def test_binary_listings_answer_a_page_or_a_precise_error(
    thread_server: ThreadedServer[RunningServer], populated: dict[str, str], data: st.DataObject
) -> None:
    """Each example: a listing request of random shape and a ping, in one write: the
    listing is answered with its page or INVALID_MESSAGE / TOO_LARGE, and the ping after it
    (the connection stays open); internal_errors stays 0."""
    fields = data.draw(requests(populated))
    conv = Conversation(thread_server.port)
    try:
        conv.send(encode({**fields, "id": 7}) + encode({"type": "ping", "id": PING_ID}))
        reply = conv.next()
        if isinstance(reply, ErrorReply):
            assert int(reply.code) in ACCEPTED, (fields, reply)
            assert reply.message
        else:
            assert isinstance(reply, Reply) and reply.request_id == 7, (fields, reply)
        ping = conv.next()
        assert isinstance(ping, Reply) and ping.request_id == PING_ID, (fields, ping)
    finally:
        conv.close()
    assert internal_errors(thread_server) == 0, fields


# --- HTTP ---------------------------------------------------------------------------------------


def http_get(port: int, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10.0)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


raw_query = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="#"),
    max_size=80,
)
http_values = st.one_of(
    st.text(max_size=300), st.integers().map(str), st.just(""), st.just("%zz"), st.just("%ff")
)


@st.composite
def queries(draw: st.DrawFn, good: dict[str, str]) -> tuple[str, str]:
    """A listing and its query string: as ``requests`` (mostly a fuzzed cursor with good
    parameters), values percent-encoded or raw; sometimes a raw garbage query instead."""
    kind = draw(st.sampled_from(KINDS))
    if draw(st.integers(0, 5)) == 0:
        return kind, draw(raw_query)
    mode = draw(st.sampled_from(["cursor", "cursor", "one", "any"]))
    bad = draw(st.sampled_from([*NAMES, "limit"])) if mode == "one" else None
    parts = []
    for name in (*NAMES, "limit", "cursor"):
        if name == "cursor":
            if mode != "cursor" and not draw(st.booleans()):
                continue
            value = draw(
                cursors(good[kind])
                if mode != "any"
                else st.one_of(cursors(good[kind]), http_values)
            )
        elif name != bad and not draw(st.booleans()):
            continue
        elif name == bad or mode == "any":
            value = draw(
                st.one_of(limits.map(str), http_values) if name == "limit" else http_values
            )
        else:
            value = str(draw(st.integers(1, 1000))) if name == "limit" else draw(GOOD_NAMES)
        raw = draw(st.booleans()) and all(
            0x21 <= ord(ch) <= 0x7E and ch not in "#&" for ch in value
        )
        parts.append(f"{name}={value if raw else urllib.parse.quote(value, safe='')}")
    if draw(st.integers(0, 5)) == 0:
        parts.append(draw(st.sampled_from(["bogus=1", "limit=1", "&", "cursor", "=x"])))
    return kind, "&".join(parts)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(data=st.data())
def test_http_listings_answer_200_or_a_400_with_its_reason(
    thread_server: ThreadedServer[RunningServer], populated: dict[str, str], data: st.DataObject
) -> None:
    """Each example: ``GET /v1/<listing>?<query>`` of random shape is 200 with the page or
    400 with ``{"error": ...}`` naming what is wrong; internal_errors stays 0."""
    kind, query = data.draw(queries(populated))
    path = f"/v1/{kind}?{query}"
    status, body = http_get(thread_server.port, path)
    if status == 200:
        assert kind in body and "cursor" in body, (query[:200], body)
    elif status == 431:  # a cursor past MAX_CURSOR, percent-encoded, passes the head's limit
        assert len(path) > HTTP_MAX_HEADER // 2, (query[:200], body)
    else:
        assert status == 400, (query[:200], status, body)
    if status != 200:
        assert isinstance(body.get("error"), str) and body["error"], (query[:200], body)
    assert internal_errors(thread_server) == 0, query[:200]


# --- the attack of issue 30, as described -------------------------------------------------------


def test_a_deeply_nested_cursor_is_400_and_invalid_message_not_an_internal_error(
    thread_server: ThreadedServer[RunningServer], populated: dict[str, str]
) -> None:
    """A base64 cursor of 5,000 nested JSON arrays: HTTP 400 naming the cursor, binary
    INVALID_MESSAGE on a connection that stays usable; internal_errors unchanged."""
    before = internal_errors(thread_server)
    deep = b64(nested(5000).encode())
    for kind in KINDS:
        status, body = http_get(thread_server.port, f"/v1/{kind}?cursor={deep}")
        assert status == 400 and "the cursor is not valid" in body["error"], body
        conv = Conversation(thread_server.port)
        try:
            conv.send(encode({"type": kind, "id": 3, "cursor": deep}))
            reply = conv.next()
            assert isinstance(reply, ErrorReply) and reply.code is ErrorCode.INVALID_MESSAGE
            assert "the cursor is not valid" in reply.message
            conv.send(encode({"type": "ping", "id": 4}))
            assert isinstance(conv.next(), Reply)
        finally:
            conv.close()
    assert internal_errors(thread_server) == before


def test_after_the_fuzzing_the_server_counted_no_internal_error(
    thread_server: ThreadedServer[RunningServer], populated: dict[str, str]
) -> None:
    """Run last in this module (on the same server, when one worker runs the module): no
    request reached ``internal_errors``, and a listing still pages."""
    assert internal_errors(thread_server) == 0
    status, body = http_get(thread_server.port, "/v1/holders?namespace=fz")
    assert status == 200 and len(body["holders"]) >= 5
