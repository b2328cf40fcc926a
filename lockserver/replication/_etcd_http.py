"""HTTP/1.1 to etcd's gateway: kept-alive connections, plain or TLS, spoken with h11 over
non-blocking sockets under trio. No JSON here: bytes in, status and bytes out.

This module owns the transport of :mod:`lockserver.replication._etcd`: what an endpoint is
(:class:`Endpoint`), one connection (:class:`Connection`: connect, TLS handshake, one request
and its whole answer, or a streamed answer read piece by piece), the idle connections kept
per endpoint (:class:`Pool`) and the two ways a request can fail (:class:`NotSent`,
:class:`MaybeSent`), which the failover rule of ``_etcd.py`` is built on.

Rules kept:
- **A failure says whether the request can have reached the server.** :class:`NotSent`: it
  cannot (no connection, the TLS handshake failed or the server refused this client's
  certificate, a kept-alive connection found closed before a byte was written);
  :class:`MaybeSent`: it may have (anything after the first byte went out: no answer in time,
  a broken connection, an answer that is not HTTP or is too large). A caller may repeat a
  request elsewhere only after :class:`NotSent`, or when it is a read.
- **Every answer is bounded.** A unary answer's body is at most ``max_answer`` bytes (a
  larger ``Content-Length`` is refused before its body is read, a chunked one when it passes
  the bound); the head is bounded by h11 (16 KiB). Time is the caller's: every wait here
  is a trio checkpoint, and :meth:`Pool.request` runs under the deadline it is given.
- **A connection is reused only when it is known clean**: its last answer was read whole,
  both sides kept it alive, and a zero-time peek finds nothing arrived since (no EOF, no
  TLS alert). Anything else is closed. A connection in use when its task is cancelled is
  closed, never pooled.

Theory of operation: the socket is a plain non-blocking ``socket.socket`` (or an
``ssl.SSLSocket`` over it), as the server's own connections are (``_peer.py``): a send or a
receive is tried at once, and only when the kernel (or the TLS layer) says "not now" does
the task wait with ``trio.lowlevel.wait_writable`` / ``wait_readable``. This skips the
per-call scheduling of ``trio.SocketStream`` and, above all, the layers of a general HTTP
client library: measured on this 2-vCPU VM, one put through httpx/httpcore cost ~0.9 ms of
client CPU, through this module about a tenth of that (benchmarks/README.md). h11 keeps the
HTTP right (framing, chunked bodies, keep-alive), as it does for the server's HTTP face.

Prior art: h11's own client examples, httpcore's connection pool (the idle peek before reuse
and the "was the request sent" split, which urllib3 and Go's net/http also make), trio's
``open_tcp_stream``.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Final, Generic, Protocol, TypeVar

import attrs
import h11
import trio

__all__ = [
    "MAX_ANSWER",
    "Connection",
    "ConnectionPool",
    "Endpoint",
    "MaybeSent",
    "NotSent",
    "Pool",
    "parse_endpoint",
    "send_all",
    "transport_cause",
]

#: Bytes of one answer's body read at most (and of one line of a watch stream): far above
#: what etcd sends (a page of keys is sized to fit, a watch response to its request limit,
#: 1.5 MiB by default), far below what would hurt a replica.
MAX_ANSWER: Final = 64 * 1024 * 1024
#: Idle kept-alive connections kept per endpoint.
MAX_IDLE: Final = 8
_RECV: Final = 64 * 1024  # below malloc's mmap threshold: no mmap per receive
_WOULD_BLOCK_READ: Final = (BlockingIOError, ssl.SSLWantReadError)
_WOULD_BLOCK_WRITE: Final = (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError)
#: TLS alerts by which a server refuses this client's certificate (or its absence): raised
#: at the first read after a TLS 1.3 handshake, so after the request went out, but the server
#: decided before it read any request.
_CERT_REFUSED: Final = frozenset(
    {
        "TLSV13_ALERT_CERTIFICATE_REQUIRED",
        "SSLV3_ALERT_BAD_CERTIFICATE",
        "TLSV1_ALERT_UNKNOWN_CA",
        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
        "SSLV3_ALERT_HANDSHAKE_FAILURE",
        "TLSV1_ALERT_ACCESS_DENIED",
    }
)


# --- endpoints and failures -------------------------------------------------------------------


@attrs.frozen
class Endpoint:
    """One etcd client URL: ``http://HOST:PORT`` or ``https://HOST:PORT`` (an IPv6 host in
    brackets). ``host`` is without brackets: what is connected to and, with TLS, what the
    server's certificate must name."""

    scheme: str
    host: str
    port: int

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def authority(self) -> str:
        """The ``Host`` header's value."""
        return self.url.split("://", 1)[1]


def parse_endpoint(text: str, *, default_scheme: str = "http") -> Endpoint:
    """``HOST:PORT``, ``http://HOST:PORT`` or ``https://HOST:PORT`` (a trailing ``/`` is
    allowed, a path is not) as an :class:`Endpoint`; ValueError naming what is wrong."""
    if type(text) is not str:
        raise TypeError(f"an etcd endpoint is a string, not {text!r}")
    rest = text.strip().rstrip("/")
    scheme = default_scheme
    if "://" in rest:
        scheme, rest = rest.split("://", 1)
        scheme = scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"etcd endpoint {text!r}: the scheme is http:// or https://")
    if "/" in rest or "@" in rest or "?" in rest or "#" in rest:
        raise ValueError(f"etcd endpoint {text!r}: only HOST:PORT after the scheme")
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not host or ":" not in host:
            raise ValueError(f"etcd endpoint {text!r}: brackets hold an IPv6 address")
    elif ":" in host:
        raise ValueError(f"etcd endpoint {text!r}: put an IPv6 address in brackets: [ADDR]:PORT")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"etcd endpoint {text!r} is not HOST:PORT (port 1-65535)")
    if any(c.isspace() for c in host):
        raise ValueError(f"etcd endpoint {text!r}: a host name has no spaces")
    return Endpoint(scheme, host, int(port))


class NotSent(Exception):
    """The request cannot have reached the server: another endpoint may be asked."""


class MaybeSent(Exception):
    """The request may have reached the server (no answer in time, a broken connection, an
    answer that is not HTTP or too large): a write must not be repeated blindly."""

    def __init__(self, cause: str, *, code: int | None = None) -> None:
        super().__init__(cause)
        self.code = code


def transport_cause(e: BaseException) -> str:
    """A transport failure in a few words: the TLS layer's reason, or the operating system's
    (the first one found in the exception's chain), else the exception's own text."""
    for inner in _chain(e):
        if isinstance(inner, ssl.SSLCertVerificationError):
            return f"TLS: the server's certificate is not trusted ({inner.verify_message})"
        if isinstance(inner, ssl.SSLError):
            reason = inner.reason or str(inner)
            if reason in _CERT_REFUSED:
                return f"TLS: the server refused this client's certificate ({reason.lower()})"
            return f"TLS: {reason.lower().replace('_', ' ')}"
        if isinstance(inner, socket.gaierror):
            return f"cannot resolve the host name ({inner.strerror or inner})"
        if isinstance(inner, ConnectionRefusedError):
            return "connection refused"
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror.lower()
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _chain(e: BaseException) -> list[BaseException]:
    """``e``, its causes and contexts, and the members of any exception group among them."""
    seen: list[BaseException] = []
    todo = [e]
    while todo and len(seen) < 20:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(x for x in (current.__cause__, current.__context__) if x is not None)
    return seen


def _cert_refused(e: BaseException) -> bool:
    return isinstance(e, ssl.SSLError) and e.reason in _CERT_REFUSED


# --- one connection ---------------------------------------------------------------------------


class _Sending(Protocol):
    """A connection :func:`send_all` writes to: its socket, and whether a byte went out."""

    sock: socket.socket
    sent: bool


async def send_all(conn: _Sending, data: bytes, *, reused: bool = False) -> None:
    """Write ``data`` to ``conn.sock`` whole (waiting while the kernel's buffer is full),
    setting ``conn.sent`` once a byte went out, then checkpoint. A failure raises
    :class:`NotSent` when nothing of the connection's request went out (also when a
    ``reused`` kept-alive connection turns out closed by the server), else
    :class:`MaybeSent`: the rule both transports' callers sort errors by."""
    view = memoryview(data)
    sock = conn.sock
    while view:
        try:
            n = sock.send(view)
        except _WOULD_BLOCK_WRITE:
            await trio.lowlevel.wait_writable(sock)
            continue
        except OSError as e:
            if not conn.sent and reused and e.errno in (errno.EPIPE, errno.ECONNRESET):
                # A kept-alive connection the server had closed: nothing went out.
                raise NotSent(f"the kept-alive connection was closed ({e.strerror})") from None
            if not conn.sent:
                raise NotSent(transport_cause(e)) from None
            raise MaybeSent(transport_cause(e)) from None
        if n:
            conn.sent = True
        view = view[n:]
    # One checkpoint per request even when the kernel took it all at once: a caller
    # looping on calls against a fast etcd still lets other tasks run.
    await trio.lowlevel.checkpoint()


class Connection:
    """One HTTP/1.1 connection to one endpoint. Plain slotted class: used on every call.

    ``sent`` tells, after a failure, whether any byte of the current request went out (the
    line between :class:`NotSent` and :class:`MaybeSent`)."""

    __slots__ = ("_h11", "endpoint", "reused", "sent", "sock")

    def __init__(self, endpoint: Endpoint, sock: socket.socket) -> None:
        self.endpoint = endpoint
        self.sock = sock
        self._h11 = h11.Connection(h11.CLIENT)
        self.sent = False
        self.reused = False

    @classmethod
    async def open(cls, endpoint: Endpoint, tls: ssl.SSLContext | None) -> Connection:
        """Connect (and, for https, complete the TLS handshake); the caller bounds the time.
        Raises :class:`NotSent` naming the cause."""
        try:
            stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
        except OSError as e:
            raise NotSent(transport_cause(e)) from None
        # Take the plain socket out of trio's stream: from here on it is driven directly.
        trio_sock = stream.socket
        sock = socket.socket(trio_sock.family, trio_sock.type, trio_sock.proto, trio_sock.detach())
        sock.setblocking(False)
        if endpoint.tls:
            assert tls is not None
            try:
                sock = tls.wrap_socket(
                    sock, server_hostname=endpoint.host, do_handshake_on_connect=False
                )
                await _handshake(sock)
            except (OSError, ValueError) as e:
                sock.close()
                raise NotSent(transport_cause(e)) from None
            except BaseException:
                sock.close()
                raise
        return cls(endpoint, sock)

    def close(self) -> None:
        """Close at once (no TLS close_notify: nothing is waited for)."""
        self.sock.close()

    def reusable(self) -> bool:
        """Whether this idle connection can carry another request: both sides kept it alive
        and nothing (an EOF, a TLS alert, stray bytes) arrived since its last answer."""
        if self._h11.our_state is not h11.IDLE or self._h11.their_state is not h11.IDLE:
            return False
        try:
            # The raw socket's peek, also under TLS: any byte at all means "not clean".
            socket.socket.recv(self.sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    # --- one exchange ----------------------------------------------------------------------

    async def request(
        self, target: str, body: bytes, headers: list[tuple[str, str]], max_answer: int
    ) -> tuple[int, bytes]:
        """POST ``body`` to ``target`` and read the whole answer: (status, body). Raises
        :class:`NotSent` / :class:`MaybeSent`; leaves the connection ready for the next
        request when both sides keep it alive."""
        await self.send_request(target, body, headers)
        status = await self.read_head(max_answer)
        parts: list[bytes] = []
        size = 0
        while (data := await self.read_body()) is not None:
            size += len(data)
            if size > max_answer:
                raise MaybeSent(f"the answer is larger than {max_answer} bytes")
            parts.append(data)
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()  # kept alive by both sides: ready for the next
        return status, b"".join(parts)

    async def send_request(self, target: str, body: bytes, headers: list[tuple[str, str]]) -> None:
        """Send one POST whole (one write when the kernel takes it)."""
        all_headers = [
            ("Host", self.endpoint.authority),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers,
        ]
        try:
            head = self._h11.send(h11.Request(method="POST", target=target, headers=all_headers))
            framed = self._h11.send(h11.Data(data=body))
            end = self._h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as e:
            raise NotSent(f"cannot send this request: {e}") from None
        assert head is not None and framed is not None and end is not None
        data = head + framed + end
        self.sent = False
        await self._send_all(data)

    async def read_head(self, max_answer: int) -> int:
        """Read up to the answer's head; its status. A ``Content-Length`` over ``max_answer``
        is refused before the body is read."""
        while True:
            event = await self._next_event()
            if type(event) is h11.Response:
                for name, value in event.headers:
                    # h11 checked it is digits; more digits than max_answer has is too many.
                    if name == b"content-length" and (len(value) > 20 or int(value) > max_answer):
                        raise MaybeSent(
                            f"the answer announces {value[:24].decode()} bytes, more than "
                            f"{max_answer}"
                        )
                return event.status_code
            if type(event) is h11.InformationalResponse:
                continue
            raise MaybeSent(f"the connection ended before an answer ({type(event).__name__})")

    async def read_body(self) -> bytes | None:
        """The next piece of the answer's body, or None at its end."""
        while True:
            event = await self._next_event()
            if type(event) is h11.Data:
                if event.data:
                    return bytes(event.data)
                continue
            if type(event) is h11.EndOfMessage:
                return None
            raise MaybeSent("the connection ended in the middle of the answer")

    async def _next_event(self) -> object:
        while True:
            try:
                event = self._h11.next_event()
            except (h11.RemoteProtocolError, ValueError) as e:  # ValueError: a huge number
                raise MaybeSent(f"the answer is not valid HTTP/1.1 ({e})") from None
            if event is not h11.NEED_DATA:
                return event
            data = await self._receive()
            try:
                self._h11.receive_data(data)
            except h11.RemoteProtocolError as e:
                raise MaybeSent(f"the answer is not valid HTTP/1.1 ({e})") from None

    async def _send_all(self, data: bytes) -> None:
        await send_all(self, data, reused=self.reused)

    async def _receive(self) -> bytes:
        sock = self.sock
        while True:
            try:
                return sock.recv(_RECV)
            except _WOULD_BLOCK_READ:
                await trio.lowlevel.wait_readable(sock)
            except ssl.SSLWantWriteError:  # TLS needs to write first (a key update)
                await trio.lowlevel.wait_writable(sock)
            except OSError as e:
                if _cert_refused(e):
                    raise NotSent(transport_cause(e)) from None
                raise MaybeSent(transport_cause(e)) from None


async def _handshake(sock: ssl.SSLSocket) -> None:
    while True:
        try:
            sock.do_handshake()
            return
        except ssl.SSLWantReadError:
            await trio.lowlevel.wait_readable(sock)
        except ssl.SSLWantWriteError:
            await trio.lowlevel.wait_writable(sock)


# --- the pool ---------------------------------------------------------------------------------


class PooledConnection(Protocol):
    """What :class:`ConnectionPool` needs of a connection (HTTP/1.1 here, HTTP/2 in
    ``_etcd_grpc``)."""

    endpoint: Endpoint
    #: Whether a byte of the current exchange went out (an exchange cut off then may have
    #: been applied).
    sent: bool

    def close(self) -> None: ...

    def reusable(self) -> bool: ...


C = TypeVar("C", bound=PooledConnection)
T = TypeVar("T")


class ConnectionPool(Generic[C]):
    """Kept-alive connections to a few endpoints, one exchange at a time on each, and the
    bound on exchanges in flight: the bookkeeping both transports share. A subclass says how
    a connection is opened (:meth:`_connect`) and runs its exchanges through :meth:`_run`
    (one exchange on an idle or new connection, under a deadline) or :meth:`_dedicated` (a
    connection of its own for a streamed answer, ended with :meth:`close_stream`). ``tls``
    is the context every https endpoint is verified with."""

    def __init__(self, tls: ssl.SSLContext | None, *, max_in_flight: int = 64) -> None:
        self.tls = tls
        self._idle: dict[Endpoint, list[C]] = {}
        self._in_flight = trio.Semaphore(max_in_flight)
        self._streams: set[C] = set()
        self.opened = 0
        self._closed = False

    async def _connect(self, endpoint: Endpoint) -> C:
        raise NotImplementedError

    async def _run(
        self,
        endpoint: Endpoint,
        exchange: Callable[[C], Awaitable[T]],
        *,
        deadline: float,
        keeps: tuple[type[BaseException], ...] = (),
    ) -> T:
        """``exchange`` on an idle connection to ``endpoint`` (or a new one) before
        ``deadline`` (trio time). The connection goes back to the idle ones after it, or
        after an exception of ``keeps`` (an answer that leaves the connection sound), and is
        closed after any other. Raises :class:`NotSent` or :class:`MaybeSent` when time runs
        out (by whether a byte went out)."""
        if self._closed:
            raise NotSent("the client is closed")
        conn: C | None = None
        with trio.move_on_at(deadline):
            async with self._in_flight:
                conn = self._take(endpoint)
                if conn is None:
                    conn = await self._connect(endpoint)
                    self.opened += 1
                try:
                    answer = await exchange(conn)
                except keeps:
                    self._give_back(conn)
                    raise
                except BaseException:
                    conn.close()
                    raise
                self._give_back(conn)
                return answer
        if conn is not None:
            conn.close()
        if conn is None or not conn.sent:
            raise NotSent("no connection within the timeout")
        raise MaybeSent("no answer within the timeout")

    async def _dedicated(self, endpoint: Endpoint) -> C:
        """A new connection to ``endpoint`` for a streamed answer, counted among the streams
        (closed with the pool)."""
        if self._closed:
            raise NotSent("the client is closed")
        conn = await self._connect(endpoint)
        self.opened += 1
        self._streams.add(conn)
        return conn

    def close_stream(self, conn: C) -> None:
        self._streams.discard(conn)
        conn.close()

    def close(self) -> None:
        """Close every connection, idle or streaming; the pool refuses new exchanges."""
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        for conn in list(self._streams):
            conn.close()
        self._streams.clear()

    def _take(self, endpoint: Endpoint) -> C | None:
        idle = self._idle.get(endpoint)
        while idle:
            conn = idle.pop()
            if conn.reusable():
                return conn
            conn.close()
        return None

    def _give_back(self, conn: C) -> None:
        if self._closed or not conn.reusable():
            conn.close()
            return
        idle = self._idle.setdefault(conn.endpoint, [])
        if len(idle) >= MAX_IDLE:
            conn.close()
            return
        idle.append(conn)


class Pool(ConnectionPool[Connection]):
    """HTTP/1.1 connections to etcd's gateway: :meth:`request` runs one exchange on an idle
    connection (or a new one) under a deadline; :meth:`open_stream` gives a dedicated
    connection for a streamed answer (a watch), which the caller closes."""

    async def _connect(self, endpoint: Endpoint) -> Connection:
        conn = await Connection.open(endpoint, self.tls)
        sock = conn.sock
        if isinstance(sock, ssl.SSLSocket) and sock.selected_alpn_protocol() == "h2":
            # The context was set to offer h2 (given to a gRPC client too): h11 cannot speak it.
            conn.close()
            raise NotSent("TLS negotiated h2: this context was given to a gRPC etcd client")
        return conn

    def _take(self, endpoint: Endpoint) -> Connection | None:
        conn = super()._take(endpoint)
        if conn is not None:
            conn.reused = True
        return conn

    async def request(
        self,
        endpoint: Endpoint,
        target: str,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        deadline: float,
        max_answer: int = MAX_ANSWER,
    ) -> tuple[int, bytes]:
        """One POST and its whole answer before ``deadline`` (trio time). Raises
        :class:`NotSent` or :class:`MaybeSent` (running out of time is either, by whether a
        byte went out)."""
        return await self._run(
            endpoint,
            lambda conn: conn.request(target, body, headers, max_answer),
            deadline=deadline,
        )

    async def open_stream(
        self, endpoint: Endpoint, target: str, body: bytes, headers: list[tuple[str, str]]
    ) -> tuple[Connection, int]:
        """A new connection that has sent ``body`` and read the answer's head: (connection,
        status). The caller reads the body with :meth:`Connection.read_body`, bounds the
        time, and ends it with :meth:`close_stream`."""
        conn = await self._dedicated(endpoint)
        try:
            await conn.send_request(target, body, headers)
            status = await conn.read_head(MAX_ANSWER)
        except BaseException:
            self.close_stream(conn)
            raise
        return conn, status
