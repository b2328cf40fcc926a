"""The async face's connection machinery: :class:`AsyncConnector`, the base of
:class:`~client.AsyncLockClient` that sends and waits (the session port's ``request`` and
``request_batch``), runs the connection's reader and writer tasks, and makes, breaks and
remakes its one connection. The public calls are ``_async.py``'s (it changes with the API,
this module with the connection).

Theory of operation:
- A *reader task* (in the client's own task group) reads the socket, feeds the core's
  :class:`~client._wire.Wire` and hands each reply to the slot of the request with that id,
  which wakes its caller; LockLost events go to the sessions' listeners from this task.
- A caller registers its slot and writes its frame **in one synchronous step** (a plain
  non-blocking ``send`` on the socket; whatever the kernel does not take is queued in order and
  flushed by a writer task). There is no checkpoint between registering and writing, so a
  request is either entirely queued or not at all, whatever cancellation does. A write that
  fails before any byte of it went out (the connection died and the reader has not noticed
  yet) breaks the connection, and the request goes to a new one: nothing of it ran, as the
  sync face also knows.
- The caller then parks on its slot (``_loops``: the running loop's own parking, chosen once
  per client, so the per-request path pays no anyio indirection; under trio it is
  ``wait_task_rescheduled``). If it is cancelled before its reply arrives, it removes the
  slot from the table: the late reply is dropped by id. If the request was a
  waiting Execute (``wait=``), a Cancel for it is written as well, so the server does not keep
  it parked. (Under asyncio a cancellation can land just after the reply did: that reply is
  counted as dropped, and the caller sees the cancellation, as if it had come first.)
- A batch (``execute_many``) is the same step for all its calls at once: every call is
  registered (one core ``Batch`` waiter for all), the frames go out in one write, and the
  caller waits once; the reader wakes it when the last call is settled. A cancelled
  batch abandons every call still in flight.
- I/O: a stdlib socket in non-blocking mode driven by ``anyio.wait_readable`` /
  ``wait_writable`` (connected here, address by address). Measured against a stream with a
  send lock (benchmarks/client_rtt.py, report of issue #3): the synchronous write saves a lock
  and two scheduler round trips per request.
- TLS (``ssl_context=``): the same socket wrapped by ``ssl_context.wrap_socket`` in
  non-blocking mode, the handshake driven by the same readiness waits; the loops below only
  add TLS's own "try again" exceptions to the plain ones, so the plain path is unchanged.
- The reader breaks the connection as soon as the stream announces its end (a closing
  connection-level error such as ``SHUTTING_DOWN``, or garbage), not only at EOF: a call made
  afterwards goes to a new connection (no server: ServerUnavailable "not sent"), never to a
  server that no longer reads.
- A (re)connect goes to a member chosen by ``_calls.open_member`` and reports, as
  ``ClientFace._reconnected`` says, the losses no connection could hear before its
  keepalives are written.
- Reconnect, retry and error rules are the core's (see ``_core`` and ``_wire``).
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from . import _calls
from ._async_session import run_async
from ._core import handshake_error, not_sent
from ._errors import ClientClosed, ConnectionLost, LockClientError, ServerUnavailable
from ._face import ClientFace
from ._loops import CLOSED, Slot, hooks_for_running_loop
from ._placement import ServerAddress
from ._session_state import SessionState
from ._wire import HELLO, RETRY, Batch, Wire

__all__ = ["AsyncConnector"]

log = logging.getLogger("client")

_RECV_SIZE = 256 * 1024
_READS_PER_CHECKPOINT = 16  # a flooding server must not starve the other tasks
# "Try again later" of a non-blocking socket, plain or TLS (an SSLSocket raises its own kinds).
_WOULD_BLOCK_READ = (BlockingIOError, ssl.SSLWantReadError)
_WOULD_BLOCK_WRITE = (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError)
SessionT = TypeVar("SessionT", bound=SessionState)
ShardT = TypeVar("ShardT")


class _NotSent(ConnectionLost):
    """The connection broke on the very write of a request: nothing of it went out, so it is
    safe to send on a new connection (``request`` / ``request_batch`` do)."""


class _Connection:
    """One TCP connection of an AsyncLockClient."""

    __slots__ = ("broken", "outbuf", "sock", "wire")

    def __init__(self, sock: socket.socket, wire: Wire[Slot]) -> None:
        self.sock = sock
        self.wire = wire
        self.outbuf = bytearray()  # bytes the kernel did not take yet; a writer task flushes
        self.broken: str | None = None


class AsyncConnector(ClientFace[SessionT, ShardT]):
    """The async face's one connection and the calls that use it (in the client's task
    group: its reader task, and a writer task while the kernel does not take a write).
    :class:`~client.AsyncLockClient` adds the public calls."""

    def _setup_connection(self, task_group: anyio.abc.TaskGroup) -> None:
        """The connection's state (no connection yet: ``_reconnect`` makes it)."""
        self._task_group = task_group
        self._conn: _Connection | None = None
        self._connect_lock = anyio.Lock()
        # The running loop's own clock, checkpoint and parking for the per-request path.
        self._hooks = hooks_for_running_loop()
        # Set when change-feed events arrive (next_feed_events waits on it); a router's
        # per-server clients set their router's instead.
        self._feed_ready = anyio.Event()
        self._feed_owner: AsyncConnector[Any, Any] = self

    def _feed_arrived(self) -> None:
        self._feed_owner._feed_ready.set()

    async def request(self, kind: int, rid: int, data: bytes, cancel_on_abort: bool = False) -> Any:
        """Session port: send the framed request ``data`` (request id ``rid``, a
        ``client._wire`` kind) and wait for its reply; reconnect first when needed
        (ServerUnavailable "not sent" when it cannot), re-send an idempotent kind once when
        the connection drops under it. Cancelling the caller drops the late reply by id
        and, with ``cancel_on_abort`` (a waiting Execute), tells the server to stop
        waiting."""
        await self._hooks.checkpoint_if_cancelled()
        retried = False
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None:
                await self._reconnect_to_send()
                continue  # re-checked with no checkpoint before _call registers and writes
            try:
                value = await self._call(conn, kind, rid, data, cancel_on_abort)
            except _NotSent:
                continue  # the connection broke on this write: send on a new one
            except ConnectionLost as exc:
                if self._closed:
                    raise ClientClosed("the client was closed with the request in flight") from exc
                raise
            if value is not RETRY:
                return value
            retried = self._retried(retried)

    async def _call(
        self, conn: _Connection, kind: int, rid: int, data: bytes, cancel_on_abort: bool
    ) -> Any:
        """Register + write (one synchronous step), then wait until resolved."""
        slot = self._hooks.slot()
        wire = conn.wire
        wire.register(rid, kind, slot)
        if not self._write(conn, data):
            raise _NotSent(f"the connection broke before request {rid} went out")
        if slot.done:  # resolved synchronously (the write broke the connection)
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return slot.unwrap()

        def abandon() -> None:  # cancelled before the reply: it is dropped by id
            if wire.abandon(rid) and cancel_on_abort and conn.broken is None:
                self._write(conn, self._core.cancel(rid)[1])  # its reply is dropped

        try:
            await slot.wait(abandon)
        except BaseException:
            if slot.done:  # the reply came just before the cancellation (asyncio): unused
                self._core.replies_dropped += 1
            raise
        return slot.unwrap()

    async def request_batch(self, rids: list[int], data: bytes) -> list[Any]:
        """Session port: send a batch's frames in one write and wait once for all its
        calls; the outcomes (Result or the call's exception) in call order. Reconnects first
        when needed; never re-sends (its calls are Executes)."""
        await self._hooks.checkpoint_if_cancelled()
        while True:
            conn = self._conn
            if conn is None or conn.broken is not None:
                await self._reconnect_to_send()
                continue  # re-checked with no checkpoint before registering and writing
            try:
                outcomes = await self._call_batch(conn, rids, data)
            except _NotSent:
                continue  # the connection broke on this write: send on a new one
            break
        return self._batch_outcomes(outcomes)

    async def _call_batch(self, conn: _Connection, rids: list[int], data: bytes) -> list[Any]:
        """Register every call + one write (one synchronous step), then wait until the last
        call is settled: one wake-up for the whole batch."""
        slot = self._hooks.slot()
        batch = Batch(rids, slot)
        wire = conn.wire
        wire.register_batch(batch)
        if not self._write(conn, data):
            raise _NotSent(f"the connection broke before the batch from request {rids[0]} went out")
        if slot.done:  # resolved synchronously (the write broke the connection)
            await anyio.lowlevel.cancel_shielded_checkpoint()
            return slot.unwrap()  # type: ignore[no-any-return]
        try:
            await slot.wait(lambda: wire.abandon_batch(batch))  # late replies dropped by id
        except BaseException:
            if slot.done:  # settled just before the cancellation (asyncio): unused
                self._core.replies_dropped += len(rids)
            raise
        return slot.unwrap()  # type: ignore[no-any-return]

    def _write(self, conn: _Connection, data: bytes) -> bool:
        """Queue ``data`` in order, synchronously; never blocks, never checkpoints. False
        when nothing of it went out because the connection is broken, or broke on this very
        write (the break has resolved everything registered on it)."""
        if conn.broken is not None:
            return False
        if conn.outbuf:
            conn.outbuf += data
            return True
        try:
            sent = conn.sock.send(data)
        except _WOULD_BLOCK_WRITE:
            sent = 0
        except OSError as exc:
            self._break(conn, f"sending failed: {exc}")
            return False
        if sent < len(data):
            conn.outbuf += memoryview(data)[sent:]
            self._task_group.start_soon(self._writer, conn)
        return True

    async def _writer(self, conn: _Connection) -> None:
        sock = conn.sock
        try:
            while conn.outbuf and conn.broken is None:
                await anyio.wait_writable(sock)
                try:
                    sent = sock.send(conn.outbuf)
                except _WOULD_BLOCK_WRITE:
                    continue
                del conn.outbuf[:sent]
        except anyio.ClosedResourceError:
            pass  # broken meanwhile
        except OSError as exc:
            self._break(conn, f"sending failed: {exc}")

    async def _reader(self, conn: _Connection) -> None:
        sock = conn.sock
        wire = conn.wire
        core = self._core
        wait_readable = self._hooks.wait_readable  # the loop's own (see _loops)
        reason = "the server closed the connection"
        reads = 0
        try:
            while True:
                try:
                    data = sock.recv(_RECV_SIZE)
                except _WOULD_BLOCK_READ:
                    await wait_readable(sock)
                    continue
                except ssl.SSLWantWriteError:  # TLS only: a record must go out first
                    await anyio.wait_writable(sock)
                    continue
                if not data:
                    break
                resolved, events = wire.feed(data)
                for slot, value, error in resolved:
                    slot.resolve(value, error)
                if events:
                    core.dispatch(events)
                if wire.feed_events:
                    self._feed_arrived()
                if wire.closing:  # e.g. SHUTTING_DOWN: the server reads nothing more
                    reason = "the server ended the connection"
                    break
                reads += 1
                if reads % _READS_PER_CHECKPOINT == 0:
                    await anyio.lowlevel.checkpoint()
        except CLOSED:
            reason = conn.broken or "the connection was closed"
        except OSError as exc:
            reason = f"receiving failed: {exc}"
        except anyio.get_cancelled_exc_class():
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
        self._not_a_connection()
        async with self._connect_lock:
            self.check_open()
            conn = self._conn
            if conn is not None and conn.broken is None:
                return conn
            # A member of this client's entry, in the order of ``Members.round``.
            op = _calls.open_member(self, conn is not None)
            new: _Connection = await run_async(op, lambda step: self._open_to(step.address))
            self._conn = conn = new
            for data in self._reconnected(self._hooks.now()):
                self._write(conn, data)
            return conn

    async def _open_to(self, address: ServerAddress) -> _Connection:
        try:
            with anyio.fail_after(self.connect_timeout):
                sock = await _connect(address.host, address.port)
        except OSError as exc:  # TimeoutError included
            raise ServerUnavailable(
                f"cannot connect to {address.id}: {exc or 'timed out'}"
            ) from exc
        if self.ssl_context is not None:
            sock = await self._tls_handshake(sock, self.ssl_context, address)
        conn = _Connection(sock, Wire(self._core))
        self._task_group.start_soon(self._reader, conn)
        rid, data = self._core.hello()
        try:
            with anyio.fail_after(self.connect_timeout):
                welcome = await self._call(conn, HELLO, rid, data, False)
        except (LockClientError, TimeoutError) as exc:
            self._break(conn, "the handshake failed")
            raise handshake_error(exc) from exc
        except BaseException:
            self._break(conn, "the handshake was cancelled")
            raise
        self._core.handshake_done(welcome)
        return conn

    async def _tls_handshake(
        self, sock: socket.socket, context: ssl.SSLContext, address: ServerAddress
    ) -> ssl.SSLSocket:
        """Wrap ``sock`` in TLS and shake hands (within ``connect_timeout``), checking the
        certificate against ``address.host``."""
        tls: ssl.SSLSocket | None = None
        try:
            tls = context.wrap_socket(
                sock, server_hostname=address.host, do_handshake_on_connect=False
            )
            with anyio.fail_after(self.connect_timeout):
                while True:
                    try:
                        tls.do_handshake()
                        return tls
                    except ssl.SSLWantReadError:
                        await anyio.wait_readable(tls)
                    except ssl.SSLWantWriteError:
                        await anyio.wait_writable(tls)
        except (OSError, ValueError) as exc:  # TimeoutError included
            (tls or sock).close()
            raise ServerUnavailable(
                f"TLS handshake with {address.id} failed: {exc or 'timed out'}"
            ) from exc
        except BaseException:
            (tls or sock).close()
            raise

    def _break(self, conn: _Connection, reason: str) -> None:
        if conn.broken is not None:
            return
        conn.broken = reason
        for slot, value, error in conn.wire.fail_all(reason):
            slot.resolve(value, error)
        conn.outbuf.clear()
        anyio.notify_closing(conn.sock)  # wakes the reader and writer
        conn.sock.close()


async def _connect(host: str, port: int) -> socket.socket:
    """A connected non-blocking TCP socket (TCP_NODELAY) to the first address of ``host``
    that accepts: the face owns its socket, for plain non-blocking send/recv on the hot path
    (see the module docstring). Raises OSError (the last address's) when none does."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:  # pragma: no cover - getaddrinfo raises instead
        raise OSError(f"no address for {host!r}")
    error: OSError | None = None
    for family, kind, proto, _name, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                sock.connect(address)
            except BlockingIOError:
                await anyio.wait_writable(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code:
                    raise OSError(
                        code, f"connect to {address[0]}:{address[1]}: {os.strerror(code)}"
                    ) from None
            return sock
        except OSError as exc:
            sock.close()
            error = exc
        except BaseException:
            sock.close()
            raise
    assert error is not None
    raise error
