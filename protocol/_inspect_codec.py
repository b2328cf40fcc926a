"""The codec of the operator's messages (``_inspect.py``): listings, force-release, the feed,
holder records.

Why apart from ``_codec.py``: that module owns the hot request and reply; this one the
operator's, which change for other reasons. ``_codec`` calls in here for the kinds listed in
:data:`REQUEST_FIELDS` and :data:`SERVER_DECODERS`; the field reader (``_codec._Fields``) is
passed in, so this module imports nothing of ``_codec`` at run time. Layout: PROTOCOL.md §3
"Inspection" and §4.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ._inspect import (
    MAX_CURSOR,
    FeedEvent,
    FeedKind,
    ForceRelease,
    HolderInfo,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    Released,
    SessionInfo,
    SessionsPage,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    WaiterInfo,
    WaitersPage,
)
from ._messages import Reply, ServerMessage
from ._trees import TreeLimits

# The field reader is ``_codec._Fields`` (passed in; named here only as Any: ``_codec``
# imports this module).
_Fields = Any

__all__ = [
    "REQUEST_FIELDS",
    "SERVER_DECODERS",
    "holder_to_wire",
    "holders_from_wire",
    "inspect_reply_to_wire",
    "inspect_request_from_wire",
    "inspect_request_to_wire",
]

_QUERY_FIELDS: Final = ("namespace", "table", "var", "session", "match", "cursor", "limit")

#: The wire fields of each operator request (``type`` and ``id`` included).
REQUEST_FIELDS: Final[Mapping[str, frozenset[str]]] = {
    "holders": frozenset({"type", "id", *_QUERY_FIELDS}),
    "sessions": frozenset({"type", "id", *_QUERY_FIELDS}),
    "waiters": frozenset({"type", "id", *_QUERY_FIELDS}),
    "release": frozenset({"type", "id", "namespace", "table", "var", "session"}),
    "subscribe": frozenset({"type", "id", "namespace", "table"}),
    "unsubscribe": frozenset({"type", "id", "target"}),
}

_LISTINGS: Final = {"holders": ListHolders, "sessions": ListSessions, "waiters": ListWaiters}
_LISTING_KIND: Final[Mapping[type, str]] = {cls: kind for kind, cls in _LISTINGS.items()}


# --- requests ---------------------------------------------------------------------------------


def _query(f: _Fields, limits: TreeLimits) -> ListQuery:
    max_name = limits.max_name
    return ListQuery(
        namespace=f.text("namespace", None, max_name, "max_name"),
        table=f.text("table", None, max_name, "max_name"),
        var=f.text("var", None, max_name, "max_name"),
        session=f.text("session", None, max_name, "max_name"),
        match=f.text("match", None, limits.max_text, "max_text"),
        cursor=f.text("cursor", None, MAX_CURSOR, "MAX_CURSOR"),
        limit=f.get("limit", (int,), None, "an integer"),
    )


def inspect_request_from_wire(kind: str, f: _Fields, limits: TreeLimits) -> Any:
    """Decode the operator request of ``kind`` (a key of :data:`REQUEST_FIELDS`); raises
    TypeError / ValueError / ProtocolError like the other request decoders."""
    rid: int = f.request_id
    max_name = limits.max_name
    request: Any
    listing = _LISTINGS.get(kind)
    if listing is not None:
        request = listing(rid, _query(f, limits))
    elif kind == "release":
        request = ForceRelease(
            rid,
            f.text("namespace", limit=max_name, setting="max_name"),
            f.text("table", limit=max_name, setting="max_name"),
            f.text("var", limit=max_name, setting="max_name"),
            f.text("session", None, max_name, "max_name"),
        )
    elif kind == "subscribe":
        request = Subscribe(
            rid,
            f.text("namespace", limit=max_name, setting="max_name"),
            f.text("table", None, max_name, "max_name"),
        )
    else:
        request = Unsubscribe(rid, f.get("target", (int,), what="an integer"))
    f.done()
    return request


def _put(out: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``out`` plus the fields that are not None (optional request fields are omitted)."""
    for key, value in fields.items():
        if value is not None:
            out[key] = value
    return out


def inspect_request_to_wire(req: Any) -> dict[str, Any] | None:
    """The wire map of an operator request; None when ``req`` is not one."""
    t = type(req)
    kind = _LISTING_KIND.get(t)
    if kind is not None:
        q: ListQuery = req.query
        return _put(
            {"type": kind, "id": req.request_id},
            namespace=q.namespace,
            table=q.table,
            var=q.var,
            session=q.session,
            match=q.match,
            cursor=q.cursor,
            limit=q.limit,
        )
    if t is ForceRelease:
        out = {
            "type": "release",
            "id": req.request_id,
            "namespace": req.namespace,
            "table": req.table,
            "var": req.var,
        }
        return _put(out, session=req.session)
    if t is Subscribe:
        out = {"type": "subscribe", "id": req.request_id, "namespace": req.namespace}
        return _put(out, table=req.table)
    if t is Unsubscribe:
        return {"type": "unsubscribe", "id": req.request_id, "target": req.target}
    return None


# --- records ----------------------------------------------------------------------------------


def holder_to_wire(h: HolderInfo) -> dict[str, Any]:
    """One holder record's map (PROTOCOL.md "Holder record")."""
    return {
        "namespace": h.namespace,
        "table": h.table,
        "var": h.var,
        "session": h.session,
        "session_description": h.session_description,
        "value": h.value,
        "description": h.description,
        "acquired_at": h.acquired_at,
        "expires_at": h.expires_at,
        "fence": h.fence,
    }


def _session_to_wire(s: SessionInfo) -> dict[str, Any]:
    return {
        "session": s.session,
        "description": s.description,
        "principal": s.principal,
        "clients": list(s.clients),
        "created": s.created,
        "last_touch": s.last_touch,
        "max_age": s.max_age,
        "valid_until": s.valid_until,
        "entries": s.entries,
        "waiters": s.waiters,
    }


def _waiter_to_wire(w: WaiterInfo) -> dict[str, Any]:
    return {
        "session": w.session,
        "namespace": w.namespace,
        "description": w.description,
        "variables": [list(v) for v in w.variables],
        "since": w.since,
        "deadline": w.deadline,
    }


def _record(item: Any, what: str) -> Any:
    if type(item) is not dict:
        raise ValueError(f"{what} records must be maps")
    return item


def _float(item: dict[str, Any], key: str) -> Any:
    value = item[key]
    if type(value) is int:
        return float(value)
    return value


def holders_from_wire(items: Any) -> tuple[HolderInfo, ...]:
    """Holder records from their wire maps (ValueError / TypeError / KeyError when one is
    not one)."""
    if type(items) is not list:
        raise ValueError("holders must be an array of holder records")
    out = []
    for raw in items:
        m = _record(raw, "holder")
        out.append(
            HolderInfo(
                m["namespace"],
                m["table"],
                m["var"],
                m["session"],
                m["session_description"],
                m["value"],
                m["description"],
                _float(m, "acquired_at"),
                None if m["expires_at"] is None else _float(m, "expires_at"),
                m["fence"],
            )
        )
    return tuple(out)


def _sessions_from_wire(items: Any) -> tuple[SessionInfo, ...]:
    if type(items) is not list:
        raise ValueError("sessions must be an array of session records")
    out = []
    for raw in items:
        m = _record(raw, "session")
        clients = m["clients"]
        if type(clients) is not list or not all(type(c) is str for c in clients):
            raise ValueError("a session record's clients must be an array of strings")
        out.append(
            SessionInfo(
                m["session"],
                m["description"],
                m["principal"],
                tuple(clients),
                _float(m, "created"),
                _float(m, "last_touch"),
                _float(m, "max_age"),
                _float(m, "valid_until"),
                m["entries"],
                m["waiters"],
            )
        )
    return tuple(out)


def _waiters_from_wire(items: Any) -> tuple[WaiterInfo, ...]:
    if type(items) is not list:
        raise ValueError("waiters must be an array of waiter records")
    out = []
    for raw in items:
        m = _record(raw, "waiter")
        variables = []
        for v in m["variables"]:
            if (
                type(v) is not list
                or len(v) != 3
                or type(v[0]) is not str
                or type(v[1]) is not str
                or type(v[2]) is not int
            ):
                raise ValueError("a waiter's variables must be [table, var, position] arrays")
            variables.append((v[0], v[1], v[2]))
        out.append(
            WaiterInfo(
                m["session"],
                m["namespace"],
                m["description"],
                tuple(variables),
                _float(m, "since"),
                _float(m, "deadline"),
            )
        )
    return tuple(out)


# --- replies and events -----------------------------------------------------------------------


def inspect_reply_to_wire(request_id: int, body: Any) -> dict[str, Any] | None:
    """The wire map of a reply to an operator request; None when ``body`` is not one."""
    t = type(body)
    page = _PAGES.get(t)
    if page is not None:
        kind, to_wire, _ = page
        records = [to_wire(r) for r in getattr(body, kind)]
        return {"type": kind, "id": request_id, kind: records, "cursor": body.cursor}
    if t is Released:
        return {"type": "released", "id": request_id, "entries": body.entries, "fence": body.fence}
    if t is Subscribed:
        return {"type": "subscribed", "id": request_id, "subscription": body.subscription}
    if t is Unsubscribed:
        return {"type": "unsubscribed", "id": request_id, "found": body.found}
    return None


def feed_to_wire(ev: FeedEvent) -> dict[str, Any]:
    """A feed event's map."""
    return {
        "type": "feed",
        "subscription": ev.subscription,
        "kind": str(ev.kind),
        "namespace": ev.namespace,
        "table": ev.table,
        "var": ev.var,
        "session": ev.session,
        "fence": ev.fence,
        "at": ev.at,
        "reason": ev.reason,
        "dropped": ev.dropped,
    }


def _reply(f: _Fields, body: Any) -> Reply:
    return Reply(f.get("id", (int,)), body)


# page type -> (its kind: the wire type and the records' key, a record's encoder, the
# records' decoder)
_PAGES: Final[Mapping[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]]] = {
    HoldersPage: ("holders", holder_to_wire, holders_from_wire),
    SessionsPage: ("sessions", _session_to_wire, _sessions_from_wire),
    WaitersPage: ("waiters", _waiter_to_wire, _waiters_from_wire),
}


def _page_decoder(page_type: type) -> Callable[[_Fields], ServerMessage]:
    kind, _, from_wire = _PAGES[page_type]

    def decode(f: _Fields) -> ServerMessage:
        return _reply(f, page_type(from_wire(f.get(kind, (list,))), f.text("cursor", None)))

    return decode


def _d_released(f: _Fields) -> ServerMessage:
    return _reply(f, Released(f.get("entries", (int,)), f.get("fence", (int,))))


def _d_subscribed(f: _Fields) -> ServerMessage:
    return _reply(f, Subscribed(f.get("subscription", (int,))))


def _d_unsubscribed(f: _Fields) -> ServerMessage:
    return _reply(f, Unsubscribed(f.get("found", (bool,))))


def _d_feed(f: _Fields) -> ServerMessage:
    kind = f.text("kind")
    try:
        feed_kind = FeedKind(kind)
    except ValueError:
        raise ValueError(f"unknown feed kind {kind!r}") from None
    return FeedEvent(
        f.get("subscription", (int,)),
        feed_kind,
        f.text("namespace"),
        f.text("table"),
        f.text("var"),
        f.text("session"),
        f.get("fence", (int,)),
        f.number("at"),
        f.text("reason", None),
        f.get("dropped", (int,), 0),
    )


#: Decoders of the operator's server messages, by wire ``type``.
SERVER_DECODERS: Final[Mapping[str, Callable[[_Fields], ServerMessage]]] = {
    "holders": _page_decoder(HoldersPage),
    "sessions": _page_decoder(SessionsPage),
    "waiters": _page_decoder(WaitersPage),
    "released": _d_released,
    "subscribed": _d_subscribed,
    "unsubscribed": _d_unsubscribed,
    "feed": _d_feed,
}
