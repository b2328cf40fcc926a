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

Adding a request kind: a builder in ``_inspect`` (or ``ClientCore``), a reply kind in
``_wire``, a generator here, and on each face one method whose body is ``return
self._drive(_calls.<name>(self, ...))``.

The state the generators read is :class:`~client._face.ClientFace`'s (``_core``, ``_router``,
``_subscriptions``) and :class:`~client._session_state.SessionState`'s; they never block.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from operator import methodcaller
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from protocol import Pong, Released, Statement

from ._errors import (
    BatchError,
    ClientTimeout,
    ConnectionLost,
    LockClientError,
    ServerError,
    ServerUnavailable,
)
from ._inspect import listing_request, release_request, subscribe_request, unsubscribe_request
from ._placement import ServerAddress, ServerGroup
from ._result import Result
from ._sharding import join_cursor, merge_outcomes, split_cursor, unavailable
from ._wire import END, PING, RELEASE, STATS, SUBSCRIBE, UNSUBSCRIBE

if TYPE_CHECKING:
    from ._core import FeedSink
    from ._face import ClientFace
    from ._session_state import BatchCall

    Face = ClientFace[Any, Any]

__all__ = [
    "Call",
    "OnPart",
    "OnShard",
    "Op",
    "OpenTo",
    "end_session",
    "keepalive_frame",
    "listing",
    "open_member",
    "ping",
    "release",
    "resend_deferred",
    "session_end",
    "sharded_end",
    "sharded_execute",
    "sharded_execute_many",
    "statistics",
    "subscribe",
    "unsubscribe",
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
    """``ping()``; a router pings every server and returns the lowest trust's Pong."""
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
    """``statistics()``; a router answers ``{server: statistics}``."""
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
    """``end_session(id)``; a router ends it on every server (True when some had it) and
    raises the first ServerUnavailable once all were asked."""
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
    """``holders()`` / ``sessions()`` / ``waiters()``: one page. A router asks the
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


def release(c: Face, namespace: str, table: str, var: str, session: str | None) -> Op[Released]:
    """``release(...)``: force-release on the namespace's server."""
    router = c._router
    if router is not None:
        server = router.place(namespace)
        try:
            released: Released = yield OnShard(
                server, lambda s: release(s, namespace, table, var, session)
            )
            return released
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc
    rid = c._core.next_id()
    data = release_request(rid, namespace, table, var, session)
    released = yield Call(RELEASE, rid, data)
    return released


def subscribe(c: Face, namespace: str, table: str | None, sink: FeedSink | None) -> Op[int]:
    """``subscribe(...)``: the subscription's id; a router's own id for the server's."""
    router = c._router
    core = c._core
    if router is not None:
        server = router.place(namespace)
        try:
            theirs = yield OnShard(server, lambda s: subscribe(s, namespace, table, sink))
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
    """``unsubscribe(id)``: False when the server did not know it."""
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


# --- a session ----------------------------------------------------------------------------------


def session_end(s: Any) -> Generator[Call, Any, bool]:
    """``end()`` of a session on one server (``s``: a session of either face): True when the
    server still had it; False without a call when it has ended already. The session is
    ended whatever the call does."""
    built = s._start_end()
    if built is None:
        return False
    try:
        existed: bool = yield Call(END, *built)
    finally:
        s._mark_ended()
    return existed


def resend_deferred(s: Any) -> Generator[tuple[str, list[Statement]], Any, None]:
    """Send a session's deferred cleanups again (``defer_cleanup``): yields each as
    ``(namespace, statements)`` for the face to ``execute``; those that fail once more (a
    LockClientError thrown in) are kept for the next call."""
    pending = s._take_deferred()
    for i, call in enumerate(pending):
        try:
            yield call
        except LockClientError:
            s._deferred[:0] = pending[i:]
            return


def keepalive_frame(
    s: Any,
) -> Generator[tuple[str, list[Statement]], Any, tuple[int, bytes] | None]:
    """Before a keepalive ping of a session (``s``: either face's): its deferred cleanups
    first, yielded as ``resend_deferred`` does (a recipe's cancel whose outcome was unknown:
    a session kept alive by pings alone would otherwise keep what it removes, a lock nobody
    knows it holds); then the ping's ``(request id, frame)``, None when it should not ping
    (the session ended, or never made a call)."""
    if s._deferred and not s._ended:
        yield from resend_deferred(s)
    built: tuple[int, bytes] | None = s._build_keepalive()
    return built


# --- a session over several servers ------------------------------------------------------------


def sharded_execute(
    s: Any, namespace: str, statements: Iterable[Statement], options: tuple[Any, ...]
) -> Op[Result]:
    """``execute`` of a session of several servers: on the part of ``namespace``'s server.
    ``options``: ``execute``'s ``(min_uptime, min_trust, description, transaction_id,
    wait)``."""
    s._check_open()
    server = s._router.place(namespace)
    min_uptime, min_trust, description, transaction_id, wait = options
    execute = methodcaller(
        "execute", namespace, statements, min_uptime=min_uptime, min_trust=min_trust,
        description=description, transaction_id=transaction_id, wait=wait,
    )  # fmt: skip
    try:
        result: Result = yield OnPart(server, execute)
    except ServerUnavailable as exc:
        raise unavailable(server, exc) from exc
    return result


def sharded_execute_many(
    s: Any, calls: Iterable[BatchCall], min_uptime: float, min_trust: float
) -> Op[list[Result]]:
    """``execute_many`` of a session of several servers (``s``: a ``ShardedSession`` of
    either face): each server's calls go to its part as one batch, servers one after
    another; the results come back in the caller's order. A server that cannot be reached
    fails its calls only (ServerUnavailable in the BatchError's ``results``)."""
    calls = list(calls)
    s._check_open()
    router = s._router
    groups = router.split(calls)
    if not groups:
        router.check_open()
        return []
    if len(groups) > 1:
        # Every call is validated before anything is sent, as in a one-server batch (the
        # errors name the call's place in the whole batch).
        s._build_batch_frames(calls, min_uptime, min_trust)
    parts: list[tuple[list[int], list[Result] | BaseException]] = []
    for server, indexes, items in groups:
        many = methodcaller("execute_many", items, min_uptime=min_uptime, min_trust=min_trust)
        try:
            parts.append((indexes, (yield OnPart(server, many))))
        except ServerUnavailable as exc:
            if len(groups) == 1:
                raise unavailable(server, exc) from exc
            parts.append((indexes, unavailable(server, exc)))
        except (BatchError, ConnectionLost, ClientTimeout) as exc:
            if len(groups) == 1:
                raise
            parts.append((indexes, exc))
    return merge_outcomes(len(calls), parts)


def sharded_end(s: Any) -> Op[bool]:
    """``end()`` of a session of several servers: end every part; True when some server
    still had the session. The first failure is raised once every part was asked."""
    if s._ended:
        return False
    s._mark_ended()
    existed = False
    failure: LockClientError | None = None
    for server in list(s._parts):
        try:
            existed = (yield OnPart(server, methodcaller("end"))) or existed
        except ServerUnavailable as exc:
            failure = failure or unavailable(server, exc)
        except LockClientError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
    return existed
