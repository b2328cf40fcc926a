"""One peer (a client connection) as the server sees it: its socket, its outbox, how it closes.

Why / rules kept (issue #3):
- Replies and events leave in the order they were queued, and anyone may queue them: the
  connection's reader (replies), and whoever delivers what the lock core returned (events
  and answers of parked transactions, from another connection's batch or a timer).
- The server never waits on a client: unsent bytes beyond ``max_send_buffer``, or a blocked
  send that makes no progress for ``send_timeout``, drop the client as a slow consumer; it is
  sent nothing more. So does an outbox that grows while the unsent bytes of all connections
  together are past ``max_send_total`` (10,000 connections x 4 MiB would be 40 GiB).
- Closing on purpose never destroys the last reply (lingering close, below).

Theory of operation
===================
**The outbox and its writer.** The outbox is a bytearray. Queuing is followed by one
synchronous, non-blocking ``send`` of the whole outbox (:meth:`Peer.send_pending`), so in the
common case there is no writer task and no task switch at all: the reader of a batch of
pipelined requests appends every reply and sends them with ONE syscall. Only when the kernel
refuses bytes (the client reads slower than it asks) does the connection become *blocked*: a
writer task is spawned in the connection's nursery; it waits for writability (at most
``send_timeout`` per wait), sends, and ends when the outbox is empty. While blocked nobody else
sends (bytes stay in order), queuing only appends, and an outbox past ``max_send_buffer``
drops the client at once.

**What all connections hold together** (:class:`Totals`, one per server). Only a blocked
connection keeps unsent bytes past the batch that queued them, so only blocked outboxes are
counted: each connection remembers how many of its bytes the total includes (``counted``)
and re-syncs it when it queues while blocked and after each of its writer's sends; the
writer's end and :meth:`Peer.kill` take them all back. The hot path (not blocked) pays
nothing. The same record holds the receive side (bytes of incomplete request frames, kept by
the reader, ``_reading.py``) and the number of blocked connections, so ``statistics()``
reads three integers instead of walking the connections.

Chosen over a permanent writer task per connection woken by an Event: that costs a task switch
per batch on the hot path and 10,000 idle tasks at the connection limit. Chosen over "the
reader writes": events for an idle connection arrive while its reader sleeps in
``wait_readable``, and a reader stuck writing to one slow client could not notice the client's
next bytes.

**Closing.** :meth:`Peer.finish` closes gracefully (a protocol error, a wrong version, a
timeout, shutdown): the writer drains what is queued (bounded), then the socket is half-closed
and the server *lingers*, reading and discarding until the peer's EOF (bounded). Closing a
socket with unread input makes the kernel send a TCP RST, which can destroy the error reply the
client has not read yet; this is Apache's lingering close (also described in h11's docs).
:meth:`Peer.kill` drops at once (slow consumer, send failure).

Prior art: Redis's ``client-output-buffer-limit`` (the slow-consumer rule), trio's
``SocketStream`` (whose per-call scheduling this avoids), Apache's lingering close.
"""

from __future__ import annotations

import itertools
import logging
import math
import socket
import ssl
from collections.abc import Callable
from typing import Final

import trio

from protocol import Connection, ErrorCode

from ._auth import ANONYMOUS, Principal

__all__ = [
    "CLOSE_GRACE",
    "TURN_SECONDS",
    "WOULD_BLOCK_READ",
    "WOULD_BLOCK_WRITE",
    "Peer",
    "Totals",
    "linger",
]

log = logging.getLogger("lockserver")

#: Bound on draining + lingering for one connection the server closes on purpose.
CLOSE_GRACE: Final = 0.5
#: Longest one connection is served (real seconds) while others may be waiting: past it, what
#: it has buffered waits until every other ready connection has been served (the protocol's
#: reader, ``_reading.py``; an HTTP connection yields to the other tasks, ``_http.py``).
TURN_SECONDS: Final = 0.002
#: "Try again later" from a non-blocking plain socket or TLS socket (an ``ssl.SSLSocket``
#: raises its own kinds). Catching a tuple costs nothing until something is raised.
WOULD_BLOCK_READ: Final = (BlockingIOError, ssl.SSLWantReadError)
WOULD_BLOCK_WRITE: Final = (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError)


class Totals:
    """What the connections of one server hold together, and the bounds on it.

    ``received``: bytes of incomplete request frames buffered (bound ``max_receive``, the
    ``max_receive_total`` setting; kept by the reader); ``unsent``: unsent bytes of blocked
    connections (bound ``max_send``, ``max_send_total``); ``blocked``: connections with a
    writer task now. Plain integers, updated in place by the connections.
    """

    __slots__ = ("blocked", "max_receive", "max_send", "received", "unsent")

    def __init__(self, *, max_receive: int, max_send: int) -> None:
        self.max_receive = max_receive
        self.max_send = max_send
        self.received = 0
        self.unsent = 0
        self.blocked = 0


_NUMBERS: Final = itertools.count(1)


class Peer:
    """One connection's state. Plain slotted class: touched on every request.

    ``on_slow(client, why)`` is called once when the client is dropped as a slow consumer
    (the server counts and logs it). ``totals`` is the server's shared :class:`Totals`.
    """

    __slots__ = (
        "__weakref__",  # tests prove a closed connection is freed (weakref.ref)
        "address",
        "backlog",
        "blocked",
        "client_name",
        "counted",
        "dead",
        "eof",
        "fd",
        "feed_dropped",
        "frame_started",
        "last_recv",
        "max_send_buffer",
        "name",
        "number",
        "nursery",
        "on_slow",
        "opened_at",
        "outbox",
        "pending",
        "principal",
        "proto",
        "read_done",
        "read_error",
        "read_scope",
        "send_timeout",
        "sock",
        "stop_code",
        "stop_message",
        "stopping",
        "totals",
        "unblocked",
    )

    def __init__(
        self,
        sock: socket.socket,
        name: str,
        proto: Connection,
        now: float,
        *,
        max_send_buffer: int,
        send_timeout: float,
        on_slow: Callable[[Peer, str], None],
        totals: Totals,
    ) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.name = name
        # This connection's calls in the trust monitor are counted under this number, not
        # under the Peer: the monitor keeps a source's counts for a few ticks after its last
        # call (more while traffic stops), and a closed connection must not be kept alive
        # that long. Unique in the process, never reused.
        self.number = next(_NUMBERS)
        self.proto = proto
        self.max_send_buffer = max_send_buffer
        self.send_timeout = send_timeout
        self.on_slow = on_slow
        self.totals = totals
        self.outbox = bytearray()
        self.counted = 0  # bytes of the outbox included in totals.unsent
        self.pending = 0  # bytes of an incomplete frame buffered, included in totals.received
        # Its turn ended with requests still buffered (RequestHandler.process): the reader
        # serves them in its next pass, before it receives more from this connection.
        self.backlog = False
        self.frame_started = math.inf  # when that frame's first byte arrived (inf: none)
        self.client_name = ""
        self.address = ""  # the peer's HOST:PORT (listings show it)
        self.feed_dropped = 0  # feed events dropped since the last one sent (not reading)
        self.principal: Principal = ANONYMOUS  # set by a hello with a valid token
        self.opened_at = now
        self.last_recv = now
        self.blocked = False  # a writer task owns sending until the outbox is empty
        self.unblocked: trio.Event | None = None
        self.stopping = False  # the server asked the reader to stop (timeout, shutdown)
        self.stop_code: ErrorCode | None = None  # error to send last when stopping
        self.stop_message = ""
        self.eof = False  # the peer half-closed
        self.dead = False  # dropped or closed: send nothing more
        self.read_scope = trio.CancelScope()  # the reader runs inside it
        self.read_done: trio.Event | None = None  # set by the poller: stop reading (server)
        self.read_error: Exception | None = None  # an unexpected error while reading
        self.nursery: trio.Nursery | None = None  # the connection's tasks (reader, writer)

    # --- sending ------------------------------------------------------------------------------

    def push(self, data: bytes) -> None:
        """Queue a server-initiated message (an event, later a parked reply) and send it."""
        if self.dead:
            return
        self.outbox += data
        self.send_pending()

    def send_pending(self) -> None:
        """Send what the kernel takes now; past ``max_send_buffer`` unsent, or grown while all
        connections together are past ``max_send_total``, drop the client."""
        self.flush()
        if self.blocked:
            self._check_unsent()

    def _check_unsent(self) -> None:
        """Blocked: count the outbox in the total, drop the client when it is over a bound."""
        size = len(self.outbox)
        grown = size - self.counted
        totals = self.totals
        totals.unsent += grown
        self.counted = size
        if size > self.max_send_buffer:
            self._slow(f"{size} unsent bytes (max_send_buffer={self.max_send_buffer})")
        elif grown > 0 and totals.unsent > totals.max_send:
            self._slow(
                f"{size} unsent bytes, {totals.unsent} in all connections together "
                f"(max_send_total={totals.max_send})"
            )

    def _recount(self) -> None:
        """Re-sync this connection's share of ``totals.unsent`` with its outbox."""
        size = len(self.outbox)
        self.totals.unsent += size - self.counted
        self.counted = size

    def _uncount(self) -> None:
        """Take this connection's unsent bytes out of the total (writer ended, killed)."""
        self.totals.unsent -= self.counted
        self.counted = 0

    def flush(self) -> None:
        """One non-blocking send of the outbox; the rest goes to a writer task."""
        out = self.outbox
        if not out or self.blocked or self.dead:
            return
        try:
            n = self.sock.send(out)
        except WOULD_BLOCK_WRITE:
            n = 0
        except OSError as exc:
            self.kill(f"send failed: {exc}")
            return
        if n == len(out):
            out.clear()
            return
        del out[:n]
        self.blocked = True
        self.totals.blocked += 1
        self.unblocked = trio.Event()
        assert self.nursery is not None
        self.nursery.start_soon(self._write_blocked)

    async def _write_blocked(self) -> None:
        try:
            while self.outbox and not self.dead:
                with trio.move_on_after(self.send_timeout) as scope:
                    await trio.lowlevel.wait_writable(self.fd)
                if scope.cancelled_caught:
                    self._slow(
                        f"no send progress for {self.send_timeout:g} s (send_timeout), "
                        f"{len(self.outbox)} bytes unsent"
                    )
                    return
                try:
                    n = self.sock.send(self.outbox)
                except WOULD_BLOCK_WRITE:
                    continue
                except OSError as exc:
                    self.kill(f"send failed: {exc}")
                    return
                del self.outbox[:n]
                self._recount()
        finally:
            self.blocked = False
            self.totals.blocked -= 1
            self._uncount()
            if self.unblocked is not None:
                self.unblocked.set()

    def _slow(self, why: str) -> None:
        if not self.dead:
            self.on_slow(self, why)
            self.kill("slow consumer")

    # --- closing ------------------------------------------------------------------------------

    def stop(self, code: ErrorCode | None, message: str) -> None:
        """Ask the reader to stop between batches and close gracefully, sending ``code`` /
        ``message`` as a last error reply when given."""
        if self.stopping or self.dead:
            return
        self.stopping = True
        self.stop_code = code
        self.stop_message = message
        self.read_scope.cancel()

    def kill(self, why: str) -> None:
        """Close at once, sending nothing more."""
        if self.dead:
            return
        self.dead = True
        self.outbox.clear()
        self._uncount()
        log.debug("connection %s dropped: %s", self.name, why)
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    async def finish(self, last: bytes, buffer: bytearray) -> None:
        """After the reader stopped: queue ``last`` (may be empty), let the outbox drain, then
        a lingering half-close (skipped after the peer's EOF). ``buffer`` is scratch space."""
        if self.dead:
            return
        if last:
            self.outbox += last
            self.flush()
        with trio.move_on_after(math.inf if self.eof else CLOSE_GRACE):
            # After EOF the peer may still be reading its replies: the writer's own
            # send_timeout bounds that wait.
            if self.blocked and self.unblocked is not None:
                await self.unblocked.wait()
            if not self.eof and not self.dead:
                await linger(self.sock, buffer)


async def linger(sock: socket.socket, buffer: bytearray) -> None:
    """Half-close, then read and discard into ``buffer`` until the peer's EOF (so no TCP RST
    destroys the last reply before the peer reads it). Callers bound it with a timeout."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    while True:
        try:
            n = sock.recv_into(buffer)
        except WOULD_BLOCK_READ:
            await trio.lowlevel.wait_readable(sock)
            continue
        except OSError:
            return
        if not n:
            return
