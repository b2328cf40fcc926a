"""The client's calls written once, as steps both faces drive: the operator's calls, routing
over several servers, connecting to a member, and a session over several servers.

Why: the sync and the async face ask the same requests, route them the same way, merge the
same way and raise the same errors; only "send this and wait" differs. As the recipes do
(``client/recipes/_ops.py``, psycopg's shape), each call here is a generator that **yields a
step** and receives its outcome; it never touches a socket, a thread or an event loop. A
face's ``_drive`` runs the steps:

- :class:`Call` -> send the framed request (``request(kind, rid, data)``) and send back its
  reply, or throw the call's exception into the generator.
- :class:`OnShard` -> on a client of several servers: run ``make(shard)`` (another call of
  this module) on the single-server client of ``server`` (opened on first use) and send back
  its result.
- :class:`OpenTo` -> open a welcomed connection to one member (the face's socket work) and
  send it back.
- :class:`OnPart` -> on a session of several servers: apply ``call`` to the part on
  ``server`` (an ordinary session, made on first use) and send back the result (awaited on
  the async face).

A session's calls (``end``; over several servers ``execute``, ``execute_many``, ``end``) are
steps of the same kinds, in ``_session_calls``.

Adding a request kind: a builder in ``_inspect`` (or ``ClientCore``), a reply kind in
``_wire``, a generator here with the public signature and docstring, and on each face one
line: ``<name> = blocking(_calls.<name>)`` / ``<name> = awaitable(_calls.<name>)``
(``_methods``).

The state the generators read is :class:`~client._face.ClientFace`'s (``_core``, ``_router``,
``_subscriptions``) and :class:`~client._session_state.SessionState`'s; they never block.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from protocol import HoldersPage, Pong, Released, SessionsPage, WaitersPage

from ._errors import (
    LockClientError,
    ServerError,
    ServerUnavailable,
)
from ._inspect import listing_request, release_request, subscribe_request, unsubscribe_request
from ._placement import ServerAddress, ServerGroup
from ._sharding import join_cursor, split_cursor, unavailable
from ._wire import END, HOLDERS, PING, RELEASE, SESSIONS, STATS, SUBSCRIBE, UNSUBSCRIBE, WAITERS

if TYPE_CHECKING:
    from ._core import FeedSink
    from ._face import ClientFace

    Face = ClientFace[Any, Any]

__all__ = [
    "Call",
    "OnPart",
    "OnShard",
    "Op",
    "OpenTo",
    "end_session",
    "holders",
    "listing",
    "open_member",
    "ping",
    "release",
    "sessions",
    "statistics",
    "subscribe",
    "unsubscribe",
    "waiters",
]

T = TypeVar("T")
S = TypeVar("S")  # a step


class Call:
    """The step "send this framed request and send me its reply"."""

    __slots__ = ("data", "kind", "rid")

    def __init__(self, kind: int, rid: int, data: bytes) -> None:
        self.kind = kind  # a client._wire request kind
        self.rid = rid
        self.data = data

    def __repr__(self) -> str:
        return f"<Call kind={self.kind} rid={self.rid}>"


class OnShard:
    """The step "run ``make(shard)`` on the client of ``server``, send me its result"."""

    __slots__ = ("make", "server")

    def __init__(self, server: ServerGroup, make: Callable[[Any], Op[Any]]) -> None:
        self.server = server
        self.make = make

    def __repr__(self) -> str:
        return f"<OnShard {self.server.id}>"


class OpenTo:
    """The step "open a welcomed connection to ``address``, send it to me"."""

    __slots__ = ("address",)

    def __init__(self, address: ServerAddress) -> None:
        self.address = address

    def __repr__(self) -> str:
        return f"<OpenTo {self.address.id}>"


class OnPart:
    """The step "apply ``call`` to this session's part on ``server``, send me the result"."""

    __slots__ = ("call", "server")

    def __init__(self, server: ServerGroup, call: Callable[[Any], Any]) -> None:
        self.server = server
        self.call = call

    def __repr__(self) -> str:
        return f"<OnPart {self.server.id}>"


Step = Call | OnShard | OpenTo | OnPart
#: A call: yields steps, receives their outcomes, returns its result.
Op = Generator[Step, Any, T]


def run_sync(op: Generator[S, Any, T], answer: Callable[[S], Any]) -> T:
    """Run ``op`` to its end, answering each step with ``answer(step)`` (the sync face's
    driver; the async face writes the same loop with ``await``: ``run_async``)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = op.send(value) if error is None else op.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value = error = None
        try:
            value = answer(step)
        except BaseException as exc:
            error = exc


# --- the server's and the operator's calls ----------------------------------------------------


def ping(c: Face) -> Op[Pong]:
    """Liveness check: the server's ``uptime`` and ``trust``. Touches no session. A
    client of several servers pings every one of them (ServerUnavailable naming the first
    that cannot be reached) and returns the Pong of the one with the lowest trust."""
    router = c._router
    if router is None:
        rid, data = c._core.ping()
        pong: Pong = yield Call(PING, rid, data)
        return pong
    pongs: list[Pong] = []
    for server in router.servers:
        pongs.append((yield OnShard(server, ping)))
    return min(pongs, key=lambda pong: pong.trust)


def statistics(c: Face) -> Op[dict[str, Any]]:
    """The server's statistics (a nested map; PROTOCOL.md lists the keys). A client of
    several servers returns ``{server: statistics}`` for every server (ServerUnavailable
    naming the first that cannot be reached)."""
    router = c._router
    if router is None:
        rid, data = c._core.get_statistics()
        stats: dict[str, Any] = yield Call(STATS, rid, data)
        return stats
    out: dict[str, Any] = {}
    for server in router.servers:
        out[server.id] = yield OnShard(server, statistics)
    return out


def end_session(c: Face, session_id: str) -> Op[bool]:
    """End any session by id (all its entries go at once); False when it did not exist.
    Prefer ``session.end()`` for your own sessions. A client of several servers ends it on
    every server (True when some had it); a server that cannot be reached raises
    ServerUnavailable after the others were asked."""
    router = c._router
    if router is None:
        rid, data = c._core.end_session(session_id)
        existed: bool = yield Call(END, rid, data)
        return existed
    existed = False
    failure: ServerUnavailable | None = None
    for server in router.servers:
        try:
            existed = (yield OnShard(server, lambda s: end_session(s, session_id))) or existed
        except ServerUnavailable as exc:
            failure = failure or unavailable(server, exc)
    if failure is not None:
        raise failure
    return existed


def listing(
    c: Face,
    kind: str,
    wire_kind: int,
    namespace: str | None,
    table: str | None,
    var: str | None,
    session: str | None,
    match: str | None,
    cursor: str | None,
    limit: int | None,
) -> Op[Any]:
    """One page of ``kind`` (``holders``, ``sessions``, ``waiters``). A router asks the
    namespace's server, or without a namespace each server in turn (its cursor says which)."""
    router = c._router
    if router is None:
        rid = c._core.next_id()
        data = listing_request(
            kind, rid, namespace, table, var, session=session, match=match, cursor=cursor,
            limit=limit,
        )  # fmt: skip
        return (yield Call(wire_kind, rid, data))
    args = (kind, wire_kind, namespace, table, var, session, match)
    if namespace is not None:
        server = router.place(namespace)
        try:
            return (yield OnShard(server, lambda s: listing(s, *args, cursor, limit)))
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc
    count = len(router.servers)
    index, inner = split_cursor(cursor, count)
    server = router.servers[index]
    try:
        page = yield OnShard(server, lambda s: listing(s, *args, inner, limit))
    except ServerUnavailable as exc:
        raise unavailable(server, exc) from exc
    return attrs.evolve(page, cursor=join_cursor(index, page.cursor, count))


def holders(
    c: Face,
    namespace: str | None = None,
    table: str | None = None,
    var: str | None = None,
    *,
    session: str | None = None,
    match: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Op[HoldersPage]:
    """A page of the entries held (``table`` and ``var`` are prefixes, ``match`` a
    substring of a description, ``limit`` 1..1,000, default 100): ``.holders`` and the
    ``.cursor`` of the next page (None at the end). With tokens, only the namespaces the
    principal may use. A client of several servers asks the namespace's server, or,
    without a namespace, each server in turn (its cursor says which)."""
    args = (namespace, table, var, session, match, cursor, limit)
    page: HoldersPage = yield from listing(c, "holders", HOLDERS, *args)
    return page


def sessions(
    c: Face,
    namespace: str | None = None,
    table: str | None = None,
    var: str | None = None,
    *,
    session: str | None = None,
    match: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Op[SessionsPage]:
    """A page of the sessions (filters as :meth:`holders`; ``namespace``, ``table`` and
    ``var``: of an entry the session holds): ``.sessions`` and ``.cursor``."""
    args = (namespace, table, var, session, match, cursor, limit)
    page: SessionsPage = yield from listing(c, "sessions", SESSIONS, *args)
    return page


def waiters(
    c: Face,
    namespace: str | None = None,
    table: str | None = None,
    var: str | None = None,
    *,
    session: str | None = None,
    match: str | None = None,
    cursor: str | None = None,
    limit: int | None = None,
) -> Op[WaitersPage]:
    """A page of the parked transactions (filters as :meth:`holders`): ``.waiters`` and
    ``.cursor``."""
    args = (namespace, table, var, session, match, cursor, limit)
    page: WaitersPage = yield from listing(c, "waiters", WAITERS, *args)
    return page


def release(
    c: Face, namespace: str, table: str, var: str, *, session: str | None = None
) -> Op[Released]:
    """Force-release: remove the entries of one variable (only ``session``'s when given),
    waking its waiters; their holders get a ``lost`` event with reason ``released``. An
    admin call: with tokens, it needs a token marked ``admin = true`` (else FORBIDDEN).
    Returns how many entries went and the fence of the change. Never re-sent after a
    dropped connection (a repeat could remove a later holder's entry)."""
    router = c._router
    if router is not None:
        server = router.place(namespace)
        try:
            released: Released = yield OnShard(
                server, lambda s: release(s, namespace, table, var, session=session)
            )
            return released
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc
    rid = c._core.next_id()
    data = release_request(rid, namespace, table, var, session)
    released = yield Call(RELEASE, rid, data)
    return released


def subscribe(
    c: Face, namespace: str, table: str | None = None, *, sink: FeedSink | None = None
) -> Op[int]:
    """Subscribe this client to the change feed of ``namespace`` (one ``table`` of it
    when given): grants, releases, expiries, lost locks and kills arrive as
    :class:`~protocol.FeedEvent` values, taken with ``feed_events()`` (read as the
    connection is read: the sync face while some call, or ``process_events()``, reads it;
    the async face's reader task at once; ``await next_feed_events()`` waits for them).
    Returns the subscription's id. A subscription outlives its connection: after a reconnect
    the client makes it again, with the same id, before anything else is sent; the events of
    the gap are not seen (``local_statistics().connections`` tells that one happened). With
    ``sink`` (a :class:`~client._core.FeedSink`), the events go to it instead of
    ``feed_events()``, and it is told of reconnects. A client of several servers subscribes
    on the namespace's server and returns an id of its own."""
    router = c._router
    core = c._core
    if router is not None:
        server = router.place(namespace)
        try:
            theirs = yield OnShard(server, lambda s: subscribe(s, namespace, table, sink=sink))
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc
        return c._subscriptions.add(core.next_id(), server, theirs)
    rid = core.next_id()
    data = subscribe_request(rid, namespace, table)
    if sink is not None:
        core.feed_sinks[rid] = sink  # before the request: its first events may come at once
    try:
        subscription: int = yield Call(SUBSCRIBE, rid, data)
    except BaseException:
        core.feed_sinks.pop(rid, None)
        raise
    core.subscriptions[subscription] = (namespace, table)
    return subscription


def unsubscribe(c: Face, subscription: int) -> Op[bool]:
    """End a subscription; False when the server did not know it (its connection
    dropped meanwhile, or it ended already)."""
    core = c._core
    if c._router is not None:
        where = c._subscriptions.pop(subscription)
        if where is None:
            return False
        known: bool = yield OnShard(where[0], lambda s: unsubscribe(s, where[1]))
        return known
    core.subscriptions.pop(subscription, None)
    core.feed_sinks.pop(subscription, None)
    rid = core.next_id()
    data = unsubscribe_request(rid, subscription)
    known = yield Call(UNSUBSCRIBE, rid, data)
    return known


# --- connecting --------------------------------------------------------------------------------


def open_member(c: Face, after_loss: bool) -> Generator[OpenTo, Any, Any]:
    """A new welcomed connection to a member of the client's entry, tried in the order of
    ``Members.round`` (one round: each member once); ``host`` and ``port`` then name the
    member. Raises ``Members.failure`` when no member could be connected to."""
    members = c._core.members
    assert members is not None  # a router never connects itself
    errors: list[tuple[ServerAddress, LockClientError]] = []
    for address in members.round(after_loss):
        try:
            conn = yield OpenTo(address)
        except (ServerUnavailable, ServerError) as exc:
            errors.append((address, exc))
            continue
        welcome = c._core.welcome
        assert welcome is not None  # set by the handshake
        members.connected(address, welcome)
        c.host, c.port = address.host, address.port
        return conn
    raise members.failure(errors)
