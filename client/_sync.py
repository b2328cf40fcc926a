"""The sync face: a thread-safe blocking client over one TCP connection.

Why: the request path must be as short as a redis-py round trip or shorter, so there is no
reader thread and no hand-off. **The caller reads**: a thread that waits for its reply takes
the *reader role* (one thread at a time), reads the socket itself, stashes replies that belong
to other threads and wakes them through one Condition, dispatches LockLost events, and returns
as soon as its own reply is there; the next waiting thread then becomes the reader. With one
thread that is: send, recv, decode, return. Prior art: the leader/follower pattern.

Sessions (:class:`Session`, its execute/end and its keepalive thread) are in
``_sync_session.py``: they change with the session API, this module with the connection
machinery. The client creates them and stops their keepalive on close. A session sees its
client only as a :class:`~client._port.SessionPort`, which :class:`LockClient` implements
(``core``, ``check_open``, ``request``, ``request_batch``, ``send_unanswered``, and the public
calls); this module imports the session module, never the other way round.

Rules kept:
- A request is registered in the wire's table (under the condition's lock) *before* its bytes
  are sent, so its reply can never arrive unclaimed. A caller that times out removes its entry
  (under the same lock); its late reply is dropped by id, and the connection stays in sync.
- Sends are serialised by a send lock (one ``sendall`` per request frame, or per batch: an
  ``execute_many`` registers all its calls under one waiter, the batch's first request id,
  and sends all its frames with one ``sendall``).
- The sync face has no reader while idle, so before sending on an idle connection it checks
  (one zero-timeout ``poll``) whether anything has arrived meanwhile. If something has
  (events, late replies, the server's last error, the close itself), the caller takes the
  reader role and processes it first; a connection that turns out closed, or announced as
  closing (e.g. ``SHUTTING_DOWN``), is broken there, and the call reconnects instead of
  losing its request to a server that no longer reads it (no server: ServerUnavailable
  "not sent").
- A reconnect reports the losses no connection could hear (``ClientCore.reconnected``: a
  restarted server, an expired session guarantee) before its keepalives go out.
- A (re)connect goes to a member of the client's entry (a server, or a replicated group's
  replicas) in the order ``_failover.Members`` gives: one round, each member once; ``host``
  and ``port`` then name the member in use.
- Nothing but the caller holds the client: keepalive threads hold their session weakly
  (``_sync_session``), and a finalizer closes the socket when an unclosed client is collected
  (it holds the socket, never the client).
- A broken connection resolves everything in flight (``Wire.fail_all``): idempotent requests
  are re-sent once on a new connection, an Execute raises ConnectionLost (outcome unknown). The
  next call reconnects; open sessions are touched on the new connection at once.
- Closing a socket that another thread may still use risks the fd being reused by a new
  socket: a broken connection is only ``shutdown`` (which wakes a blocked ``recv``), and closed
  by the last reader, or at once when no thread is reading; senders check ``broken`` under the
  send lock and closing takes it too.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import socket
import ssl
import threading
import weakref
from collections.abc import Callable, Generator
from time import monotonic
from types import TracebackType
from typing import Any, TypeVar

from protocol import FeedEvent, HoldersPage, Pong, Released, SessionsPage, WaitersPage

from . import _calls
from ._core import ClientStatistics, FeedSink, handshake_error, not_sent
from ._errors import ClientClosed, ClientTimeout, ConnectionLost, LockClientError, ServerUnavailable
from ._face import ClientFace
from ._placement import ServerAddress, ServerGroup, Servers
from ._sharding import shard_servers, unavailable
from ._sync_session import Session, ShardedSession
from ._wire import BATCH, HELLO, HOLDERS, RETRY, SESSIONS, WAITERS, Batch, Wire

__all__ = ["LockClient"]

log = logging.getLogger("client")

_RECV_SIZE = 256 * 1024
_MIN_SOCKET_TIMEOUT = 0.001  # settimeout(0) would make the socket non-blocking
_Resolution = tuple[Any, BaseException | None]
T = TypeVar("T")


def _positive(name: str, value: float) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _readable(sock: socket.socket) -> bool:
    """True when something is waiting on an idle connection: bytes (events, late replies, a
    closing error), the peer's close, or an error. One ``poll`` with a zero timeout (``poll``,
    not ``select``: select() cannot watch a file descriptor >= 1024, which a busy process
    easily has)."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLPRI)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True  # closed meanwhile: the read that follows notices


class _SocketHolder:
    """The client's current socket, for the finalizer that closes it when an unclosed
    client is collected (it must not reference the client itself)."""

    __slots__ = ("sock",)

    def __init__(self) -> None:
        self.sock: socket.socket | None = None

    def close(self) -> None:
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


class _Connection:
    """One TCP connection of a LockClient (state guarded by the client's condition)."""

    __slots__ = ("broken", "done", "reader_busy", "reader_ident", "sock", "wire")

    def __init__(self, sock: socket.socket, wire: Wire[int]) -> None:
        self.sock = sock
        self.wire = wire
        self.done: dict[int, _Resolution] = {}  # request id -> resolution, for waiting threads
        self.reader_busy = False
        self.reader_ident = 0  # the reading thread's ident (0: none)
        self.broken: str | None = None  # why, once broken


class LockClient(ClientFace[Session, "LockClient"]):
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
        self._cond = threading.Condition(threading.Lock())
        self._send_lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._conn: _Connection | None = None
        self._socket = _SocketHolder()
        self._finalizer = weakref.finalize(self, self._socket.close)
        if router is None:
            self._reconnect()

    def _drive(self, op: Generator[_calls.Step, Any, T]) -> T:
        """Run a call of ``_calls`` to its end with blocking calls."""
        return _calls.run_sync(op, self._answer)

    def _answer(self, step: _calls.Step) -> Any:
        if type(step) is _calls.Call:
            return self.request(step.kind, step.rid, step.data, self.timeout)
        if type(step) is _calls.OnShard:
            shard = self.shard_client(step.server)
            return shard._drive(step.make(shard))
        assert type(step) is _calls.OpenTo  # OnPart is a session's step
        return self._open_to(step.address)

    # --- public API (what is not here is ClientFace's: welcome, session, servers...) -------------

    def shard(self, server: str) -> LockClient:
        """The single-server client of ``server`` (one of :attr:`servers`, or any configured
        member of a group: that group's client), connected now if it was not yet: its
        ``ping``, ``statistics`` and ``welcome`` are that server's. A client of one server
        (or one group) returns itself. ServerUnavailable naming the server when it cannot be
        reached; ValueError for a server not in the list."""
        address = self._placement.member(server)
        if self._router is None:
            return self
        return self.shard_client(address)

    def ping(self) -> Pong:
        """Liveness check: the server's ``uptime`` and ``trust``. Touches no session. A
        client of several servers pings every one of them (ServerUnavailable naming the first
        that cannot be reached) and returns the Pong of the one with the lowest trust."""
        return self._drive(_calls.ping(self))

    def statistics(self) -> dict[str, Any]:
        """The server's statistics (a nested map; PROTOCOL.md lists the keys). A client of
        several servers returns ``{server: statistics}`` for every server (ServerUnavailable
        naming the first that cannot be reached)."""
        return self._drive(_calls.statistics(self))

    def end_session(self, session_id: str) -> bool:
        """End any session by id (all its entries go at once); False when it did not exist.
        Prefer ``session.end()`` for your own sessions. A client of several servers ends it on
        every server (True when some had it); a server that cannot be reached raises
        ServerUnavailable after the others were asked."""
        return self._drive(_calls.end_session(self, session_id))

    def local_statistics(self) -> ClientStatistics:
        """Client-side counters: requests, drops, retries, reconnects, events (a client of
        several servers: the sums over its per-server clients, and its own open sessions)."""
        if self._router is not None:
            return self._shard_totals()
        conn = self._conn
        with self._cond:
            in_flight = 0 if conn is None else len(conn.wire.pending)
            return self._core.statistics(in_flight)

    # --- the operator's calls (docs/operations.md; PROTOCOL.md "Inspection and operations") ---

    def holders(
        self,
        namespace: str | None = None,
        table: str | None = None,
        var: str | None = None,
        *,
        session: str | None = None,
        match: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> HoldersPage:
        """A page of the entries held (``table`` and ``var`` are prefixes, ``match`` a
        substring of a description, ``limit`` 1..1,000, default 100): ``.holders`` and the
        ``.cursor`` of the next page (None at the end). With tokens, only the namespaces the
        principal may use. A client of several servers asks the namespace's server, or,
        without a namespace, each server in turn (its cursor says which)."""
        args = (namespace, table, var, session, match, cursor, limit)
        return self._drive(_calls.listing(self, "holders", HOLDERS, *args))  # type: ignore[no-any-return]

    def sessions(
        self,
        namespace: str | None = None,
        table: str | None = None,
        var: str | None = None,
        *,
        session: str | None = None,
        match: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> SessionsPage:
        """A page of the sessions (filters as :meth:`holders`; ``namespace``, ``table`` and
        ``var``: of an entry the session holds): ``.sessions`` and ``.cursor``."""
        args = (namespace, table, var, session, match, cursor, limit)
        return self._drive(_calls.listing(self, "sessions", SESSIONS, *args))  # type: ignore[no-any-return]

    def waiters(
        self,
        namespace: str | None = None,
        table: str | None = None,
        var: str | None = None,
        *,
        session: str | None = None,
        match: str | None = None,
        cursor: str | None = None,
        limit: int | None = None,
    ) -> WaitersPage:
        """A page of the parked transactions (filters as :meth:`holders`): ``.waiters`` and
        ``.cursor``."""
        args = (namespace, table, var, session, match, cursor, limit)
        return self._drive(_calls.listing(self, "waiters", WAITERS, *args))  # type: ignore[no-any-return]

    def release(
        self, namespace: str, table: str, var: str, *, session: str | None = None
    ) -> Released:
        """Force-release: remove the entries of one variable (only ``session``'s when given),
        waking its waiters; their holders get a ``lost`` event with reason ``released``. An
        admin call: with tokens, it needs a token marked ``admin = true`` (else FORBIDDEN).
        Returns how many entries went and the fence of the change. Never re-sent after a
        dropped connection (a repeat could remove a later holder's entry)."""
        return self._drive(_calls.release(self, namespace, table, var, session))

    def subscribe(
        self, namespace: str, table: str | None = None, *, sink: FeedSink | None = None
    ) -> int:
        """Subscribe this client to the change feed of ``namespace`` (one ``table`` of it
        when given): grants, releases, expiries, lost locks and kills arrive as
        :class:`~protocol.FeedEvent` values, taken with :meth:`feed_events` (this face reads
        them while some call, or :meth:`process_events`, reads the connection). Returns the
        subscription's id. A subscription outlives its connection: after a reconnect the
        client makes it again, with the same id, before anything else is sent; the events of
        the gap are not seen (``local_statistics().connections`` tells that one happened).
        With ``sink`` (a :class:`~client._core.FeedSink`), the events go to it instead of
        :meth:`feed_events`, and it is told of reconnects."""
        return self._drive(_calls.subscribe(self, namespace, table, sink))

    def unsubscribe(self, subscription: int) -> bool:
        """End a subscription; False when the server did not know it (its connection
        dropped meanwhile, or it ended already)."""
        return self._drive(_calls.unsubscribe(self, subscription))

    def feed_events(self) -> list[FeedEvent]:
        """The change-feed events received since the last call, in arrival order (an event's
        ``dropped`` counts the events the server could not send before it, because this
        client did not read fast enough)."""
        if self._router is not None:
            return self._shard_feed()
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
        for state in self._core.open_sessions():
            state._stop_keepalive()
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
                try:
                    shard = LockClient(
                        servers=shard_servers(server),
                        timeout=self.timeout,
                        client_name=self._core.client_name,
                        connect_timeout=self.connect_timeout,
                        token=self._core.token,
                        ssl_context=self.ssl_context,
                    )
                except ServerUnavailable as exc:
                    raise unavailable(server, exc) from exc
                self._shards[server] = shard
        if self._closed:  # closed while connecting: close() may have missed it
            shard.close()
            self.check_open()
        return shard

    # --- the session port (client._port.SessionPort): how a Session sends; not for applications

    def request(self, kind: int, rid: int, data: bytes, timeout: float) -> Any:
        """Session port: send the framed request ``data`` (request id ``rid``, a
        ``client._wire`` kind) and wait at most ``timeout`` seconds for its reply, reading
        the socket if no other thread is. Reconnects first when needed (ServerUnavailable
        "not sent" when it cannot); an idempotent kind is re-sent once after a drop; raises
        ServerError, ConnectionLost, ClientTimeout, ClientClosed."""
        deadline = monotonic() + timeout
        retried = False
        while True:
            conn, unsent = self._send(rid, kind, None, data)
            value, failure = self._wait(conn, rid, deadline)
            if failure is not None:
                if self._closed and isinstance(failure, ConnectionLost):
                    raise ClientClosed("the client was closed with the request in flight") from (
                        failure
                    )
                if unsent:
                    # Nothing went out (the connection broke first, e.g. SHUTTING_DOWN read by
                    # another thread): safe to send on a new connection.
                    continue
                raise failure
            if value is not RETRY:
                return value
            if retried:
                raise ConnectionLost(
                    "the connection dropped twice with the same idempotent request in flight"
                )
            retried = True
            self._core.retries += 1

    def request_batch(self, rids: list[int], data: bytes, timeout: float) -> list[Any]:
        """Session port: send a batch's frames in one ``sendall`` and wait for all its
        calls; the outcomes (Result or the call's exception) in call order. Never re-sent
        once it may have gone out (its calls are Executes); the batch waits under its first
        request id."""
        deadline = monotonic() + timeout
        while True:
            batch = Batch(rids, rids[0])
            conn, unsent = self._send(rids[0], BATCH, batch, data)
            outcomes: list[Any] = self._wait(conn, rids[0], deadline, batch)[0]
            if unsent:
                continue  # nothing went out: safe to send on a new connection
            if self._closed:
                for item in outcomes:
                    if isinstance(item, ConnectionLost):
                        raise ClientClosed("the client was closed with the batch in flight")
            return outcomes

    def _send(
        self, rid: int, kind: int, batch: Batch[int] | None, data: bytes
    ) -> tuple[_Connection, bool]:
        """Register the request (or every call of ``batch``) on a live connection, then send
        ``data``; reconnects first when needed (ServerUnavailable "not sent" when it cannot).
        Returns the connection and whether the bytes stayed unsent (it broke between
        registering and sending: the break resolved the request, which is safe to send again
        on a new connection)."""
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None:
                try:
                    conn = self._reconnect()
                except ServerUnavailable as exc:
                    raise not_sent(exc) from exc
            if conn.reader_ident == threading.get_ident():
                raise LockClientError(
                    "a lost-listener must not call the client: it runs in the thread that "
                    "reads the connection (hand the event to another thread)"
                )
            with self._cond:
                if conn.broken is not None:
                    continue
                # Idle (nothing in flight, so nobody reads) with something waiting: read it
                # first, as the reader (events, late replies, or the server's close or
                # closing error, which breaks the connection: the request then goes to a new
                # one). Under the lock, so no other reader can take what the probe sees.
                catch_up = not conn.reader_busy and not conn.wire.pending and _readable(conn.sock)
                if catch_up:
                    conn.reader_busy = True
                    conn.reader_ident = threading.get_ident()
                elif batch is None:
                    conn.wire.register(rid, kind, rid)
                else:
                    conn.wire.register_batch(batch)
            if catch_up:
                try:
                    self._read(conn, None, monotonic())  # one read: what has arrived
                finally:
                    self._leave_reader(conn)
                continue
            error: OSError | None = None
            with self._send_lock:
                unsent = conn.broken is not None  # broke between registering and sending
                if not unsent:
                    try:
                        conn.sock.sendall(data)
                    except OSError as exc:
                        error = exc
            if error is not None:
                self._break(conn, f"sending failed: {error}")
            return conn, unsent

    def _wait(
        self, conn: _Connection, rid: int, deadline: float, batch: Batch[int] | None = None
    ) -> _Resolution:
        cond = self._cond
        timed_out = False
        with cond:
            while True:
                out = conn.done.pop(rid, None)
                if out is not None:
                    return out
                if not conn.reader_busy:
                    conn.reader_busy = True
                    conn.reader_ident = threading.get_ident()
                    break
                remaining = deadline - monotonic()
                if remaining <= 0:
                    self._abandon(conn, rid, batch)
                    timed_out = True
                    break
                cond.wait(remaining)
        if timed_out:  # outside the condition's lock: giving up takes it
            self._give_up_on(conn)
            raise self._timeout(rid, batch)
        try:
            out = self._read(conn, rid, deadline, batch)
        finally:
            self._leave_reader(conn)
        if out is None:
            self._give_up_on(conn)
            raise self._timeout(rid, batch)
        return out

    def _give_up_on(self, conn: _Connection) -> None:
        """A call timed out. Connected to a replica of a group, stop using that replica: it
        may be paused or cut off, and a group's session lives on elsewhere, so the next call
        (a recipe's cleanup, a keepalive) goes to another member instead of waiting on the
        same one. A single server keeps its connection (a late reply is dropped)."""
        members = self._core.members
        if members is not None and len(members.members) > 1:
            self._break(conn, "no reply within the timeout: trying another replica")

    @staticmethod
    def _abandon(conn: _Connection, rid: int, batch: Batch[int] | None) -> None:
        if batch is None:
            conn.wire.abandon(rid)
        else:
            conn.wire.abandon_batch(batch)

    @staticmethod
    def _timeout(rid: int, batch: Batch[int] | None = None) -> ClientTimeout:
        if batch is not None:
            return ClientTimeout(
                f"not every reply to the batch of {len(batch.rids)} calls (request {rid} "
                "onwards) came within the timeout; their outcome is unknown (late replies are "
                "dropped)"
            )
        return ClientTimeout(
            f"no reply to request {rid} within the timeout; its outcome is unknown "
            "(a late reply is dropped)"
        )

    def _read(
        self,
        conn: _Connection,
        rid: int | None,
        deadline: float,
        batch: Batch[int] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> _Resolution | None:
        """As the reader: read until ``rid`` is resolved (returns its resolution) or the
        deadline passes (abandons ``rid``, or every call of ``batch``, returns None). With
        ``rid`` None, read at least once and until the deadline (or until ``until()``),
        dispatching what arrives."""
        sock = conn.sock
        cond = self._cond
        core = self._core
        attempted = False
        while True:
            remaining = deadline - monotonic()
            if remaining <= 0 and (rid is not None or attempted):
                if rid is None:
                    return None
                with cond:
                    self._abandon(conn, rid, batch)
                    return conn.done.pop(rid, None)
            attempted = True
            try:
                sock.settimeout(max(remaining, _MIN_SOCKET_TIMEOUT))
                data = sock.recv(_RECV_SIZE)
                reason = "the server closed the connection"
            except TimeoutError:
                continue
            except OSError as exc:
                data = b""
                reason = f"receiving failed: {exc}"
            mine: _Resolution | None = None
            with cond:
                if not data:
                    self._break_locked(conn, reason)
                    return None if rid is None else conn.done.pop(rid, None)
                wire = conn.wire
                resolved, events = wire.feed(data)
                for waiter, value, error in resolved:
                    if waiter == rid:
                        mine = (value, error)
                    else:
                        conn.done[waiter] = (value, error)
                closing = wire.closing
                if closing:
                    # The server's last words (e.g. SHUTTING_DOWN) or garbage: it reads
                    # nothing more. Resolve the rest now (notifies the waiters).
                    self._break_locked(conn, "the server ended the connection")
                    if mine is None and rid is not None:
                        mine = conn.done.pop(rid, None)
                elif len(resolved) > (mine is not None):
                    cond.notify_all()
            if events:
                core.dispatch(events)
            if mine is not None or closing:
                return mine
            if until is not None and until():
                return None

    def _leave_reader(self, conn: _Connection) -> None:
        with self._cond:
            conn.reader_busy = False
            conn.reader_ident = 0
            close_now = conn.broken is not None
            self._cond.notify_all()
        if close_now:
            self._close_socket(conn)

    def send_unanswered(self, data: bytes) -> None:
        """Session port: send an unregistered request (its reply is dropped) if connected;
        errors ignored (the next call notices a broken connection)."""
        conn = self._conn
        if conn is None:
            return
        with self._send_lock:
            if conn.broken is None:
                with contextlib.suppress(OSError):
                    conn.sock.sendall(data)

    # --- connection lifecycle ---------------------------------------------------------------------

    def _reconnect(self) -> _Connection:
        self._not_a_connection()
        with self._connect_lock:
            self.check_open()
            conn = self._conn
            if conn is not None and conn.broken is None:
                return conn
            # A member of this client's entry, in the order of ``Members.round``.
            new: _Connection = self._drive(_calls.open_member(self, conn is not None))
            self._conn = conn = new
            self._socket.sock = conn.sock
            # The losses no connection could hear (a restarted server, a session whose
            # guarantee ran out meanwhile), before the keepalives re-create those sessions.
            self._core.reconnected(monotonic())
            # Touch the open sessions on the new connection (so its LockLost events come here,
            # and their idle timers restart); the replies are dropped by id.
            try:
                with self._send_lock:
                    for data in self._core.keepalives() + self._core.resubscriptions():
                        conn.sock.sendall(data)
            except OSError as exc:
                self._break(conn, f"sending failed: {exc}")
            return conn

    def _open_to(self, address: ServerAddress) -> _Connection:
        host, port = address.host, address.port
        try:
            sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        except OSError as exc:
            raise ServerUnavailable(f"cannot connect to {address.id}: {exc}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ssl_context is not None:  # the handshake runs here, within the timeout
                sock = self.ssl_context.wrap_socket(sock, server_hostname=host)
            conn = _Connection(sock, Wire(self._core))
            rid, data = self._core.hello()
            conn.wire.register(rid, HELLO, rid)
            sock.sendall(data)
            out = self._read(conn, rid, monotonic() + self.connect_timeout)
            if out is None:
                raise ClientTimeout("no Welcome within connect_timeout")
            value, error = out
            if error is not None:
                raise error
        except (OSError, LockClientError) as exc:
            sock.close()
            raise handshake_error(exc) from exc
        self._core.handshake_done(value)
        return conn

    def _break(self, conn: _Connection, reason: str) -> None:
        with self._cond:
            self._break_locked(conn, reason)
            close_now = not conn.reader_busy
        if close_now:
            self._close_socket(conn)

    def _break_locked(self, conn: _Connection, reason: str) -> None:
        if conn.broken is not None:
            return
        conn.broken = reason
        for waiter, value, error in conn.wire.fail_all(reason):
            conn.done[waiter] = (value, error)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv
        self._cond.notify_all()

    def _close_socket(self, conn: _Connection) -> None:
        with self._send_lock:
            conn.sock.close()
