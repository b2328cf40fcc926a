"""Property tests: arbitrary valid trees and messages round-trip exactly, however the bytes are
chunked; arbitrary garbage never makes a Connection raise anything but ProtocolError."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import msgpack
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from protocol import (
    FALSE,
    MAX_PAGE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    Block,
    Cancel,
    Cancelled,
    Cause,
    Connection,
    DeleteVar,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    Exists,
    FeedEvent,
    FeedKind,
    ForceRelease,
    GetStatistics,
    Hello,
    HolderInfo,
    HoldersPage,
    If,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    LockLost,
    LostReason,
    Not,
    Or,
    Ping,
    Pong,
    ProtocolError,
    Released,
    Reply,
    Role,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SessionEnded,
    SessionInfo,
    SessionsPage,
    SessionSpec,
    SetVar,
    Statistics,
    Status,
    Subscribe,
    Subscribed,
    Transaction,
    TransactionResult,
    TreeLimits,
    Unsubscribe,
    Unsubscribed,
    WaiterInfo,
    WaitersPage,
    Welcome,
    Xor,
    encode_execute,
    frame,
    new_transaction_result,
    node_from_wire,
    node_to_wire,
    pack,
    request_to_wire,
    server_message_from_wire,
    server_message_to_wire,
    statements_from_wire,
)
from protocol._trees import _TOP, _TreeDecoder

# Generated trees can be deeper / larger than the default limits; the round trip is about the
# encoding, the limits have their own tests.
ROOMY = TreeLimits(max_depth=500, max_ops=100_000, max_ttl=1e9)
# No per-example deadline: a loaded CI machine must not turn a slow example into a failure.
RELAXED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=8).filter(lambda s: bool(s.strip()))
texts = st.text(max_size=8)
uint64 = st.integers(0, 2**64 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
non_negative = st.one_of(st.integers(0, 10**9), st.floats(0, 1e9, allow_nan=False))
# Durations (max_age, ttl): at least MIN_SECONDS (1 ms), finite.
positive = st.one_of(
    st.integers(1, 10**9),
    st.floats(0.001, 1e9, allow_nan=False, allow_infinity=False),
)

# User values as they come back from the wire: lists (never tuples), str-keyed maps, no NaN
# (NaN != NaN would defeat the equality check; NaN itself has a golden test elsewhere).
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    texts,
    st.binary(max_size=8),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=8,
)


def _change_ops() -> st.SearchStrategy[Any]:
    setvar = st.builds(
        SetVar,
        names,
        names,
        values,
        description=st.none() | texts,
        ttl=st.none() | positive,
        allow_duplicates=st.booleans(),
    )
    deletevar = st.builds(DeleteVar, names, names, values)
    return setvar | deletevar


change_ops = _change_ops()
leaf_operators = st.one_of(
    st.just(TRUE),
    st.just(FALSE),
    st.builds(Exists, names, names, values, ignore_this_session=st.booleans()),
    st.builds(ArrivedBelow, names, names, st.integers(0, 2**64 - 1)),
    change_ops,
)
operators = st.recursive(
    leaf_operators,
    lambda inner: st.one_of(
        st.builds(And, inner, inner),
        st.builds(Or, inner, inner),
        st.builds(Xor, inner, inner),
        st.builds(Not, inner),
    ),
    max_leaves=6,
)
leaf_statements = st.one_of(
    st.just(Abort()),
    st.builds(Assert, operators),
    st.builds(SelectConstantValue, names, values),
    st.builds(SelectOperatorValue, names, operators),
    st.builds(
        SelectVarValue,
        names,
        names,
        names,
        ignore_this_session=st.booleans(),
        abort_if_not_found=st.booleans(),
        select_many=st.booleans(),
    ),
    st.builds(AnywayContinueAfter, change_ops, reset_abort=st.booleans()),
)
statements = st.recursive(
    leaf_statements,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda items: Block(*items)),
        st.builds(If, operators, inner, st.none() | inner),
    ),
    max_leaves=6,
)
nodes = statements | operators

sessions = st.builds(SessionSpec, names, max_age=positive, description=texts)
transactions = st.builds(
    Transaction,
    names,
    st.lists(statements, max_size=3),
    transaction_id=texts,
    description=texts,
    min_uptime=non_negative,
    min_trust=st.floats(0, 1) | st.sampled_from([0, 1]),
)
requests = st.one_of(
    st.builds(
        Hello,
        uint64,
        version=uint64,
        client_name=texts,
        token=st.none() | texts,
    ),
    st.builds(Execute, uint64, sessions, transactions, st.none() | non_negative),
    st.builds(EndSession, uint64, names),
    st.builds(GetStatistics, uint64),
    st.builds(Ping, uint64),
    st.builds(Cancel, uint64, uint64),
)
# The operator's requests (PROTOCOL.md "Inspection").
queries = st.builds(
    ListQuery,
    st.none() | names,
    st.none() | texts,
    st.none() | texts,
    st.none() | names,
    st.none() | texts,
    st.none() | st.text(min_size=1, max_size=12),
    st.none() | st.integers(1, MAX_PAGE),
)
requests = st.one_of(
    requests,
    st.builds(ListHolders, uint64, queries),
    st.builds(ListSessions, uint64, queries),
    st.builds(ListWaiters, uint64, queries),
    st.builds(ForceRelease, uint64, names, names, names, st.none() | names),
    st.builds(Subscribe, uint64, names, st.none() | names),
    st.builds(Unsubscribe, uint64, uint64),
)
holder_records = st.builds(
    HolderInfo,
    texts,
    texts,
    texts,
    texts,
    texts,
    values,
    st.none() | texts,
    finite,
    st.none() | finite,
    uint64,
)

stat_maps = st.dictionaries(texts, values, max_size=4)
results = st.builds(
    TransactionResult,
    status=st.sampled_from(Status),
    cause=st.sampled_from(Cause),
    transaction_id=texts,
    host=texts,
    uptime=st.floats(allow_nan=False),
    trust=st.floats(allow_nan=False),
    failed_statement=st.none() | texts,
    data=st.lists(st.tuples(texts, values), max_size=4).map(tuple),
    fence=uint64,
    valid_until=st.none() | st.floats(allow_nan=False),
    holders=st.lists(holder_records, max_size=3).map(tuple),
)
bodies = st.one_of(
    results,
    st.builds(SessionEnded, st.booleans()),
    st.builds(Pong, st.floats(allow_nan=False), st.floats(allow_nan=False)),
    st.builds(Statistics, stat_maps),
    st.builds(
        Welcome,
        st.integers(-(2**63), 2**64 - 1),
        texts,
        texts,
        stat_maps,
        texts,
        st.none() | finite,
        texts,
        st.lists(texts, max_size=3).map(tuple),
    ),
    st.builds(Cancelled, st.booleans()),
    st.builds(HoldersPage, st.lists(holder_records, max_size=3), st.none() | texts),
    st.builds(
        SessionsPage,
        st.lists(
            st.builds(
                SessionInfo,
                texts,
                texts,
                texts,
                st.lists(texts, max_size=2).map(tuple),
                finite,
                finite,
                finite,
                finite,
                uint64,
                uint64,
            ),
            max_size=3,
        ),
        st.none() | texts,
    ),
    st.builds(
        WaitersPage,
        st.lists(
            st.builds(
                WaiterInfo,
                texts,
                texts,
                texts,
                st.lists(st.tuples(texts, texts, uint64), max_size=3).map(tuple),
                finite,
                finite,
            ),
            max_size=3,
        ),
        st.none() | texts,
    ),
    st.builds(Released, uint64, uint64),
    st.builds(Subscribed, uint64),
    st.builds(Unsubscribed, st.booleans()),
)
server_messages = st.one_of(
    st.builds(Reply, uint64, bodies),
    st.builds(ErrorReply, st.none() | uint64, st.sampled_from(ErrorCode), texts),
    st.builds(
        LockLost,
        texts,
        st.sampled_from(LostReason),
        st.lists(st.tuples(texts, texts, texts, uint64), max_size=3).map(tuple),
    ),
    st.builds(
        FeedEvent,
        uint64,
        st.sampled_from(FeedKind),
        texts,
        texts,
        texts,
        texts,
        uint64,
        finite,
        st.none() | texts,
        uint64,
    ),
)


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """Split ``data`` at the given positions (taken modulo len+1, sorted, deduplicated)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    out, prev = [], 0
    for p in [*points, len(data)]:
        out.append(data[prev:p])
        prev = p
    return out


# --- round trips --------------------------------------------------------------------------------


@RELAXED
@given(nodes)
def test_tree_round_trip(node: Any) -> None:
    """Any valid tree -> wire -> msgpack -> wire -> tree is the identity."""
    wire = node_to_wire(node)
    assert node_from_wire(msgpack.unpackb(pack(wire)), ROOMY) == node


@RELAXED
@given(requests, st.lists(st.integers(0, 10_000), max_size=8))
def test_request_round_trip(request: Any, cuts: list[int]) -> None:
    """Any valid request encoded by a client decodes to an equal request on the server, fed
    whole and fed in arbitrary chunks."""
    data = Connection(Role.CLIENT).send(request)
    server = Connection(Role.SERVER, limits=ROOMY)
    server.receive_data(data)
    assert server.next_message() == request
    assert server.next_message() is None
    server = Connection(Role.SERVER, limits=ROOMY)
    got = []
    for chunk in chunked(data + data, cuts):
        server.receive_data(chunk)
        while (msg := server.next_message()) is not None:
            got.append(msg)
    assert got == [request, request]
    assert server.buffered == 0


@RELAXED
@given(uint64, results)
def test_send_result_is_the_bytes_of_send_reply(rid: int, body: TransactionResult) -> None:
    """The server's shortcut (no Reply object, enums and tuples packed as they are) writes
    byte for byte what send(Reply(...)) writes, and it decodes to that reply."""
    server = Connection(Role.SERVER)
    data = server.send_result(rid, body)
    assert data == server.send(Reply(rid, body))
    client = Connection(Role.CLIENT)
    client.receive_data(data)
    assert client.next_message() == Reply(rid, body)


plain_results = st.builds(
    TransactionResult,
    status=st.sampled_from(Status),
    cause=st.sampled_from(Cause),
    transaction_id=texts | st.text(min_size=30, max_size=300),
    host=texts | st.text(min_size=30, max_size=70_000),
    uptime=st.floats(allow_nan=False) | st.integers(0, 2**64 - 1),
    trust=st.floats(allow_nan=False) | st.integers(0, 1),
    failed_statement=st.none() | texts,
    fence=uint64,
    valid_until=st.none() | st.floats(allow_nan=False) | st.integers(0, 2**64 - 1),
)


@RELAXED
@given(uint64, plain_results)
def test_a_result_is_written_as_msgpack_writes_its_map(rid: int, body: TransactionResult) -> None:
    """The server's result reply is byte for byte msgpack's packing of its wire map, built
    here by hand, in either build: any id, string lengths across msgpack's size classes,
    uptimes, trusts and deadlines given as floats, ints or None (an int stays an int: a
    compiled build read them as the declared float)."""
    wire = {
        "type": "result",
        "id": rid,
        "status": int(body.status),
        "cause": int(body.cause),
        "tx_id": body.transaction_id,
        "host": body.host,
        "uptime": body.uptime,
        "trust": body.trust,
        "failed": body.failed_statement,
        "data": [],
        "fence": body.fence,
        "valid_until": body.valid_until,
    }
    expected = msgpack.packb(wire, use_bin_type=True)
    assert Connection(Role.SERVER).send_result(rid, body) == frame(expected)


@RELAXED
@given(uint64, sessions, transactions, st.none() | non_negative)
def test_encode_execute_is_the_bytes_of_send_execute(
    rid: int, session: SessionSpec, tx: Transaction, wait: float | None
) -> None:
    """The client's shortcut (no Transaction / Execute built) writes byte for byte what
    send(Execute(...)) writes, for statements given as a tuple, a list or a generator."""
    expected = Connection(Role.CLIENT).send(Execute(rid, session, tx, wait))
    for statements in (tx.statements, list(tx.statements), (s for s in tx.statements)):
        data = encode_execute(
            rid,
            session,
            tx.namespace,
            statements,
            transaction_id=tx.transaction_id,
            description=tx.description,
            min_uptime=tx.min_uptime,
            min_trust=tx.min_trust,
            wait=wait,
        )
        assert data == expected


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"namespace": " "}, ValueError),
        ({"namespace": 7}, TypeError),
        ({"statements": [SetVar("t", "v")]}, TypeError),  # an operator, not a statement
        ({"statements": [Abort(), "Abort"]}, TypeError),
        ({"transaction_id": None}, TypeError),
        ({"min_uptime": math.inf}, ValueError),
        ({"min_uptime": -1}, ValueError),
        ({"min_trust": 1.5}, ValueError),
        ({"min_trust": True}, ValueError),
        ({"wait": math.nan}, ValueError),
        ({"request_id": -1}, ValueError),
        ({"request_id": 2**64}, ValueError),
    ],
)
def test_encode_execute_refuses_what_the_messages_refuse(
    change: dict[str, Any], error: type[Exception]
) -> None:
    """An invalid argument raises what building Transaction / Execute raises, same message."""
    args: dict[str, Any] = {
        "request_id": 1,
        "session": SessionSpec("s"),
        "namespace": "ns",
        "statements": [Abort()],
        "transaction_id": "",
        "description": "",
        "min_uptime": 0.0,
        "min_trust": 0.0,
        "wait": None,
    }
    args.update(change)
    with pytest.raises(error) as fast:
        encode_execute(
            args.pop("request_id"),
            args.pop("session"),
            args.pop("namespace"),
            args.pop("statements"),
            **args,
        )
    args = {"transaction_id": "", "description": "", "min_uptime": 0.0, "min_trust": 0.0}
    args.update({k: v for k, v in change.items() if k in args})
    with pytest.raises(error) as built:
        tx = Transaction(change.get("namespace", "ns"), change.get("statements", [Abort()]), **args)
        Execute(change.get("request_id", 1), SessionSpec("s"), tx, change.get("wait"))
    assert str(fast.value) == str(built.value)


@RELAXED
@given(uint64, results)
def test_result_fast_path_decodes_like_the_general_path(rid: int, body: TransactionResult) -> None:
    """A result reply decodes to the same Reply through the fast path (exactly the 12 fields)
    and through the general one (taken when an unknown extra field is present, which the
    client tolerates for forward compatibility)."""
    wire = server_message_to_wire(Reply(rid, body))
    assert server_message_from_wire(wire) == Reply(rid, body)
    assert server_message_from_wire({**wire, "future_field": 1}) == Reply(rid, body)


_ACQUIRE_NAMES = st.text(st.characters(codec="utf-8"), min_size=1, max_size=4)
_ACQUIRE_VALUES = st.one_of(
    st.none(),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.integers(min_value=-(2**64), max_value=2**65),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
# What sends the acquire's wire to the tree walk (or makes it an error there), one at a time;
# "none" (most draws) leaves a valid acquire.
_ACQUIRE_CHANGES: dict[str, Callable[[list[Any]], list[Any]]] = {
    "outer": lambda w: [["Not", *w[0][1:]]],
    "outer bytes": lambda w: [[b"Assert", *w[0][1:]]],
    "inner": lambda w: [["Assert", ["Exists", *w[0][1][1:]]]],
    "table": lambda w: [["Assert", ["SetVar", " ", *w[0][1][2:]]]],
    "var": lambda w: [["Assert", ["SetVar", w[0][1][1], 7, *w[0][1][3:]]]],
    "empty var": lambda w: [["Assert", ["SetVar", w[0][1][1], "", *w[0][1][3:]]]],
    "description": lambda w: [["Assert", [*w[0][1][:3], None, "why"]]],
    "no var": lambda w: [["Assert", ["SetVar", w[0][1][1]]]],
    "two args": lambda w: [["Assert", w[0][1], None]],
    "extra statement": lambda w: [*w, ["Abort"]],
    "no statement": lambda w: [],
}


@settings(max_examples=300, deadline=None)
@given(
    _ACQUIRE_NAMES,
    _ACQUIRE_NAMES,
    st.lists(_ACQUIRE_VALUES, max_size=1),
    st.sampled_from(["none"] * len(_ACQUIRE_CHANGES) + sorted(_ACQUIRE_CHANGES)),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 5),
    st.integers(32, 96),
)
def test_the_acquire_shortcut_decodes_like_the_tree_walk(
    table: str,
    var: str,
    value: list[Any],
    change: str,
    max_depth: int,
    max_ops: int,
    max_name: int,
    max_value: int,
) -> None:
    """statements_from_wire's one-step decode of [Assert(SetVar(table, var[, value]))] (issue
    32) gives what the general tree walk gives for the same wire and limits: the same nodes,
    or a ProtocolError with the same code and message (names, values, arities, op names and
    the limits on both sides of their bounds)."""
    wire: list[Any] = [["Assert", ["SetVar", table, var, *value]]]
    if change != "none":
        wire = _ACQUIRE_CHANGES[change](wire)
    limits = TreeLimits(
        max_depth=max_depth, max_ops=max_ops, max_name=max_name, max_value=max_value
    )

    def walked() -> tuple[Any, ...]:
        d = _TreeDecoder(limits)
        return tuple(d.statement(s, _TOP[i], 0) for i, s in enumerate(wire))

    try:
        expected: Any = walked()
    except ProtocolError as exc:
        event("refused")
        with pytest.raises(ProtocolError) as got:
            statements_from_wire(wire, limits)
        assert (got.value.code, got.value.message) == (exc.code, exc.message)
    else:
        event("decoded")
        decoded = statements_from_wire(wire, limits)
        assert decoded == expected
        assert [type(n) for n in decoded] == [type(n) for n in expected]
        assert [type(n.condition) for n in decoded if isinstance(n, Assert)] == [
            type(n.condition) for n in expected if isinstance(n, Assert)
        ]


@pytest.mark.pure_only("replaces the tree walk by patching protocol._trees._TreeDecoder")
def test_the_acquire_shortcut_walks_no_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """[Assert(SetVar(table, var[, value]))] within the limits is decoded without the tree
    walk (the walk is made to fail here), anything else still goes through it."""
    import protocol._trees

    class Refused(Exception):
        pass

    def no_walk(limits: TreeLimits) -> None:
        raise Refused

    monkeypatch.setattr(protocol._trees, "_TreeDecoder", no_walk)
    assert statements_from_wire([["Assert", ["SetVar", "T", "v"]]]) == (Assert(SetVar("T", "v")),)
    assert statements_from_wire([["Assert", ["SetVar", "T", "v", b"x"]]]) == (
        Assert(SetVar("T", "v", b"x")),
    )
    for other in (
        [["Assert", ["SetVar", "T", "v", None, "why"]]],
        [["Assert", ["Exists", "T", "v"]]],
        [["Assert", ["SetVar", "T", "v"]], ["Abort"]],
        [["Assert", ["SetVar", " ", "v"]]],
    ):
        with pytest.raises(Refused):
            statements_from_wire(other)
    with pytest.raises(Refused):
        statements_from_wire([["Assert", ["SetVar", "T", "v"]]], TreeLimits(max_depth=1))


@given(results)
def test_new_transaction_result_builds_what_the_class_builds(body: TransactionResult) -> None:
    """The engine's cheap constructor, given every field in order, builds an object equal to
    (and of the same class as) the one the class's own __init__ builds; a field added to the
    class without it fails here."""
    fields = [getattr(body, f.name) for f in attrs.fields(TransactionResult)]
    made = new_transaction_result(*fields)
    assert type(made) is TransactionResult
    assert made == TransactionResult(*fields) == body


@pytest.mark.parametrize(
    "change",
    [
        {"status": True},
        {"status": 99},
        {"cause": 2.0},
        {"uptime": math.nan},
        {"trust": "1"},
        {"valid_until": math.nan},
        {"failed": 3},
        {"data": [["a"]]},
        {"data": [[1, 2]]},
        {"data": {}},
        {"fence": 1.0},
        {"tx_id": None},
        {"id": "1"},
    ],
)
def test_result_fast_path_refuses_what_the_general_path_refuses(change: dict[str, Any]) -> None:
    """A malformed result is not accepted by the fast path: the general path answers with its
    precise error (the same one as with an extra field, which skips the fast path)."""
    body = TransactionResult(Status.TRANSACTION_OK, Cause.UNSPECIFIED, "", "h", 1.0, 1.0)
    wire = {**server_message_to_wire(Reply(1, body)), **change}
    with pytest.raises(ProtocolError) as fast:
        server_message_from_wire(wire)
    with pytest.raises(ProtocolError) as general:
        server_message_from_wire({**wire, "future_field": 1})
    assert fast.value.code == general.value.code == ErrorCode.INVALID_MESSAGE
    assert str(fast.value) == str(general.value)


@RELAXED
@given(server_messages, st.lists(st.integers(0, 10_000), max_size=8))
def test_server_message_round_trip(message: Any, cuts: list[int]) -> None:
    """Any valid server message encoded by a server decodes to an equal message on the
    client, fed whole and fed in arbitrary chunks."""
    data = Connection(Role.SERVER).send(message)
    client = Connection(Role.CLIENT)
    client.receive_data(data)
    assert client.next_message() == message
    client = Connection(Role.CLIENT)
    got = []
    for chunk in chunked(data * 3, cuts):
        client.receive_data(chunk)
        while (msg := client.next_message()) is not None:
            got.append(msg)
    assert got == [message] * 3


@RELAXED
@given(st.lists(requests, min_size=1, max_size=5), st.lists(st.integers(0, 10_000), max_size=10))
def test_pipelined_requests_round_trip(batch: list[Any], cuts: list[int]) -> None:
    """A pipelined batch of requests, however chunked, comes out complete and in order."""
    client = Connection(Role.CLIENT)
    data = b"".join(client.send(r) for r in batch)
    server = Connection(Role.SERVER, limits=ROOMY)
    got = []
    for chunk in chunked(data, cuts):
        server.receive_data(chunk)
        while (msg := server.next_message()) is not None:
            got.append(msg)
    assert got == batch


@RELAXED
@given(values)
def test_values_round_trip_inside_trees(value: Any) -> None:
    """Any wire value carried by a SelectConstantValue comes back equal."""
    node = SelectConstantValue("x", value)
    assert node_from_wire(msgpack.unpackb(pack(node_to_wire(node)))) == node


# --- garbage never crashes ----------------------------------------------------------------------


def feed_all(conn: Connection, chunks: list[bytes]) -> None:
    """Feed chunks and pull messages; ProtocolError is the only acceptable failure. After a
    poisoning (1xx) error the connection must keep refusing; after any other it continues."""
    poisoned: ProtocolError | None = None
    for chunk in chunks:
        try:
            conn.receive_data(chunk)
        except ProtocolError as exc:
            assert exc.code.closes_connection
            poisoned = exc
            break
        while True:
            try:
                msg = conn.next_message()
            except ProtocolError as exc:
                assert isinstance(exc.code, ErrorCode)
                assert isinstance(exc.message, str)
                assert len(exc.message) < 2000
                if exc.code < 200:
                    poisoned = exc
                    break
                continue
            except Exception as exc:  # anything else is a bug
                pytest.fail(f"{type(exc).__name__} escaped the decoder: {exc!r}")
            if msg is None:
                break
        if poisoned is not None:
            break
    if poisoned is not None:
        with pytest.raises(ProtocolError) as again:
            conn.next_message()
        assert (again.value.code, again.value.message) == (poisoned.code, poisoned.message)


ROLES = st.sampled_from([Role.SERVER, Role.CLIENT])


@RELAXED
@given(ROLES, st.binary(max_size=300), st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_only_raise_protocol_error(role: Role, data: bytes, cuts: list[int]) -> None:
    """Random bytes, in random chunks, raise nothing but ProtocolError (either role)."""
    feed_all(Connection(role, max_frame=1 << 16), chunked(data, cuts))


@RELAXED
@given(ROLES, st.lists(st.binary(max_size=64), max_size=4), st.lists(st.integers(0, 400)))
def test_random_framed_payloads_only_raise_protocol_error(
    role: Role, payloads: list[bytes], cuts: list[int]
) -> None:
    """Correctly framed random payloads raise nothing but ProtocolError (either role)."""
    feed_all(Connection(role), chunked(b"".join(frame(p) for p in payloads), cuts))


# Random msgpack documents biased towards the protocol's own vocabulary, so they get past the
# first checks and exercise the field readers and the tree decoder.
FIELD_NAMES = sorted(
    {
        "type", "id", "version", "client", "token", "session", "max_age",
        "session_description", "namespace", "statements", "tx_id", "description",
        "min_uptime", "min_trust", "wait", "target", "status", "cause", "host", "uptime",
        "trust", "failed", "data", "fence", "valid_until", "existed", "stats", "server",
        "limits", "found", "code", "name", "message", "reason", "entries", "instance",
        # the operator's (PROTOCOL.md "Inspection")
        "started_at", "holders", "table", "var", "match", "cursor", "limit", "sessions",
        "waiters", "subscription", "kind", "at", "dropped",
        # a replica's welcome (PROTOCOL.md "welcome")
        "group", "replicas",
    }
)  # fmt: skip
WORDS = [
    *FIELD_NAMES,
    "hello", "execute", "end", "ping", "cancel", "result", "ended", "pong", "welcome",
    "cancelled", "error", "lost", "expired", "ttl", "ended", "released", "subscribe",
    "unsubscribe", "subscribed", "unsubscribed", "feed", "granted",
    "Assert", "Abort", "Block", "If", "AnywayContinueAfter", "SelectConstantValue",
    "SelectOperatorValue", "SelectVarValue", "And", "Or", "Xor", "Not", "True", "False",
    "Exists", "SetVar", "DeleteVar", "", " ",
]  # fmt: skip
wire_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([0, 1, 2, 3, 101, 203, 500, -1, 2**64 - 1]),
    st.floats(),
    st.sampled_from(WORDS),
    st.text(max_size=4),
    st.binary(max_size=4),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**32), st.integers(0, 999_999_999)),
)
wire_values = st.recursive(
    wire_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.tuples(st.sampled_from(WORDS), inner).map(list),
        st.tuples(st.sampled_from(WORDS), inner, inner).map(list),
        st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=3), inner, max_size=6),
    ),
    max_leaves=20,
)
message_like = st.fixed_dictionaries(
    {"type": st.sampled_from(WORDS), "id": st.one_of(st.integers(0, 5), wire_scalars)},
    optional={k: wire_values for k in FIELD_NAMES if k not in ("type", "id")},
)


def _pack_any(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True, datetime=False)


@RELAXED
@given(ROLES, st.lists(message_like | wire_values, min_size=1, max_size=3))
def test_random_msgpack_values_only_raise_protocol_error(role: Role, docs: list[Any]) -> None:
    """Random msgpack documents (message-like maps, trees, ext types, timestamps, NaN...)
    raise nothing but ProtocolError (either role)."""
    feed_all(Connection(role), [b"".join(frame(_pack_any(d)) for d in docs)])


@RELAXED
@given(
    requests,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["replace", "insert", "delete"]),
    st.booleans(),
)
def test_mutated_request_frames_only_raise_protocol_error(
    request: Any, edits: list[tuple[int, int]], how: str, reframe: bool
) -> None:
    """A valid request frame with a few bytes replaced, inserted or deleted (in the payload
    with the header fixed up, or anywhere) raises nothing but ProtocolError on the server,
    and a valid ping right behind it decodes unless the stream was poisoned."""
    framed_req = Connection(Role.CLIENT).send(request)
    mutated = _mutate(framed_req[4:] if reframe else framed_req, edits, how)
    data = frame(mutated) if reframe else mutated
    feed_all(Connection(Role.SERVER), [data + frame(pack({"type": "ping", "id": 1}))])


@RELAXED
@given(
    server_messages,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["replace", "insert", "delete"]),
    st.booleans(),
)
def test_mutated_server_frames_only_raise_protocol_error(
    message: Any, edits: list[tuple[int, int]], how: str, reframe: bool
) -> None:
    """Mutated server message frames raise nothing but ProtocolError on the client."""
    framed_msg = Connection(Role.SERVER).send(message)
    mutated = _mutate(framed_msg[4:] if reframe else framed_msg, edits, how)
    feed_all(Connection(Role.CLIENT), [frame(mutated) if reframe else mutated])


def _mutate(data: bytes, edits: list[tuple[int, int]], how: str) -> bytes:
    buf = bytearray(data)
    for pos, byte in edits:
        if not buf and how != "insert":
            break
        i = pos % (len(buf) + (1 if how == "insert" else 0))
        if how == "replace":
            buf[i] = byte
        elif how == "insert":
            buf.insert(i, byte)
        else:
            del buf[i]
    return bytes(buf)


@RELAXED
@given(st.lists(statements, min_size=1, max_size=3), st.integers(1, 12), st.integers(1, 60))
def test_limits_never_crash_and_are_exact(stmts: list[Any], max_depth: int, max_ops: int) -> None:
    """Under any limits a valid transaction either decodes intact or is refused with exactly
    TREE_TOO_DEEP or TOO_MANY_OPS, as its true depth and size dictate."""
    wire = Connection(Role.CLIENT).send(Execute(1, SessionSpec("s"), Transaction("n", stmts)))
    conn = Connection(
        Role.SERVER, limits=TreeLimits(max_depth=max_depth, max_ops=max_ops, max_ttl=1e9)
    )
    conn.receive_data(wire)
    depth = max(_depth(s) for s in stmts)
    size = sum(_size(s) for s in stmts)
    try:
        got = conn.next_message()
    except ProtocolError as exc:
        assert exc.request_id == 1
        assert exc.code in (ErrorCode.TREE_TOO_DEEP, ErrorCode.TOO_MANY_OPS)
        assert depth > max_depth or size > max_ops
        return
    assert depth <= max_depth
    assert size <= max_ops
    assert got.transaction.statements == tuple(stmts)  # type: ignore[union-attr]


def _children(node: Any) -> list[Any]:
    wire = node_to_wire(node)
    return [node_from_wire(w, ROOMY) for w in _child_wires(wire)]


def _child_wires(wire: list[Any]) -> list[Any]:
    op = wire[0]
    if op == "Block":
        return list(wire[1])
    if op in ("Assert", "Not", "AnywayContinueAfter"):
        return [wire[1]]
    if op in ("And", "Or", "Xor"):
        return [wire[1], wire[2]]
    if op == "If":
        return wire[1:]
    if op == "SelectOperatorValue":
        return [wire[2]]
    return []


def _depth(node: Any) -> int:
    return 1 + max((_depth(c) for c in _children(node)), default=0)


def _size(node: Any) -> int:
    return 1 + sum(_size(c) for c in _children(node))


def test_nan_value_encodes_and_decodes() -> None:
    """A NaN user value is a valid float on the wire (it is just never equal to anything)."""
    node = node_from_wire(node_to_wire(SelectConstantValue("x", math.nan)))
    assert isinstance(node, SelectConstantValue)
    assert math.isnan(node.value)


@RELAXED
@given(requests)
def test_request_wire_maps_use_only_documented_keys(request: Any) -> None:
    """Encoded requests only ever use the documented field names."""
    wire = request_to_wire(request)
    assert set(wire) <= set(FIELD_NAMES)


@RELAXED
@given(server_messages)
def test_server_wire_maps_use_only_documented_keys(message: Any) -> None:
    """Encoded server messages only ever use the documented field names."""
    wire = server_message_to_wire(message)
    assert set(wire) <= set(FIELD_NAMES)
