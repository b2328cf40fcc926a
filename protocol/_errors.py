"""Protocol error codes and the one exception kind the protocol layer raises.

Why: every failure that can be blamed on the peer must reach it as a precise, documented code
plus a human message, and never as a crash. Inside ``protocol`` everything wrong with received
bytes or a received message raises :class:`ProtocolError` carrying the wire code to reply with
(h11's "blame at the boundary": the shell re-raises nothing, it just maps the code to an error
reply). The numeric values are part of the wire contract (see PROTOCOL.md): never renumber.
"""

from __future__ import annotations

import enum

__all__ = ["ErrorCode", "ProtocolError"]


class ErrorCode(enum.IntEnum):
    """Wire codes of error replies. 1xx: framing (the connection is closed after the reply);
    2xx: a well-framed but invalid request (the connection stays open); 3xx: limits and refusals
    of a valid request; 5xx: the server's own trouble."""

    # Framing: after one of these the byte stream cannot be trusted, the server closes.
    FRAME_TOO_LARGE = 101
    MALFORMED_FRAME = 102  # not one msgpack document, or trailing bytes inside the frame

    # Invalid requests: answered, connection stays open, nothing changed.
    INVALID_MESSAGE = 201  # not a map, missing/extra/wrong-typed field
    UNKNOWN_MESSAGE_TYPE = 202
    INVALID_TRANSACTION = 203  # a bad transaction tree (wrong op, wrong child kind, blank name...)
    UNSUPPORTED_VERSION = 204
    HANDSHAKE_REQUIRED = 205  # a request before `hello`
    DUPLICATE_REQUEST_ID = 206  # an id still in flight on this connection

    # Limits and refusals of a well-formed request.
    TREE_TOO_DEEP = 301
    TOO_MANY_OPS = 302
    TOO_MANY_SESSIONS = 303
    TOO_MANY_ENTRIES = 304
    TOO_MANY_CONNECTIONS = 305
    TOO_MANY_WAITERS = 306
    UNAUTHORIZED = 307
    FORBIDDEN = 308
    SESSION_CONFLICT = 309  # e.g. a session id owned by another principal
    NOT_FOUND = 310  # e.g. cancelling an unknown request
    SHUTTING_DOWN = 311
    SLOW_CONSUMER = 312  # the peer does not read its replies; it is disconnected
    TOO_LARGE = 313  # a name, text or value (or the data a transaction selects) over its limit
    STORE_FULL = 314  # the server's stored data reached its budget (max_store_bytes)
    OVERLOADED = 315  # the server cannot buffer this request now (receive buffers full)
    UNAVAILABLE = 316  # a replica cut off from its group's log: reconnect to another replica

    INTERNAL_ERROR = 500

    @property
    def closes_connection(self) -> bool:
        """True for codes after which the server closes the connection."""
        return self < 200 or self in _CLOSING


_CLOSING = frozenset(
    {
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.SHUTTING_DOWN,
        ErrorCode.SLOW_CONSUMER,
        ErrorCode.OVERLOADED,
        ErrorCode.UNAVAILABLE,
        ErrorCode.INTERNAL_ERROR,
    }
)


class ProtocolError(Exception):
    """Something the peer sent (or asked for) cannot be accepted.

    ``code`` is the :class:`ErrorCode` to reply with, ``message`` says precisely what was wrong
    (which field, which node, which limit), ``request_id`` is the id of the offending request
    when it could be read, else None.
    """

    def __init__(self, code: ErrorCode, message: str, *, request_id: int | None = None) -> None:
        super().__init__(f"{code.name} ({int(code)}): {message}")
        self.code = code
        self.message = message
        self.request_id = request_id
