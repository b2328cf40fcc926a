"""The async (trio) face: one connection shared by any number of tasks, pipelined.

Why: many tasks of one program should share one connection with many requests in flight
(64 tasks -> 64 requests on the wire, answered in any order), and a cancelled caller must never
desynchronise the connection or receive someone else's reply.

Sessions (:class:`AsyncSession`, its execute/end, ``wait_lost`` and its keepalive task) are in
``_async_session.py``: they change with the session API, this module with the connection
machinery. The client creates them and stops their keepalive on shutdown. A session sees its
client only as a :class:`~client._port.AsyncSessionPort`, which :class:`AsyncLockClient`
implements (``core``, ``check_open``, ``request``, ``request_batch``, ``start_soon``, and the
public calls); this module imports the session module, never the other way round.

Theory of operation:
- A *reader task* (in the client's own nursery) reads the socket, feeds the core's
  :class:`~client._wire.Wire` and hands each reply to the slot of the request with that id;
  LockLost events go to the sessions' listeners from this task.
- A caller registers its slot and writes its frame **in one synchronous step** (a plain
  non-blocking ``send`` on the socket; whatever the kernel does not take is queued in order and
  flushed by a writer task). There is no checkpoint between registering and writing, so a
  request is either entirely queued or not at all, whatever cancellation does.
- The caller then parks in ``wait_task_rescheduled``. If it is cancelled before its reply
  arrives, its abort callback removes the slot from the table: the late reply is dropped by id.
  If the request was a waiting Execute (``wait=``), a Cancel for it is written as well, so the
  server does not keep it parked.
- A batch (``execute_many``) is the same step for all its calls at once: every call is
  registered (one core ``Batch`` waiter for all), the frames go out in one write, and the
  caller parks once; the reader reschedules it when the last call is settled. Its abort
  callback abandons every call still in flight.
- I/O: a stdlib socket in non-blocking mode driven by ``trio.lowlevel.wait_readable`` /
  ``wait_writable`` (connected through ``trio.open_tcp_stream``, then detached). Measured
  against ``trio.SocketStream`` with a send lock (benchmarks/client_rtt.py, report of issue #3):
  the synchronous write saves a lock and two scheduler round trips per request.
- TLS (``ssl_context=``): the same socket wrapped by ``ssl_context.wrap_socket`` in
  non-blocking mode, the handshake driven by the same readiness waits; the loops below only
  add TLS's own "try again" exceptions to the plain ones, so the plain path is unchanged.
- The reader breaks the connection as soon as the stream announces its end (a closing
  connection-level error such as ``SHUTTING_DOWN``, or garbage), not only at EOF: a call made
  afterwards goes to a new connection (no server: ServerUnavailable "not sent"), never to a
  server that no longer reads.
- A reconnect reports the losses no connection could hear (``ClientCore.reconnected``: a
  restarted server, an expired session guarantee) before its keepalives are written.
- Reconnect, retry and error rules are the core's (see ``_core`` and ``_wire``).
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import outcome
import trio

from protocol import Pong, Welcome

from ._async_session import AsyncSession
from ._core import ClientCore, ClientStatistics, handshake_error, not_sent
from ._errors import ClientClosed, ConnectionLost, LockClientError, ServerUnavailable
from ._wire import END, HELLO, PING, RETRY, STATS, Batch, Wire

__all__ = ["AsyncLockClient", "open_lock_client"]

log = logging.getLogger("client")

_RECV_SIZE = 256 * 1024
_READS_PER_CHECKPOINT = 16  # a flooding server must not starve the other tasks
# "Try again later" of a non-blocking socket, plain or TLS (an SSLSocket raises its own kinds).
_WOULD_BLOCK_READ = (BlockingIOError, ssl.SSLWantReadError)
_WOULD_BLOCK_WRITE = (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError)


class _Slot:
    """Where a reply meets its caller: the parked task, or the outcome if it came first."""

    __slots__ = ("outcome", "task")

    def __init__(self) -> None:
        self.task: trio.lowlevel.Task | None = None
        self.outcome: outcome.Outcome[Any] | None = None


class _Connection:
    """One TCP connection of an AsyncLockClient."""

    __slots__ = ("broken", "outbuf", "sock", "wire")

    def __init__(self, sock: socket.socket, wire: Wire[_Slot]) -> None:
        self.sock = sock
        self.wire = wire
        self.outbuf = bytearray()  # bytes the kernel did not take yet; a writer task flushes
        self.broken: str | None = None


@asynccontextmanager
async def open_lock_client(
    host: str = "127.0.0.1",
    port: int = 7400,
    *,
    client_name: str = "python-trio",
    connect_timeout: float = 10.0,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[AsyncLockClient]:
    """Connect to a lock server; the client is closed when the block exits.

    ``token``: the shared secret the server asks for (docs/security.md). ``ssl_context``:
    speak TLS, verifying the server with it (e.g. ``ssl.create_default_context(cafile=...)``;
    the server name checked is ``host``).

    Raises :class:`ServerUnavailable` when no connection can be made. Calls have no timeout
    of their own (a waiting Execute may be answered much later): bound them with trio's cancel
    scopes, which is always safe (see the module docstring).
    """
    failure: BaseException | None = None
    async with trio.open_nursery() as nursery:
        client = AsyncLockClient(
            nursery,
            host,
            port,
            client_name=client_name,
            connect_timeout=connect_timeout,
            token=token,
            ssl_context=ssl_context,
        )
        try:
            await client._reconnect()
            yield client
        except BaseException as exc:
            # Raised again below, outside the nursery, so it is not wrapped in an
            # ExceptionGroup (the client's own tasks never raise).
            failure = exc
        finally:
            client._shutdown()
    if failure is not None:
        raise failure


class AsyncLockClient:
    """A trio client; create it with :func:`open_lock_client`. Safe to share between tasks."""

    def __init__(
        self,
        nursery: trio.Nursery,
        host: str,
        port: int,
        *,
        client_name: str,
        connect_timeout: float,
        token: str | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if (
            type(connect_timeout) not in (int, float)
            or not math.isfinite(connect_timeout)
            or connect_timeout <= 0
        ):
            raise ValueError(
                f"connect_timeout must be a finite number > 0, got {connect_timeout!r}"
            )
        self.host = host
        self.port = port
        self.connect_timeout = float(connect_timeout)
        self.ssl_context = ssl_context
        self._nursery = nursery
        self._core = ClientCore(client_name, token)
        self._conn: _Connection | None = None
        self._connect_lock = trio.Lock()
        self._closed = False

    # --- public API -------------------------------------------------------------------------------

    @property
    def welcome(self) -> Welcome:
        """The server's Welcome of the current connection (version, name, host, limits)."""
        welcome = self._core.welcome
        assert welcome is not None  # set by open_lock_client's handshake
        return welcome

    @property
    def closed(self) -> bool:
        """True once the ``open_lock_client`` block has exited."""
        return self._closed

    @property
    def core(self) -> ClientCore:
        """The socket-free core (request ids, open sessions, counters). Session port: what
        an :class:`AsyncSession` builds its frames with; not for applications."""
        return self._core

    def session(
        self,
        max_age: float = 60.0,
        description: str = "",
        session_id: str | None = None,
        *,
        keepalive: bool = True,
    ) -> AsyncSession:
        """A session (a fresh uuid4 id unless ``session_id`` is given). Use it with
        ``async with``: the session is ended on exit, also on an exception or cancellation.
        While open and used, a keepalive task pings it every ``max_age / 3`` seconds of
        idleness (unless ``keepalive=False``)."""
        self.check_open()
        return AsyncSession(self, session_id, max_age, description, keepalive)

    async def ping(self) -> Pong:
        """Liveness check: the server's ``uptime`` and ``trust``. Touches no session."""
        rid, data = self._core.ping()
        return await self.request(PING, rid, data)  # type: ignore[no-any-return]

    async def statistics(self) -> dict[str, Any]:
        """The server's statistics (a nested map; PROTOCOL.md lists the keys)."""
        rid, data = self._core.get_statistics()
        return await self.request(STATS, rid, data)  # type: ignore[no-any-return]

    async def end_session(self, session_id: str) -> bool:
        """End any session by id (all its entries go at once); False when it did not exist.
        Prefer ``session.end()`` for your own sessions."""
        rid, data = self._core.end_session(session_id)
        return await self.request(END, rid, data)  # type: ignore[no-any-return]

    def local_statistics(self) -> ClientStatistics:
        """Client-side counters: requests, drops, retries, reconnects, events."""
        conn = self._conn
        return self._core.statistics(0 if conn is None else len(conn.wire.pending))

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<AsyncLockClient {self.host}:{self.port} {state}>"

    # --- the session port (client._port.AsyncSessionPort): how an AsyncSession sends and runs
    # its keepalive; not for applications

    def check_open(self) -> None:
        """Session port: raise ClientClosed once the client is closed."""
        if self._closed:
            raise ClientClosed("the client is closed")

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Session port: run ``fn(*args)`` as a task of the client's own nursery (cancelled
        when the client closes); it must not raise."""
        self._nursery.start_soon(fn, *args)

    async def request(self, kind: int, rid: int, data: bytes, cancel_on_abort: bool = False) -> Any:
        """Session port: send the framed request ``data`` (request id ``rid``, a
        ``client._wire`` kind) and wait for its reply; reconnect first when needed
        (ServerUnavailable "not sent" when it cannot), re-send an idempotent kind once when
        the connection drops under it. Cancelling the caller drops the late reply by id
        and, with ``cancel_on_abort`` (a waiting Execute), tells the server to stop
        waiting."""
        await trio.lowlevel.checkpoint_if_cancelled()
        retried = False
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None:
                await self._reconnect_to_send()
                continue  # re-checked with no checkpoint before _call registers and writes
            try:
                value = await self._call(conn, kind, rid, data, cancel_on_abort)
            except ConnectionLost as exc:
                if self._closed:
                    raise ClientClosed("the client was closed with the request in flight") from exc
                raise
            if value is not RETRY:
                return value
            if retried:
                raise ConnectionLost(
                    "the connection dropped twice with the same idempotent request in flight"
                )
            retried = True
            self._core.retries += 1

    async def _call(
        self, conn: _Connection, kind: int, rid: int, data: bytes, cancel_on_abort: bool
    ) -> Any:
        """Register + write (one synchronous step), then park until resolved."""
        slot = _Slot()
        wire = conn.wire
        wire.register(rid, kind, slot)
        self._write(conn, data)
        if slot.outcome is not None:  # resolved synchronously (the write broke the connection)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return slot.outcome.unwrap()
        slot.task = trio.lowlevel.current_task()

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            slot.task = None
            if wire.abandon(rid) and cancel_on_abort and conn.broken is None:
                self._write(conn, self._core.cancel(rid)[1])  # its reply is dropped
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    async def request_batch(self, rids: list[int], data: bytes) -> list[Any]:
        """Session port: send a batch's frames in one write and wait once for all its
        calls; the outcomes (Result or the call's exception) in call order. Reconnects first
        when needed; never re-sends (its calls are Executes)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        conn = self._conn
        while conn is None or conn.broken is not None:
            await self._reconnect_to_send()
            conn = self._conn  # re-checked with no checkpoint before registering and writing
        outcomes = await self._call_batch(conn, rids, data)
        if self._closed:
            for item in outcomes:
                if isinstance(item, ConnectionLost):
                    raise ClientClosed("the client was closed with the batch in flight")
        return outcomes

    async def _call_batch(self, conn: _Connection, rids: list[int], data: bytes) -> list[Any]:
        """Register every call + one write (one synchronous step), then park until the last
        call is settled: one wake-up for the whole batch."""
        slot = _Slot()
        batch = Batch(rids, slot)
        wire = conn.wire
        wire.register_batch(batch)
        self._write(conn, data)
        if slot.outcome is not None:  # resolved synchronously (the write broke the connection)
            await trio.lowlevel.cancel_shielded_checkpoint()
            return slot.outcome.unwrap()  # type: ignore[no-any-return]
        slot.task = trio.lowlevel.current_task()

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            slot.task = None
            wire.abandon_batch(batch)  # late replies are dropped by id
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    @staticmethod
    def _resolve(slot: _Slot, value: Any, error: BaseException | None) -> None:
        result: outcome.Outcome[Any] = (
            outcome.Value(value) if error is None else outcome.Error(error)
        )
        task = slot.task
        if task is None:
            slot.outcome = result
        else:
            slot.task = None
            trio.lowlevel.reschedule(task, result)

    def _write(self, conn: _Connection, data: bytes) -> None:
        """Queue ``data`` in order, synchronously; never blocks, never checkpoints."""
        if conn.broken is not None:
            return
        if conn.outbuf:
            conn.outbuf += data
            return
        try:
            sent = conn.sock.send(data)
        except _WOULD_BLOCK_WRITE:
            sent = 0
        except OSError as exc:
            self._break(conn, f"sending failed: {exc}")
            return
        if sent < len(data):
            conn.outbuf += memoryview(data)[sent:]
            self._nursery.start_soon(self._writer, conn)

    async def _writer(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            while conn.outbuf and conn.broken is None:
                await trio.lowlevel.wait_writable(sock)
                try:
                    sent = sock.send(conn.outbuf)
                except _WOULD_BLOCK_WRITE:
                    continue
                del conn.outbuf[:sent]
        except trio.ClosedResourceError:
            pass  # broken meanwhile
        except OSError as exc:
            self._break(conn, f"sending failed: {exc}")

    async def _reader(self, conn: _Connection) -> None:
        sock = conn.sock
        wire = conn.wire
        core = self._core
        resolve = self._resolve
        reason = "the server closed the connection"
        reads = 0
        try:
            while True:
                try:
                    data = sock.recv(_RECV_SIZE)
                except _WOULD_BLOCK_READ:
                    await trio.lowlevel.wait_readable(sock)
                    continue
                except ssl.SSLWantWriteError:  # TLS only: a record must go out first
                    await trio.lowlevel.wait_writable(sock)
                    continue
                if not data:
                    break
                resolved, events = wire.feed(data)
                for slot, value, error in resolved:
                    resolve(slot, value, error)
                if events:
                    core.dispatch(events)
                if wire.closing:  # e.g. SHUTTING_DOWN: the server reads nothing more
                    reason = "the server ended the connection"
                    break
                reads += 1
                if reads % _READS_PER_CHECKPOINT == 0:
                    await trio.lowlevel.checkpoint()
        except trio.ClosedResourceError:
            reason = conn.broken or "the connection was closed"
        except OSError as exc:
            reason = f"receiving failed: {exc}"
        except trio.Cancelled:
            reason = "the client was closed"
            raise
        except Exception as exc:  # pragma: no cover - a bug; fail the calls, not the nursery
            log.exception("lock client reader crashed")
            reason = f"internal error in the reader: {exc!r}"
        finally:
            self._break(conn, reason)

    # --- connection lifecycle ---------------------------------------------------------------------

    async def _reconnect_to_send(self) -> None:
        """Reconnect for a request about to be sent; ServerUnavailable says it was not."""
        try:
            await self._reconnect()
        except ServerUnavailable as exc:
            raise not_sent(exc) from exc

    async def _reconnect(self) -> _Connection:
        async with self._connect_lock:
            self.check_open()
            conn = self._conn
            if conn is not None and conn.broken is None:
                return conn
            conn = await self._open()
            self._conn = conn
            # The losses no connection could hear (a restarted server, a session whose
            # guarantee ran out meanwhile), before the keepalives re-create those sessions.
            self._core.reconnected(trio.current_time())
            # Touch the open sessions on the new connection (so its LockLost events come here
            # and their idle timers restart); the replies are dropped by id.
            for data in self._core.keepalives():
                self._write(conn, data)
            return conn

    async def _open(self) -> _Connection:
        try:
            with trio.fail_after(self.connect_timeout):
                stream = await trio.open_tcp_stream(self.host, self.port)
        except (OSError, trio.TooSlowError) as exc:
            raise ServerUnavailable(
                f"cannot connect to {self.host}:{self.port}: {exc or 'timed out'}"
            ) from exc
        # Own the socket: plain non-blocking send/recv on the hot path (see module docstring).
        # trio.SocketStream has already set TCP_NODELAY.
        sock = socket.socket(fileno=stream.socket.detach())
        sock.setblocking(False)
        if self.ssl_context is not None:
            sock = await self._tls_handshake(sock, self.ssl_context)
        conn = _Connection(sock, Wire(self._core))
        self._nursery.start_soon(self._reader, conn)
        rid, data = self._core.hello()
        try:
            with trio.fail_after(self.connect_timeout):
                welcome = await self._call(conn, HELLO, rid, data, False)
        except (LockClientError, trio.TooSlowError) as exc:
            self._break(conn, "the handshake failed")
            raise handshake_error(exc) from exc
        except BaseException:
            self._break(conn, "the handshake was cancelled")
            raise
        self._core.handshake_done(welcome)
        return conn

    async def _tls_handshake(self, sock: socket.socket, context: ssl.SSLContext) -> ssl.SSLSocket:
        """Wrap ``sock`` in TLS and shake hands (within ``connect_timeout``)."""
        tls: ssl.SSLSocket | None = None
        try:
            tls = context.wrap_socket(
                sock, server_hostname=self.host, do_handshake_on_connect=False
            )
            with trio.fail_after(self.connect_timeout):
                while True:
                    try:
                        tls.do_handshake()
                        return tls
                    except ssl.SSLWantReadError:
                        await trio.lowlevel.wait_readable(tls)
                    except ssl.SSLWantWriteError:
                        await trio.lowlevel.wait_writable(tls)
        except (OSError, ValueError, trio.TooSlowError) as exc:
            (tls or sock).close()
            raise ServerUnavailable(
                f"TLS handshake with {self.host}:{self.port} failed: {exc or 'timed out'}"
            ) from exc
        except BaseException:
            (tls or sock).close()
            raise

    def _break(self, conn: _Connection, reason: str) -> None:
        if conn.broken is not None:
            return
        conn.broken = reason
        for slot, value, error in conn.wire.fail_all(reason):
            self._resolve(slot, value, error)
        conn.outbuf.clear()
        trio.lowlevel.notify_closing(conn.sock)  # wakes the reader and writer
        conn.sock.close()

    def _shutdown(self) -> None:
        """Close for good: stop keepalives, fail calls in flight, stop the reader."""
        if self._closed:
            return
        self._closed = True
        for state in self._core.open_sessions():
            state._stop_keepalive()
        if self._conn is not None:
            self._break(self._conn, "the client was closed")
        self._nursery.cancel_scope.cancel()
