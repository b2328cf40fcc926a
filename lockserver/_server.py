"""The trio shell: accept connections, read frames, call the engine, write replies, run timers.

Why / rules kept (issue #3, STYLE.md):
- The engine is called synchronously; nothing awaits between reading a batch of requests and
  queueing their replies, so transactions are serializable without a lock.
- Time is ``trio.current_time()`` everywhere (tests run under ``MockClock``). The one wall-clock
  read is the fence epoch at start (``time.time_ns() // 1000``), so fences keep increasing
  across restarts.
- A malformed frame (1xx, or any ``closes_connection`` code) is answered and the connection
  closed; a well-framed invalid request is answered and the connection stays usable; an
  ``EngineError`` (a limit) is answered, nothing changed; an unexpected exception while serving
  one request answers INTERNAL_ERROR, is logged with its traceback, closes that connection
  only.
- No client can make the server wait on it: a client that does not read is dropped once its
  unsent bytes pass ``max_send_buffer`` or a blocked send makes no progress for
  ``send_timeout``; one that sends nothing is dropped after ``handshake_timeout`` /
  ``idle_timeout``.

Theory of operation
===================
**Sockets.** Each connection is a plain non-blocking stdlib socket; no trio Stream or trio
socket wraps it. The issue measured trio's Stream layer at ~26 us of server CPU per request,
and a trio socket yields to the scheduler on *every* successful syscall. Here the only yields
are the poller's (or a TLS reader's) waits for readiness, once per batch. One 64 KiB receive
buffer is shared by all connections: a batch is decoded synchronously before the next await,
so nobody else can touch it meanwhile. TCP_NODELAY is set: replies are complete frames and
must not wait for Nagle.

**Reading.** Every plain connection is read by ONE poller task (Linux): the sockets sit in
a private level-triggered ``select.epoll`` whose own fd trio watches; on each wake-up the
poller takes up to ``_POLL_BATCH`` ready sockets and, for each, does one ``recv_into``, feeds
the sans-I/O ``protocol.Connection``, decodes and executes every complete frame, appends every
reply to the connection's outbox and sends the outbox with one ``send`` — all synchronously
(a long batch sends every ``_EARLY_FLUSH`` bytes of replies on the way, so the client can
decode them while the rest is served). While traffic is dense the poller keeps polling for a
moment after a batch instead of sleeping (``busy_poll``, the policy in ``_busypoll.py``).
Why: a task per connection costs, per request, a trio task switch and an ``epoll_ctl``
re-arm (trio registers one-shot); one wake-up now serves every connection that has data, and
a socket stays registered while it lives (measured with 64 unpipelined connections: 25-28 ->
21 us of server CPU per request). Each connection still has its task (handshake,
closing, lingering): it parks on an Event the poller sets at EOF, error or a close. A
connection that sent more than one buffer's worth stays ready (level-triggered) and gets its
next turn in the next pass, after the others and the timers (fairness). TLS connections,
whose SSL object may hold decrypted bytes no readiness event announces, and platforms without
epoll keep a reading task each (``_read_loop_task``): ``recv_into`` until EAGAIN, then
``wait_readable``.

**The outbox, the writer and closing** live in ``_client.py``: replies are appended to the
connection's outbox and the whole batch goes out with one non-blocking ``send``; a writer task
exists only while the kernel refuses bytes; a client that does not read is dropped; a
connection closed on purpose lingers so its last error reply survives.

**Sessions and LockLost.** ``users`` maps each session id to the connections that executed in
it (and each connection keeps the ids it used), cleaned when a connection closes or a session
ends or expires. After every batch of requests and every sweep, ``engine.drain_lost()`` is
routed through this map to the connections' outboxes. Sessions outlive connections: a client
that reconnects can keep using its session id, and one connection may use many sessions.

**Security** (issue #8, docs/security.md, ``_auth.py``). With tokens configured the hello
must carry a valid one (else UNAUTHORIZED, closed) and sets the connection's principal; an
Execute is checked against the principal's namespaces (FORBIDDEN) and the session's owner
(``owners``: session id -> principal name, kept here so the engine stays pure; SESSION_CONFLICT),
before the engine sees it. Without tokens all of it is one ``is None`` test per Execute. With
TLS the accepted socket is wrapped in an ``ssl.SSLSocket`` (non-blocking, the handshake driven
by the same readiness waits before the read loop); the loops only add TLS's "want read/write"
exceptions to the plain ``BlockingIOError``, so the plain path costs the same.

**Timers.** A sweeper sleeps until ``min(engine.next_deadline(), now + sweep_interval)``; a
trust ticker wakes on every trust tick boundary; a reaper enforces the handshake and idle
timeouts by scanning the connections (O(connections) once per second at most, which keeps the
per-request cost to one attribute store).

**Shutdown.** ``RunningServer.shutdown()`` stops accepting, stops every reader between
batches, lets queued replies drain, sends SHUTTING_DOWN, closes; all bounded by
``_SHUTDOWN_GRACE`` so SIGTERM exits within a second.

Prior art: h11/wsproto's sans-I/O split (the protocol package), trio's ``SocketStream`` and
``serve_listeners`` (what this inlines), Apache's lingering close, Redis's client output
buffer limits (``client-output-buffer-limit``) for the slow-consumer rule.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import select
import socket
import ssl
import time
from typing import Any, Final

import attrs
import trio

from protocol import (
    PROTOCOL_VERSION,
    Cancel,
    Cancelled,
    Connection,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    GetStatistics,
    Hello,
    LostReason,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Request,
    Role,
    SessionEnded,
    Statistics,
    TransactionResult,
    TreeLimits,
    Welcome,
)

from ._auth import Authenticator, SecurityConfigError, server_ssl_context
from ._busypoll import BusyPoll
from ._client import CLOSE_GRACE, WOULD_BLOCK_READ, Client, linger
from ._config import ConfigError, ServerConfig, server_version
from ._gcstats import GcPauses
from ._trust import TrustMonitor
from .engine import Engine, EngineError, EngineLimits, WaitLimits, WaitQueue

__all__ = ["RunningServer", "serve"]

log = logging.getLogger("lockserver")

_RECV_SIZE: Final = 64 * 1024
#: Ready connections the poller serves per wake-up before it yields to the other tasks.
_POLL_BATCH: Final = 64
# Replies of a long batch go out as soon as this many bytes are ready (~22 results), not at
# the batch's end: the client decodes the first replies while the rest are being served.
# Measured with one connection, 64 transactions per write (lockbench run mutex-uncontended
# --connections 1 --pipeline 64): 24k -> 30k acquire+release pairs/s; server CPU per request
# unchanged within noise (one more send per ~22 replies).
_EARLY_FLUSH: Final = 3072
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
    asked); ``addresses``: every bound address. ``engine``/``trust``: the live engine and
    trust monitor (for tests and embedding; call them only from the server's trio run).
    """

    __slots__ = ("_shell", "addresses", "config", "engine", "host", "port", "started_at", "trust")

    def __init__(self, shell: _Shell, addresses: list[tuple[str, int]]) -> None:
        self._shell = shell
        self.config: ServerConfig = shell.config
        self.engine: Engine = shell.engine
        self.trust: TrustMonitor = shell.trust
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
        return self._shell.statistics(trio.current_time())

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


async def serve(
    config: ServerConfig,
    *,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``config.host:config.port`` and serve until cancelled or shut down.

    Calls ``task_status.started(running)`` with the :class:`RunningServer` once listening, so
    ``running = await nursery.start(serve, config)`` gives the real port. Cancelling ``serve``
    closes everything at once; ``running.shutdown()`` closes gracefully and lets it return.
    """
    try:
        ssl_context = server_ssl_context(config.tls_cert, config.tls_key, config.tls_client_ca)
    except SecurityConfigError as exc:
        raise ConfigError(str(exc)) from None
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    try:
        shell = _Shell(config, listeners, ssl_context)
        await shell.run(task_status)
    finally:
        for listener in listeners:
            listener.socket.close()


class _Poller:
    """The set of plain connections the poller task reads: a level-triggered epoll (Linux)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._by_fd: dict[int, Client] = {}

    def fileno(self) -> int:
        return self._epoll.fileno()

    def add(self, c: Client) -> None:
        self._epoll.register(c.fd, select.EPOLLIN)
        self._by_fd[c.fd] = c

    def discard(self, c: Client) -> None:
        if self._by_fd.get(c.fd) is c:
            del self._by_fd[c.fd]
            with contextlib.suppress(OSError):  # closed already: the kernel dropped it
                self._epoll.unregister(c.fd)

    def ready(self) -> list[Client]:
        """The registered connections with something to read (at most _POLL_BATCH)."""
        by_fd = self._by_fd
        out = []
        for fd, _ in self._epoll.poll(0, _POLL_BATCH):
            c = by_fd.get(fd)
            if c is not None:
                out.append(c)
        return out

    def close(self) -> None:
        self._by_fd.clear()
        self._epoll.close()


class _Shell:
    """Everything ``serve`` runs: the engine, the connections, the timers."""

    def __init__(
        self,
        config: ServerConfig,
        listeners: list[trio.SocketListener],
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        now = trio.current_time()
        self.config = config
        self.max_session_age = config.max_session_age  # read per execute
        self.max_wait = config.max_wait
        self.ssl_context = ssl_context
        # None: no tokens configured, every connection is ANONYMOUS and may do everything.
        self.auth = Authenticator(config.tokens) if config.tokens else None
        # Session id -> name of the principal that created it (only with auth). Entries of
        # sessions the engine no longer has are dropped lazily (see _owner_conflict) and in
        # bulk by the sweeper.
        self.owners: dict[str, str] = {}
        self.started_at = now
        self.hostname = socket.gethostname()
        self.engine = Engine(
            started_at=now,
            host=self.hostname,
            fence_epoch=time.time_ns() // 1000,
            limits=EngineLimits(
                max_sessions=config.max_sessions,
                max_entries=config.max_entries,
                max_entries_per_session=config.max_entries_per_session,
            ),
        )
        self.trust = TrustMonitor(config.trust, started_at=now)
        self.waits = WaitQueue(
            self.engine,
            WaitLimits(
                max_waiters=config.max_waiters,
                max_waiters_per_session=config.max_waiters_per_session,
                max_waiters_per_owner=config.max_waiters_per_connection,
            ),
        )
        # Moved earlier whenever a waiter parks with an earlier deadline (see _wait_loop).
        self.wait_scope: trio.CancelScope | None = None
        self.listeners = listeners
        addresses = []
        for listener in listeners:
            sockname = listener.socket.getsockname()
            addresses.append((str(sockname[0]), int(sockname[1])))
        self.running = RunningServer(self, addresses)
        self.tree_limits = TreeLimits(max_depth=config.max_depth, max_ops=config.max_ops)
        self.limits: dict[str, Any] = {
            "max_frame": config.max_frame,
            "max_ops": config.max_ops,
            "max_depth": config.max_depth,
            "max_connections": config.max_connections,
            "max_sessions": config.max_sessions,
            "max_entries": config.max_entries,
            "max_entries_per_session": config.max_entries_per_session,
            "max_session_age": config.max_session_age,
            "max_send_buffer": config.max_send_buffer,
            "send_timeout": config.send_timeout,
            "handshake_timeout": config.handshake_timeout,
            "idle_timeout": config.idle_timeout,
            "max_wait": config.max_wait,
            "max_waiters": config.max_waiters,
            "max_waiters_per_session": config.max_waiters_per_session,
            "max_waiters_per_connection": config.max_waiters_per_connection,
        }
        self.version = server_version()
        self.welcome = Welcome(
            PROTOCOL_VERSION, f"lockserver {self.version}", self.hostname, self.limits
        )
        self.encoder = Connection(Role.SERVER)  # stateless encoding of events and refusals
        self.recv_buffer = bytearray(_RECV_SIZE)
        self.recv_view = memoryview(self.recv_buffer)
        self.clients: set[Client] = set()
        self.users: dict[str, set[Client]] = {}  # session id -> connections that used it
        self.closed = trio.Event()
        self.shutting_down = False
        self.accept_scope: trio.CancelScope | None = None
        self.conn_nursery: trio.Nursery | None = None
        self.next_id = 0
        # counters (statistics "server" section)
        self.connections_total = 0
        self.connections_refused = 0
        self.requests_total = 0
        self.protocol_errors = 0
        self.internal_errors = 0
        self.slow_consumers_dropped = 0
        self.handshake_timeouts = 0
        self.idle_timeouts = 0
        self.events_sent = 0
        self.gc_pauses = GcPauses()  # collector pauses while serving (statistics "gc")
        # Reads every plain connection from one task (None: no epoll on this platform).
        self.poller = _Poller() if hasattr(select, "epoll") else None
        self.busy_poll = BusyPoll(config.busy_poll)  # the poller's spin policy

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self, task_status: trio.TaskStatus[RunningServer]) -> None:
        self.gc_pauses.install()
        try:
            async with trio.open_nursery() as timers:
                timers.start_soon(self._sweep_loop)
                timers.start_soon(self._trust_loop)
                timers.start_soon(self._reap_loop)
                timers.start_soon(self._wait_loop)
                if self.poller is not None:
                    timers.start_soon(self._poll_loop)
                async with trio.open_nursery() as conns:
                    self.conn_nursery = conns
                    async with trio.open_nursery() as accepting:
                        self.accept_scope = accepting.cancel_scope
                        for listener in self.listeners:
                            accepting.start_soon(self._accept_loop, listener.socket)
                        log.info("lockserver %s listening on %s", self.version, self.address)
                        task_status.started(self.running)
                    # Only reached after shutdown(): accepting has stopped.
                    for listener in self.listeners:
                        listener.socket.close()
                    log.info("shutting down: closing %d connection(s)", len(self.clients))
                    for c in list(self.clients):
                        c.stop(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
                    conns.cancel_scope.deadline = trio.current_time() + _SHUTDOWN_GRACE
                timers.cancel_scope.cancel()
            log.info("stopped")
        finally:
            self.gc_pauses.uninstall()
            if self.poller is not None:
                self.poller.close()
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
                self.connections_refused += 1
                log.warning(
                    "refused connection from %s: %d connections open (max_connections)",
                    peer,
                    len(self.clients),
                )
                nursery.start_soon(self._refuse, sock)
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
            proto = Connection(Role.SERVER, max_frame=config.max_frame, limits=self.tree_limits)
            c = Client(
                sock,
                f"#{self.next_id} ({peer})",
                proto,
                trio.current_time(),
                max_send_buffer=config.max_send_buffer,
                send_timeout=config.send_timeout,
                on_slow=self._slow_consumer,
            )
            self.clients.add(c)
            log.debug("connection %s opened", c.name)
            nursery.start_soon(self._connection, c)

    async def _refuse(self, sock: socket.socket) -> None:
        message = (
            f"the server has {len(self.clients)} connections open, the limit "
            f"(max_connections={self.config.max_connections})"
        )
        data = self.encoder.send(ErrorReply(None, ErrorCode.TOO_MANY_CONNECTIONS, message))
        if self.ssl_context is not None:  # a TLS client cannot read a plain frame: just close
            sock.close()
            return
        try:
            sock.send(data)  # a fresh socket's kernel buffer takes one small frame
            with trio.move_on_after(CLOSE_GRACE):
                await linger(sock, self.recv_buffer)
        except OSError:
            pass
        finally:
            sock.close()

    # --- one connection -----------------------------------------------------------------------

    async def _connection(self, c: Client) -> None:
        try:
            async with trio.open_nursery() as nursery:
                c.nursery = nursery
                with c.read_scope:
                    if self.ssl_context is None or await self._tls_handshake(c):
                        await self._read_loop(c)
                last = b""
                if c.stop_code is not None:
                    last = self.encoder.send(ErrorReply(None, c.stop_code, c.stop_message))
                await c.finish(last, self.recv_buffer)
                nursery.cancel_scope.cancel()
        except Exception:
            self.internal_errors += 1
            log.exception("connection %s failed", c.name)
        finally:
            self._forget(c)
            c.sock.close()
            log.debug("connection %s closed", c.name)

    async def _tls_handshake(self, c: Client) -> bool:
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

    async def _read_loop(self, c: Client) -> None:
        """Serve the connection's requests until EOF, an error, or a close (then return)."""
        poller = self.poller
        if poller is None or self.ssl_context is not None:
            await self._read_loop_task(c)
            return
        done = c.read_done = trio.Event()
        poller.add(c)
        try:
            await done.wait()
        finally:
            poller.discard(c)
        if c.read_error is not None:
            raise c.read_error  # logged by _connection as an internal error of this connection

    def _read_ready(self, c: Client) -> None:
        """The poller found ``c`` readable: one receive, every complete frame served."""
        if c.dead or c.read_done is None or c.read_done.is_set():
            return
        try:
            n = c.sock.recv_into(self.recv_buffer)
        except BlockingIOError:
            return
        except OSError as exc:  # reset by the peer
            log.debug("connection %s: receive failed: %s", c.name, exc)
            c.dead = True
            self._read_stop(c)
            return
        try:
            if not n:
                c.eof = True
                self._read_stop(c)
            elif not self._process(c, self.recv_view[:n]):
                self._read_stop(c)
        except Exception as exc:  # not one request's failure (those are answered): the loop's
            c.read_error = exc
            self._read_stop(c)

    def _read_stop(self, c: Client) -> None:
        assert self.poller is not None and c.read_done is not None
        self.poller.discard(c)
        c.read_done.set()

    async def _poll_loop(self) -> None:
        """The poller task: wake when any registered connection is readable, serve them."""
        poller = self.poller
        assert poller is not None
        wait_readable = trio.lowlevel.wait_readable
        checkpoint = trio.lowlevel.checkpoint
        clock = time.perf_counter  # real time: a MockClock may stand still (see _busypoll)
        busy = self.busy_poll
        fd = poller.fileno()
        ready = self._read_ready
        while True:
            if busy.spinning:
                await checkpoint()  # other tasks and timers run; cancellable
            else:
                await wait_readable(fd)
            batch = poller.ready()
            if batch:
                start = clock()
                for c in batch:
                    ready(c)
                busy.served(start, clock())
            elif busy.spinning:
                busy.idle(clock())

    async def _read_loop_task(self, c: Client) -> None:
        sock = c.sock
        fd = c.fd
        buf = self.recv_buffer
        view = self.recv_view
        process = self._process
        wait_readable = trio.lowlevel.wait_readable
        checkpoint = trio.lowlevel.checkpoint
        while True:
            try:
                n = sock.recv_into(buf)
            except WOULD_BLOCK_READ:  # BlockingIOError; for TLS also SSLWantReadError
                await wait_readable(fd)
                continue
            except ssl.SSLWantWriteError:  # TLS only: a record must go out first
                await trio.lowlevel.wait_writable(fd)
                continue
            except OSError as exc:  # reset by the peer
                log.debug("connection %s: receive failed: %s", c.name, exc)
                c.dead = True
                return
            if not n:
                c.eof = True
                return
            if not process(c, view[:n]):
                return
            await checkpoint()

    def _slow_consumer(self, c: Client, why: str) -> None:
        self.slow_consumers_dropped += 1
        log.warning("connection %s dropped as a slow consumer: %s", c.name, why)

    def _forget(self, c: Client) -> None:
        c.dead = True
        if self.waits.cancel_owner(c):
            # Its waiters may have held others back (Waiting): let those run now.
            now = trio.current_time()
            self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
        self.clients.discard(c)
        users_by_session = self.users
        for sid in c.sessions:
            users = users_by_session.get(sid)
            if users is not None:
                users.discard(c)
                if not users:
                    del users_by_session[sid]
        c.sessions.clear()

    # --- requests -----------------------------------------------------------------------------

    def _process(self, c: Client, data: memoryview) -> bool:
        """Decode and serve every complete frame in ``data``; False: close the connection.

        Synchronous on purpose: the whole batch runs without an await.
        """
        now = trio.current_time()
        c.last_recv = now
        proto = c.proto
        out = c.outbox
        keep = True
        try:
            proto.receive_data(data)
        except ProtocolError as exc:
            self.protocol_errors += 1
            out += proto.send(ErrorReply(exc.request_id, exc.code, exc.message))
            keep = False
        else:
            execute = self._execute
            other = self._request
            while True:
                try:
                    msg: Any = proto.next_message()  # a Request on the server side
                except ProtocolError as exc:
                    self.requests_total += 1
                    self.protocol_errors += 1
                    out += proto.send(ErrorReply(exc.request_id, exc.code, exc.message))
                    if exc.code.closes_connection:
                        keep = False
                        break
                    continue
                if msg is None:
                    break
                self.requests_total += 1
                try:
                    if type(msg) is Execute and c.greeted:
                        out += execute(c, msg, now)
                        if len(out) >= _EARLY_FLUSH:
                            c.flush()
                    else:
                        out += other(c, msg, now)
                except EngineError as exc:
                    out += proto.send(ErrorReply(msg.request_id, exc.code, exc.message))
                except Exception:
                    self.internal_errors += 1
                    # A hello's repr hides its token already; say "hello" anyway, to be sure.
                    what = "hello" if type(msg) is Hello else repr(msg)
                    log.exception("connection %s: internal error serving %s", c.name, what)
                    out += proto.send(
                        ErrorReply(
                            msg.request_id,
                            ErrorCode.INTERNAL_ERROR,
                            "internal server error (logged); the connection is closed",
                        )
                    )
                    keep = False
                    break
                if c.closing:
                    keep = False
                    break
        self._dispatch_lost()
        c.send_pending()
        return keep and not c.dead

    def _execute(self, c: Client, msg: Execute, now: float) -> bytes:
        session = msg.session
        if session.max_age > self.max_session_age:
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.INVALID_MESSAGE,
                f"execute: session max_age {session.max_age:g} s exceeds the server's "
                f"max_session_age of {self.config.max_session_age:g} s",
            )
        wait = msg.wait
        if wait is not None and wait > self.max_wait:
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.INVALID_MESSAGE,
                f"execute: wait {wait:g} s exceeds the server's max_wait of "
                f"{self.config.max_wait:g} s",
            )
        if self.auth is not None:
            refusal = self._authorize(c, msg)
            if refusal is not None:
                return refusal
        trust = self.trust
        trust.record_call(now)
        sid = session.session_id
        rid = msg.request_id
        token = (c, rid)
        try:
            answers = self.waits.submit(
                c, token, session, msg.transaction, now=now, trust=trust.trust(now), wait=wait
            )
        finally:
            # First use of a session on this connection: remember it for LockLost routing
            # if the session exists now (a refused call may have created nothing).
            if sid not in c.sessions and sid in self.engine.sessions:
                self._use(c, sid)
            if self.auth is not None and sid not in self.owners and sid in self.engine.sessions:
                self.owners[sid] = c.principal.name
        if len(answers) == 1 and answers[0][0] is token:
            return c.proto.send_result(rid, answers[0][1])  # the common case, nothing parked
        own = bytearray()
        if wait is not None and wait > 0 and self.wait_scope is not None:
            deadline = now + wait
            self.wait_scope.deadline = min(self.wait_scope.deadline, deadline)
        for answered, result in answers:
            conn: Client
            conn_rid: int
            conn, conn_rid = answered  # type: ignore[misc]
            if conn is c:
                own += c.proto.send_result(conn_rid, result)
            else:
                self._answer(conn, conn_rid, result)
        return bytes(own)

    def _answer(self, c: Client, rid: int, result: TransactionResult) -> None:
        """Send a (parked) request's answer to its connection, whenever it comes."""
        if not c.dead:
            c.push(c.proto.send_result(rid, result))

    def _answer_all(self, answers: list[tuple[Any, TransactionResult]]) -> None:
        for token, result in answers:
            conn, rid = token
            self._answer(conn, rid, result)

    def _request(self, c: Client, msg: Request, now: float) -> bytes:
        """Every request but a greeted Execute."""
        send = c.proto.send
        rid = msg.request_id
        t = type(msg)
        if t is Hello:
            hello: Any = msg
            if c.greeted:
                return self._invalid(
                    c, rid, ErrorCode.INVALID_MESSAGE, "hello: the handshake is already done"
                )
            if hello.version != PROTOCOL_VERSION:
                c.closing = True
                return self._invalid(
                    c,
                    rid,
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"hello: protocol version {hello.version} is not supported, this "
                    f"server speaks version {PROTOCOL_VERSION}",
                )
            if self.auth is not None:
                principal = self.auth.authenticate(hello.token)
                if principal is None:
                    # Never log or echo the presented token.
                    log.info(
                        "connection %s: authentication failed (%s token), closing",
                        c.name,
                        "no" if hello.token is None else "invalid",
                    )
                    c.closing = True
                    return self._invalid(
                        c,
                        rid,
                        ErrorCode.UNAUTHORIZED,
                        "hello: a valid token is required"
                        if hello.token is None
                        else "hello: the token is not valid",
                    )
                c.principal = principal
            c.greeted = True
            c.client_name = hello.client_name
            log.debug(
                "connection %s: hello from %r (principal %r)",
                c.name,
                hello.client_name,
                c.principal.name,
            )
            return send(Reply(rid, self.welcome))
        if not c.greeted:
            return self._invalid(
                c,
                rid,
                ErrorCode.HANDSHAKE_REQUIRED,
                f"{t.__name__}: the first request on a connection must be hello",
            )
        if t is Ping:
            return send(Reply(rid, Pong(self.engine.uptime(now), self.trust.trust(now))))
        if t is EndSession:
            if self.auth is not None:
                owner = self._owner_conflict(c, msg.session_id)  # type: ignore[union-attr]
                if owner is not None:
                    return self._invalid(c, rid, ErrorCode.SESSION_CONFLICT, owner)
            return send(Reply(rid, SessionEnded(self._end_session(c, msg.session_id, now))))  # type: ignore[union-attr]
        if t is GetStatistics:
            return send(Reply(rid, Statistics(self.statistics(now))))
        if t is Cancel:
            target = msg.target_id  # type: ignore[union-attr]
            last = self.waits.cancel((c, target))
            if last is None:
                return send(Reply(rid, Cancelled(False)))
            # The cancelled request is answered first, with its last failure; then waiters
            # that gave way to it (Waiting) get their chance.
            out = send(Reply(target, last)) + send(Reply(rid, Cancelled(True)))
            self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
            return out
        raise TypeError(f"no handler for {t.__name__}")

    # --- authorization (only with tokens configured) -------------------------------------------

    def _authorize(self, c: Client, msg: Execute) -> bytes | None:
        """The refusal of an Execute this principal may not run; None: allowed."""
        principal = c.principal
        namespace = msg.transaction.namespace
        if not principal.allows(namespace):
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.FORBIDDEN,
                f"execute: token {principal.name!r} may not use namespace {namespace!r}",
            )
        conflict = self._owner_conflict(c, msg.session.session_id)
        if conflict is not None:
            return self._invalid(c, msg.request_id, ErrorCode.SESSION_CONFLICT, conflict)
        return None

    def _owner_conflict(self, c: Client, sid: str) -> str | None:
        """The refusal message when session ``sid`` belongs to another principal, else None.
        Drops the owner of a session the engine no longer has (it expired or ended)."""
        owner = self.owners.get(sid)
        if owner is None or owner == c.principal.name:
            return None
        if sid not in self.engine.sessions:
            del self.owners[sid]
            return None
        return f"session {sid!r} belongs to another principal"

    def _prune_owners(self) -> None:
        """Forget owners of sessions that are gone; amortised: only when they outnumber the
        live sessions by far."""
        owners = self.owners
        live = self.engine.sessions
        if len(owners) > 2 * len(live) + 1024:
            self.owners = {sid: name for sid, name in owners.items() if sid in live}

    def _invalid(self, c: Client, rid: int, code: ErrorCode, message: str) -> bytes:
        """An invalid request the codec could not see (it depends on connection or server
        state): counted with the protocol errors, answered with ``code``."""
        self.protocol_errors += 1
        return c.proto.send(ErrorReply(rid, code, message))

    def _end_session(self, c: Client, sid: str, now: float) -> bool:
        users = self.users.get(sid)
        # Tell the session's other connections; the one ending it gets SessionEnded instead.
        notify = users is not None and any(u is not c for u in users)
        if users is not None and c in users:
            users.discard(c)
            c.sessions.discard(sid)
            if not users:
                del self.users[sid]
        existed = self.engine.end_session(sid, now=now, notify=notify)
        if self.owners:
            self.owners.pop(sid, None)
        if existed and len(self.waits):
            self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
        # Route now, before a later request of this batch can reuse the id in a new session.
        self._dispatch_lost()
        return existed

    # --- sessions and events ------------------------------------------------------------------

    def _use(self, c: Client, sid: str) -> None:
        users = self.users.get(sid)
        if users is None:
            self.users[sid] = {c}
        else:
            users.add(c)
        c.sessions.add(sid)

    def _dispatch_lost(self) -> None:
        """Route the engine's LockLost events to the connections that used each session."""
        lost = self.engine.drain_lost()
        if not lost:
            return
        users_by_session = self.users
        live = self.engine.sessions
        for event in lost:
            sid = event.session_id
            users = users_by_session.get(sid)
            if not users:
                continue
            data = self.encoder.send(event)
            for u in list(users):
                self.events_sent += 1
                u.push(data)
            if event.reason is not LostReason.TTL and sid not in live:
                del users_by_session[sid]
                for u in users:
                    u.sessions.discard(sid)

    # --- timers -------------------------------------------------------------------------------

    async def _sweep_loop(self) -> None:
        engine = self.engine
        interval = self.config.sweep_interval
        while True:
            wake = trio.current_time() + interval
            deadline = engine.next_deadline()
            if deadline is not None and deadline < wake:
                wake = deadline
            await trio.sleep_until(wake)
            try:
                now = trio.current_time()
                engine.sweep(now)
                if self.owners:
                    self._prune_owners()
                if len(self.waits):
                    self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
                self._dispatch_lost()
            except Exception:
                self.internal_errors += 1
                log.exception("expiry sweep failed")

    async def _wait_loop(self) -> None:
        """Answers parked transactions at their deadlines, exactly on time: the sleep's
        deadline is moved earlier by ``_execute`` when a waiter parks with an earlier one."""
        waits = self.waits
        while True:
            deadline = waits.next_deadline()
            with trio.CancelScope(deadline=math.inf if deadline is None else deadline) as scope:
                self.wait_scope = scope
                await trio.sleep_forever()
            self.wait_scope = None
            try:
                now = trio.current_time()
                self._answer_all(waits.process(now=now, trust=self.trust.trust(now)))
                self._dispatch_lost()
            except Exception:
                self.internal_errors += 1
                log.exception("answering parked transactions failed")

    async def _trust_loop(self) -> None:
        tick = self.config.trust.tick
        started = self.started_at
        while True:
            k = math.floor((trio.current_time() - started) / tick) + 1
            await trio.sleep_until(started + k * tick)
            self.trust.tick(trio.current_time())

    async def _reap_loop(self) -> None:
        handshake = self.config.handshake_timeout
        idle = self.config.idle_timeout
        if not handshake and not idle:
            return
        interval = min(_REAP_INTERVAL, *(t / 4 for t in (handshake, idle) if t))
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for c in list(self.clients):
                if c.stopping or c.dead:
                    continue
                if handshake and not c.greeted and now - c.opened_at >= handshake:
                    self.handshake_timeouts += 1
                    log.info("connection %s: no hello within %g s, closing", c.name, handshake)
                    c.stop(None, "")
                elif idle and now - c.last_recv >= idle:
                    self.idle_timeouts += 1
                    log.info("connection %s: idle for %g s, closing", c.name, idle)
                    c.stop(None, "")

    # --- statistics ---------------------------------------------------------------------------

    def statistics(self, now: float) -> dict[str, Any]:
        return {
            "server": {
                "version": self.version,
                "host": self.hostname,
                "address": self.address,
                "uptime": self.engine.uptime(now),
                "connections": len(self.clients),
                "connections_blocked": sum(1 for c in self.clients if c.blocked),
                "connections_total": self.connections_total,
                "connections_refused": self.connections_refused,
                "requests_total": self.requests_total,
                "protocol_errors": self.protocol_errors,
                "internal_errors": self.internal_errors,
                "slow_consumers_dropped": self.slow_consumers_dropped,
                "handshake_timeouts": self.handshake_timeouts,
                "idle_timeouts": self.idle_timeouts,
                "events_sent": self.events_sent,
                "sessions_tracked": len(self.users),
                **self.busy_poll.to_wire(),
            },
            "waiting": self.waits.statistics().to_wire(),
            "trust": attrs.asdict(self.trust.statistics(now)),
            "engine": self.engine.statistics(now).to_wire(),
            "limits": dict(self.limits),
            "gc": self.gc_pauses.to_wire(),
        }
