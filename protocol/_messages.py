"""Messages exchanged between client and server, as frozen value classes.

Why: the wire carries msgpack maps; inside the program we carry these. Requests carry the
client-chosen ``request_id``; everything the server answers is either a :class:`Reply`
(``request_id`` + a body), an :class:`ErrorReply`, or a server-initiated event (no request id).
Replies may arrive in any order (the server parks waiting transactions), so clients match them
by id, never by position. The codec (``_codec``) is the only place that turns these into wire
maps and back.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._errors import ErrorCode
from ._inspect import (
    FeedEvent,
    ForceRelease,
    HolderInfo,
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
from ._ops import MIN_SECONDS, Statement

__all__ = [
    "PROTOCOL_VERSION",
    "Status",
    "Cause",
    "LostReason",
    "SessionSpec",
    "Transaction",
    "Hello",
    "Execute",
    "EndSession",
    "GetStatistics",
    "Ping",
    "Cancel",
    "Request",
    "Welcome",
    "TransactionResult",
    "SessionEnded",
    "Statistics",
    "Pong",
    "Cancelled",
    "ReplyBody",
    "Reply",
    "ErrorReply",
    "LockLost",
    "Event",
    "ServerMessage",
    "DEFAULT_SESSION_MAX_AGE",
]

PROTOCOL_VERSION = 1
DEFAULT_SESSION_MAX_AGE = 60.0
_MAX_REQUEST_ID = 2**64 - 1


class Status(enum.IntEnum):
    """Outcome of a transaction (wire values of SEMANTICS.md)."""

    CALL_FAILED = 0
    TRANSACTION_ERROR = 1
    TRANSACTION_OK = 2


class Cause(enum.IntEnum):
    """Why a transaction failed (wire values of SEMANTICS.md)."""

    UNSPECIFIED = 0
    STATEMENT = 1
    MINIMUM_REQUIREMENTS = 2
    SESSION_EXPIRED = 3


class LostReason(enum.StrEnum):
    """Why a holder lost entries (the ``reason`` of a :class:`LockLost` event)."""

    EXPIRED = "expired"  # the session was idle longer than its max age
    TTL = "ttl"  # the entry's own time to live ran out
    ENDED = "ended"  # the session was ended (by the server/admin, or another connection)
    RELEASED = "released"  # an operator force-released the entry (``release`` request)
    # Never sent by a server: a client reports it when it reconnects to a server that is not
    # the instance its session lived on (a restart), so every entry held through the old one
    # is gone (its ``entries`` are then empty: the client does not know them all).
    RESTARTED = "restarted"
    # Never sent by a server: the client's decoder reports a reason it does not know (a newer
    # server's) as this; the entries listed are gone all the same.
    UNKNOWN = "unknown"


# --- validators -------------------------------------------------------------------------------


def _request_id(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not 0 <= value <= _MAX_REQUEST_ID:
        raise ValueError(f"{attribute.name} must be an integer in 0..2**64-1, got {value!r}")


def _version(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not 0 <= value <= _MAX_REQUEST_ID:
        raise ValueError(f"{attribute.name} must be an integer in 0..2**64-1, got {value!r}")


def _str(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str, got {type(value).__name__}")


def _opt_str(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str or None, got {type(value).__name__}")


def _name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _str(inst, attribute, value)
    if not value.strip():
        raise ValueError(f"{attribute.name} must not be blank")


def _non_negative(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{attribute.name} must be a finite number >= 0, got {value!r}")


def _duration(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value) or value < MIN_SECONDS:
        raise ValueError(
            f"{attribute.name} must be a finite number of seconds >= {MIN_SECONDS:g}, got {value!r}"
        )


def _opt_non_negative(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _non_negative(inst, attribute, value)


def _fraction(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a number in 0..1, got {value!r}")


def _statements(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    for i, item in enumerate(value):
        if not isinstance(item, Statement):
            raise TypeError(
                f"statements[{i}] must be a statement (Assert, Abort, Block, If, "
                f"AnywayContinueAfter, Select*), got {type(item).__name__}; wrap operators "
                "in Assert, If, SelectOperatorValue or AnywayContinueAfter"
            )


def _to_tuple(value: Iterable[Statement]) -> tuple[Statement, ...]:
    return value if type(value) is tuple else tuple(value)


# --- requests ---------------------------------------------------------------------------------


@attrs.frozen
class SessionSpec:
    """The session a transaction runs in. The first call with an id creates the session;
    its description and max age are kept from that first call."""

    session_id: str = attrs.field(validator=_name)
    max_age: float = attrs.field(default=DEFAULT_SESSION_MAX_AGE, validator=_duration)
    description: str = attrs.field(default="", validator=_str)


@attrs.frozen
class Transaction:
    """A transaction: statements run in order, all or nothing. No statements = a ping."""

    namespace: str = attrs.field(validator=_name)
    statements: tuple[Statement, ...] = attrs.field(converter=_to_tuple, validator=_statements)
    transaction_id: str = attrs.field(default="", kw_only=True, validator=_str)
    description: str = attrs.field(default="", kw_only=True, validator=_str)
    min_uptime: float = attrs.field(default=0.0, kw_only=True, validator=_non_negative)
    min_trust: float = attrs.field(default=0.0, kw_only=True, validator=_fraction)


@attrs.frozen
class Hello:
    """First request on a connection: protocol version, client name, optional auth token."""

    request_id: int = attrs.field(validator=_request_id)
    version: int = attrs.field(default=PROTOCOL_VERSION, validator=_version)
    client_name: str = attrs.field(default="", validator=_str)
    token: str | None = attrs.field(default=None, validator=_opt_str, repr=False)


@attrs.frozen
class Execute:
    """Run a transaction in a session. ``wait`` (seconds): park it on the server until it
    can succeed, at most that long (None or 0: answer at once)."""

    request_id: int = attrs.field(validator=_request_id)
    session: SessionSpec
    transaction: Transaction
    wait: float | None = attrs.field(default=None, validator=_opt_non_negative)


@attrs.frozen
class EndSession:
    """End a session now: all its entries are removed atomically."""

    request_id: int = attrs.field(validator=_request_id)
    session_id: str = attrs.field(validator=_name)


@attrs.frozen
class GetStatistics:
    """Ask for the server's statistics."""

    request_id: int = attrs.field(validator=_request_id)


@attrs.frozen
class Ping:
    """Liveness check; answered with uptime and trust. Touches no session."""

    request_id: int = attrs.field(validator=_request_id)


@attrs.frozen
class Cancel:
    """Cancel a parked (waiting) request of this connection."""

    request_id: int = attrs.field(validator=_request_id)
    target_id: int = attrs.field(validator=_request_id)


Request = (
    Hello
    | Execute
    | EndSession
    | GetStatistics
    | Ping
    | Cancel
    | ListHolders
    | ListSessions
    | ListWaiters
    | ForceRelease
    | Subscribe
    | Unsubscribe
)


# --- replies ----------------------------------------------------------------------------------


@attrs.frozen
class Welcome:
    """Answer to Hello: the server's version, name, host and limits, and ``instance``: an id
    the server process draws when it starts, so a client that reconnects can tell a restarted
    server (which forgot every session and entry) from the one it was talking to ("" when the
    server did not send one). ``started_at``: the server's wall clock (Unix seconds, UTC) at
    uptime 0, so ``started_at + uptime`` is the wall-clock time of any uptime the server
    reports (None when the server did not send it).

    A replica of a replicated group also says ``group`` (the group's name) and ``replicas``
    (the group's current replicas as ``host:port`` ids), and sends the group's ``instance``
    (the same from every replica: reconnecting to another replica is not a restart). Both
    are empty when the server is not in a group (and are then not on the wire)."""

    version: int
    server_name: str
    host: str
    limits: Mapping[str, Any] = attrs.field(factory=dict)
    instance: str = ""
    started_at: float | None = None
    group: str = ""
    replicas: tuple[str, ...] = ()


@attrs.frozen
class TransactionResult:
    """The outcome of a transaction (SEMANTICS.md "Result").

    ``data``: the selected (name, value) pairs in order, kept even when the transaction
    aborted. ``fence``: the revision this transaction committed at when it changed something,
    else the latest revision it observed. ``valid_until``: the server uptime until which the
    session is guaranteed to live without another call (None when refused). ``holders``:
    when a statement failed, the entries that made it fail (at most ``MAX_HOLDERS``; empty
    otherwise).
    """

    status: Status
    cause: Cause
    transaction_id: str
    host: str
    uptime: float
    trust: float
    failed_statement: str | None = None
    data: tuple[tuple[str, Any], ...] = ()
    fence: int = 0
    valid_until: float | None = None
    holders: tuple[HolderInfo, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the transaction committed."""
        return self.status is Status.TRANSACTION_OK


@attrs.frozen
class SessionEnded:
    """Answer to EndSession: whether the session existed."""

    existed: bool


@attrs.frozen
class Statistics:
    """Answer to GetStatistics: a nested map of figures (PROTOCOL.md lists the keys)."""

    values: Mapping[str, Any]


@attrs.frozen
class Pong:
    """Answer to Ping."""

    uptime: float
    trust: float


@attrs.frozen
class Cancelled:
    """Answer to Cancel: whether the target was still parked. A cancelled target is answered
    (before this reply) with its last failure, as if its wait deadline had passed."""

    found: bool


ReplyBody = (
    Welcome
    | TransactionResult
    | SessionEnded
    | Statistics
    | Pong
    | Cancelled
    | HoldersPage
    | SessionsPage
    | WaitersPage
    | Released
    | Subscribed
    | Unsubscribed
)


@attrs.frozen
class Reply:
    """A successful answer to the request ``request_id``."""

    request_id: int
    body: ReplyBody


@attrs.frozen
class ErrorReply:
    """A request (or the connection) could not be served. ``request_id`` is None when the
    offending request's id could not be read."""

    request_id: int | None
    code: ErrorCode
    message: str


# --- events -----------------------------------------------------------------------------------


@attrs.frozen
class LockLost:
    """Server-initiated: entries of a session this connection used are gone.

    ``entries`` lists (namespace, table, var, fence) of what was lost.
    """

    session_id: str
    reason: LostReason
    entries: tuple[tuple[str, str, str, int], ...] = ()


Event = LockLost | FeedEvent
ServerMessage = Reply | ErrorReply | LockLost | FeedEvent
