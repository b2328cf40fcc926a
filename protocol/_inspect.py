"""The operator's messages: listings (holders, sessions, waiters), force-release, the change
feed, and the holder record a denial carries.

Why a module of its own: these change for the operator's reasons (what a listing shows, how
it pages), not the transaction's; ``_messages.py`` keeps the lock protocol proper. The codec
half is ``_inspect_codec.py``; PROTOCOL.md §3 ("Inspection") is the contract.

Rules kept:
- A listing is **bounded**: at most ``limit`` records (default :data:`DEFAULT_PAGE`, at most
  :data:`MAX_PAGE`), and the server also ends a page early when its records would pass
  :data:`PAGE_BYTES` or it has looked at :data:`PAGE_SCAN` items: a page may hold fewer
  records than asked (even none) while its ``cursor`` is not nil. Nil cursor: the end.
- A cursor is opaque (a str of at most :data:`MAX_CURSOR` characters) and only valid on the
  server run that made it, for the same listing and the same filters.
- Times in records are **wall-clock seconds** (Unix epoch, UTC) as floats: the server's
  clock at its start plus its uptime (PROTOCOL.md "Times").
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any, Final

import attrs

from ._trees import _unchecked_maker

__all__ = [
    "DEFAULT_PAGE",
    "MAX_CURSOR",
    "MAX_HOLDERS",
    "MAX_PAGE",
    "PAGE_BYTES",
    "PAGE_SCAN",
    "FeedEvent",
    "FeedKind",
    "ForceRelease",
    "HolderInfo",
    "HoldersPage",
    "ListHolders",
    "ListQuery",
    "ListSessions",
    "ListWaiters",
    "Released",
    "SessionInfo",
    "SessionsPage",
    "Subscribe",
    "Subscribed",
    "Unsubscribe",
    "Unsubscribed",
    "WaiterInfo",
    "WaitersPage",
    "make_holder",
]

#: Records per page when the request does not say.
DEFAULT_PAGE: Final = 100
#: Most records per page a request may ask for; more is INVALID_MESSAGE.
MAX_PAGE: Final = 1000
#: A page ends once its records' encoded size passes this (the reply stays far below 1 MiB).
PAGE_BYTES: Final = 512 * 1024
#: A page ends once the server has looked at this many items (entries, sessions, waiters),
#: matching or not: a narrow filter over a big table costs each page this much at most.
PAGE_SCAN: Final = 5_000
#: Longest cursor, in characters.
MAX_CURSOR: Final = 16_384
#: Most holders a denied transaction's result names.
MAX_HOLDERS: Final = 8

_MAX_ID = 2**64 - 1


class FeedKind(enum.StrEnum):
    """What happened to an entry (the ``kind`` of a :class:`FeedEvent`)."""

    GRANTED = "granted"  # a transaction set it (a new entry, or its holder's replacement)
    RELEASED = "released"  # its holder's transaction deleted it
    EXPIRED = "expired"  # its TTL ran out ("ttl") or its session idled out ("expired")
    LOST = "lost"  # an operator force-released it ("released")
    KILLED = "killed"  # its session was ended by an ``end`` request ("ended")


# --- validators -------------------------------------------------------------------------------


def _request_id(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not 0 <= value <= _MAX_ID:
        raise ValueError(f"{attribute.name} must be an integer in 0..2**64-1, got {value!r}")


def _opt_name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str or None, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{attribute.name} must not be blank")


def _name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        raise TypeError(f"{attribute.name} must be a str, got None")
    _opt_name(inst, attribute, value)


def _opt_prefix(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str or None, got {type(value).__name__}")


def _cursor(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _opt_prefix(inst, attribute, value)
    if value is not None and not 0 < len(value) <= MAX_CURSOR:
        raise ValueError(f"cursor must be 1..{MAX_CURSOR} characters long, got {len(value)}")


def _limit(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) is not int or not 1 <= value <= MAX_PAGE:
        raise ValueError(f"limit must be an integer in 1..{MAX_PAGE} (MAX_PAGE), got {value!r}")


def _time(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be a finite number, got {value!r}")


def _opt_time(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _time(inst, attribute, value)


def _count(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 0:
        raise ValueError(f"{attribute.name} must be an integer >= 0, got {value!r}")


def _str(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str, got {type(value).__name__}")


def _opt_str(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _str(inst, attribute, value)


def _tuple(value: Any) -> Any:
    return tuple(value) if type(value) is list else value


# --- requests ---------------------------------------------------------------------------------


@attrs.frozen
class ListQuery:
    """What a listing asks for: filters (every one optional, all must hold), a page size and
    where to resume.

    ``namespace``: exactly this namespace. ``table`` / ``var``: names starting with these
    prefixes. ``session``: exactly this session id. ``match``: a substring of the session's
    description (or, for holders and waiters, the entry's / transaction's description).
    ``limit``: records per page (None: :data:`DEFAULT_PAGE`). ``cursor``: the previous page's.
    """

    namespace: str | None = attrs.field(default=None, validator=_opt_name)
    table: str | None = attrs.field(default=None, validator=_opt_prefix)
    var: str | None = attrs.field(default=None, validator=_opt_prefix)
    session: str | None = attrs.field(default=None, validator=_opt_name)
    match: str | None = attrs.field(default=None, validator=_opt_prefix)
    cursor: str | None = attrs.field(default=None, validator=_cursor)
    limit: int | None = attrs.field(default=None, validator=_limit)

    @property
    def page_size(self) -> int:
        """The records per page this query asks for."""
        return DEFAULT_PAGE if self.limit is None else self.limit


@attrs.frozen
class ListHolders:
    """List held entries (:class:`HolderInfo`); answered with :class:`HoldersPage`."""

    request_id: int = attrs.field(validator=_request_id)
    query: ListQuery = attrs.field(factory=ListQuery)


@attrs.frozen
class ListSessions:
    """List live sessions (:class:`SessionInfo`); answered with :class:`SessionsPage`."""

    request_id: int = attrs.field(validator=_request_id)
    query: ListQuery = attrs.field(factory=ListQuery)


@attrs.frozen
class ListWaiters:
    """List parked transactions (:class:`WaiterInfo`); answered with :class:`WaitersPage`."""

    request_id: int = attrs.field(validator=_request_id)
    query: ListQuery = attrs.field(factory=ListQuery)


@attrs.frozen
class ForceRelease:
    """Remove the entries of one variable (only ``session``'s when given): waiters run, the
    holders hear a ``lost`` event with reason ``released``. Answered with :class:`Released`."""

    request_id: int = attrs.field(validator=_request_id)
    namespace: str = attrs.field(validator=_name)
    table: str = attrs.field(validator=_name)
    var: str = attrs.field(validator=_name)
    session: str | None = attrs.field(default=None, validator=_opt_name)


@attrs.frozen
class Subscribe:
    """Subscribe this connection to the changes of a namespace (one table of it, when
    ``table`` is given): :class:`FeedEvent` events until unsubscribed or closed. The
    subscription's id is this request's id. Answered with :class:`Subscribed`."""

    request_id: int = attrs.field(validator=_request_id)
    namespace: str = attrs.field(validator=_name)
    table: str | None = attrs.field(default=None, validator=_opt_name)


@attrs.frozen
class Unsubscribe:
    """End this connection's subscription ``target`` (the id of its ``subscribe``)."""

    request_id: int = attrs.field(validator=_request_id)
    target: int = attrs.field(validator=_request_id)


# --- records ----------------------------------------------------------------------------------


@attrs.frozen
class HolderInfo:
    """One held entry, as a listing or a denial shows it."""

    namespace: str = attrs.field(validator=_str)
    table: str = attrs.field(validator=_str)
    var: str = attrs.field(validator=_str)
    session: str = attrs.field(validator=_str)
    session_description: str = attrs.field(validator=_str)
    value: Any
    description: str | None = attrs.field(validator=_opt_str)
    acquired_at: float = attrs.field(validator=_time)  # wall clock, Unix seconds
    expires_at: float | None = attrs.field(validator=_opt_time)  # wall clock; None: no TTL
    fence: int = attrs.field(validator=_count)


#: ``HolderInfo(*fields)`` without the validators, for a server building records from its own
#: (already valid) data: the path of a denied transaction (about 3x cheaper).
make_holder: Final[Callable[..., HolderInfo]] = _unchecked_maker(HolderInfo)
make_holder.__module__ = __name__
make_holder.__name__ = make_holder.__qualname__ = "make_holder"


@attrs.frozen
class SessionInfo:
    """One live session. ``principal``: the token name that owns it ("" without tokens);
    ``clients``: the addresses of the connections that used it and are open."""

    session: str = attrs.field(validator=_str)
    description: str = attrs.field(validator=_str)
    principal: str = attrs.field(validator=_str)
    clients: tuple[str, ...] = attrs.field(converter=_tuple)
    created: float = attrs.field(validator=_time)
    last_touch: float = attrs.field(validator=_time)
    max_age: float = attrs.field(validator=_time)
    valid_until: float = attrs.field(validator=_time)
    entries: int = attrs.field(validator=_count)
    waiters: int = attrs.field(validator=_count)


@attrs.frozen
class WaiterInfo:
    """One parked transaction. ``variables``: (table, var, position) for each variable it
    waits on, ``position`` 0 for the oldest waiter of that variable."""

    session: str = attrs.field(validator=_str)
    namespace: str = attrs.field(validator=_str)
    description: str = attrs.field(validator=_str)  # the transaction's
    variables: tuple[tuple[str, str, int], ...] = attrs.field(converter=_tuple)
    since: float = attrs.field(validator=_time)
    deadline: float = attrs.field(validator=_time)


# --- replies and events -----------------------------------------------------------------------


@attrs.frozen
class HoldersPage:
    """A page of holders; ``cursor`` None at the end."""

    holders: tuple[HolderInfo, ...] = attrs.field(converter=_tuple)
    cursor: str | None = None


@attrs.frozen
class SessionsPage:
    """A page of sessions; ``cursor`` None at the end."""

    sessions: tuple[SessionInfo, ...] = attrs.field(converter=_tuple)
    cursor: str | None = None


@attrs.frozen
class WaitersPage:
    """A page of waiters; ``cursor`` None at the end."""

    waiters: tuple[WaiterInfo, ...] = attrs.field(converter=_tuple)
    cursor: str | None = None


@attrs.frozen
class Released:
    """Answer to ForceRelease: how many entries went, and the fence of the change (the
    latest fence when nothing went)."""

    entries: int = attrs.field(validator=_count)
    fence: int = attrs.field(validator=_count)


@attrs.frozen
class Subscribed:
    """Answer to Subscribe: the subscription's id (the subscribe's request id)."""

    subscription: int = attrs.field(validator=_count)


@attrs.frozen
class Unsubscribed:
    """Answer to Unsubscribe: whether the subscription existed."""

    found: bool


@attrs.frozen
class FeedEvent:
    """Server-initiated: an entry of a subscribed namespace changed. ``reason`` is the lost
    reason (``ttl``, ``expired``, ``ended``, ``released``) of kinds EXPIRED, KILLED and LOST,
    else None. ``dropped``: events of this connection's subscriptions the server dropped
    since the last one it sent (the connection did not read fast enough)."""

    subscription: int
    kind: FeedKind
    namespace: str
    table: str
    var: str
    session: str
    fence: int
    at: float  # wall clock, Unix seconds
    reason: str | None = None
    dropped: int = 0
