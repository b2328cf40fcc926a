"""The operator's requests, socket-free: build the frames of listings, force-release and
(un)subscribing; render records for people (ISO 8601 UTC) and for JSON; page through a
listing; name the holders of a denial in one line.

Why a module of its own: the faces (``_sync.py``, ``_async.py``) hold only drivers; each
operator method there is one line over a builder here (``rid = core.next_id(); return
request(HOLDERS, rid, listing_request("holders", rid, ...))``), the reply arrives as the
protocol's page or answer (``_wire.py`` kinds ``HOLDERS`` ... ``UNSUBSCRIBE``), and feed
events arrive in ``Wire.feed_events``. Times on the wire are wall-clock Unix seconds (floats,
UTC); this module is where they become text.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

from protocol import (
    ForceRelease,
    HolderInfo,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    SessionInfo,
    SessionsPage,
    Subscribe,
    Unsubscribe,
    WaiterInfo,
    WaitersPage,
    frame,
    iso_utc,
    pack,
    record_to_json,
    request_to_wire,
)

__all__ = [
    "describe_holders",
    "listing_request",
    "iso_utc",
    "pages",
    "release_request",
    "subscribe_request",
    "to_json",
    "unsubscribe_request",
]


def _encode(request: Any) -> bytes:
    return frame(pack(request_to_wire(request)))


_LISTINGS: Final = {"holders": ListHolders, "sessions": ListSessions, "waiters": ListWaiters}


def listing_request(
    kind: str,
    rid: int,
    namespace: str | None = None,
    table: str | None = None,
    var: str | None = None,
    *,
    session: str | None = None,
    match: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> bytes:
    """The frame of a listing: ``kind`` is ``"holders"``, ``"sessions"`` or ``"waiters"``
    (answered with a :class:`~protocol.HoldersPage`, ``SessionsPage`` or ``WaitersPage``).
    ``table`` and ``var`` are prefixes (for sessions: of an entry the session holds);
    ``match`` a substring of a description; ``cursor`` the previous page's; ``limit`` 1 to
    1,000. Raises TypeError / ValueError for arguments the server would refuse, KeyError for
    an unknown ``kind``."""
    query = ListQuery(namespace, table, var, session, match, cursor, limit)
    return _encode(_LISTINGS[kind](rid, query))


def release_request(
    rid: int, namespace: str, table: str, var: str, session: str | None = None
) -> bytes:
    """The frame of a force-release (answered with :class:`~protocol.Released`)."""
    return _encode(ForceRelease(rid, namespace, table, var, session))


def subscribe_request(rid: int, namespace: str, table: str | None = None) -> bytes:
    """The frame of a feed subscription; the subscription's id is ``rid``."""
    return _encode(Subscribe(rid, namespace, table))


def unsubscribe_request(rid: int, target: int) -> bytes:
    """The frame that ends subscription ``target``."""
    return _encode(Unsubscribe(rid, target))


# --- reading ----------------------------------------------------------------------------------

Page = HoldersPage | SessionsPage | WaitersPage
Record = HolderInfo | SessionInfo | WaiterInfo
R = TypeVar("R")


def pages(fetch: Callable[[str | None], Page]) -> Iterator[Record]:
    """Every record of a listing: ``fetch(cursor)`` gets one page (the first with None);
    pages are fetched until one comes back without a cursor. (For the async face, write the
    same three lines with ``await``.)"""
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        yield from _records(page)
        cursor = page.cursor
        if cursor is None:
            return


def _records(page: Page) -> tuple[Record, ...]:
    if type(page) is HoldersPage:
        return page.holders
    if type(page) is SessionsPage:
        return page.sessions
    return page.waiters  # type: ignore[union-attr]


#: A record (or feed event) as a JSON-ready map with the wire's field names; times as ISO
#: 8601 UTC strings, tuples as lists, binaries and non-finite floats in a value as
#: ``{"base64": ...}`` / ``{"float": ...}`` (``protocol.record_to_json``: the server's HTTP
#: listings render the same).
to_json: Final = record_to_json


def _short(session_id: str) -> str:
    return session_id if len(session_id) <= 12 else session_id[:8] + "\u2026"


def describe_holders(holders: tuple[HolderInfo, ...]) -> str:
    """Who held it, in one line: ``held by session 3f2c1a9e… 'worker-7 pid 4411' since
    12:03:05, fence 1732579200000002`` (times UTC; several holders joined by ``; ``)."""
    parts = []
    for h in holders:
        since = _dt.datetime.fromtimestamp(h.acquired_at, _dt.UTC).strftime("%H:%M:%S")
        who = f"session {_short(h.session)}"
        if h.session_description:
            who += f" {h.session_description!r}"
        parts.append(f"held by {who} since {since} UTC, fence {h.fence}")
    return "; ".join(parts)
