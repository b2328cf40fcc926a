"""The sync face: :class:`LockClient`, a thread-safe blocking client over one TCP connection
(or, given several servers, over one per server).

Why: the calls are written once as steps (``_calls``) and the state and what reads it once
(``_face.ClientFace``); this module only **drives** them with blocking calls and adds what is
the sync face's own (``process_events``, ``close``, per-server clients opened under a lock).
The connection machinery (send, wait, read; connect, break, reconnect) is
``_sync_conn.SyncConnector``, LockClient's base, and its rules are written there.

Sessions (:class:`Session`, its execute/end and its keepalive thread) are in
``_sync_session.py``: they change with the session API, this module with the public calls.
The client creates them and stops their keepalive on close. A session sees its client only as
a :class:`~client._port.SessionPort`, which :class:`LockClient` implements (``core``,
``check_open``, ``request``, ``request_batch``, ``send_unanswered``, and the public calls);
this module imports the session module, never the other way round.
"""

from __future__ import annotations

import math
import ssl
import threading
from collections.abc import Callable, Generator
from time import monotonic
from types import TracebackType
from typing import Any, TypeVar

from protocol import FeedEvent

from . import _calls
from ._methods import blocking
from ._placement import ServerGroup, Servers
from ._sync_conn import SyncConnector
from ._sync_session import Session, ShardedSession

__all__ = ["LockClient"]

T = TypeVar("T")


def _positive(name: str, value: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class LockClient(SyncConnector[Session, "LockClient"]):
    """A blocking, thread-safe client: one TCP connection shared by every thread; or, given
    several ``servers``, one client over all of them (below).

    ``timeout`` bounds each call (extended by the ``wait`` of an Execute); ``connect_timeout``
    bounds connecting and the handshake. The connection is made at construction (raises
    :class:`ServerUnavailable` when it cannot be) and re-made transparently by the next call
    after it drops. Use as a context manager or call :meth:`close`. ``token``: the shared
    secret the server asks for; ``ssl_context``: speak TLS, verifying the server with it (the
    name checked is ``host``); see docs/security.md.

    A client dropped without :meth:`close` does not outlive its last reference: once it and
    its sessions are collected, their keepalive threads end and the socket is closed (the
    server then expires the sessions after their ``max_age``).

    ``servers`` (instead of ``host`` and ``port``): ``["lock-1:7400", "lock-2:7400"]``, or one
    string such as ``"127.0.0.1:7400-7403"`` (ports 7400 to 7403) or ``"a:7400,b:7400"``.
    One server is exactly the host/port form. Several make a client of several servers
    (docs/client.md#several-servers): each namespace lives on one of them (PROTOCOL.md §12,
    :meth:`server_for`); connections are opened lazily, one per server, by the first call
    that needs it (so the constructor connects to none); sessions span servers; a server that
    cannot be reached makes the calls for its namespaces raise :class:`ServerUnavailable`
    naming it. The other arguments apply to every server.

    A replicated group (its replicas share one lock state) is given as a list of its
    servers: ``servers=[["h1:7400", "h2:7400", "h3:7400"]]`` (one group), or beside other
    groups and servers (``[["a1:7400", "a2:7400"], ["b1:7400", "b2:7400"]]``: two shards).
    The connection to a group goes to one member at a time; when it is lost, the next call
    reconnects to the next member (then the others, round robin) and the sessions carry on
    there (docs/client.md#replicated-groups). ``host`` and ``port`` are the member of the
    current connection; :attr:`members` lists the members, learned ones included.
    """

    _session_class = Session
    _sharded_session_class = ShardedSession

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7400,
        *,
        servers: Servers | None = None,
        timeout: float = 10.0,
        client_name: str = "python-sync",
        connect_timeout: float = 5.0,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._setup(host, port, servers, client_name, token, ssl_context)
        self.timeout = _positive("timeout", timeout)
        self.connect_timeout = _positive("connect_timeout", connect_timeout)
        # A router's per-server clients are opened each under its own lock, so a server that
        # is slow to answer does not hold up opening the others.
        router = self._router
        self._shard_locks = {} if router is None else {s: threading.Lock() for s in router.servers}
        self._setup_connection()
        if router is None:
            self._reconnect()

    def _drive(self, op: Generator[_calls.Step, Any, T]) -> T:
        """Run a call of ``_calls`` to its end with blocking calls."""
        return _calls.run_sync(op, self._answer)

    def _answer(self, step: _calls.Step) -> Any:
        if type(step) is _calls.Call:
            return self.request(step.kind, step.rid, step.data, self.timeout)
        assert type(step) is _calls.OnShard  # OpenTo is the connector's, OnPart a session's
        shard = self.shard_client(step.server)
        return shard._drive(step.make(shard))

    # --- public API (what is not here is ClientFace's: welcome, session, servers...) -------------

    ping = blocking(_calls.ping)
    statistics = blocking(_calls.statistics)
    end_session = blocking(_calls.end_session)

    def shard(self, server: str) -> LockClient:
        """The single-server client of ``server`` (one of :attr:`servers`, or any configured
        member of a group: that group's client), connected now if it was not yet: its
        ``ping``, ``statistics`` and ``welcome`` are that server's. A client of one server
        (or one group) returns itself. ServerUnavailable naming the server when it cannot be
        reached; ValueError for a server not in the list."""
        address = self._shard_address(server)
        return self if address is None else self.shard_client(address)

    def _in_flight(self) -> int:
        conn = self._conn
        with self._cond:
            return 0 if conn is None else len(conn.wire.pending)

    # --- the operator's calls (docs/operations.md; PROTOCOL.md "Inspection and operations") ---

    holders = blocking(_calls.holders)
    sessions = blocking(_calls.sessions)
    waiters = blocking(_calls.waiters)
    release = blocking(_calls.release)
    subscribe = blocking(_calls.subscribe)
    unsubscribe = blocking(_calls.unsubscribe)

    def _take_feed(self) -> list[FeedEvent]:
        conn = self._conn
        if conn is None:
            return []
        with self._cond:
            return conn.wire.take_feed()

    def process_events(
        self, timeout: float = 0.0, *, until: Callable[[], bool] | None = None
    ) -> None:
        """Read the connection for up to ``timeout`` seconds (0: only what has arrived) and
        dispatch LockLost events, when no other thread is reading. Events are otherwise
        dispatched whenever some thread reads (any call, or a session's keepalive). With
        ``until``, stop as soon as it returns True (checked after each read)."""
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        self.check_open()
        if self._router is not None:
            shards = list(self._shards.values())
            for shard in shards:
                shard.process_events(timeout / len(shards), until=until)
            return
        conn = self._conn
        if conn is None or conn.broken is not None:
            return
        with self._cond:
            if conn.reader_busy:
                return
            conn.reader_busy = True
            conn.reader_ident = threading.get_ident()
        try:
            self._read(conn, None, monotonic() + timeout, until=until)
        finally:
            self._leave_reader(conn)

    def close(self) -> None:
        """Close the connection and stop the sessions' keepalive. Calls in flight in other
        threads raise ClientClosed. Sessions are not ended (the server expires them after their
        max age); end them first, or use them as context managers."""
        with self._connect_lock:
            if self._closed:
                return
            self._closed = True
            conn = self._conn
        self._stop_keepalives()
        if conn is not None:
            self._break(conn, "the client was closed")
        for shard in list(self._shards.values()):
            shard.close()

    def __enter__(self) -> LockClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- several servers: how a ShardedSession finds its server's client; not for applications

    def shard_client(self, server: ServerGroup) -> LockClient:
        """Router port: the single-entry client of ``server`` (a server or group of this
        client), opened on first use; ServerUnavailable naming it when it cannot be."""
        shard = self._shards.get(server)
        if shard is not None:
            return shard
        with self._shard_locks[server]:
            shard = self._shards.get(server)
            if shard is None:
                self.check_open()
                with self._opening(server):
                    shard = LockClient(timeout=self.timeout, **self._shard_options(server))
                self._shards[server] = shard
        if self._closed:  # closed while connecting: close() may have missed it
            shard.close()
            self.check_open()
        return shard
