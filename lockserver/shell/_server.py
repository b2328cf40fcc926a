"""The trio shell: accept connections, read frames, call the lock core, write replies, run timers.

The shell is four modules, one reason to change each, composed here: this one (``Server``:
listeners, the accept loop, each connection's lifecycle and TLS handshake, the timers,
shutdown, statistics), ``_reading.py`` (``Reader``: the epoll poller and the read loops,
received bytes in a batch at a time), ``_requests.py`` (``RequestHandler``: serving a batch,
one call through the lock core's door per request, delivering what comes back) and
``_peer.py`` (``Peer``: one connection's socket, outbox and closing). The lock state and every
decision about it live behind the door, ``engine.LockCore``. A connection whose first bytes
are an HTTP request (the reader tells, once) is handed to the HTTP face: ``_http.py`` serves
it, ``_endpoints.py`` answers its paths, ``_metrics.py`` renders ``/metrics``; it then leaves
``clients`` for ``http_clients`` and its own limits (``http_max_connections``).

Why / rules kept (issue #3, STYLE.md):
- The lock core is called synchronously; nothing awaits between reading a batch of requests
  and queueing their replies, so transactions are serializable without a lock.
- Time is ``trio.current_time()`` everywhere (tests run under ``MockClock``). The one wall-clock
  read is the fence epoch at start (``time.time_ns() // 1000``), so fences keep increasing
  across restarts.
- No client can make the server wait on it: a client that does not read is dropped once its
  unsent bytes pass ``max_send_buffer`` or a blocked send makes no progress for
  ``send_timeout``; one that sends nothing is dropped after ``handshake_timeout`` /
  ``idle_timeout``; one that starts a frame and does not finish it within ``frame_timeout``
  is dropped, however steadily its bytes trickle in.
- What all connections hold together is bounded, not only what each holds: bytes of
  incomplete request frames by ``max_receive_total`` (the receive that would pass it closes
  its connection with OVERLOADED), unsent bytes by ``max_send_total`` (the connection whose
  outbox grows past it is dropped as a slow consumer). Others are unaffected.

Theory of operation
===================
**Sockets.** Each connection is a plain non-blocking stdlib socket; no trio Stream or trio
socket wraps it. The issue measured trio's Stream layer at ~26 us of server CPU per request,
and a trio socket yields to the scheduler on *every* successful syscall. Here the only yields
are the poller's (or a TLS reader's) waits for readiness, once per batch (``_reading.py``).
One 64 KiB receive buffer is shared by all connections: a batch is decoded synchronously
before the next await, so nobody else can touch it meanwhile. TCP_NODELAY is set: replies are
complete frames and must not wait for Nagle.

**The outbox, the writer and closing** live in ``_peer.py``: replies are appended to the
connection's outbox and the whole batch goes out with one non-blocking ``send``; a writer task
exists only while the kernel refuses bytes; a client that does not read is dropped; a
connection closed on purpose lingers so its last error reply survives.

**TLS** (issue #8, docs/security.md, ``_auth.py``; tokens are checked in ``_requests.py``).
With TLS the accepted socket is wrapped in an ``ssl.SSLSocket`` (non-blocking, the handshake
driven by the same readiness waits before the read loop); the loops only add TLS's "want
read/write" exceptions to the plain ``BlockingIOError``, so the plain path costs the same.

**Timers.** One timer sleeps until ``min(core.next_deadline(), now + sweep_interval)`` (a
request that parks a transaction moves it earlier: ``Alarm``) and then makes one call,
``core.advance``: expiries, wait deadlines and the waiters they let run; a trust ticker wakes
on every trust tick boundary; a reaper enforces the handshake, idle and
frame timeouts by scanning the connections (O(connections) once per second at most, which
keeps the per-request cost to one attribute store; the frame timeout's start is noted by the
reader only when a receive leaves part of a frame buffered).

**Statistics** are read per ``stats`` request, which anybody greeted may send, thousands per
64 KiB: nothing here walks the connections or the heap per call (the blocked connections
are counted as they block and unblock, ``Totals``; the frozen-object count is taken once at
start, ``_gcstats.py``), and the requests of one turn of a connection share one snapshot
(``_requests.py``). A token restricted to some namespaces reads its own counts (``scope``,
``LockCore.visible_counts``; docs/security.md).

**Probes at the limits** (issue 30). A connection past ``max_connections`` whose first bytes
(within a quarter second) are an HTTP request goes to the HTTP face instead of being refused,
and at ``http_max_connections`` a new HTTP connection takes the slot of the one that has
waited longest (``_http.py``): a liveness probe is answered however full the server is.

**Shutdown.** ``RunningServer.shutdown()`` stops accepting, stops every reader between
batches, lets queued replies drain, sends SHUTTING_DOWN, closes; all bounded by
``_SHUTDOWN_GRACE`` so SIGTERM exits within a second.

Prior art: h11/wsproto's sans-I/O split (the protocol package), trio's ``SocketStream`` and
``serve_listeners`` (what this inlines), Apache's lingering close, Redis's client output
buffer limits (``client-output-buffer-limit``) for the slow-consumer rule.
"""

from __future__ import annotations

import errno
import logging
import math
import secrets
import socket
import ssl
import time
from typing import Any, Final

import attrs
import trio

from lockserver._auth import Authenticator, Principal, SecurityConfigError, server_ssl_context
from lockserver._build import build
from lockserver._config import (
    ConfigError,
    ServerConfig,
    advertised_limits,
    engine_limits,
    server_version,
    skip_revisions,
)
from lockserver._gcstats import GcPauses
from lockserver._peer import CLOSE_GRACE, Peer, Totals, linger
from lockserver._trust import TrustMonitor
from lockserver.engine import Door, Engine, EngineLimits, LockCore, Output, WaitLimits
from lockserver.http import (
    Durations,
    Endpoints,
    History,
    HttpConnection,
    HttpCounters,
    HttpLimits,
    ServerCollector,
    is_http,
    too_many,
)
from lockserver.replication import (
    Genesis,
    Replica,
    ReplicatedDoor,
    ReplicationSettings,
    etcd_client,
    etcd_endpoints,
    read_group_secret,
)
from protocol import (
    PROTOCOL_VERSION,
    Connection,
    ErrorCode,
    ErrorReply,
    Role,
    State,
    TreeLimits,
    Welcome,
)

from ._busypoll import BusyPoll
from ._http_listings import HttpListings
from ._reading import Reader
from ._requests import Alarm, RequestHandler
from ._statistics import ServerStatistics, ShellFigures

__all__ = ["RunningServer", "serve"]

log = logging.getLogger("lockserver")

_RECV_SIZE: Final = 64 * 1024
AWAITING_HELLO: Final = State.AWAITING_HELLO
#: Bound on closing every connection at shutdown (SIGTERM must exit within a second).
_SHUTDOWN_GRACE: Final = 0.6
#: Longest sleep of the timeout reaper.
_REAP_INTERVAL: Final = 1.0
# accept() errors that mean "out of resources now", not "the listener is broken": back off.
_ACCEPT_BACKOFF_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
_ACCEPT_RETRY_ERRNOS: Final = frozenset(
    {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EAGAIN, errno.EINTR}
)


class RunningServer:
    """A listening server, handed out by ``serve`` through ``task_status.started``.

    ``host``/``port``: the bound address of the first listener (the real port when 0 was
    asked); ``addresses``: every bound address. ``core``: the lock core (the door every
    change goes through); ``engine``/``trust``: the live engine behind it and the trust
    monitor (for tests and embedding: read them only from the server's trio run).
    """

    __slots__ = (
        "_shell",
        "addresses",
        "config",
        "core",
        "engine",
        "host",
        "port",
        "replica",
        "started_at",
        "trust",
    )

    def __init__(self, shell: Server, addresses: list[tuple[str, int]]) -> None:
        self._shell = shell
        self.config: ServerConfig = shell.config
        self.core: Door[Peer] = shell.core
        self.engine: Engine = shell.core.engine
        self.trust: TrustMonitor = shell.trust
        #: The replica of a replicated group (None for a single server).
        self.replica: Replica | None = shell.replica
        self.started_at: float = shell.started_at
        self.addresses: tuple[tuple[str, int], ...] = tuple(addresses)
        self.host: str = addresses[0][0]
        self.port: int = addresses[0][1]

    def __repr__(self) -> str:
        return f"<RunningServer {self.address}>"

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the first listener (IPv6 hosts in brackets)."""
        return _format_address(self.host, self.port)

    def statistics(self) -> dict[str, Any]:
        """The nested figures the GetStatistics request answers (docs/configuration.md)."""
        return self._shell.wire_statistics(trio.current_time())

    def shutdown(self) -> None:
        """Stop accepting, let in-flight replies drain, close every connection; ``serve``
        then returns. Idempotent, does not wait: see :meth:`aclose`."""
        self._shell.shutdown()

    async def aclose(self) -> None:
        """:meth:`shutdown` and wait until ``serve`` has finished."""
        self._shell.shutdown()
        await self._shell.closed.wait()


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --- replicated groups: the welcome's identity (internal hook) ---------------------------------
# The replication mode sets it; the client tests set it to run standalone servers as the
# replicas of one group (same instance, group name, replica list). Without it, the welcome is a
# standalone server's: its own instance, no group, no replicas.


@attrs.frozen
class GroupIdentity:
    """What the welcome of a replica of a replicated group says (PROTOCOL.md §4
    "welcome"): ``group`` (its name), ``instance`` (the group's, the same from every
    replica, instead of one drawn per process) and ``replicas`` (the group's replicas,
    ``host:port``)."""

    group: str
    instance: str
    replicas: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if not self.group or not self.instance:
            raise ValueError("a group identity needs a group name and an instance")


async def serve(
    config: ServerConfig,
    *,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
    group: GroupIdentity | None = None,
) -> None:
    """Listen on ``config.host:config.port`` and serve until cancelled or shut down.

    Calls ``task_status.started(running)`` with the :class:`RunningServer` once listening, so
    ``running = await nursery.start(serve, config)`` gives the real port. Cancelling ``serve``
    closes everything at once; ``running.shutdown()`` closes gracefully and lets it return.
    ``group`` (internal, keyword-only): welcome clients as a replica of that group.
    """
    try:
        ssl_context = server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
        keys = read_group_secret(config.group_secret_file) if config.group_secret_file else None
        # A replica's etcd client: its files are read (and its warnings logged) now.
        etcd_connection = etcd_client(config) if config.replicate else None
    except SecurityConfigError as exc:
        raise ConfigError(str(exc)) from None
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    try:
        if not config.replicate:
            shell = Server(config, listeners, ssl_context, group=group)
            await shell.run(task_status)
            return
        # A replica of a group (docs/replication.md): the group's state comes from etcd
        # before the first client is accepted.
        settings = ReplicationSettings(
            endpoints=etcd_endpoints(config.replicate),
            group=config.group,
            lease_ttl=config.replica_lease_ttl,
            snapshot_every=config.replica_snapshot_every,
            snapshot_chunk=config.replica_snapshot_chunk,
            snapshot_rate=config.replica_snapshot_rate,
            commit_poll=config.replica_commit_poll,
            skip_revisions=skip_revisions(config.skip_revision),
        )
        assert etcd_connection is not None
        async with etcd_connection as etcd:
            host, port = listeners[0].socket.getsockname()[:2]
            replica = await Replica.join(
                settings, etcd, _advertised(str(host), int(port)), _genesis(config), keys
            )
            shell = Server(config, listeners, ssl_context, replica=replica)
            await shell.run(task_status)
    finally:
        for listener in listeners:
            listener.socket.close()


#: How long a connection past ``max_connections`` may take to send its first bytes, to be
#: told from a health probe (HTTP, served) or not (refused).
_PROBE_WAIT: Final = 0.25


async def _first_bytes(sock: socket.socket) -> bytes:
    """What ``sock`` received first, waiting at most _PROBE_WAIT (b"": nothing, or an
    error)."""
    with trio.move_on_after(_PROBE_WAIT):
        await trio.lowlevel.wait_readable(sock)
    try:
        return sock.recv(_RECV_SIZE)
    except OSError:  # nothing yet (BlockingIOError), or reset
        return b""


def _advertised(host: str, port: int) -> str:
    """The address other machines reach this replica at (a wildcard becomes the host name)."""
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return _format_address(host, port)


def _genesis(config: ServerConfig) -> Genesis:
    """The settings a group is created with when this replica is its first."""
    return Genesis(
        started_at=time.time(),
        instance=secrets.token_hex(8),
        authenticated=bool(config.tokens),
        limits={**engine_limits(config, "store"), **engine_limits(config, "feed")},
        wait_limits=engine_limits(config, "wait"),
    )


class Server:
    """Everything ``serve`` runs: the lock core, the connections, the timers.

    Composes the request handler (``requests``, ``_requests.py``) and the reader
    (``reader``, ``_reading.py``); owns the connections, the listeners and the timers."""

    def __init__(
        self,
        config: ServerConfig,
        listeners: list[trio.SocketListener],
        ssl_context: ssl.SSLContext | None = None,
        *,
        replica: Replica | None = None,
        group: GroupIdentity | None = None,
    ) -> None:
        now = trio.current_time()
        self.config = config
        self.ssl_context = ssl_context
        # None: no tokens configured, every connection is ANONYMOUS and may do everything.
        auth = Authenticator(config.tokens) if config.tokens else None
        self.started_at = now
        self.hostname = socket.gethostname()
        # The one wall-clock reading: the fence epoch, and the offset that turns uptime into
        # the wall-clock times people read (listings, denials, the feed, Welcome.started_at).
        # Uptime is monotonic: a wall clock set later does not move those times.
        fence_epoch = time.time_ns() // 1000
        self.wall_at_start = fence_epoch / 1_000_000
        self.replica = replica
        self.core: Door[Peer]
        if replica is None:
            self.core = LockCore(
                started_at=now,
                host=self.hostname,
                fence_epoch=fence_epoch,
                limits=EngineLimits(**engine_limits(config, "store")),
                wait_limits=WaitLimits(**engine_limits(config, "wait")),
                authenticated=auth is not None,
                **engine_limits(config, "feed"),
            )
        else:
            # The group's state, behind the same calls (answers come as the log is applied).
            self.core = ReplicatedDoor(replica)
            self.wall_at_start = replica.genesis.started_at
        self.trust = TrustMonitor(config.trust, started_at=now)
        # The timer's sleep; a request that parks moves it earlier (see _timer_loop).
        self.alarm = Alarm()
        self.listeners = listeners
        addresses = []
        for listener in listeners:
            sockname = listener.socket.getsockname()
            addresses.append((str(sockname[0]), int(sockname[1])))
        self.running = RunningServer(self, addresses)
        self.tree_limits = TreeLimits(
            max_depth=config.max_depth,
            max_ops=config.max_ops,
            max_name=config.max_name,
            max_text=config.max_text,
            max_value=config.max_value,
            max_ttl=config.max_ttl,
        )
        self.limits = advertised_limits(config)  # what the welcome and stats report
        self.version = server_version()
        self.build = build()  # "pure" or "compiled" (lockserver/_build.py)
        # Drawn at every start: a client that reconnects and sees another instance knows
        # that every session and entry of the old one is gone (PROTOCOL.md "welcome"). A
        # replica of a group says the group's instead, and its name and replicas.
        if replica is not None:
            group = GroupIdentity(
                replica.settings.group,
                replica.genesis.instance,
                tuple(replica.state.replicas.values()),
            )
        self.group = group
        self.instance = secrets.token_hex(8) if group is None else group.instance
        self.welcome = Welcome(
            PROTOCOL_VERSION,
            f"lockserver {self.version}",
            self.hostname,
            self.limits,
            self.instance,
            self.wall_at_start,
            "" if group is None else group.group,
            () if group is None else group.replicas,
        )
        self.requests = RequestHandler(
            config, self.core, self.trust, auth, self.welcome, self.alarm, self.statistics
        )
        # What the connections hold together (incomplete frames, unsent bytes) and its bounds.
        self.totals = Totals(max_receive=config.max_receive_total, max_send=config.max_send_total)
        self.durations = Durations()  # request durations, per read pass (/metrics)
        self.gc_pauses = GcPauses()  # collector pauses while serving (statistics "gc")
        self.reader = Reader(
            self.requests.process,
            totals=self.totals,
            busy_poll=BusyPoll(config.busy_poll),  # the poller's spin policy
            tls=ssl_context is not None,
            recv_size=_RECV_SIZE,
            durations=self.durations,
            counted=self.requests,
            after_pass=self.gc_pauses.after_pass,
        )
        self.recv_buffer = self.reader.recv_buffer  # scratch space for lingering closes too
        self.clients: set[Peer] = set()
        self.closed = trio.Event()
        self.shutting_down = False
        self.accept_scope: trio.CancelScope | None = None
        self.conn_nursery: trio.Nursery | None = None
        self.next_id = 0
        # counters (statistics "server" section; the request and read counters are kept by
        # the handler and the reader)
        self.connections_total = 0
        self.connections_refused = 0
        self.internal_errors = 0
        self.slow_consumers_dropped = 0
        self.handshake_timeouts = 0
        self.idle_timeouts = 0
        self.frame_timeouts = 0
        # HTTP on the same port (_http.py, _endpoints.py): its connections, once sniffed,
        # leave self.clients for this set and are bounded by http_max_connections.
        self.http = HttpCounters()
        self.http_clients: set[HttpConnection] = set()
        self.http_limits = HttpLimits(
            max_header=config.http_max_header,
            request_timeout=config.http_request_timeout,
            idle_timeout=config.http_idle_timeout,
            send_timeout=config.send_timeout,
        )
        self.history = History()  # the status page's chart, sampled by the trust ticker
        self.endpoints = Endpoints(
            config,
            statistics=self.wire_statistics,
            scope=self.requests.scope,
            shutting_down=lambda: self.shutting_down,
            history=self.history,
            collector=ServerCollector(
                lambda: self.wire_statistics(trio.current_time()),
                durations=self.durations,
                gc_pauses=self.gc_pauses,
                http=self.http,
                version=self.version,
            ),
            auth=auth,
            instance=self.instance,
        )
        HttpListings(self.requests, self.core, self.tree_limits).install(self.endpoints)
        if replica is not None:
            replica.trust = self.trust.trust
            replica.on_outputs = self._deliver_applied
            replica.on_reset = self._reset_connections
            replica.wake = self.alarm.wake_by
            replica.on_replicas = self._replicas_changed

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[RunningServer]) -> None:
        self.gc_pauses.install()
        try:
            async with trio.open_nursery() as timers:
                timers.start_soon(self._timer_loop)
                timers.start_soon(self._trust_loop)
                timers.start_soon(self._reap_loop)
                if self.replica is not None:
                    await timers.start(self.replica.run)
                if self.reader.poller is not None:
                    timers.start_soon(self.reader.poll_loop)
                async with trio.open_nursery() as conns:
                    self.conn_nursery = conns
                    async with trio.open_nursery() as accepting:
                        self.accept_scope = accepting.cancel_scope
                        for listener in self.listeners:
                            accepting.start_soon(self._accept_loop, listener.socket)
                        log.info(
                            "lockserver %s (%s build) listening on %s",
                            self.version,
                            self.build,
                            self.address,
                        )
                        task_status.started(self.running)
                    # Only reached after shutdown(): accepting has stopped.
                    for listener in self.listeners:
                        listener.socket.close()
                    log.info("shutting down: closing %d connection(s)", len(self.clients))
                    code, why = ErrorCode.SHUTTING_DOWN, "the server is shutting down"
                    if self.replica is not None:
                        # SHUTTING_DOWN promises that a request left unanswered was not
                        # executed; a replica cannot promise it: a request it proposed to
                        # the group's log may commit there after it stopped (the fault lab
                        # found a compare-and-set told "not executed" that took effect).
                        code = ErrorCode.UNAVAILABLE
                        why = (
                            "this replica is shutting down: a request of this connection "
                            "still unanswered may have committed in the group (look on "
                            "another replica)"
                        )
                    for c in list(self.clients):
                        c.stop(code, why)
                    for h in list(self.http_clients):
                        h.stop()
                    conns.cancel_scope.deadline = trio.current_time() + _SHUTDOWN_GRACE
                timers.cancel_scope.cancel()
            log.info("stopped")
        finally:
            self.gc_pauses.uninstall()
            self.reader.close()
            self.closed.set()

    @property
    def address(self) -> str:
        return ", ".join(_format_address(h, p) for h, p in self.running.addresses)

    def shutdown(self) -> None:
        if self.shutting_down:
            return
        self.shutting_down = True
        if self.accept_scope is not None:
            self.accept_scope.cancel()

    # --- accepting ----------------------------------------------------------------------------

    async def _accept_loop(self, listener: trio.socket.SocketType) -> None:
        assert self.conn_nursery is not None
        nursery = self.conn_nursery
        config = self.config
        while True:
            try:
                tsock, addr = await listener.accept()
            except OSError as exc:
                if exc.errno in _ACCEPT_BACKOFF_ERRNOS:
                    log.error("accept failed (%s); backing off for 0.1 s", exc)
                    await trio.sleep(0.1)
                    continue
                if exc.errno in _ACCEPT_RETRY_ERRNOS:
                    continue
                raise
            sock = socket.socket(fileno=tsock.detach())
            sock.setblocking(False)
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            peer = _format_address(str(addr[0]), int(addr[1])) if addr else "?"
            if len(self.clients) >= config.max_connections:
                nursery.start_soon(self._refuse, sock, peer)
                continue
            self.next_id += 1
            self.connections_total += 1
            if self.ssl_context is not None:
                try:
                    sock = self.ssl_context.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except OSError as exc:
                    log.debug("connection from %s: TLS setup failed: %s", peer, exc)
                    sock.close()
                    continue
            proto = Connection(
                Role.SERVER,
                max_frame=config.max_frame,
                limits=self.tree_limits,
                require_hello=True,
            )
            c = Peer(
                sock,
                f"#{self.next_id} ({peer})",
                proto,
                trio.current_time(),
                max_send_buffer=config.max_send_buffer,
                send_timeout=config.send_timeout,
                on_slow=self._slow_consumer,
                totals=self.totals,
            )
            c.address = peer
            self.clients.add(c)
            log.debug("connection %s opened", c.name)
            nursery.start_soon(self._connection, c)

    async def _refuse(self, sock: socket.socket, peer: str) -> None:
        """A connection past ``max_connections``: refused (TOO_MANY_CONNECTIONS), unless its
        first bytes, within _PROBE_WAIT, are an HTTP request (a health probe: it goes to the
        HTTP face, which has its own limit)."""
        try:
            if self.ssl_context is None:  # (TLS: no plain bytes to look at before a handshake)
                first = await _first_bytes(sock)
                if first and is_http(first[0]):
                    self.next_id += 1
                    self.connections_total += 1
                    await self._serve_http(sock, f"#{self.next_id} ({peer})", first)
                    return
            self.connections_refused += 1
            log.warning(
                "refused connection from %s: %d connections open (max_connections)",
                peer,
                len(self.clients),
            )
            if self.ssl_context is not None:  # a TLS client cannot read a plain frame
                return
            message = (
                f"the server has {len(self.clients)} connections open, the limit "
                f"(max_connections={self.config.max_connections})"
            )
            error = ErrorReply(None, ErrorCode.TOO_MANY_CONNECTIONS, message)
            sock.send(self.requests.encoder.send(error))  # a fresh socket takes one small frame
            with trio.move_on_after(CLOSE_GRACE):
                await linger(sock, self.recv_buffer)
        except OSError:
            pass
        finally:
            sock.close()

    # --- one connection -----------------------------------------------------------------------

    async def _connection(self, c: Peer) -> None:
        try:
            async with trio.open_nursery() as nursery:
                c.nursery = nursery
                http: bytes | None = None
                with c.read_scope:
                    if self.ssl_context is None or await self._tls_handshake(c):
                        http = await self.reader.read_loop(c)
                if http is not None:
                    await self._http(c, http)
                    return
                last = b""
                if c.stop_code is not None:
                    last = self.requests.encoder.send(ErrorReply(None, c.stop_code, c.stop_message))
                await c.finish(last, self.recv_buffer)
                nursery.cancel_scope.cancel()
        except Exception:
            self.internal_errors += 1
            log.exception("connection %s failed", c.name)
        finally:
            self._forget(c)
            c.sock.close()
            log.debug("connection %s closed", c.name)

    async def _http(self, c: Peer, first: bytes) -> None:
        """The connection's first bytes were an HTTP request: serve HTTP on it (it leaves
        the protocol's connections and their limit for the HTTP ones)."""
        self.clients.discard(c)
        await self._serve_http(c.sock, c.name, first)

    async def _serve_http(self, sock: socket.socket, name: str, first: bytes) -> None:
        """Serve HTTP on ``sock``, whose ``first`` bytes are read already, within
        ``http_max_connections``; the caller closes the socket."""
        conn = HttpConnection(
            sock, name, self.http_limits, self.endpoints, self.http, self.recv_buffer
        )
        http = self.http
        if len(self.http_clients) >= self.config.http_max_connections:
            # Room for the newcomer (a health probe must get in): the connection that has
            # waited longest on its client goes, as nginx reuses its idle keep-alive
            # connections. Refused only when none waits (each is being answered right now).
            victim = next(iter(http.waiting), None)
            if victim is None:
                http.refused += 1
                log.warning(
                    "refused HTTP connection %s: %d HTTP connections open, none waiting "
                    "on its client (http_max_connections)",
                    name,
                    len(self.http_clients),
                )
                await conn.refuse(too_many(self.config.http_max_connections))
                return
            http.evicted += 1
            log.info(
                "HTTP connection %s closed to make room for %s: %d HTTP connections open "
                "(http_max_connections)",
                victim.name,
                name,
                len(self.http_clients),
            )
            victim.evict()
            self.http_clients.discard(victim)
            http.open -= 1
        http.accepted += 1
        http.open += 1
        self.http_clients.add(conn)
        try:
            await conn.serve(first)
        finally:
            if conn in self.http_clients:  # (an evicted one left already)
                self.http_clients.discard(conn)
                http.open -= 1

    async def _tls_handshake(self, c: Peer) -> bool:
        """The TLS handshake of a new connection (bounded by the reaper's handshake timeout,
        like the hello). False: it failed, the connection is dropped, others carry on."""
        sock: Any = c.sock
        while True:
            try:
                sock.do_handshake()
                return True
            except ssl.SSLWantReadError:
                await trio.lowlevel.wait_readable(c.fd)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(c.fd)
            except OSError as exc:  # SSLError included: not TLS, bad certificate, reset
                log.info("connection %s: TLS handshake failed: %s", c.name, exc)
                c.dead = True
                return False

    def _slow_consumer(self, c: Peer, why: str) -> None:
        self.slow_consumers_dropped += 1
        log.warning("connection %s dropped as a slow consumer: %s", c.name, why)

    def _forget(self, c: Peer) -> None:
        c.dead = True
        # Its incomplete frame goes with it (its unsent bytes went when its writer ended).
        self.totals.received -= c.pending
        c.pending = 0
        c.frame_started = math.inf
        self.clients.discard(c)
        # Its waiters may have held others back (Waiting): those run now.
        now = trio.current_time()
        self.requests.deliver(self.core.owner_gone(c, now=now, trust=self.trust.trust(now)))

    # --- a replica's deliveries ---------------------------------------------------------------

    def _deliver_applied(self, outs: list[Output[Peer]]) -> None:
        """Send what applying the group's log answered to this replica's connections: each
        output appended to its peer's outbox, then one send per peer (``deliver``)."""
        self.requests.deliver(outs)

    def _replicas_changed(self, replicas: tuple[str, ...]) -> None:
        """A replica registered or departed: later welcomes list the group's replicas now."""
        self.welcome = attrs.evolve(self.welcome, replicas=replicas)
        self.requests.welcome = self.welcome

    def _reset_connections(self, why: str) -> None:
        """The replica cannot answer its connections any more (it lost its place in the
        group, or reloaded the state): close each with UNAVAILABLE; clients reconnect."""
        for c in list(self.clients):
            c.stop(ErrorCode.UNAVAILABLE, f"{why}; reconnect (to any replica of the group)")

    # --- timers -------------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Expiries and wait deadlines, on time: sleeps until the core's next deadline (at
        most ``sweep_interval``); a request that parks moves the wake-up earlier (``Alarm``)."""
        core = self.core
        alarm = self.alarm
        interval = self.config.sweep_interval
        while True:
            wake = trio.current_time() + interval
            deadline = core.next_deadline()
            if deadline is not None and deadline < wake:
                wake = deadline
            with trio.CancelScope(deadline=wake) as scope:
                alarm.scope = scope
                await trio.sleep_forever()
            alarm.scope = None
            try:
                now = trio.current_time()
                self.requests.deliver(core.advance(now, trust=self.trust.trust(now)))
            except Exception:
                self.internal_errors += 1
                log.exception("expiry and wait deadlines failed")

    async def _trust_loop(self) -> None:
        tick = self.config.trust.tick
        started = self.started_at
        while True:
            k = math.floor((trio.current_time() - started) / tick) + 1
            await trio.sleep_until(started + k * tick)
            now = trio.current_time()
            self.trust.tick(now)
            t = self.trust.statistics(now)
            self.history.sample(t.uptime, t.trust, t.norm, t.rate, t.calls_total)

    async def _reap_loop(self) -> None:
        handshake = self.config.handshake_timeout
        idle = self.config.idle_timeout
        frame = self.config.frame_timeout
        timeouts = [t for t in (handshake, idle, frame) if t]
        if not timeouts:
            return
        interval = min(_REAP_INTERVAL, *(t / 4 for t in timeouts))
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for c in list(self.clients):
                if c.stopping or c.dead:
                    continue
                if handshake and c.proto.state is AWAITING_HELLO and now - c.opened_at >= handshake:
                    self.handshake_timeouts += 1
                    log.info("connection %s: no hello within %g s, closing", c.name, handshake)
                    c.stop(None, "")
                elif idle and now - c.last_recv >= idle:
                    self.idle_timeouts += 1
                    log.info("connection %s: idle for %g s, closing", c.name, idle)
                    c.stop(None, "")
                elif frame and now - c.frame_started >= frame:  # frame_started: inf if none
                    self.frame_timeouts += 1
                    log.info(
                        "connection %s: a frame incomplete for %g s (frame_timeout, %d bytes "
                        "buffered), closing",
                        c.name,
                        frame,
                        c.pending,
                    )
                    c.stop(None, "")

    # --- statistics ---------------------------------------------------------------------------

    def statistics(self, now: float, scope: Principal | None = None) -> ServerStatistics:
        """The statistics record (docs/configuration.md "Statistics"); with ``scope`` (a
        principal that may not see the whole server) its counts are the principal's own
        (``LockCore.visible_counts``: docs/security.md)."""
        stats = self._statistics(now)
        if scope is None:
            return stats
        return stats.scoped(scope.name, self.core.visible_counts(scope))

    def wire_statistics(self, now: float, scope: Principal | None = None) -> dict[str, Any]:
        """:meth:`statistics` as the ``stats`` reply's map: what the HTTP face reads."""
        return self.statistics(now, scope).to_wire()

    def _statistics(self, now: float) -> ServerStatistics:
        core, losses = self.core.statistics(now, trust=self.trust.trust(now))
        self.requests.deliver(losses)  # sessions that expired as the counts were taken
        requests = self.requests
        return ServerStatistics(
            server=ShellFigures(
                version=self.version,
                build=self.build,
                host=self.hostname,
                address=self.address,
                uptime=core.engine.uptime,
                connections=len(self.clients),
                connections_blocked=self.totals.blocked,
                connections_total=self.connections_total,
                connections_refused=self.connections_refused,
                requests_total=requests.requests_total,
                protocol_errors=requests.protocol_errors,
                internal_errors=self.internal_errors + requests.internal_errors,
                slow_consumers_dropped=self.slow_consumers_dropped,
                handshake_timeouts=self.handshake_timeouts,
                idle_timeouts=self.idle_timeouts,
                frame_timeouts=self.frame_timeouts,
                overloaded_drops=self.reader.overloaded_drops,
                receive_buffered=self.totals.received,
                send_buffered=self.totals.unsent,
                events_sent=requests.events_sent,
                feed_events_sent=requests.feed_sent,
                feed_events_dropped=requests.feed_dropped,
                sessions_tracked=core.sessions_routed,
                http_connections=self.http.open,
                http_connections_evicted=self.http.evicted,
                http_requests_total=self.http.requests,
                busy_poll=self.reader.busy_poll.to_wire(),
                passes=self.durations.passes_to_wire(),
            ),
            waiting=core.waiting,
            trust=self.trust.statistics(now),
            engine=core.engine,
            limits=self.limits,
            gc=self.gc_pauses.to_wire(),
            replication=None if self.replica is None else self.replica.statistics(),
        )
