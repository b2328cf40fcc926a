"""The sync face's connection machinery: :class:`SyncConnector`, the base of
:class:`~client.LockClient` that sends, waits and reads (the session port's ``request``,
``request_batch``, ``send_unanswered``) and makes, breaks and remakes its one connection.

Why: the request path must be as short as a redis-py round trip or shorter, so there is no
reader thread and no hand-off. **The caller reads**: a thread that waits for its reply takes
the *reader role* (one thread at a time), reads the socket itself, stashes replies that belong
to other threads and wakes them through one Condition, dispatches LockLost events, and returns
as soon as its own reply is there; the next waiting thread then becomes the reader. With one
thread that is: send, recv, decode, return. Prior art: the leader/follower pattern. The
public calls are ``_sync.py``'s (it changes with the API, this module with the connection).

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
- A (re)connect goes to a member chosen by ``_calls.open_member`` and reports, as
  ``ClientFace._reconnected`` says, the losses no connection could hear before its
  keepalives go out.
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
import select
import socket
import threading
import weakref
from collections.abc import Callable
from time import monotonic
from typing import Any, TypeVar

from . import _calls
from ._core import handshake_error, not_sent
from ._errors import ClientClosed, ClientTimeout, ConnectionLost, LockClientError, ServerUnavailable
from ._face import ClientFace
from ._placement import ServerAddress
from ._session_state import SessionState
from ._wire import BATCH, HELLO, RETRY, Batch, Wire

__all__ = ["SyncConnector"]

_RECV_SIZE = 256 * 1024
_MIN_SOCKET_TIMEOUT = 0.001  # settimeout(0) would make the socket non-blocking
_Resolution = tuple[Any, BaseException | None]
SessionT = TypeVar("SessionT", bound=SessionState)
ShardT = TypeVar("ShardT")


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


class SyncConnector(ClientFace[SessionT, ShardT]):
    """The sync face's one connection and the calls that use it (state guarded by the
    condition ``_cond``; sends serialised by ``_send_lock``; (re)connecting by
    ``_connect_lock``). :class:`~client.LockClient` adds the public calls."""

    timeout: float
    connect_timeout: float

    def _setup_connection(self) -> None:
        """The connection's locks and holders (no connection yet: ``_reconnect`` makes it)."""
        self._cond = threading.Condition(threading.Lock())
        self._send_lock = threading.Lock()
        self._connect_lock = threading.Lock()
        self._conn: _Connection | None = None
        self._socket = _SocketHolder()
        self._finalizer = weakref.finalize(self, self._socket.close)

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
            retried = self._retried(retried)

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
            return self._batch_outcomes(outcomes)

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
            op = _calls.open_member(self, conn is not None)
            new: _Connection = _calls.run_sync(op, lambda step: self._open_to(step.address))
            self._conn = conn = new
            self._socket.sock = conn.sock
            try:
                with self._send_lock:
                    for data in self._reconnected(monotonic()):
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
