"""What the two client faces share besides the calls: their state and everything that reads it
without I/O (psycopg's ``BaseConnection``).

Why: :class:`~client.LockClient` and :class:`~client.AsyncLockClient` hold the same state
(the socket-free :class:`~client._core.ClientCore`, the placement of a client of several
servers, its per-server clients and subscriptions) and answer the same questions about it
(``welcome``, ``servers``, ``members``, ``server_for``, ``session``...). Those are written
here once; a face adds its connection machinery, its driver (``_drive``, which runs the
calls of ``_calls``) and the signatures of its blocking or awaitable calls.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar, Generic, TypeVar

from protocol import FeedEvent, Welcome

from ._core import ClientCore, ClientStatistics
from ._errors import ClientClosed, ConnectionLost, LockClientError, ServerUnavailable
from ._failover import Members
from ._placement import ServerGroup, Servers
from ._session_state import SessionState
from ._sharding import (
    Router,
    Subscriptions,
    client_groups,
    describe,
    shard_servers,
    unavailable,
)

__all__ = ["ClientFace"]

SessionT = TypeVar("SessionT", bound=SessionState)
ShardT = TypeVar("ShardT")


class ClientFace(Generic[SessionT, ShardT]):
    """The state of a client and what reads it, for both faces (``SessionT``: the face's
    session; ``ShardT``: the face's client class, a router's per-server clients)."""

    #: How the face's docs and errors name a per-server client (``client.shard(server)``).
    _SHARD_HINT: ClassVar[str] = "client.shard(server)"
    #: The face's sessions (one server or group, and several), made with ``(client,
    #: session_id, max_age, description, keepalive)``.
    _session_class: ClassVar[type[Any]]
    _sharded_session_class: ClassVar[type[Any]]
    #: Bounds connecting and the handshake (seconds; the face validates it).
    connect_timeout: float

    def _setup(
        self,
        host: str,
        port: int,
        servers: Servers | None,
        client_name: str,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        """Set the state both faces share (validates the server arguments)."""
        groups = client_groups(host, port, servers)
        first = groups[0].members[0]
        #: The server of the current connection (of a group: the member in use; a client of
        #: several servers: its first server's first member, unused).
        self.host = first.host
        self.port = first.port
        self.ssl_context = ssl_context
        # One entry (a server or a group): the members its connection may go to.
        members = Members(groups[0]) if len(groups) == 1 else None
        self._core = ClientCore(client_name, token, members)
        self._closed = False
        # Several entries: the placement, and one single-entry client per entry, opened by
        # the first call that needs it.
        router = Router(groups) if len(groups) > 1 else None
        self._router = router
        # Where namespaces live: the router's list, or this client's one entry (``place``,
        # ``servers`` and ``shard`` read it either way).
        self._placement = router if router is not None else Router(groups)
        self._shards: dict[ServerGroup, ShardT] = {}
        self._subscriptions = Subscriptions()

    # --- state ------------------------------------------------------------------------------------

    @property
    def welcome(self) -> Welcome:
        """The server's Welcome of the current connection (version, name, host, limits). A
        client of several servers has one per server: ``client.shard(server).welcome`` (the
        async face: ``(await client.shard(server)).welcome``)."""
        if self._router is not None:
            raise LockClientError(
                f"a client of several servers has one welcome per server: use "
                f"{self._SHARD_HINT}.welcome (or session.welcome_for(namespace))"
            )
        welcome = self._core.welcome
        assert welcome is not None  # set by the first handshake
        return welcome

    @property
    def closed(self) -> bool:
        """True once the client is closed (``close()``, or the ``open_lock_client`` block
        has exited)."""
        return self._closed

    @property
    def core(self) -> ClientCore:
        """The socket-free core (request ids, open sessions, counters). Session port: what
        a session builds its frames with; not for applications."""
        return self._core

    def session(
        self,
        max_age: float = 60.0,
        description: str = "",
        session_id: str | None = None,
        *,
        keepalive: bool = True,
    ) -> SessionT:
        """A session (a fresh uuid4 id unless ``session_id`` is given). Use it as a context
        manager (``with`` / ``async with``): the session is ended on exit, also on an
        exception or cancellation. While it is open and has been used, a keepalive thread
        (async face: task) pings it every ``max_age / 3`` seconds of idleness (unless
        ``keepalive=False``), so a slow critical section does not lose its locks."""
        self.check_open()
        make = self._session_class if self._router is None else self._sharded_session_class
        session: SessionT = make(self, session_id, max_age, description, keepalive)
        return session

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers of this client as configured, by their placement ids (PROTOCOL.md
        §12): ``host:port``, or for a replicated group its members' ids sorted and joined by
        ``,`` (e.g. ``"h1:7400,h2:7400"``)."""
        return tuple(s.id for s in self._placement.servers)

    @property
    def members(self) -> tuple[str, ...]:
        """The servers this client's connection may go to (``host:port``), in the order of
        failover: its one server; for a replicated group the configured members, then those
        learned from the welcome. The member in use is ``host:port`` (and
        ``local_statistics().server``). A client of several servers has one list per entry:
        ``client.shard(server).members``."""
        members = self._core.members
        if members is None:
            raise LockClientError(
                "a client of several servers has one member list per server: use "
                f"{self._SHARD_HINT}.members"
            )
        return tuple(m.id for m in members.members)

    def server_for(self, namespace: str) -> str:
        """The server (``host:port``) ``namespace`` lives on (PROTOCOL.md §12)."""
        return self.place(namespace).id

    def local_statistics(self) -> ClientStatistics:
        """Client-side counters: requests, drops, retries, reconnects, events (a client of
        several servers: the sums over its per-server clients, and its own open sessions)."""
        if self._router is not None:
            return self._shard_totals()
        return self._core.statistics(self._in_flight())

    def feed_events(self) -> list[FeedEvent]:
        """The change-feed events received since the last call, in arrival order (an event's
        ``dropped`` counts the events the server could not send before it, because this
        client did not read fast enough)."""
        if self._router is not None:
            return self._shard_feed()
        return self._take_feed()

    def _in_flight(self) -> int:
        """The requests in flight on the face's connection (0 without one)."""
        raise NotImplementedError

    def _take_feed(self) -> list[FeedEvent]:
        """The feed events the face's connection has received since the last call."""
        raise NotImplementedError

    def _shard_totals(self) -> ClientStatistics:
        """A router's ``local_statistics()``: the sums over its per-server clients, and its
        own open sessions."""
        shards: list[Any] = list(self._shards.values())
        return ClientStatistics.total(
            [s.local_statistics() for s in shards], len(self._core.open_sessions())
        )

    def _shard_feed(self) -> list[FeedEvent]:
        """A router's ``feed_events()``: its per-server clients' events, under its own ids."""
        shards: list[tuple[ServerGroup, Any]] = list(self._shards.items())
        return self._subscriptions.relabel([(server, s.feed_events()) for server, s in shards])

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {describe(self._placement.servers)} {state}>"

    # --- several servers: how a sharded session finds its server's client; not for applications

    def place(self, namespace: str) -> ServerGroup:
        """Router port: the server (or group) ``namespace`` lives on."""
        return self._placement.place(namespace)

    def split(self, calls: Iterable[Any]) -> list[tuple[ServerGroup, list[int], list[Any]]]:
        """Router port: a batch's calls grouped by server (``Router.split``)."""
        assert self._router is not None  # only sessions of several servers split
        return self._router.split(calls)

    def _shard_options(self, server: ServerGroup) -> dict[str, Any]:
        """The options of the single-entry client of ``server``: this client's own."""
        return {
            "servers": shard_servers(server),
            "client_name": self._core.client_name,
            "connect_timeout": self.connect_timeout,
            "token": self._core.token,
            "ssl_context": self.ssl_context,
        }

    def _shard_address(self, server: str) -> ServerGroup | None:
        """``shard(server)``: the entry (server or group) ``server`` names, or None when this
        client has one entry (it is its own shard); ValueError for a server not in the
        list."""
        address = self._placement.member(server)
        return None if self._router is None else address

    @contextlib.contextmanager
    def _opening(self, server: ServerGroup) -> Iterator[None]:
        """Opening the per-server client of ``server``: ServerUnavailable names it."""
        try:
            yield
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc

    def _not_a_connection(self) -> None:
        """Raise when a router is asked to connect itself (it sends through its per-server
        clients)."""
        if self._router is not None:
            raise LockClientError(
                "a client of several servers sends through its per-server clients, not itself"
            )

    # --- connecting -------------------------------------------------------------------------------

    def _reconnected(self, now: float) -> list[bytes]:
        """A new connection is up (at ``now``, the face's clock; a member of the client's
        entry, chosen by ``_calls.open_member``): report the losses no connection could hear
        (``ClientCore.reconnected``: a restarted server, a session whose guarantee ran out
        meanwhile), then return the frames the face sends on it at once, before anything
        else: the open sessions' keepalives (so its LockLost events come here and their idle
        timers restart) and the subscriptions made again; their replies are dropped by id."""
        self._core.reconnected(now)
        return self._core.keepalives() + self._core.resubscriptions()

    def _retried(self, retried: bool) -> bool:
        """An idempotent request was answered RETRY (its connection dropped with it in
        flight): count the re-send and return True (it has been retried), or raise
        ConnectionLost when it was re-sent once already."""
        if retried:
            raise ConnectionLost(
                "the connection dropped twice with the same idempotent request in flight"
            )
        self._core.retries += 1
        return True

    def _batch_outcomes(self, outcomes: list[Any]) -> list[Any]:
        """A batch's outcomes as the caller gets them: ClientClosed when the client was
        closed with the batch in flight (a call lost its connection to the close)."""
        if self._closed and any(isinstance(item, ConnectionLost) for item in outcomes):
            raise ClientClosed("the client was closed with the batch in flight")
        return outcomes

    def _stop_keepalives(self) -> None:
        """Closing: stop every open session's keepalive (the sessions are not ended)."""
        for state in self._core.open_sessions():
            state._stop_keepalive()

    # --- the session port -------------------------------------------------------------------------

    def check_open(self) -> None:
        """Session port: raise ClientClosed once the client is closed."""
        if self._closed:
            raise ClientClosed("the client is closed")
