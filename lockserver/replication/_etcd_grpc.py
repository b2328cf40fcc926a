"""etcd's gRPC API spoken directly: HTTP/2 with h2 over non-blocking sockets under trio,
messages with protobuf (``_etcd_rpc.proto``). No etcd semantics here: a path and message
bytes in; message bytes, or etcd's gRPC status, out.

This module owns the gRPC transport of :mod:`lockserver.replication._etcd` (its default,
``Etcd(..., transport="grpc")``): one HTTP/2 connection (:class:`GrpcConnection`: connect,
one unary call, or one streaming call read message by message), the idle connections kept
per endpoint (:class:`GrpcPool`), how each configures h2 (:func:`h2_config`), and a gRPC
status other than OK (:class:`GrpcStatus`).
Transport failures are ``_etcd_http``'s :class:`NotSent` / :class:`MaybeSent`, so the
failover rule of ``_etcd.py`` holds unchanged.

Why: etcd 3.4's JSON gateway is itself a gRPC client of the server over loopback, so every
gateway put pays one more hop and every watch event a JSON encode per watcher. Measured from
Python against one member (benchmarks/README.md, issue 29): a put 817 -> 629 µs p50, a put
and its watch event 894 -> 608 µs.

Rules kept:
- **A failure says whether the request can have reached the server** (as ``_etcd_http``):
  :class:`NotSent` before the first byte of a call went out, :class:`MaybeSent` after.
- **Every answer is bounded.** One gRPC message is at most ``max_message`` bytes (refused
  from its 5-byte prefix, before its body arrives); a compressed message (we never offer
  compression), a frame h2 refuses (too large, malformed, a protocol violation), a stream
  reset, a GOAWAY before the answer, or an answer that is not ``application/grpc`` is a
  clear :class:`MaybeSent` and the connection is closed. Time is the caller's: every wait
  here is a trio checkpoint.
- **A request of any size goes out** as etcd's flow control lets it (its initial window is
  64 KiB, a value may be 1.4 MiB), in frames of the size it allows; the events that arrive
  meanwhile are kept for the answer.
- **A PING's ACK waits for the next request during a unary call, and goes after it.** etcd
  (grpc-go) answers a request's DATA with a WINDOW_UPDATE and a PING (its bandwidth
  estimate) while no PING of its is unacknowledged. Sent at once, the ACK is one more write
  for us and one more wake-up for etcd in every put, while etcd commits. So during a unary
  call the ACKs are held (at most :data:`_HELD_MAX` bytes of them, then they go out) and
  leave in the same write as the connection's next request, *after* it: etcd reads that
  request while its PING is still out and does not PING it, so it PINGs every other put.
  Measured against one member (``benchmarks/grpc_costs.py``): a put's p50 -11 % and our
  CPU per put -17 % when the caller sleeps while waiting; -7 % and -8 % when it polls its
  sockets meanwhile, as a replica does. A PING that needs a prompt answer (a keepalive)
  comes only after minutes of silence on a connection, never during a call; a streaming
  call (a watch, a keepalive) and anything else h2 queues (SETTINGS acks, WINDOW_UPDATEs)
  is sent at once.
- **One call per connection at a time**, as the HTTP/1.1 pool: a connection is reused only
  when its last call ended whole and no GOAWAY came; the pool opens more under concurrency.
  A watch has a connection of its own.

Prior art: gRPC's HTTP/2 protocol document (PROTOCOL-HTTP2.md: the length-prefixed message,
``te: trailers``, status in the trailers or a trailers-only answer), h2's client examples,
grpclib (gRPC on h2 for asyncio).
"""

from __future__ import annotations

import socket
import ssl
import struct
from typing import Final

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from ._etcd_http import Connection as _Http1
from ._etcd_http import (
    ConnectionPool,
    Endpoint,
    MaybeSent,
    NotSent,
    send_all,
    transport_cause,
)

__all__ = ["GrpcConnection", "GrpcPool", "GrpcStatus", "grpc_context", "h2_config"]

_RECV: Final = 64 * 1024
_WOULD_BLOCK_READ: Final = (BlockingIOError, ssl.SSLWantReadError)
#: Our receive window, per stream and for the connection: etcd never waits on our
#: WINDOW_UPDATEs for one answer (each message is acknowledged as it is read anyway).
_WINDOW: Final = 16 * 1024 * 1024
_PREFIX: Final = struct.Struct(">BI")
#: A PING ACK frame as h2 writes one: its 9-byte header (length 8, type PING, flag ACK,
#: stream 0), then 8 bytes of the PING's data.
_PING_ACK: Final = b"\x00\x00\x08\x06\x01\x00\x00\x00\x00"
_PING_ACK_SIZE: Final = 17
#: The most PING ACK bytes held back for the next request (module header): a server that
#: floods PINGs during a call gets its ACKs then, and holds no more of our memory.
_HELD_MAX: Final = 1024


def _only_ping_acks(data: bytes) -> bool:
    """Whether ``data`` (h2's output) is PING ACK frames and nothing else (or nothing)."""
    return len(data) % _PING_ACK_SIZE == 0 and all(
        data.startswith(_PING_ACK, i) for i in range(0, len(data), _PING_ACK_SIZE)
    )


class GrpcStatus(Exception):
    """etcd answered the call with a gRPC status other than OK: ``code`` and ``message``
    (grpc-message, percent-decoded, bounded)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"gRPC status {code}: {message}")
        self.code = code
        self.message = message


def grpc_context(tls: ssl.SSLContext) -> ssl.SSLContext:
    """``tls`` set to offer ALPN ``h2`` (gRPC over TLS needs it): the same context object,
    so its CA bundle and client certificate are kept; a context is given to one transport."""
    tls.set_alpn_protocols(["h2"])
    return tls


def h2_config() -> h2.config.H2Configuration:
    """How every connection here configures h2 (a new object each time: h2's settings are
    attributes a caller may change)."""
    # Our headers are constants and a token etcd gave: h2's checks and normalising of them
    # cost ~10 µs a call for nothing. What etcd sends is still validated.
    return h2.config.H2Configuration(
        client_side=True,
        header_encoding=None,
        validate_outbound_headers=False,
        normalize_outbound_headers=False,
    )


def _percent_decode(raw: bytes) -> str:
    from urllib.parse import unquote_to_bytes

    return unquote_to_bytes(raw[:4000]).decode("utf-8", "replace")[:1000]


class GrpcConnection:
    """One HTTP/2 connection to one endpoint, carrying one call at a time."""

    __slots__ = (
        "_h2",
        "_held",
        "_preface",
        "_stream",
        "_unary",
        "endpoint",
        "goaway",
        "sent",
        "sock",
    )

    def __init__(self, endpoint: Endpoint, sock: socket.socket) -> None:
        self.endpoint = endpoint
        self.sock = sock
        self._h2 = h2.connection.H2Connection(config=h2_config())
        self._h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
            },
        )
        self._h2.initiate_connection()
        self._h2.increment_flow_control_window(_WINDOW)
        self._stream = 0
        self._preface = bytearray()  # the server's first bytes, until its SETTINGS is seen
        self._held = b""  # PING ACKs held for the next request (module header)
        self._unary = False  # the call in progress is unary: PING ACKs may be held
        self.sent = False
        self.goaway = False

    @classmethod
    async def open(cls, endpoint: Endpoint, tls: ssl.SSLContext | None) -> GrpcConnection:
        """Connect (TLS with ALPN h2 for https) and queue HTTP/2's preface; the caller bounds
        the time. Raises :class:`NotSent` naming the cause."""
        sock = (await _Http1.open(endpoint, tls)).sock
        if isinstance(sock, ssl.SSLSocket) and sock.selected_alpn_protocol() not in (None, "h2"):
            sock.close()
            raise NotSent(f"TLS: the server chose {sock.selected_alpn_protocol()!r}, not h2")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(endpoint, sock)

    def close(self) -> None:
        self.sock.close()

    def reusable(self) -> bool:
        """Whether another call can go on this connection: the last one ended whole, and
        what arrived since (read now without waiting: a PING, SETTINGS, a GOAWAY, the end)
        is neither a GOAWAY nor the connection's end nor invalid HTTP/2."""
        if self._stream or self.goaway:
            return False
        while True:
            try:
                data = self.sock.recv(_RECV)
            except _WOULD_BLOCK_READ:
                return True
            except OSError:
                return False
            if not data:
                return False
            try:
                events = self._h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                return False
            if any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
                self.goaway = True
                return False

    # --- calls -----------------------------------------------------------------------------

    async def _start(
        self, path: str, metadata: list[tuple[str, str]], message: bytes, end: bool
    ) -> list[h2.events.Event]:
        """Send a call's headers and its first message (all of it, as HTTP/2's flow control
        lets it go, in frames of the size the server allows). Returns the events that
        arrived meanwhile, which belong to the call's answer."""
        stream = self._h2.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "https" if self.endpoint.tls else "http"),
            (":path", path),
            (":authority", self.endpoint.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *metadata,
        ]
        self._h2.send_headers(stream, headers)
        self._stream = stream
        return await self._send(stream, _PREFIX.pack(0, len(message)) + message, end)

    async def _send(self, stream: int, payload: bytes, end: bool) -> list[h2.events.Event]:
        """Send ``payload`` on ``stream``, waiting for WINDOW_UPDATEs when the server's
        window is spent (a request larger than 64 KiB, etcd's initial window). Stops early
        when the server ends or resets the stream, or goes away, meanwhile: the answer says
        why. The events read while waiting are returned for the answer's reader."""
        h2c = self._h2
        early: list[h2.events.Event] = []
        offset = 0
        while True:
            room = min(h2c.local_flow_control_window(stream), h2c.max_outbound_frame_size)
            size = min(len(payload) - offset, room)
            if size > 0:
                last = offset + size == len(payload)
                h2c.send_data(stream, payload[offset : offset + size], end_stream=end and last)
                offset += size
                if last:
                    break
                continue
            await self._flush()
            events = await self._events()
            early += events
            if any(
                (
                    isinstance(e, h2.events.StreamEnded | h2.events.StreamReset)
                    and e.stream_id == stream
                )
                or isinstance(e, h2.events.ConnectionTerminated)
                for e in events
            ):
                break
        await self._flush()
        return early

    async def unary(
        self, path: str, message: bytes, metadata: list[tuple[str, str]], max_message: int
    ) -> bytes:
        """One unary call: the answer's one message. Raises :class:`GrpcStatus` for etcd's
        refusal, :class:`NotSent` / :class:`MaybeSent` for the transport."""
        self.sent = False
        self._unary = True
        early = await self._start(path, metadata, message, end=True)
        reader = MessageReader(self, max_message, early=early)
        answer = await reader.next()
        if answer is None:
            raise MaybeSent("the call ended without an answer message")
        if await reader.next() is not None:
            raise MaybeSent("a unary call answered with more than one message")
        return answer

    async def open_stream(
        self, path: str, message: bytes, metadata: list[tuple[str, str]], max_message: int
    ) -> MessageReader:
        """Start a streaming call with its first message (the stream stays open for
        writing); its answers are read with the returned reader."""
        self.sent = False
        self._unary = False
        early = await self._start(path, metadata, message, end=False)
        return MessageReader(self, max_message, early=early)

    # --- bytes -----------------------------------------------------------------------------

    async def _flush(self, *, hold_acks: bool = False) -> None:
        """Send what h2 queued, then the PING ACKs held so far (module header). ``hold_acks``:
        when what h2 queued is only PING ACKs, hold it too (up to :data:`_HELD_MAX` bytes)."""
        data = self._h2.data_to_send()
        if hold_acks and len(self._held) + len(data) <= _HELD_MAX and _only_ping_acks(data):
            self._held += data
            return
        if self._held:
            data, self._held = data + self._held, b""
        if data:
            await send_all(self, data)

    async def _events(self, timeout: float | None = None) -> list[h2.events.Event]:
        """The next events HTTP/2 yields from what arrives (at least one). Once bytes have
        arrived that end no frame (h2 holds a partial frame, up to 16 MiB by the 24-bit
        length), the rest must come within ``timeout`` seconds (None: no bound)."""
        partial = False
        while True:
            if partial and timeout is not None:
                with trio.move_on_after(timeout) as scope:
                    data = await self._receive()
                if scope.cancelled_caught:
                    raise MaybeSent(f"an HTTP/2 frame did not arrive whole within {timeout} s")
            else:
                data = await self._receive()
            if not data:
                raise MaybeSent("the connection was closed")
            if not self._preface:
                # A server's first frame is SETTINGS (type 4): anything else is not HTTP/2
                # (h2 would wait for a "frame" as long as the garbage's first bytes say).
                self._preface += data[:9]
                if len(self._preface) >= 4 and self._preface[3] != 4:
                    raise MaybeSent(
                        f"the server does not speak HTTP/2 (it began {bytes(self._preface)!r})"
                    )
            try:
                events = self._h2.receive_data(data)
            except h2.exceptions.ProtocolError as e:
                raise MaybeSent(
                    f"the answer is not valid HTTP/2 ({type(e).__name__}: {e})"
                ) from None
            # SETTINGS acks, WINDOW_UPDATEs; PING ACKs, held in a unary call (module header).
            await self._flush(hold_acks=self._unary)
            if events:
                return events
            partial = True

    async def _receive(self) -> bytes:
        sock = self.sock
        while True:
            try:
                return sock.recv(_RECV)
            except _WOULD_BLOCK_READ:
                await trio.lowlevel.wait_readable(sock)
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(sock)
            except OSError as e:
                raise MaybeSent(transport_cause(e)) from None


class MessageReader:
    """The answers of one call, message by message: gRPC's length-prefixed messages joined
    from DATA frames, the status checked from the trailers (or a trailers-only answer)."""

    def __init__(
        self,
        conn: GrpcConnection,
        max_message: int,
        *,
        timeout: float | None = None,
        early: list[h2.events.Event] | None = None,
    ) -> None:
        self._conn = conn
        self._max = max_message
        self.timeout = timeout  # a message begun must end within it (None: no bound)
        self._buffer = bytearray()
        self._ended = False
        self._headers = False
        self._status: tuple[int, str] | None = None
        self._queue: list[h2.events.Event] = early or []

    @property
    def started(self) -> bool:
        """Whether part of a message has arrived (the rest should follow promptly)."""
        return bool(self._buffer)

    async def next(self) -> bytes | None:
        """The next message, or None when the call ended with status OK. Raises
        :class:`GrpcStatus` for another status, :class:`MaybeSent` for the transport."""
        conn = self._conn
        stream = conn._stream
        while True:
            if len(self._buffer) >= 5:
                flag, length = _PREFIX.unpack_from(self._buffer)
                if flag != 0:
                    raise MaybeSent("a compressed gRPC message (no compression was offered)")
                if length > self._max:
                    raise MaybeSent(f"a gRPC message of {length} bytes, more than {self._max}")
                if len(self._buffer) >= 5 + length:
                    message = bytes(self._buffer[5 : 5 + length])
                    del self._buffer[: 5 + length]
                    return message
            if self._ended:
                if self._buffer:
                    raise MaybeSent("the call ended in the middle of a message")
                conn._stream = 0
                if self._status is None:
                    raise MaybeSent("the call ended without a grpc-status")
                code, text = self._status
                if code != 0:
                    raise GrpcStatus(code, text)
                return None
            if not self._queue:
                if self._buffer and self.timeout is not None:
                    with trio.move_on_after(self.timeout) as scope:
                        self._queue = await conn._events(self.timeout)
                    if scope.cancelled_caught:
                        raise MaybeSent(
                            f"a gRPC message did not arrive whole within {self.timeout} s"
                        )
                else:
                    self._queue = await conn._events(self.timeout)
            self._event(self._queue.pop(0), stream)

    def _event(self, event: h2.events.Event, stream: int) -> None:
        conn = self._conn
        if isinstance(event, h2.events.ConnectionTerminated):
            conn.goaway = True
            if event.last_stream_id is not None and event.last_stream_id < stream:
                raise MaybeSent(f"the server said GOAWAY ({event.error_code!r}) before this call")
            return
        if getattr(event, "stream_id", stream) not in (stream, 0):
            return  # a stream of a call that ended: nothing of ours
        if isinstance(event, h2.events.ResponseReceived):
            self._headers = True
            fields = dict(event.headers)
            if fields.get(b":status") != b"200":
                raise MaybeSent(f"the answer is HTTP {fields.get(b':status', b'?')[:8]!r}")
            if not fields.get(b"content-type", b"").startswith(b"application/grpc"):
                raise MaybeSent("the answer is not application/grpc")
            self._take_status(fields)
        elif isinstance(event, h2.events.DataReceived):
            if not self._headers:
                raise MaybeSent("data before the answer's headers")
            conn._h2.acknowledge_received_data(event.flow_controlled_length, stream)
            if len(self._buffer) + len(event.data) > self._max + 5:
                raise MaybeSent(f"a gRPC message of more than {self._max} bytes")
            self._buffer += event.data
        elif isinstance(event, h2.events.TrailersReceived):
            self._take_status(dict(event.headers))
        elif isinstance(event, h2.events.StreamEnded):
            self._ended = True
        elif isinstance(event, h2.events.StreamReset):
            conn._stream = 0
            raise MaybeSent(f"the server reset the call ({event.error_code!r})")

    def _take_status(self, fields: dict[bytes, bytes]) -> None:
        raw = fields.get(b"grpc-status")
        if raw is None:
            return
        if not raw.isdigit() or len(raw) > 3:
            raise MaybeSent(f"grpc-status {raw[:8]!r} is not a status code")
        self._status = (int(raw), _percent_decode(fields.get(b"grpc-message", b"")))

    async def send(self, message: bytes) -> None:
        """Send one more message on the call's open stream."""
        conn = self._conn
        self._queue += await conn._send(
            conn._stream, _PREFIX.pack(0, len(message)) + message, False
        )


class GrpcPool(ConnectionPool[GrpcConnection]):
    """Kept-alive HTTP/2 connections to a few endpoints, one call at a time on each.

    :meth:`unary` runs one call on an idle connection (or a new one) under a deadline;
    :meth:`open_stream` gives a connection of its own to a streaming call, which the caller
    closes with :meth:`close_stream`."""

    async def _connect(self, endpoint: Endpoint) -> GrpcConnection:
        return await GrpcConnection.open(endpoint, self.tls)

    async def unary(
        self,
        endpoint: Endpoint,
        path: str,
        message: bytes,
        metadata: list[tuple[str, str]],
        *,
        deadline: float,
        max_message: int,
    ) -> bytes:
        """One unary call and its answer before ``deadline`` (trio time). Raises
        :class:`GrpcStatus` (the connection stays sound), or :class:`NotSent` /
        :class:`MaybeSent` (running out of time is either, by whether a byte went out)."""
        return await self._run(
            endpoint,
            lambda conn: conn.unary(path, message, metadata, max_message),
            deadline=deadline,
            keeps=(GrpcStatus,),
        )

    async def open_stream(
        self,
        endpoint: Endpoint,
        path: str,
        message: bytes,
        metadata: list[tuple[str, str]],
        max_message: int,
    ) -> tuple[GrpcConnection, MessageReader]:
        """A new connection that has started a streaming call with ``message``; the caller
        reads the answers, bounds the time, and ends it with :meth:`close_stream`."""
        conn = await self._dedicated(endpoint)
        try:
            reader = await conn.open_stream(path, message, metadata, max_message)
        except BaseException:
            self.close_stream(conn)
            raise
        return conn, reader
