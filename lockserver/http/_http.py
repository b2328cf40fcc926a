"""HTTP/1.1 on the protocol's port: telling an HTTP request from a frame, and serving one HTTP
connection with h11.

This module owns the transport half of the server's HTTP face: the sniffing rule
(:func:`is_http`), the limits an HTTP client gets (:class:`HttpLimits`), the request and
response values the endpoints see (:class:`HttpRequest`, :class:`HttpResponse`), its counters
(:class:`HttpCounters`) and :class:`HttpConnection`, which reads requests with h11, asks a
router for each answer and writes it. What the paths answer lives in ``_endpoints.py``; the
shell (``_server.py``) hands a connection here after its first read.

Rules kept (issue 16 section 3):
- **Sniffing costs the protocol nothing per request.** A connection's first frame is a hello,
  read under the 16 KiB limit of the handshake, so its header's first byte is always 0x00; an
  HTTP request line starts with its method, an upper-case ASCII letter. The reader decides
  once, on the first byte of a connection's first read, and never looks again.
- **An HTTP client gets the limits a protocol client gets**: a bounded request head
  (``http_max_header``, 431), a whole request within ``http_request_timeout`` of its first
  byte however slowly it trickles (408), a kept-alive connection closed after
  ``http_idle_timeout`` without a request, a bounded body (:data:`MAX_BODY`, 413), replies
  the client does not read dropped after ``send_timeout``, and at most
  ``http_max_connections`` of them at once. Bad input gets a precise status with a JSON
  ``{"error": ...}`` body and never an exception out of here.
- **One connection cannot stall the others** (issue 30). Pipelined requests never make a
  read or a send wait, so a connection that wrote 20,000 ``GET /healthz`` at once was
  answered whole before anyone else was served (2.3 s). A connection is served in turns of
  ``TURN_SECONDS`` (2 ms) of work; after each it lets every other task run
  (:meth:`HttpConnection._next_turn`). The identical requests of one turn (same path, query
  and ``Authorization``) share the first one's answer, so a costly read (``/metrics``,
  ``/v1/status``, the page, a listing page) costs once per turn, not once per pipelined
  copy; it is at most a turn old (the answer of a request pipelined behind the first may miss
  what changed in those 2 ms).
- **The probes always get in** (issue 30). At ``http_max_connections`` a new connection
  takes the slot of the connection that has waited longest -- on its client (an idle
  kept-alive connection, a request trickling in, a response not read) or for its next turn
  -- which is closed at once (:meth:`HttpConnection.evict`), as nginx reuses its idle
  keep-alive connections when it runs out; every connection but the one running is waiting,
  so a ``/healthz`` probe is answered however the others behave. (``counters.waiting`` holds
  them, longest-waiting first: O(1) to find.)
- Only GET and HEAD are served (everything here is read-only); other methods get 405 with
  ``Allow``. A request whose body was not read ends its connection (h11 cannot resync).

Theory of operation: the socket is the connection's plain non-blocking socket (or TLS
socket), as in ``_peer.py``; reads and writes wait for readiness with trio. Each request is
read whole (h11 events up to ``EndOfMessage``, the body discarded), answered by one
synchronous call of the router, and written with one ``send`` (a writer loop when the
kernel does not take it all). Time is ``trio.current_time()``: the tests run the timeouts
under a MockClock.

Prior art: h11's own trio example server (``examples/trio-server.py``), which this follows
for the state handling and the error-response rule.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from http import HTTPStatus
from time import perf_counter
from typing import Any, Final

import attrs
import h11
import trio

from lockserver._peer import CLOSE_GRACE, TURN_SECONDS, WOULD_BLOCK_READ, WOULD_BLOCK_WRITE, linger

__all__ = [
    "MAX_BODY",
    "HttpConnection",
    "HttpCounters",
    "HttpLimits",
    "HttpRequest",
    "HttpResponse",
    "is_http",
    "too_many",
]

log = logging.getLogger("lockserver")

#: The first bytes an HTTP request line may start with: every method is upper-case ASCII
#: letters (GET, HEAD, POST, OPTIONS...). A hello frame's header starts with 0x00.
_METHOD_FIRST_BYTES: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")

#: Largest request body read (and discarded): GET and HEAD bodies mean nothing here, but a
#: client library may send a short one. Larger: 413, the connection closed unread.
MAX_BODY: Final = 4096

_RECV_SIZE: Final = 64 * 1024
_JSON: Final = "application/json"
#: Most distinct answers one turn shares (a burst of distinct queries keeps a few, not all).
_SHARED_ANSWERS: Final = 8


def is_http(first_byte: int) -> bool:
    """True when a connection whose first received byte is ``first_byte`` speaks HTTP."""
    return first_byte in _METHOD_FIRST_BYTES


@attrs.frozen
class HttpLimits:
    """What one HTTP connection may cost (the ``http_*`` settings and ``send_timeout``)."""

    max_header: int
    request_timeout: float
    idle_timeout: float
    send_timeout: float


@attrs.frozen
class HttpRequest:
    """One request as the router sees it: the method (``GET`` or ``HEAD``), the path and
    query of its target (undecoded), its headers (names lower-case; a repeated header keeps
    its last value)."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]


@attrs.frozen
class HttpResponse:
    """One answer: a status, a body and its type, and extra headers."""

    status: int
    body: bytes
    content_type: str = _JSON
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(
        cls, status: int, value: Any, headers: tuple[tuple[str, str], ...] = ()
    ) -> HttpResponse:
        """``value`` as a JSON body."""
        body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
        return cls(status, body, _JSON, headers)

    @classmethod
    def error(
        cls, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> HttpResponse:
        """An error: ``{"error": message}``."""
        return cls.json(status, {"error": message}, headers)


class HttpCounters:
    """What the HTTP face counts, for the statistics and ``/metrics``: connections open now,
    accepted, evicted and refused (``http_max_connections``), and responses by status code.

    ``waiting`` holds the open connections that wait -- on their client (for its next
    request, the rest of one, to take a response, to close) or for their next turn --
    longest-waiting first: at the connection limit the first one makes room for a new
    connection (:meth:`HttpConnection.evict`). Every connection but the one running waits."""

    __slots__ = ("accepted", "evicted", "open", "refused", "responses", "waiting")

    def __init__(self) -> None:
        self.open = 0
        self.accepted = 0
        self.evicted = 0
        self.refused = 0
        self.responses: dict[int, int] = {}
        self.waiting: dict[HttpConnection, None] = {}

    @property
    def requests(self) -> int:
        """Responses sent, all statuses (every request read gets exactly one)."""
        return sum(self.responses.values())


Router = Callable[[HttpRequest, float], HttpResponse]


class _Close(Exception):
    """End the connection: EOF, a reset, an idle timeout, a stop, a send that did not finish."""


class HttpConnection:
    """Serves HTTP on one accepted socket until the client is done, a limit is hit, or
    :meth:`stop`. ``route`` answers each request (synchronously); ``counters`` is the
    server's; ``buffer`` is scratch space for the lingering close."""

    def __init__(
        self,
        sock: socket.socket,
        name: str,
        limits: HttpLimits,
        route: Router,
        counters: HttpCounters,
        buffer: bytearray,
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.name = name
        self.limits = limits
        self.route = route
        self.counters = counters
        self.buffer = buffer
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header)
        # When the first byte of the request being read arrived (None: none yet, idle since
        # idle_since).
        self.began: float | None = None
        self.idle_since = 0.0
        self.eof = False
        self.stopping = False
        self.evicted = False  # closed to make room for a new connection
        self.waiting: trio.CancelScope | None = None  # the socket wait stop() cancels
        self.reading = False  # that wait is for bytes from the client (else: to send)
        # This connection's turn: when it ends (perf_counter), and the answers given in it,
        # by what decides an answer (path, query, authorization): shared by the identical
        # requests pipelined behind the first in the same turn.
        self.turn_ends = 0.0
        self.answers: dict[tuple[str, str, str], HttpResponse] = {}

    def stop(self) -> None:
        """Close between requests (shutdown): a request being answered is finished first."""
        self.stopping = True
        if self.waiting is not None and self.reading:
            self.waiting.cancel()

    def evict(self) -> None:
        """Close now, to make room at ``http_max_connections``. Only a connection that waits
        (in ``counters.waiting``: on its client, or for its turn) is evicted, so nothing is
        being answered: a request it had begun to send, or had pipelined, is dropped
        unanswered, a response it had not taken whole is cut off."""
        self.evicted = self.stopping = True
        self.counters.waiting.pop(self, None)
        if self.waiting is not None:
            self.waiting.cancel()

    async def _wait(
        self, fd_wait: Callable[[int], Awaitable[None]], deadline: float, *, reading: bool
    ) -> bool:
        """Wait for the socket (``trio.lowlevel.wait_readable`` or ``wait_writable``) at
        most until ``deadline``, among the connections ``counters.waiting`` lists. False:
        the deadline passed, or (a read wait) a stop, or an eviction came first."""
        waiting = self.counters.waiting
        waiting[self] = None  # the longest-waiting first
        self.reading = reading
        try:
            with trio.CancelScope(deadline=deadline) as scope:
                self.waiting = scope
                if self.evicted or (reading and self.stopping):
                    scope.cancel()
                await fd_wait(self.fd)
        finally:
            self.waiting = None
            waiting.pop(self, None)
        self._new_turn()
        return not scope.cancelled_caught

    async def serve(self, first: bytes) -> None:
        """Serve requests, starting with the bytes already read (``first``); return when the
        connection is done. The socket is left open for the caller to close."""
        h = self.h11
        self.began = trio.current_time()
        h.receive_data(first)
        self._new_turn()
        try:
            while True:
                try:
                    response, method = await self._next()
                except h11.RemoteProtocolError as exc:
                    await self._reply(_protocol_error(exc), "GET")
                    break
                if response is None:
                    break
                await self._reply(response, method)
                if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                    break  # HTTP/1.0, Connection: close, or a body left unread
                if perf_counter() >= self.turn_ends:
                    await self._next_turn()
                h.start_next_cycle()
                self.idle_since = trio.current_time()
                # A pipelined next request may be buffered already: its clock runs now.
                self.began = self.idle_since if h.trailing_data[0] else None
                if self.stopping:
                    break
            if not self.eof:
                await self._linger()
        except _Close:
            pass

    async def _next_turn(self) -> None:
        """Let every other task run before this connection's next request. Why: pipelined
        requests never make a read or a send wait, so without it one connection's burst
        would be answered whole before anyone else is served. Meanwhile it waits for its
        turn: it may be evicted (then _Close)."""
        waiting = self.counters.waiting
        waiting[self] = None
        try:
            await trio.lowlevel.checkpoint()
        finally:
            waiting.pop(self, None)
        self._new_turn()
        if self.evicted:
            raise _Close

    async def _linger(self) -> None:
        """The lingering close (``_peer.linger``), bounded by CLOSE_GRACE; evictable."""
        waiting = self.counters.waiting
        waiting[self] = None
        try:
            with trio.move_on_after(CLOSE_GRACE) as scope:
                self.waiting = scope
                self.reading = True
                if self.evicted:
                    scope.cancel()
                await linger(self.sock, self.buffer)
        finally:
            self.waiting = None
            waiting.pop(self, None)

    def _new_turn(self) -> None:
        """A turn begins (the connection waited, or let the others run): answers given
        before are not shared any more."""
        self.turn_ends = perf_counter() + TURN_SECONDS
        self.answers.clear()

    async def refuse(self, response: HttpResponse) -> None:
        """Answer ``response`` whatever was asked (a refused connection), then close."""
        try:
            await self._reply(response, "GET", close=True)
            with trio.move_on_after(CLOSE_GRACE):
                await linger(self.sock, self.buffer)
        except _Close:
            pass

    # --- reading ------------------------------------------------------------------------------

    async def _next(self) -> tuple[HttpResponse | None, str]:
        """Read the next request whole and return its answer (None: the client closed
        between requests, or a stop or the idle timeout came first) and its method."""
        h = self.h11
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                if not await self._receive():
                    return _TIMEOUT, "GET"
                continue
            if type(event) is h11.ConnectionClosed:
                return None, "GET"
            assert type(event) is h11.Request, event
            return await self._request(event), event.method.decode("ascii", "replace")

    async def _request(self, event: h11.Request) -> HttpResponse:
        if _head_size(event) > self.limits.max_header:
            # h11 bounds only a head still incomplete; one that arrived whole in one read is
            # measured here, so the bound does not depend on how the bytes were split.
            return _HEAD_TOO_LARGE
        if event.http_version not in (b"1.1", b"1.0"):
            return HttpResponse.error(
                505,
                f"HTTP/{event.http_version.decode('ascii', 'replace')} is not supported: "
                "this server speaks HTTP/1.1 (and 1.0)",
            )
        method = event.method.decode("ascii", "replace")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in event.headers}
        if method not in ("GET", "HEAD"):
            self._end_if_bodiless()
            return HttpResponse.error(
                405,
                f"method {method} is not allowed: every endpoint here is read-only (GET, HEAD)",
                (("Allow", "GET, HEAD"),),
            )
        length = headers.get("content-length")
        if length is not None and int(length) > MAX_BODY:  # h11 checked it is digits
            return HttpResponse.error(
                413, f"a request body of {length} bytes is over the limit of {MAX_BODY} bytes"
            )
        read = 0
        h = self.h11
        while True:
            part = h.next_event()
            if part is h11.NEED_DATA:
                if not await self._receive():
                    return _TIMEOUT
                continue
            if type(part) is h11.Data:
                read += len(part.data)
                if read > MAX_BODY:
                    return HttpResponse.error(
                        413, f"the request body is over the limit of {MAX_BODY} bytes"
                    )
                continue
            assert type(part) is h11.EndOfMessage, part
            break
        target = event.target.decode("latin-1")
        if not target.startswith("/"):
            if not target.startswith(("http://", "https://")):
                return HttpResponse.error(400, f"the request target {target!r} is not a path")
            # The absolute form (a proxy's): only its path matters here.
            slash = target.find("/", target.index("//") + 2)
            target = "/" if slash < 0 else target[slash:]
        path, _, query = target.partition("?")
        key = (path, query, headers.get("authorization", ""))
        shared = self.answers.get(key)
        if shared is not None:
            return shared
        try:
            answer = self.route(HttpRequest(method, path, query, headers), trio.current_time())
        except Exception:  # a bug in an endpoint: this request's 500, nobody else's problem
            log.exception(
                "http connection %s: internal error serving %s %s", self.name, method, path
            )
            return HttpResponse.error(500, "internal server error (logged)")
        if len(self.answers) >= _SHARED_ANSWERS:
            self.answers.clear()
        self.answers[key] = answer
        return answer

    def _end_if_bodiless(self) -> None:
        """A refused request without a body ends here, so the connection can go on."""
        if self.h11.their_state is h11.SEND_BODY:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA and type(event) is not h11.EndOfMessage:
                return  # a body: it stays unread and the connection ends after the reply

    async def _receive(self) -> bool:
        """Feed the next received bytes to h11. False: the request (or the idle) timeout ran
        out; raises _Close on a stop between requests, an idle timeout, a reset."""
        began = self.began
        limits = self.limits
        idle = began is None
        if began is None:
            deadline = self.idle_since + limits.idle_timeout
        else:
            deadline = began + limits.request_timeout
        if self.stopping and idle:
            raise _Close
        data = await self._recv(deadline)
        if data is None:
            if idle or self.stopping:
                raise _Close  # nothing of a request was sent: nothing to answer
            return False
        if idle:
            self.began = trio.current_time()
        if not data:
            self.eof = True
        self.h11.receive_data(data)
        return True

    async def _recv(self, deadline: float) -> bytes | None:
        """The next received bytes (empty: EOF); None: ``deadline`` passed or a stop came
        first. Raises _Close on a reset."""
        sock = self.sock
        while True:
            try:
                return sock.recv(_RECV_SIZE)
            except WOULD_BLOCK_READ:
                wait = trio.lowlevel.wait_readable
            except ssl.SSLWantWriteError:
                wait = trio.lowlevel.wait_writable
            except OSError as exc:
                log.debug("http connection %s: receive failed: %s", self.name, exc)
                raise _Close from None
            if not await self._wait(wait, deadline, reading=True):
                return None

    # --- writing ------------------------------------------------------------------------------

    async def _reply(self, response: HttpResponse, method: str, *, close: bool = False) -> None:
        """Write ``response`` (its head only for HEAD); count it."""
        h = self.h11
        if h.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            raise _Close  # h11 cannot answer in this state (cannot happen after a request)
        counters = self.counters
        counters.responses[response.status] = counters.responses.get(response.status, 0) + 1
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(response.body))),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            *response.headers,
        ]
        if close or (response.status >= 400 and h.their_state is not h11.DONE):
            # The rest of this request stays unread: say that the connection ends.
            headers.append(("Connection", "close"))
        head = h11.Response(
            status_code=response.status, headers=headers, reason=_reason(response.status)
        )
        data = h.send(head) or b""
        if method != "HEAD" and response.body:
            data += h.send(h11.Data(data=response.body)) or b""
        data += h.send(h11.EndOfMessage()) or b""
        await self._send_all(data)

    async def _send_all(self, data: bytes) -> None:
        """Send everything, waiting for writability; a client that takes nothing for
        ``send_timeout`` is dropped (_Close)."""
        view = memoryview(data)
        sock = self.sock
        while view:
            try:
                n = sock.send(view)
            except WOULD_BLOCK_WRITE:
                deadline = trio.current_time() + self.limits.send_timeout
                if not await self._wait(trio.lowlevel.wait_writable, deadline, reading=False):
                    if not self.evicted:
                        log.info("http connection %s: the client reads nothing, dropped", self.name)
                    raise _Close from None
                continue
            except OSError as exc:
                log.debug("http connection %s: send failed: %s", self.name, exc)
                raise _Close from None
            view = view[n:]


#: The answer to a request that did not arrive whole in time (http_request_timeout).
_TIMEOUT: Final = HttpResponse.error(
    408, "the request did not arrive whole within http_request_timeout"
)


def _head_size(event: h11.Request) -> int:
    """The bytes of ``event``'s request line and headers as written canonically
    (``METHOD SP target SP HTTP/x.y CRLF``, ``name: value CRLF`` each, then CRLF): what
    ``http_max_header`` bounds. Whitespace h11 strips is not counted."""
    size = len(event.method) + len(event.target) + 14  # 2 spaces, "HTTP/1.1", 2 CRLFs
    for name, value in event.headers:
        size += len(name) + len(value) + 4  # ": " and CRLF
    return size


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


_HEAD_TOO_LARGE: Final = HttpResponse.error(
    431, "the request head is over the limit (http_max_header)"
)


def _protocol_error(exc: h11.RemoteProtocolError) -> HttpResponse:
    """The answer to a request h11 could not parse: its hint (400, or 431 for a head over
    ``http_max_header``), and what was wrong."""
    status = exc.error_status_hint
    if status == 431:
        return _HEAD_TOO_LARGE
    return HttpResponse.error(status, f"malformed HTTP request: {exc}")


def too_many(limit: int) -> HttpResponse:
    """The answer of a connection refused by ``http_max_connections``."""
    return HttpResponse.error(
        503, f"too many HTTP connections open, the limit (http_max_connections={limit})"
    )
