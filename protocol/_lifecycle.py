"""The connection lifecycle: its states, the message kinds, and what each side may send when.

Why: the rules of a conversation (hello first, what a refused hello leaves, what a closing
error ends) live in one table that the Connection consults, PROTOCOL.md §2 prints and the
tests walk cell by cell, instead of flags spread over the Connection and its callers.

Theory of operation
===================
One conversation has one state, seen alike by both ends (h11 keeps one machine per role,
because HTTP's sides move independently; ours move together: only the server's answers move
the state, and a client's request never does). :data:`LIFECYCLE` maps
``(sender, state, kind) -> next state``; a kind absent from a cell is not allowed there.

- ``AWAITING_HELLO``: the client may send only ``hello`` (any other request is refused with
  HANDSHAKE_REQUIRED, not read, and changes nothing). The server answers the hello with
  ``welcome`` (-> READY) or an error. A refusal with a non-closing code (a hello that does not
  decode: INVALID_MESSAGE, TOO_LARGE...) leaves the state as it was, so the hello may be
  retried on the same connection; a closing code (UNSUPPORTED_VERSION, UNAUTHORIZED, a 1xx
  framing error...) -> CLOSED.
- ``READY``: every request; the server sends replies, errors and ``lost`` events. A second
  ``hello`` is read and answered with a non-closing INVALID_MESSAGE ("the handshake is already
  done"). Any error whose code ``closes_connection`` -> CLOSED.
- ``CLOSED``: after a closing error, sent or received. The server reads nothing more from the
  client; what it had already produced (a parked request's answer, a ``lost`` event) may
  still arrive before the transport closes, but never a ``welcome``.

A kind is a message's wire ``type``, except that an error whose code closes the connection is
its own kind, :data:`CLOSING_ERROR` (it moves the state where an ordinary error does not).
``stats``, ``holders``, ``sessions`` and ``waiters`` are both requests and replies: the sender
tells them apart.

Prior art: h11's ``_state.py`` (``EVENT_TRIGGERED_TRANSITIONS``, an illegal move names the
event and the state and changes nothing).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import attrs

from ._inspect import (
    FeedEvent,
    ForceRelease,
    HoldersPage,
    ListHolders,
    ListSessions,
    ListWaiters,
    Released,
    SessionsPage,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    WaitersPage,
)
from ._messages import (
    Cancel,
    Cancelled,
    EndSession,
    ErrorReply,
    Execute,
    GetStatistics,
    Hello,
    LockLost,
    Ping,
    Pong,
    Reply,
    Request,
    ServerMessage,
    SessionEnded,
    Statistics,
    TransactionResult,
    Welcome,
)

__all__ = [
    "CLOSING_ERROR",
    "LIFECYCLE",
    "Lifecycle",
    "LifecycleError",
    "Role",
    "State",
    "message_kind",
]


class Role(enum.Enum):
    """Which side a Connection speaks for, and which side sent a message."""

    CLIENT = "client"  # sends requests, receives server messages
    SERVER = "server"  # receives requests, sends server messages


class State(enum.Enum):
    """Where a conversation is (see the module's header and PROTOCOL.md §2)."""

    AWAITING_HELLO = "awaiting_hello"  # no hello accepted yet
    READY = "ready"  # welcomed: requests, replies and events flow
    CLOSED = "closed"  # a closing error was sent: the server reads nothing more


#: The kind of an error reply whose code closes the connection (``ErrorCode.closes_connection``).
CLOSING_ERROR: Final = "closing error"

#: The kinds each side sends, in PROTOCOL.md's order.
REQUEST_KINDS: Final = (
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
SERVER_KINDS: Final = (
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

_REQUEST_KIND: Final[Mapping[type, str]] = {
    Hello: "hello",
    Execute: "execute",
    EndSession: "end",
    GetStatistics: "stats",
    Ping: "ping",
    Cancel: "cancel",
    ListHolders: "holders",
    ListSessions: "sessions",
    ListWaiters: "waiters",
    ForceRelease: "release",
    Subscribe: "subscribe",
    Unsubscribe: "unsubscribe",
}
_REPLY_KIND: Final[Mapping[type, str]] = {
    Welcome: "welcome",
    TransactionResult: "result",
    SessionEnded: "ended",
    Statistics: "stats",
    Pong: "pong",
    Cancelled: "cancelled",
    HoldersPage: "holders",
    SessionsPage: "sessions",
    WaitersPage: "waiters",
    Released: "released",
    Subscribed: "subscribed",
    Unsubscribed: "unsubscribed",
}


def message_kind(message: Request | ServerMessage) -> str:
    """The lifecycle kind of a message (its wire ``type``, or :data:`CLOSING_ERROR`).
    Raises TypeError for anything that is not a request or a server message."""
    t = type(message)
    if t is Reply:
        kind = _REPLY_KIND.get(type(message.body))  # type: ignore[union-attr]
    elif t is ErrorReply:
        kind = CLOSING_ERROR if message.code.closes_connection else "error"  # type: ignore[union-attr]
    elif t is LockLost:
        kind = "lost"
    elif t is FeedEvent:
        kind = "feed"
    else:
        kind = _REQUEST_KIND.get(t)
    if kind is None:
        raise TypeError(f"not a protocol message: {message!r}")
    return kind


class LifecycleError(Exception):
    """A move the lifecycle table does not allow; nothing was changed. (A Connection turns
    the peer's illegal moves into ProtocolError with a wire code; this is raised for the
    local side's own, e.g. ``handshake_done`` on a closed connection.)"""

    def __init__(self, sender: Role, state: State, kind: str) -> None:
        super().__init__(f"{sender.value} cannot send {kind!r} in state {state.name}")
        self.sender = sender
        self.state = state
        self.kind = kind


def _frozen(
    table: Mapping[Role, Mapping[State, Mapping[str, State]]],
) -> Mapping[Role, Mapping[State, Mapping[str, State]]]:
    return MappingProxyType(
        {
            role: MappingProxyType(
                {state: MappingProxyType(dict(moves)) for state, moves in states.items()}
            )
            for role, states in table.items()
        }
    )


@attrs.frozen
class Lifecycle:
    """The transition table: ``moves[sender][state][kind]`` is the state after ``sender``
    sends a message of ``kind`` in ``state``; a kind missing from a cell is not allowed.
    Every role has a cell for every state."""

    moves: Mapping[Role, Mapping[State, Mapping[str, State]]] = attrs.field(converter=_frozen)

    def allowed(self, sender: Role, state: State) -> frozenset[str]:
        """The kinds ``sender`` may send in ``state``."""
        return frozenset(self.moves[sender][state])

    def next_state(self, sender: Role, state: State, kind: str) -> State:
        """The state after ``sender`` sends ``kind`` in ``state``; LifecycleError (naming
        both) when the table does not allow it."""
        try:
            return self.moves[sender][state][kind]
        except KeyError:
            raise LifecycleError(sender, state, kind) from None


_A, _R, _C = State.AWAITING_HELLO, State.READY, State.CLOSED

#: The protocol's lifecycle (PROTOCOL.md §2 prints it; tests/protocol pins every cell).
LIFECYCLE: Final = Lifecycle(
    {
        Role.CLIENT: {
            # The hello moves nothing by itself: the server's answer does.
            _A: {"hello": _A},
            # A second hello is read and answered with a non-closing INVALID_MESSAGE.
            _R: dict.fromkeys(REQUEST_KINDS, _R),
            _C: {},  # the server reads nothing more
        },
        Role.SERVER: {
            _A: {"welcome": _R, "error": _A, CLOSING_ERROR: _C},
            _R: {
                **{kind: _R for kind in SERVER_KINDS if kind != "welcome"},
                CLOSING_ERROR: _C,
            },
            # What the server had produced before closing may still arrive.
            _C: {kind: _C for kind in SERVER_KINDS if kind != "welcome"},
        },
    }
)
