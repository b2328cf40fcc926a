"""The client's one exception hierarchy.

Why: an *expected* outcome (a lock that was not granted, a refused reliability contract) is a
:class:`~client.Result` value with ``ok == False``; an exception means misuse or trouble with the
transport or the server. Every such exception derives from :class:`LockClientError`, so one
``except LockClientError`` covers them; the subclasses say what is known about the request:

- :class:`ServerError`: the server answered with an error reply (``.code``, ``.message``); the
  request was *not* executed.
- :class:`ConnectionLost`: the connection dropped while the request was in flight; the server may
  or may not have executed it (an Execute is never retried silently).
- :class:`ServerUnavailable`: no connection could be made (refused, handshake failed); nothing
  was sent.
- :class:`ClientTimeout`: no reply within the sync face's per-call timeout; the outcome is unknown
  and a late reply is dropped.
- :class:`ClientClosed`: the client (or the session) was closed.

Bad arguments are not in this hierarchy: the protocol's validators raise TypeError/ValueError
where the value is built.
"""

from __future__ import annotations

from protocol import ErrorCode, ErrorReply

__all__ = [
    "LockClientError",
    "ServerError",
    "LimitExceeded",
    "AccessDenied",
    "TransportError",
    "ConnectionLost",
    "ServerUnavailable",
    "ClientTimeout",
    "ClientClosed",
    "server_error",
]


class LockClientError(Exception):
    """Base of every exception the client raises for transport or server trouble."""


class ServerError(LockClientError):
    """The server refused the request with an error reply; nothing was executed.

    ``code`` is the wire :class:`~protocol.ErrorCode`, ``message`` the server's explanation,
    ``request_id`` the refused request's id (None for a connection-level error).
    """

    def __init__(self, code: ErrorCode, message: str, request_id: int | None = None) -> None:
        super().__init__(f"{code.name} ({int(code)}): {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class LimitExceeded(ServerError):
    """A server limit refused the request (tree too deep, too many ops, sessions, entries,
    connections or waiters: the 301..306 codes)."""


class AccessDenied(ServerError):
    """The server refused access (unauthorized, forbidden, session owned by someone else)."""


class TransportError(LockClientError):
    """Base of the connection-level failures."""


class ConnectionLost(TransportError):
    """The connection dropped while the request was in flight: its outcome is unknown."""


class ServerUnavailable(TransportError):
    """No connection to the server could be made or completed; nothing was executed."""


class ClientTimeout(LockClientError, TimeoutError):
    """No reply within the per-call timeout (sync face); the outcome is unknown."""


class ClientClosed(LockClientError):
    """The client, or the session used, is closed."""


_LIMIT_CODES = frozenset(
    {
        ErrorCode.TREE_TOO_DEEP,
        ErrorCode.TOO_MANY_OPS,
        ErrorCode.TOO_MANY_SESSIONS,
        ErrorCode.TOO_MANY_ENTRIES,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.TOO_MANY_WAITERS,
    }
)
_ACCESS_CODES = frozenset({ErrorCode.UNAUTHORIZED, ErrorCode.FORBIDDEN, ErrorCode.SESSION_CONFLICT})


def server_error(reply: ErrorReply) -> ServerError:
    """The exception (not raised) for an error reply: the most precise subclass for its code."""
    code = reply.code
    if code in _LIMIT_CODES:
        cls: type[ServerError] = LimitExceeded
    elif code in _ACCESS_CODES:
        cls = AccessDenied
    else:
        cls = ServerError
    return cls(code, reply.message, reply.request_id)
