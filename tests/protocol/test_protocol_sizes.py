"""Size limits a request is decoded under: names, texts, values counted as stored, durations,
dense frames, and what a server reads before the handshake (issue 14, items 1, 2 and 7)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    ELEMENT_SIZE,
    MAX_HELLO_FRAME,
    MIN_SECONDS,
    Connection,
    ErrorCode,
    Execute,
    Hello,
    Ping,
    ProtocolError,
    Role,
    TreeLimits,
    frame,
    pack,
    value_size,
)

LIMITS = TreeLimits(max_name=16, max_text=32, max_value=256, max_ttl=100.0)


def framed(wire: Any) -> bytes:
    return frame(pack(wire))


def execute(statements: list[Any], **fields: Any) -> dict[str, Any]:
    return {
        "type": "execute",
        "id": 7,
        "session": "s",
        "namespace": "ns",
        "statements": statements,
        **fields,
    }


def decode(wire: Any, limits: TreeLimits = LIMITS) -> Any:
    conn = Connection(Role.SERVER, limits=limits)
    conn.receive_data(framed(wire))
    return conn.next_message()


def refused(wire: Any, limits: TreeLimits = LIMITS) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(wire, limits)
    return info.value


# --- value_size ---------------------------------------------------------------------------------


def _reference_size(value: Any) -> int:
    if isinstance(value, str):
        return ELEMENT_SIZE + len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes):
        return ELEMENT_SIZE + len(value)
    if isinstance(value, list | tuple):
        return ELEMENT_SIZE + sum(_reference_size(v) for v in value)
    if isinstance(value, dict):
        return ELEMENT_SIZE + sum(_reference_size(k) + _reference_size(v) for k, v in value.items())
    return ELEMENT_SIZE


values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@given(values)
def test_value_size_counts_32_per_element_plus_string_bytes(value: Any) -> None:
    """value_size is 32 per element (map keys included) plus the UTF-8 bytes of strings and
    the bytes of binaries, whatever the nesting."""
    assert value_size(value) == _reference_size(value)


@given(values, st.integers(0, 400))
def test_value_size_with_a_limit_stops_early_but_is_exact_below_it(value: Any, limit: int) -> None:
    """With a limit the count may stop early, but only once past the limit: a size at or
    below the limit is exact, and a value over the limit is always reported over it."""
    true = value_size(value)
    bounded = value_size(value, limit)
    if true <= limit:
        assert bounded == true
    else:
        assert bounded > limit


def test_value_size_of_a_million_empty_maps_stops_after_the_limit() -> None:
    """The attack of issue 14 (a value of 1,040,000 empty maps): counted only until the
    limit is passed."""
    value = [{}] * 1_040_000
    assert value_size(value, 65536) <= 65536 + 2 * ELEMENT_SIZE
    assert value_size(value) == ELEMENT_SIZE * 1_040_001


def test_non_ascii_strings_count_their_utf8_bytes() -> None:
    assert value_size("é") == ELEMENT_SIZE + 2
    assert value_size("€uro") == ELEMENT_SIZE + 6
    assert value_size({"ключ": "x"}) == 3 * ELEMENT_SIZE + 8 + 1


# --- values in trees ------------------------------------------------------------------------------

VALUE_NODES = [
    lambda v: ["Assert", ["SetVar", "t", "v", v]],
    lambda v: ["Assert", ["SetVar", "t", "v", v, None, 5]],  # the general (long) form
    lambda v: ["Assert", ["Exists", "t", "v", v]],
    lambda v: ["Assert", ["DeleteVar", "t", "v", v]],
    lambda v: ["SelectConstantValue", "x", v],
]


@pytest.mark.parametrize("node", VALUE_NODES)
def test_a_value_at_the_limit_passes_and_one_byte_more_is_too_large(node: Any) -> None:
    """Every node carrying a value accepts one of exactly max_value and refuses one byte more
    with TOO_LARGE, naming the node, the limit and its setting; the request id is kept."""
    at_limit = "a" * (LIMITS.max_value - ELEMENT_SIZE)
    assert isinstance(decode(execute([node(at_limit)])), Execute)
    err = refused(execute([node(at_limit + "a")]))
    assert err.code is ErrorCode.TOO_LARGE
    assert err.request_id == 7
    assert "max_value" in err.message and "statements[0]" in err.message
    assert not err.code.closes_connection


@pytest.mark.parametrize("node", VALUE_NODES)
def test_a_dense_value_is_measured_as_stored_not_as_sent(node: Any) -> None:
    """Nine empty maps are 10 bytes on the wire but 320 as stored: over a 256 limit."""
    err = refused(execute([node([{}] * 9)]))
    assert err.code is ErrorCode.TOO_LARGE
    assert isinstance(decode(execute([node([{}] * 7)])), Execute)


def test_a_non_ascii_value_is_measured_in_utf8_bytes() -> None:
    """A str of 100 characters of 3 UTF-8 bytes each is 332 as stored: over 256 (the fast
    path's 4-bytes-per-character shortcut must not let it through)."""
    err = refused(execute([["Assert", ["SetVar", "t", "v", "€" * 100]]]))
    assert err.code is ErrorCode.TOO_LARGE
    assert isinstance(decode(execute([["Assert", ["SetVar", "t", "v", "€" * 70]]])), Execute)


# --- names and texts ------------------------------------------------------------------------------

NAME_NODES = [
    lambda n: ["Assert", ["SetVar", n, "v"]],
    lambda n: ["Assert", ["SetVar", "t", n]],
    lambda n: ["Assert", ["SetVar", "t", n, None, None, 5]],
    lambda n: ["Assert", ["Exists", n, "v"]],
    lambda n: ["Assert", ["DeleteVar", "t", n]],
    lambda n: ["Assert", ["CountBelow", "t", n, 1]],
    lambda n: ["Assert", ["CountBelow", "t", "v", 1, n, "x"]],
    lambda n: ["Assert", ["Waiting", n, "v"]],
    lambda n: ["Assert", ["ArrivedBelow", n, "v", 2]],
    lambda n: ["Assert", ["ArrivedBelow", "t", n, 2]],
    lambda n: ["SelectConstantValue", n, 1],
    lambda n: ["SelectOperatorValue", n, ["True"]],
    lambda n: ["SelectVarValue", "x", "t", n],
]


@pytest.mark.parametrize("node", NAME_NODES)
def test_names_in_trees_are_bounded_by_max_name(node: Any) -> None:
    """A table, var, into or limit name of max_name characters passes; one more is TOO_LARGE
    naming the field, its length and the setting."""
    assert isinstance(decode(execute([node("n" * 16)])), Execute)
    err = refused(execute([node("n" * 17)]))
    assert err.code is ErrorCode.TOO_LARGE
    assert "17 characters" in err.message and "max_name" in err.message


def test_an_entry_description_is_bounded_by_max_text() -> None:
    ok = execute([["Assert", ["SetVar", "t", "v", None, "d" * 32]]])
    assert isinstance(decode(ok), Execute)
    err = refused(execute([["Assert", ["SetVar", "t", "v", None, "d" * 33]]]))
    assert err.code is ErrorCode.TOO_LARGE and "max_text" in err.message


@pytest.mark.parametrize(
    ("field", "limit", "setting"),
    [
        ("session", 16, "max_name"),
        ("namespace", 16, "max_name"),
        ("tx_id", 16, "max_name"),
        ("session_description", 32, "max_text"),
        ("description", 32, "max_text"),
    ],
)
def test_execute_fields_are_bounded(field: str, limit: int, setting: str) -> None:
    """Each name or text field of an execute passes at its limit and is TOO_LARGE one
    character past it, with the field and the setting named and the id kept."""
    assert isinstance(decode(execute([], **{field: "x" * limit})), Execute)
    err = refused(execute([], **{field: "x" * (limit + 1)}))
    assert err.code is ErrorCode.TOO_LARGE
    assert err.request_id == 7
    assert repr(field) in err.message and setting in err.message


def test_end_and_hello_names_are_bounded() -> None:
    err = refused({"type": "end", "id": 3, "session": "s" * 17})
    assert err.code is ErrorCode.TOO_LARGE and err.request_id == 3
    err = refused({"type": "hello", "id": 4, "version": 1, "client": "c" * 17})
    assert err.code is ErrorCode.TOO_LARGE and err.request_id == 4
    assert isinstance(decode({"type": "hello", "id": 4, "version": 1, "client": "c" * 16}), Hello)


# --- durations ------------------------------------------------------------------------------------


@pytest.mark.parametrize("position", [5, 7])  # ttl, period
def test_ttl_and_period_are_bounded_by_max_ttl(position: int) -> None:
    """ttl and period of max_ttl pass; above it: INVALID_TRANSACTION naming the cap."""
    node: list[Any] = ["SetVar", "t", "v", None, None, None, None, None]
    node[position] = 100.0
    assert isinstance(decode(execute([["Assert", node]])), Execute)
    node[position] = 100.5
    err = refused(execute([["Assert", node]]))
    assert err.code is ErrorCode.INVALID_TRANSACTION
    assert "max_ttl" in err.message


@pytest.mark.parametrize("tiny", [1e-300, 5e-324, 0.0009])
@pytest.mark.parametrize("position", [5, 7])
def test_ttl_and_period_below_a_millisecond_are_refused(tiny: float, position: int) -> None:
    """The issue's attack: period=1e-300 made floor(wall / period) infinite on the server.
    Such durations never pass the decoder."""
    node: list[Any] = ["SetVar", "t", "v", None, None, None, None, None]
    node[position] = tiny
    err = refused(execute([["Assert", node]]))
    assert err.code is ErrorCode.INVALID_TRANSACTION
    assert f">= {MIN_SECONDS:g}" in err.message


@pytest.mark.parametrize("max_age", [1e-300, 5e-324, 0.0009])
def test_a_session_max_age_below_a_millisecond_is_refused(max_age: float) -> None:
    err = refused(execute([], max_age=max_age))
    assert err.code is ErrorCode.INVALID_MESSAGE and "max_age" in err.message


# --- dense frames -----------------------------------------------------------------------------


def test_a_frame_with_too_many_containers_is_refused_while_decoding() -> None:
    """A server-side frame may hold at most max_frame / 16 arrays and maps: the excess is
    TOO_LARGE (id unknown, it was not read), the stream carries on with the next frame."""
    conn = Connection(Role.SERVER, max_frame=1024 * 1024)
    allowed = 1024 * 1024 // 16
    attack = execute([["SetVar", "t", "v", [{}] * (allowed + 1)]])
    conn.receive_data(framed(attack) + framed({"type": "ping", "id": 2}))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.TOO_LARGE
    assert info.value.request_id is None
    assert str(allowed) in info.value.message
    assert conn.next_message() == Ping(2)


def test_containers_up_to_the_limit_decode() -> None:
    """A frame holding exactly max_frame / 16 containers (here the value's maps plus the
    request's own map and arrays) is decoded, not refused."""
    limits = TreeLimits(max_value=10**9)
    conn = Connection(Role.SERVER, max_frame=1024 * 1024, limits=limits)
    allowed = 1024 * 1024 // 16
    own = 4  # the request map, statements, the Assert and the SetVar arrays
    value = [{}] * (allowed - own - 1)  # minus the value's own list
    conn.receive_data(framed(execute([["Assert", ["SetVar", "t", "v", value]]])))
    assert isinstance(conn.next_message(), Execute)


def test_small_frames_are_decoded_without_counting() -> None:
    """Under 16 KiB a frame is never refused for its containers (counting costs a call per
    container; such a frame builds at most ~1 MiB of objects)."""
    limits = TreeLimits(max_value=10**9)
    conn = Connection(Role.SERVER, max_frame=8192, limits=limits)  # 1024 containers at most
    wire = execute([["SelectConstantValue", "x", [[]] * 2000]])
    data = pack(wire)
    assert len(data) < 16 * 1024
    conn.receive_data(frame(data))
    assert isinstance(conn.next_message(), Execute)


# --- before the handshake -----------------------------------------------------------------------


def gated(max_frame: int = 1024 * 1024) -> Connection:
    return Connection(Role.SERVER, max_frame=max_frame, require_hello=True)


def test_before_hello_frames_are_limited_to_max_hello_frame() -> None:
    """Until the handshake a frame may be MAX_HELLO_FRAME bytes: a larger header is refused
    at once (FRAME_TOO_LARGE, closing) before its body is read."""
    conn = gated()
    conn.receive_data(framed({"type": "hello", "id": 0, "version": 1, "token": "t" * 16000}))
    assert isinstance(conn.next_message(), Hello)
    conn = gated()
    with pytest.raises(ProtocolError) as info:
        conn.receive_data((MAX_HELLO_FRAME + 1).to_bytes(4, "big"))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "before the handshake" in info.value.message


def test_before_hello_only_the_type_of_another_request_is_read() -> None:
    """A request before hello is HANDSHAKE_REQUIRED with its id, whatever else it holds: an
    invalid tree is not even decoded (no INVALID_TRANSACTION), and the stream carries on."""
    conn = gated()
    bad_tree = execute([["NoSuchOp"]])
    conn.receive_data(framed(bad_tree) + framed({"type": "ping", "id": 9}))
    for rid in (7, 9):
        with pytest.raises(ProtocolError) as info:
            conn.next_message()
        assert info.value.code is ErrorCode.HANDSHAKE_REQUIRED
        assert info.value.request_id == rid
    conn.receive_data(framed({"type": "hello", "id": 1, "version": 1}))
    assert isinstance(conn.next_message(), Hello)
    assert not conn.greeted


def test_after_the_handshake_the_full_frame_limit_and_decoding_apply() -> None:
    conn = gated(max_frame=128 * 1024)
    conn.receive_data(framed({"type": "hello", "id": 1, "version": 1}))
    assert isinstance(conn.next_message(), Hello)
    conn.handshake_done()
    assert conn.greeted
    big = execute([["SelectConstantValue", "x", "y" * 70_000]])
    conn.receive_data(framed(big))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.TOO_LARGE  # decoded now: the value is over max_value
    conn.receive_data(framed(execute([["NoSuchOp"]])))
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.INVALID_TRANSACTION


def test_hello_cannot_be_pipelined_into_a_big_frame_before_it_is_accepted() -> None:
    """hello and a 20 KiB execute in one write: the execute's header is checked against the
    pre-handshake limit until the server accepts the hello."""
    conn = gated()
    hello = framed({"type": "hello", "id": 1, "version": 1})
    big = framed(execute([["SelectConstantValue", "x", "y" * 20_000]]))
    conn.receive_data(hello + big)
    assert isinstance(conn.next_message(), Hello)
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    conn = gated()
    conn.receive_data(hello + big)
    assert isinstance(conn.next_message(), Hello)
    conn.handshake_done()
    assert isinstance(conn.next_message(), Execute)


def test_a_server_connection_without_require_hello_decodes_everything() -> None:
    """Gating is the server's choice (protocol tools decode requests without a hello)."""
    conn = Connection(Role.SERVER)
    assert conn.greeted
    conn.receive_data(framed({"type": "ping", "id": 5}))
    assert conn.next_message() == Ping(5)
