"""The connection lifecycle: the table cell by cell, the Connection following it in both roles,
and random conversations in which a client and a server Connection agree on the state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import (
    CLOSING_ERROR,
    LIFECYCLE,
    MAX_HELLO_FRAME,
    Assert,
    Cancel,
    Cancelled,
    Cause,
    Connection,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    FeedEvent,
    FeedKind,
    ForceRelease,
    GetStatistics,
    Hello,
    HoldersPage,
    Lifecycle,
    LifecycleError,
    ListHolders,
    ListSessions,
    ListWaiters,
    LockLost,
    LostReason,
    Ping,
    Pong,
    ProtocolError,
    Released,
    Reply,
    Request,
    Role,
    ServerMessage,
    SessionEnded,
    SessionsPage,
    SessionSpec,
    SetVar,
    State,
    Statistics,
    Status,
    Subscribe,
    Subscribed,
    Transaction,
    TransactionResult,
    Unsubscribe,
    Unsubscribed,
    WaitersPage,
    Welcome,
    frame,
    message_kind,
    pack,
)

A, R, C = State.AWAITING_HELLO, State.READY, State.CLOSED

REQUEST_KINDS = (
    "hello",
    "execute",
    "end",
    "stats",
    "ping",
    "cancel",
    "holders",
    "sessions",
    "waiters",
    "release",
    "subscribe",
    "unsubscribe",
)
SERVER_KINDS = (
    "welcome",
    "result",
    "ended",
    "stats",
    "pong",
    "cancelled",
    "holders",
    "sessions",
    "waiters",
    "released",
    "subscribed",
    "unsubscribed",
    "error",
    CLOSING_ERROR,
    "lost",
    "feed",
)

#: The expected table, written out cell by cell: (sender, state) -> {kind: next state}.
EXPECTED: dict[tuple[Role, State], dict[str, State]] = {
    (Role.CLIENT, A): {"hello": A},
    (Role.CLIENT, R): dict.fromkeys(REQUEST_KINDS, R),
    (Role.CLIENT, C): {},
    (Role.SERVER, A): {"welcome": R, "error": A, CLOSING_ERROR: C},
    (Role.SERVER, R): {
        "result": R,
        "ended": R,
        "stats": R,
        "pong": R,
        "cancelled": R,
        "holders": R,
        "sessions": R,
        "waiters": R,
        "released": R,
        "subscribed": R,
        "unsubscribed": R,
        "error": R,
        CLOSING_ERROR: C,
        "lost": R,
        "feed": R,
    },
    (Role.SERVER, C): {
        "result": C,
        "ended": C,
        "stats": C,
        "pong": C,
        "cancelled": C,
        "holders": C,
        "sessions": C,
        "waiters": C,
        "released": C,
        "subscribed": C,
        "unsubscribed": C,
        "error": C,
        CLOSING_ERROR: C,
        "lost": C,
        "feed": C,
    },
}

REQUESTS: dict[str, Callable[[int], Request]] = {
    "hello": lambda rid: Hello(rid, client_name="t"),
    "execute": lambda rid: Execute(
        rid, SessionSpec("s"), Transaction("ns", [Assert(SetVar("t", "v"))])
    ),
    "end": lambda rid: EndSession(rid, "s"),
    "stats": GetStatistics,
    "ping": Ping,
    "cancel": lambda rid: Cancel(rid, 1),
    "holders": ListHolders,
    "sessions": ListSessions,
    "waiters": ListWaiters,
    "release": lambda rid: ForceRelease(rid, "ns", "t", "v"),
    "subscribe": lambda rid: Subscribe(rid, "ns"),
    "unsubscribe": lambda rid: Unsubscribe(rid, 1),
}

SERVER_MESSAGES: dict[str, Callable[[int], ServerMessage]] = {
    "welcome": lambda rid: Reply(rid, Welcome(1, "lockserver", "h", {"max_frame": 1024}, "ab")),
    "result": lambda rid: Reply(
        rid, TransactionResult(Status.TRANSACTION_OK, Cause.UNSPECIFIED, "", "h", 1.0, 1.0)
    ),
    "ended": lambda rid: Reply(rid, SessionEnded(True)),
    "stats": lambda rid: Reply(rid, Statistics({"server": {}})),
    "pong": lambda rid: Reply(rid, Pong(1.0, 1.0)),
    "cancelled": lambda rid: Reply(rid, Cancelled(False)),
    "error": lambda rid: ErrorReply(rid, ErrorCode.INVALID_MESSAGE, "no"),
    CLOSING_ERROR: lambda rid: ErrorReply(None, ErrorCode.SHUTTING_DOWN, "bye"),
    "lost": lambda rid: LockLost("s", LostReason.TTL, (("ns", "t", "v", 5),)),
    "holders": lambda rid: Reply(rid, HoldersPage(())),
    "sessions": lambda rid: Reply(rid, SessionsPage(())),
    "waiters": lambda rid: Reply(rid, WaitersPage(())),
    "released": lambda rid: Reply(rid, Released(0, 1)),
    "subscribed": lambda rid: Reply(rid, Subscribed(rid)),
    "unsubscribed": lambda rid: Reply(rid, Unsubscribed(False)),
    "feed": lambda rid: FeedEvent(1, FeedKind.GRANTED, "ns", "t", "v", "s", 5, 1.5),
}


# --- the table ----------------------------------------------------------------------------------


def test_the_table_is_exactly_the_documented_one() -> None:
    """Every (sender, state) cell holds exactly the expected moves; no other kind appears."""
    for (sender, state), moves in EXPECTED.items():
        assert dict(LIFECYCLE.moves[sender][state]) == moves, (sender, state)
        assert LIFECYCLE.allowed(sender, state) == frozenset(moves)
    assert set(LIFECYCLE.moves) == set(Role)
    for sender in Role:
        assert set(LIFECYCLE.moves[sender]) == set(State)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize(
    ("sender", "kind"),
    [(Role.CLIENT, k) for k in REQUEST_KINDS] + [(Role.SERVER, k) for k in SERVER_KINDS],
)
def test_next_state_of_every_cell(sender: Role, state: State, kind: str) -> None:
    """next_state gives the table's move, or raises LifecycleError naming the sender, the
    kind and the state."""
    expected = EXPECTED[(sender, state)].get(kind)
    if expected is not None:
        assert LIFECYCLE.next_state(sender, state, kind) is expected
        return
    with pytest.raises(LifecycleError) as info:
        LIFECYCLE.next_state(sender, state, kind)
    assert (info.value.sender, info.value.state, info.value.kind) == (sender, state, kind)
    assert kind in str(info.value) and state.name in str(info.value)


def test_the_table_is_read_only() -> None:
    """The table cannot be changed in place, and a Lifecycle built from plain dicts freezes
    them (a copy: the caller's dict stays the caller's)."""
    with pytest.raises(TypeError):
        LIFECYCLE.moves[Role.CLIENT][A]["ping"] = R  # type: ignore[index]
    with pytest.raises(TypeError):
        LIFECYCLE.moves[Role.CLIENT][A] = {}  # type: ignore[index]
    source = {Role.CLIENT: {A: {"hello": A}}}
    table = Lifecycle(source)  # type: ignore[arg-type]
    source[Role.CLIENT][A]["ping"] = A
    assert dict(table.moves[Role.CLIENT][A]) == {"hello": A}


def test_message_kind_of_every_message() -> None:
    """message_kind is the wire type, and an error whose code closes the connection is
    CLOSING_ERROR; anything else is a TypeError."""
    for kind, make in REQUESTS.items():
        assert message_kind(make(1)) == kind
    for kind, make in SERVER_MESSAGES.items():
        assert message_kind(make(1)) == kind
    for code in ErrorCode:
        expected = CLOSING_ERROR if code.closes_connection else "error"
        assert message_kind(ErrorReply(1, code, "x")) == expected
    with pytest.raises(TypeError):
        message_kind("ping")  # type: ignore[arg-type]


# --- a Connection in every state ----------------------------------------------------------------


def server_in(state: State) -> Connection:
    """A server-role Connection (``require_hello``, as the server runs it) in ``state``."""
    conn = Connection(Role.SERVER, require_hello=True)
    if state is R:
        conn.handshake_done()
    elif state is C:
        conn.send(ErrorReply(1, ErrorCode.UNSUPPORTED_VERSION, "hello: version 9"))
    assert conn.state is state
    return conn


def client_in(state: State) -> Connection:
    """A client-role Connection that follows the handshake, brought to ``state`` by what it
    received."""
    conn = Connection(Role.CLIENT, require_hello=True)
    if state is not A:
        conn.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES["welcome"](0)))
        assert conn.next_message() is not None
    if state is C:
        conn.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES[CLOSING_ERROR](0)))
        assert conn.next_message() is not None
    assert conn.state is state
    return conn


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", REQUEST_KINDS)
def test_server_role_reads_what_the_table_allows(state: State, kind: str) -> None:
    """A request the table allows is decoded and moves nothing; one it refuses raises
    (HANDSHAKE_REQUIRED with its id before the handshake, the closing error once CLOSED)
    and the state stays."""
    conn = server_in(state)
    data = Connection(Role.CLIENT).send(REQUESTS[kind](7))
    if kind in EXPECTED[(Role.CLIENT, state)]:
        conn.receive_data(data)
        assert message_kind(conn.next_message()) == kind  # type: ignore[arg-type]
    elif state is A:
        conn.receive_data(data)
        with pytest.raises(ProtocolError) as info:
            conn.next_message()
        assert info.value.code is ErrorCode.HANDSHAKE_REQUIRED
        assert info.value.request_id == 7
        assert info.value.message == f"{kind}: the first request on a connection must be hello"
    else:
        with pytest.raises(ProtocolError) as info:
            conn.receive_data(data)
        assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert conn.state is state


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", SERVER_KINDS)
def test_client_role_reads_what_the_table_allows(state: State, kind: str) -> None:
    """A server message the table allows is decoded and moves the state as the table says;
    one it refuses is INVALID_MESSAGE and changes nothing. The one exception is a welcome in
    READY, which is not looked at (the hot path reads every kind there) and moves nothing."""
    conn = client_in(state)
    conn.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES[kind](3)))
    expected = EXPECTED[(Role.SERVER, state)].get(kind)
    if expected is not None or (state is R and kind == "welcome"):
        assert message_kind(conn.next_message()) == kind  # type: ignore[arg-type]
        assert conn.state is (expected or R)
        return
    with pytest.raises(ProtocolError) as info:
        conn.next_message()
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    assert repr(kind) in info.value.message and state.name in info.value.message
    assert conn.state is state
    conn.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES["error"](4)))
    assert conn.next_message() == SERVER_MESSAGES["error"](4)  # the stream goes on


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", SERVER_KINDS)
def test_server_role_sends_follow_the_table(state: State, kind: str) -> None:
    """What the server role sends is never refused; it moves the state when the table lists
    the move and changes nothing otherwise."""
    conn = server_in(state)
    message = SERVER_MESSAGES[kind](3)
    assert conn.send(message) == Connection(Role.SERVER).send(message)
    assert conn.state is EXPECTED[(Role.SERVER, state)].get(kind, state)


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("kind", REQUEST_KINDS)
def test_client_role_sends_move_nothing(state: State, kind: str) -> None:
    """A request moves no state (the server's answer does), in every state."""
    conn = client_in(state)
    assert conn.send(REQUESTS[kind](1)) == Connection(Role.CLIENT).send(REQUESTS[kind](1))
    assert conn.state is state


def test_state_without_require_hello_is_ready() -> None:
    """A Connection built without ``require_hello`` starts READY in both roles (protocol tools
    decode without a handshake)."""
    assert Connection(Role.SERVER).state is R
    assert Connection(Role.CLIENT).state is R
    assert Connection(Role.SERVER, require_hello=True).state is A
    assert Connection(Role.CLIENT, require_hello=True).state is A


def test_handshake_done_in_every_state() -> None:
    """handshake_done is the welcome's move: AWAITING_HELLO -> READY (the full frame limit
    applies from then), nothing in READY, LifecycleError in CLOSED (nothing changed)."""
    conn = server_in(A)
    conn.receive_data((MAX_HELLO_FRAME + 1).to_bytes(4, "big")[:3])
    conn.handshake_done()
    conn.receive_data((MAX_HELLO_FRAME + 1).to_bytes(4, "big")[3:])  # no FRAME_TOO_LARGE now
    assert conn.state is R and conn.greeted
    conn.handshake_done()
    assert conn.state is R
    closed = server_in(C)
    with pytest.raises(LifecycleError) as info:
        closed.handshake_done()
    assert info.value.state is C and info.value.kind == "welcome"
    assert closed.state is C and not closed.greeted
    client = client_in(A)
    client.handshake_done()
    assert client.state is R


def test_a_refused_hello_may_be_retried_unless_the_refusal_closes() -> None:
    """The server's behaviour (lockserver/shell/_requests.py, Hello branch): a hello that does not
    decode is refused with a non-closing code, the state stays AWAITING_HELLO and a next hello
    is read; a refusal with a closing code (UNSUPPORTED_VERSION, UNAUTHORIZED) closes: nothing
    after it is read, not even a hello."""
    server = server_in(A)
    client = client_in(A)
    server.receive_data(frame(pack({"type": "hello", "id": 1, "version": "1"})))
    with pytest.raises(ProtocolError) as info:
        server.next_message()
    assert info.value.code is ErrorCode.INVALID_MESSAGE
    client.receive_data(server.send(ErrorReply(1, info.value.code, info.value.message)))
    client.next_message()
    assert server.state is client.state is A
    server.receive_data(client.send(Hello(2)))
    assert server.next_message() == Hello(2)
    server.handshake_done()
    client.receive_data(server.send(SERVER_MESSAGES["welcome"](2)))
    client.next_message()
    assert server.state is client.state is R

    server = server_in(A)
    client = client_in(A)
    server.receive_data(client.send(Hello(1, 2)))
    assert server.next_message() == Hello(1, 2)
    refusal = ErrorReply(1, ErrorCode.UNSUPPORTED_VERSION, "hello: version 2")
    client.receive_data(server.send(refusal))
    assert client.next_message() == refusal
    assert server.state is client.state is C
    with pytest.raises(ProtocolError) as info:
        server.receive_data(client.send(Hello(2)))
    assert info.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert info.value.request_id == 1


def test_a_closing_error_sent_ends_reading_with_the_requests_already_buffered() -> None:
    """Requests pipelined behind the one whose answer closed the connection are not read:
    next_message raises the closing error (the server sends it once and stops reading)."""
    server = server_in(R)
    server.receive_data(Connection(Role.CLIENT).send(Ping(1)) * 2)
    assert server.next_message() == Ping(1)
    server.send(ErrorReply(1, ErrorCode.INTERNAL_ERROR, "bug"))
    assert server.state is C and not server.greeted
    with pytest.raises(ProtocolError) as info:
        server.next_message()
    assert (info.value.code, info.value.message) == (ErrorCode.INTERNAL_ERROR, "bug")


def test_a_broken_stream_is_closed_in_both_roles() -> None:
    """A 1xx error in what a Connection received (framing, msgpack) moves it to CLOSED."""
    for role in Role:
        conn = Connection(role)
        with pytest.raises(ProtocolError):
            conn.receive_data(b"\xff\xff\xff\xff")
        assert conn.state is C
        conn = Connection(role)
        conn.receive_data(frame(b"\xc1"))
        with pytest.raises(ProtocolError):
            conn.next_message()
        assert conn.state is C


def test_a_client_after_a_closing_error_still_reads_what_was_already_produced() -> None:
    """After a closing error the server may still deliver answers of parked requests and lost
    events it had produced (lockserver pushes them until the socket closes); a client-role
    Connection reads them, and refuses a welcome."""
    client = client_in(C)
    for kind in ("result", "lost", "error", CLOSING_ERROR):
        client.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES[kind](5)))
        assert message_kind(client.next_message()) == kind  # type: ignore[arg-type]
    assert client.state is C


def test_an_untracked_client_takes_its_welcome_in_ready() -> None:
    """The reference client's Connection is built without ``require_hello`` (READY from the
    start): the welcome it reads there changes nothing, a closing error still closes."""
    client = Connection(Role.CLIENT)
    client.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES["welcome"](0)))
    assert message_kind(client.next_message()) == "welcome"  # type: ignore[arg-type]
    assert client.state is R
    client.receive_data(Connection(Role.SERVER).send(SERVER_MESSAGES[CLOSING_ERROR](0)))
    client.next_message()
    assert client.state is C


# --- random conversations -----------------------------------------------------------------------

# A step: the client sends a request of a kind, or the server sends a message of a kind.
steps = st.lists(
    st.one_of(
        st.tuples(st.just(Role.CLIENT), st.sampled_from(REQUEST_KINDS)),
        st.tuples(st.just(Role.SERVER), st.sampled_from(SERVER_KINDS)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_random_conversations_agree_and_never_read_a_forbidden_message(
    conversation: list[tuple[Role, str]],
) -> None:
    """Drive a client Connection and a server Connection (both ``require_hello``) with random
    messages in both directions: after every step both are in the same state, that state is
    the table's, and a Connection decodes a message only when the table allows it in the state
    it was in (the only exception: a welcome in READY, read without a look, moving nothing)."""
    client = Connection(Role.CLIENT, require_hello=True)
    server = Connection(Role.SERVER, require_hello=True)
    model = A
    for rid, (sender, kind) in enumerate(conversation):
        allowed = LIFECYCLE.moves[sender][model].get(kind)
        if sender is Role.CLIENT:
            data = client.send(REQUESTS[kind](rid))
            try:
                server.receive_data(data)
                decoded = server.next_message()
            except ProtocolError as exc:
                assert allowed is None
                expected = ErrorCode.HANDSHAKE_REQUIRED if model is A else exc.code
                assert exc.code is expected
                assert model is A or exc.code.closes_connection
            else:
                assert allowed is not None
                assert message_kind(decoded) == kind  # type: ignore[arg-type]
        else:
            data = server.send(SERVER_MESSAGES[kind](rid))
            client.receive_data(data)
            try:
                decoded = client.next_message()
            except ProtocolError as exc:
                assert allowed is None
                assert exc.code is ErrorCode.INVALID_MESSAGE
            else:
                assert allowed is not None or (model is R and kind == "welcome")
                assert message_kind(decoded) == kind  # type: ignore[arg-type]
            model = allowed or model
        assert client.state is server.state is model
