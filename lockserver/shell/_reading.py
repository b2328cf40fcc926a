"""Reading: how received bytes get from the sockets to the request handler, a batch at a time.

``Reader`` is the read path of the trio shell (``_server.py`` composes it): the epoll poller
for plain connections and the per-connection read loop for TLS (and platforms without epoll).
It changes for its own reasons (the read strategy: batching, busy polling, readiness), not
when the request set or the connection lifecycle does. It hands every received chunk to one
callable, ``serve(peer, data) -> keep`` (``RequestHandler.process``), bound once.

Theory of operation
===================
**Reading.** Every plain connection is read by ONE poller task (Linux): the sockets sit in
a private level-triggered ``select.epoll`` whose own fd trio watches; on each wake-up the
poller takes up to ``_POLL_BATCH`` ready sockets and, for each, does one ``recv_into``, feeds
the sans-I/O ``protocol.Connection``, decodes and executes every complete frame and appends
every reply to the connection's outbox; once every ready connection has been served, each
outbox goes out with one ``send`` — all synchronously (a long batch sends every
``_EARLY_FLUSH`` bytes of replies on the way, so the client can decode them while the rest
is served). While traffic is dense the poller keeps polling for a moment after a batch
instead of sleeping (``busy_poll``, the policy in ``_busypoll.py``, which weighs each spin
against what a sleep costs: the poller measures its thread's CPU around every sleep).
Why the sends wait for the end of the pass: a ``send`` that wakes a client sleeping on
another CPU pays a cross-CPU wake-up (py-spy: ~30 us of this VM's server CPU per send, half
of the per-request CPU with 64 unpipelined connections); sent back to back, the first wakes
the client and the next ones find it running (issue 19, pinned, 64 unpipelined connections,
three interleaved rounds: 59.6 -> 42.3 us of server CPU per request, 16.8k -> 23.7k tx/s;
one pipelined connection unchanged). An early reply of a pass waits at most for the rest of
the pass.
Why: a task per connection costs, per request, a trio task switch and an ``epoll_ctl``
re-arm (trio registers one-shot); one wake-up now serves every connection that has data, and
a socket stays registered while it lives (measured with 64 unpipelined connections: 25-28 ->
21 us of server CPU per request). Each connection still has its task (handshake,
closing, lingering): it parks on an Event the poller sets at EOF, error or a close. A
connection that sent more than one buffer's worth stays ready (level-triggered) and gets its
next turn in the next pass, after the others and the timers (fairness; and one receive's
worth is served in turns, below). TLS connections,
whose SSL object may hold decrypted bytes no readiness event announces, and platforms without
epoll keep a reading task each (``_read_loop_task``): ``recv_into`` until EAGAIN, then
``wait_readable``.

**Turns** (issue 30: no client can stall the others). One receive can bring thousands of
pipelined requests (3,000 ``stats`` fit in 64 KiB, and took ~150 ms to serve back to back,
delaying every other client that long). So a connection is served one *turn* at a time: the
request handler stops after ``TURN_SECONDS`` (2 ms) of work on it (``RequestHandler.process``)
and marks it ``backlog``; its replies so far go out with the pass, the rest of its requests
stay in its protocol buffer, and the connection gets its next turn in the next pass, served
from that buffer (:meth:`Reader._serve_backlog`), after the connections that pass read and
after the other tasks and the timers (the poller checkpoints instead of sleeping while a
backlog waits). Nothing more is received from it until its buffer holds no whole request, so
what it can make the server buffer stays one receive's worth. Its replies still leave in
request order: one connection, one outbox, one turn at a time. A connection read by its own
task (TLS) does the same with a checkpoint between its turns. The hot path pays two clock
reads per ``process`` call (its turn's start, and a check after each request).

**The first read** (issue 16: HTTP on the same port). A connection's first bytes are read by
its own task (:meth:`Reader._first_read`) before it joins the poller: when the first byte is
an upper-case ASCII letter the connection speaks HTTP (a hello frame's header always starts
with 0x00, PROTOCOL.md section 1) and :meth:`Reader.read_loop` hands the bytes back to the
shell; otherwise they are served like any chunk and the connection is polled from then on.
Decided once per connection: no request pays for it.

**Incomplete frames** (issue 14: slowloris with partial frames). Nothing is allocated for the
size a header announces: the protocol's frame buffer holds only the bytes received. After a
receive that leaves part of a frame buffered, the reader (:meth:`Reader._buffered`) counts
those bytes in the server's ``Totals.received`` and notes when the frame's first byte arrived
(``Peer.frame_started``: the reaper in ``_server.py`` closes the connection when the frame
is not complete within ``frame_timeout``, however steadily its bytes trickle in). A receive
that grows the total past ``max_receive_total`` closes its connection with ``OVERLOADED``;
connections that only send whole frames never add to it. The hot path (every frame of the
receive complete, nothing buffered before) pays one attribute read and one length check
(``proto.buffered``): ~0.16 us per batch, measured with timeit.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import ssl
import time
from collections.abc import Callable
from typing import Final, Protocol

import trio

from lockserver._peer import WOULD_BLOCK_READ, Peer, Totals
from lockserver.http import Durations, is_http
from protocol import ErrorCode

from ._busypoll import BusyPoll

log = logging.getLogger("lockserver")

#: Ready connections the poller serves per wake-up before it yields to the other tasks.
_POLL_BATCH: Final = 64
# A turn served from a connection's buffer receives nothing.
_NOTHING: Final = memoryview(b"")
# What ``_buffered`` is told was received when a connection's backlog ran out: frames were
# completed since the last count, so an incomplete frame left now began since.
_FRAMES_DONE: Final = 1 << 62


class _Counted(Protocol):
    """Whoever counts the requests served (the request handler)."""

    requests_total: int


class Poller:
    """The set of plain connections the poller task reads: a level-triggered epoll (Linux)."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._by_fd: dict[int, Peer] = {}

    def fileno(self) -> int:
        return self._epoll.fileno()

    def add(self, c: Peer) -> None:
        self._epoll.register(c.fd, select.EPOLLIN)
        self._by_fd[c.fd] = c

    def discard(self, c: Peer) -> None:
        if self._by_fd.get(c.fd) is c:
            del self._by_fd[c.fd]
            with contextlib.suppress(OSError):  # closed already: the kernel dropped it
                self._epoll.unregister(c.fd)

    def ready(self) -> list[Peer]:
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


class Reader:
    """Reads every connection and hands each received chunk to ``serve``.

    ``totals`` is the server's shared :class:`Totals` (incomplete frames are counted there);
    ``busy_poll`` the poller's spin policy; ``tls``: connections are TLS (each keeps a
    reading task). ``durations``: each pass's duration is added there, weighted by the
    requests it served (``counted.requests_total`` before and after). ``overloaded_drops``
    counts connections closed by ``max_receive_total``.
    """

    def __init__(
        self,
        serve: Callable[[Peer, memoryview, bool], bool],
        *,
        totals: Totals,
        busy_poll: BusyPoll,
        tls: bool,
        recv_size: int,
        durations: Durations,
        counted: _Counted,
        after_pass: Callable[[], None],
    ) -> None:
        self._process = serve
        self.durations = durations
        # Called after every read pass that served requests (the collector policy,
        # GcPauses.after_pass): per pass, not per request.
        self.after_pass = after_pass
        self.counted = counted
        self.totals = totals
        self.busy_poll = busy_poll
        self.tls = tls
        # One receive buffer for all connections: a batch is decoded synchronously before
        # the next await, so nobody else can touch it meanwhile.
        self.recv_buffer = bytearray(recv_size)
        self.recv_view = memoryview(self.recv_buffer)
        # Reads every plain connection from one task (None: no epoll on this platform).
        self.poller: Poller | None = Poller() if hasattr(select, "epoll") else None
        # The connections served in the current poller pass, whose replies are sent at its
        # end (module header: why).
        self._unsent: list[Peer] = []
        # The connections whose turn ended with requests buffered (``Peer.backlog``): each
        # gets its next turn in the next pass, from its buffer (module header: fairness).
        self._backlog: list[Peer] = []
        self.overloaded_drops = 0

    def close(self) -> None:
        if self.poller is not None:
            self.poller.close()

    async def read_loop(self, c: Peer) -> bytes | None:
        """Serve the connection's requests until EOF, an error, or a close (then return
        None); or, when its first bytes are an HTTP request, return them at once (the
        caller serves HTTP: ``_http.py``)."""
        n = await self._first_read(c)
        if not n:
            return None
        first = self.recv_view[:n]
        if is_http(first[0]):
            return bytes(first)
        requests = self.counted.requests_total
        start = time.perf_counter()
        keep = self._process(c, first, True)
        served = self.counted.requests_total - requests
        if served:
            self.durations.observe(time.perf_counter() - start, served)
            self.after_pass()
        if keep and c.backlog:
            keep = await self._serve_backlog_task(c)
            n = _FRAMES_DONE
        if not keep or (c.proto.buffered and not self._buffered(c, 0, n)):
            return None
        poller = self.poller
        if poller is None or self.tls:
            await self._read_loop_task(c)
            return None
        done = c.read_done = trio.Event()
        poller.add(c)
        try:
            await done.wait()
        finally:
            poller.discard(c)
        if c.read_error is not None:
            raise c.read_error  # logged by _connection as an internal error of this connection
        return None

    async def _first_read(self, c: Peer) -> int:
        """Wait for a connection's first bytes and receive them into the shared buffer: the
        one read that decides between the protocol and HTTP. 0: EOF or an error first."""
        sock = c.sock
        while True:
            try:
                n = sock.recv_into(self.recv_buffer)
            except WOULD_BLOCK_READ:
                await trio.lowlevel.wait_readable(c.fd)
                continue
            except ssl.SSLWantWriteError:
                await trio.lowlevel.wait_writable(c.fd)
                continue
            except OSError as exc:
                log.debug("connection %s: receive failed: %s", c.name, exc)
                c.dead = True
                return 0
            if not n:
                c.eof = True
            return n

    def _read_ready(self, c: Peer) -> None:
        """The poller found ``c`` readable: one receive, every complete frame served; its
        replies are sent at the end of the pass (``_unsent``)."""
        # A peer stopped earlier in this pass (an answer to its parked request closed it)
        # is read no more.
        if c.dead or c.stopping or c.read_done is None or c.read_done.is_set():
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
                return
            before = c.pending
            self._unsent.append(c)
            if not self._process(c, self.recv_view[:n], False):
                self._read_stop(c)
            elif c.backlog:
                c.frame_started = math.inf  # what it buffered is whole frames, for now
                self._backlog.append(c)
            elif (before or c.proto.buffered) and not self._buffered(c, before, n):
                self._read_stop(c)
        except Exception as exc:  # not one request's failure (those are answered): the loop's
            c.read_error = exc
            self._read_stop(c)

    def _serve_backlog(self) -> None:
        """Give each connection whose last turn ended with requests buffered its next turn
        (served from its buffer, nothing received): after the connections the pass read."""
        waiting = self._backlog
        if not waiting:
            return
        turn = waiting[:]
        waiting.clear()
        for c in turn:
            c.backlog = False
            if c.dead or c.stopping or c.read_done is None or c.read_done.is_set():
                continue
            try:
                before = c.pending
                self._unsent.append(c)
                if not self._process(c, _NOTHING, False):
                    self._read_stop(c)
                elif c.backlog:
                    waiting.append(c)
                elif (before or c.proto.buffered) and not self._buffered(c, before, _FRAMES_DONE):
                    self._read_stop(c)
            except Exception as exc:  # as in _read_ready
                c.read_error = exc
                self._read_stop(c)

    async def _serve_backlog_task(self, c: Peer) -> bool:
        """A connection read by its own task: its next turns, each after a checkpoint (the
        other tasks, the poller among them, run in between), until nothing is left of what
        it had buffered. False: close it."""
        process = self._process
        counted = self.counted
        c.frame_started = math.inf  # what it buffered is whole frames, for now
        while c.backlog:
            c.backlog = False
            await trio.lowlevel.checkpoint()
            if c.dead or c.stopping:
                return False
            requests = counted.requests_total
            start = time.perf_counter()
            keep = process(c, _NOTHING, True)
            served = counted.requests_total - requests
            if served:
                self.durations.observe(time.perf_counter() - start, served)
                self.after_pass()
            if not keep:
                return False
        return True

    def _read_stop(self, c: Peer) -> None:
        assert self.poller is not None and c.read_done is not None
        self.poller.discard(c)
        c.read_done.set()

    async def poll_loop(self) -> None:
        """The poller task: wake when any registered connection is readable, serve them."""
        poller = self.poller
        assert poller is not None
        wait_readable = trio.lowlevel.wait_readable
        checkpoint = trio.lowlevel.checkpoint
        clock = time.perf_counter  # real time: a MockClock may stand still (see _busypoll)
        cpu = time.thread_time  # ~0.7 us a call (a syscall), paid only around a sleep
        busy = self.busy_poll
        metered = busy.window > 0  # busy_poll off: nothing to weigh a sleep against
        fd = poller.fileno()
        ready = self._read_ready
        counted = self.counted
        observe = self.durations.observe
        after_pass = self.after_pass
        unsent = self._unsent
        backlog = self._backlog
        serve_backlog = self._serve_backlog
        while True:
            if busy.spinning or backlog:
                await checkpoint()  # other tasks and timers run; cancellable
            elif metered:
                # What a sleep and its wake-up cost this thread: what a spin that finds the
                # next request saves (BusyPoll.slept).
                asleep = cpu()
                await wait_readable(fd)
                busy.slept(cpu() - asleep)
            else:
                await wait_readable(fd)
            batch = poller.ready()
            if batch or backlog:
                before = counted.requests_total
                start = clock()
                for c in batch:
                    if not c.backlog:  # else its turn comes from its buffer (serve_backlog)
                        ready(c)
                serve_backlog()
                for c in unsent:
                    c.send_pending()
                unsent.clear()
                end = clock()
                busy.served(start, end)
                served = counted.requests_total - before
                if served:
                    observe(end - start, served)
                    after_pass()
            elif busy.spinning:
                busy.idle(clock())

    async def _read_loop_task(self, c: Peer) -> None:
        sock = c.sock
        fd = c.fd
        buf = self.recv_buffer
        view = self.recv_view
        process = self._process
        wait_readable = trio.lowlevel.wait_readable
        checkpoint = trio.lowlevel.checkpoint
        clock = time.perf_counter
        counted = self.counted
        observe = self.durations.observe
        after_pass = self.after_pass
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
            before = c.pending
            requests = counted.requests_total
            start = clock()
            keep = process(c, view[:n], True)
            served = counted.requests_total - requests
            if served:
                observe(clock() - start, served)
                after_pass()
            if keep and c.backlog:
                keep = await self._serve_backlog_task(c)
                n = _FRAMES_DONE
            if not keep:
                return
            if (before or c.proto.buffered) and not self._buffered(c, before, n):
                return
            await checkpoint()

    def _buffered(self, c: Peer, before: int, n: int) -> bool:
        """After a receive of ``n`` bytes that left (or, ``before`` > 0, had left) part of a
        frame buffered: count it in ``Totals.received``, note when the frame began. False:
        the total is past ``max_receive_total``; the connection is closed with OVERLOADED."""
        left = c.proto.buffered
        totals = self.totals
        totals.received += left - before
        c.pending = left
        if not left:
            c.frame_started = math.inf
            return True
        if not before or left < before + n:
            # Nothing was buffered, or a frame completed in this receive: the incomplete
            # frame buffered now began in this receive.
            c.frame_started = trio.current_time()
        if left <= before or totals.received <= totals.max_receive:
            return True
        if not c.stopping:
            self.overloaded_drops += 1
            log.warning(
                "connection %s closed: %d bytes of incomplete frames buffered in all "
                "connections together (max_receive_total=%d)",
                c.name,
                totals.received,
                totals.max_receive,
            )
            c.stop(
                ErrorCode.OVERLOADED,
                "the server cannot buffer this incomplete request now "
                f"(max_receive_total={totals.max_receive} bytes for all connections together)",
            )
        return False
