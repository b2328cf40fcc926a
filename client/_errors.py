"""The client's one exception hierarchy.

Why: an *expected* outcome (a lock that was not granted, a refused reliability contract) is a
:class:`~client.Result` value with ``ok == False``; an exception means misuse or trouble with the
transport or the server. Every such exception derives from :class:`LockClientError`, so one
``except LockClientError`` covers them; the subclasses say what is known about the request:

- :class:`ServerError`: the server answered with an error reply (``.code``, ``.message``); the
  request was *not* executed. Also raised, with code ``SHUTTING_DOWN``, for a request still
  unanswered when the server announced its shutdown: the server answers every request it read
  before it stopped reading, so that one was not executed either.
- :class:`ConnectionLost`: the connection dropped while the request was in flight; the server may
  or may not have executed it (an Execute is never retried silently).
- :class:`ServerUnavailable`: no connection could be made (refused, handshake failed); nothing
  was sent (a call that needed a new connection says "not sent").
- :class:`ClientTimeout`: no reply within the sync face's per-call timeout; the outcome is unknown
  and a late reply is dropped.
- :class:`ClientClosed`: the client (or the session) was closed.
- :class:`BatchError`: some calls of an ``execute_many`` batch failed (each with one of the
  above); the others' Results are kept in it, in call order.

Bad arguments are not in this hierarchy: the protocol's validators raise TypeError/ValueError
where the value is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from protocol import ErrorCode, ErrorReply

if TYPE_CHECKING:
    from ._result import Result

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
    "BatchError",
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
    connections or waiters: the 301..306 codes; a name, text or value too large: 313; the
    server's store full: 314)."""


class AccessDenied(ServerError):
    """The server refused access (unauthorized, forbidden, session owned by someone else)."""


class TransportError(LockClientError):
    """Base of the connection-level failures."""


class ConnectionLost(TransportError):
    """The connection dropped while the request was in flight: its outcome is unknown."""


class ServerUnavailable(TransportError):
    """No connection to the server could be made or completed; nothing was executed.

    ``server``: the server's ``host:port`` when the client has several servers (its calls for
    that server's namespaces raise this; the other servers are not affected), else None."""

    server: str | None = None


class ClientTimeout(LockClientError, TimeoutError):
    """No reply within the per-call timeout (sync face); the outcome is unknown."""


class ClientClosed(LockClientError):
    """The client, or the session used, is closed."""


class BatchError(LockClientError):
    """Some calls of an ``execute_many`` batch failed; the others' outcomes are not lost.

    Raised once every call of the batch is settled. ``results`` has one entry per call, in
    call order: its :class:`~client.Result` (which may itself be ``ok == False``: a refusal is a
    value), or the exception of that call: a :class:`ServerError` (the server refused it;
    it was not executed) or :class:`ConnectionLost` (the connection dropped before its reply:
    its outcome is unknown). ``failures`` lists ``(index, exception)`` of the failed calls; the
    first one is also the ``__cause__``.
    """

    def __init__(self, results: list[Result | LockClientError]) -> None:
        self.results = results
        self.failures = [(i, r) for i, r in enumerate(results) if isinstance(r, LockClientError)]
        first_i, first = self.failures[0]
        super().__init__(
            f"{len(self.failures)} of {len(results)} calls of the batch failed, the first "
            f"(call {first_i}) with {type(first).__name__}: {first}"
        )

    @property
    def outcome_unknown(self) -> bool:
        """True when some call's outcome is unknown (a ConnectionLost in ``results``):
        check with a read, or repeat the batch with the same transaction ids."""
        return any(isinstance(exc, ConnectionLost) for _, exc in self.failures)


_LIMIT_CODES = frozenset(
    {
        ErrorCode.TREE_TOO_DEEP,
        ErrorCode.TOO_MANY_OPS,
        ErrorCode.TOO_MANY_SESSIONS,
        ErrorCode.TOO_MANY_ENTRIES,
        ErrorCode.TOO_MANY_CONNECTIONS,
        ErrorCode.TOO_MANY_WAITERS,
        ErrorCode.TOO_LARGE,
        ErrorCode.STORE_FULL,
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
