"""The blaster: a raw client light enough that the server is the bottleneck.

Why: the Python client costs more CPU per request than the server does, so end-to-end runs
measure the client. The blaster removes it: every distinct request is encoded ONCE with the
protocol's codec (``request_to_wire`` + ``pack`` + ``frame``), then only bytes are written;
replies are counted by walking their 4-byte length prefixes (lockserver) or their line ends
(Redis), never decoded — except one reply in 64, decoded to check that acquires succeed and to
catch error replies. Plain sockets and ``select.epoll``, one thread per process.

What is sent: a simple mutex, **release/acquire alternating** on each connection —
``[Assert(SetVar("Mutex", key, ticket))]`` then ``[AnywayContinueAfter(DeleteVar("Mutex", key,
ticket))]`` on the same key, cycling over 512 keys per connection — so the store does not grow
during the run (with distinct keys that all succeed, 200,000 tx/s for 10 s would add 2 million
entries and measure the growth instead). A connection's requests are served in order, so every
acquire succeeds; both halves count as transactions (tx/s = replies/s). Redis gets the same via
EVALSHA of the seed-001 scripts (SET NX PX / compare-and-DEL).

Several servers (shards): one process drives connections to each server (a spec's
:class:`ServerShare` per server: its address, its connections, its namespaces). A lockserver
connection's keys spread over the namespaces :mod:`._sharding` placed on its server, key *k*
of connection *c* in ``namespaces[(c + k) % len(namespaces)]``, so each server gets exactly
its own namespaces' traffic; the report counts replies per server as well as in total.

Sending: each connection keeps ``pipeline`` requests in flight (refilled as replies come), or,
paced (``rate_per_conn``, one in flight), sends on a fixed schedule; then latency is measured
from the *scheduled* send time whenever the connection was still waiting for its previous
reply at that time (no coordinated omission: a send the server delayed counts its lateness),
and from the actual send when the connection was idle at its slot — then any lateness is the
blaster's own timer (epoll sleeps whole milliseconds, rounded up) or CPU, not the server's:
counting it put ~0.6 ms into the p50 of Redis at 3,000 requests/s. The report's second
histogram is always from the actual send.

:func:`prefill` loads N held entries (the mutex shape, key ``pf:<i>`` and ticket ``t<i>``)
through sessions of up to 50,000 entries (the server's per-session limit is 100,000) with a max
age of an hour, 400 SetVars per transaction, 32 transactions in flight.
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import msgpack

from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Execute,
    GetStatistics,
    Hello,
    Request,
    SessionSpec,
    SetVar,
    Transaction,
    frame,
    pack,
    request_to_wire,
)

from ._hdr import LatencyHistogram
from ._sharding import prefill_batches
from ._targets import Backend
from ._worker import Gate, Recorder, WorkerReport

__all__ = [
    "PREFILL_PER_TX",
    "RING_KEYS",
    "BlastSpec",
    "ReplyGaps",
    "ServerShare",
    "blast_worker",
    "connect",
    "encode_request",
    "lockserver_call",
    "lockserver_handshake",
    "lockserver_ring",
    "read_frame",
    "prefill",
    "redis_ring",
    "resp",
    "server_entries",
]

RING_KEYS = 512  # keys per connection; the ring holds an acquire and a release for each
SAMPLE_MASK = 63  # decode one reply in 64
PREFILL_PER_TX = 400  # SetVars per prefill transaction (2 nodes each; the tree limit is 1000)
PREFILL_PER_SESSION = 50_000
PREFILL_IN_FLIGHT = 32
PREFILL_MAX_AGE = 3600.0
RECV_SIZE = 256 * 1024
NAMESPACE = "lockbench"
_HEADER = struct.Struct(">I")
_OK = 2  # Status.TRANSACTION_OK on the wire


def encode_request(request: Request) -> bytes:
    """One request, framed, with the protocol's own codec."""
    return frame(pack(request_to_wire(request)))


@attrs.frozen
class ServerShare:
    """One server's part of a blaster process's load (picklable)."""

    server: int  # the server's index in the target's list (for the per-server counts)
    host: str
    port: int
    first_conn: int  # global index of its first connection (keys and sessions are per index)
    connections: int
    namespaces: tuple[str, ...] = (NAMESPACE,)  # lockserver: the namespaces placed on it


@attrs.frozen
class BlastSpec:
    """One blaster process's load (picklable): a share of each server."""

    backend: Backend
    shares: tuple[ServerShare, ...]
    pipeline: int
    count: int
    rate_per_conn: float | None  # paced mode: sends per second per connection
    run_id: str
    servers: int = 1  # how many servers the whole blast drives (the per-server counts' size)


# --- the pre-encoded requests -----------------------------------------------------------------


def lockserver_ring(
    conn_index: int, run_id: str, namespaces: tuple[str, ...] = (NAMESPACE,)
) -> list[bytes]:
    """The frames of one connection: acquire/release pairs over RING_KEYS keys, key *k* in
    ``namespaces[(conn_index + k) % len(namespaces)]``, each with its own request id (ids are
    reused only after a full turn of the ring)."""
    session = SessionSpec(f"blast-{run_id}-{conn_index}")
    frames = []
    rid = 1
    for k in range(RING_KEYS):
        key, ticket = f"b{conn_index}:{k}", f"t{conn_index}.{k}"
        ns = namespaces[(conn_index + k) % len(namespaces)]
        acquire = Transaction(ns, [Assert(SetVar("Mutex", key, ticket))])
        release = Transaction(ns, [AnywayContinueAfter(DeleteVar("Mutex", key, ticket))])
        frames.append(encode_request(Execute(rid, session, acquire)))
        frames.append(encode_request(Execute(rid + 1, session, release)))
        rid += 2
    return frames


def resp(*args: str | bytes) -> bytes:
    """A Redis command in RESP."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a.encode() if isinstance(a, str) else a
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def redis_ring(conn_index: int, sha_acquire: str, sha_release: str) -> list[bytes]:
    """The Redis twin of :func:`lockserver_ring` (EVALSHA of the mutex scripts)."""
    from ._redis import TTL_MS

    frames = []
    for k in range(RING_KEYS):
        key, uid = f"lb:m:b{conn_index}:{k}", f"t{conn_index}.{k}"
        frames.append(resp("EVALSHA", sha_acquire, "1", key, uid, str(TTL_MS)))
        frames.append(resp("EVALSHA", sha_release, "1", key, uid))
    return frames


# --- raw connections --------------------------------------------------------------------------


class _Conn:
    """One blaster connection."""

    __slots__ = (
        "due",
        "frames",
        "free_ns",
        "inflight",
        "n_frames",
        "next",
        "rbuf",
        "sent",
        "server",
        "sock",
    )

    def __init__(self, sock: socket.socket, frames: list[bytes], server: int = 0) -> None:
        self.sock = sock
        self.server = server  # index of its server, for the per-server counts
        self.frames = frames
        self.n_frames = len(frames)
        self.next = 0  # index of the next frame to send
        self.inflight = 0
        self.rbuf = bytearray()
        self.sent: collections.deque[int] = collections.deque()  # send times, oldest first
        self.due = 0.0  # paced mode: monotonic time of the next scheduled send
        self.free_ns = 0  # paced mode: perf_counter_ns when the last reply came back

    def send(self, n: int, now_ns: int) -> None:
        """Write the next ``n`` frames of the ring in one syscall."""
        i, total = self.next, self.n_frames
        if n == 1:
            data = self.frames[i]
            self.sent.append(now_ns)
        else:
            if i + n <= total:
                data = b"".join(self.frames[i : i + n])
            else:
                data = b"".join(self.frames[i:] + self.frames[: i + n - total])
            self.sent.extend([now_ns] * n)
        self.next = (i + n) % total
        self.sock.sendall(data)
        self.inflight += n


def connect(host: str, port: int) -> socket.socket:
    """A TCP connection to ``host:port`` with Nagle off (a 10 s timeout to connect)."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def read_frame(sock: socket.socket, buf: bytearray) -> bytes:
    """Block until one whole lockserver frame is in ``buf``; return its payload."""
    while True:
        if len(buf) >= 4:
            size = _HEADER.unpack_from(buf, 0)[0]
            if len(buf) >= 4 + size:
                payload = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                return payload
        data = sock.recv(RECV_SIZE)
        if not data:
            raise ConnectionError("the server closed the connection")
        buf += data


def _read_line(sock: socket.socket, buf: bytearray) -> bytes:
    """Block until one RESP line is in ``buf``; return it (without CRLF)."""
    while True:
        end = buf.find(b"\r\n")
        if end >= 0:
            line = bytes(buf[:end])
            del buf[: end + 2]
            return line
        data = sock.recv(RECV_SIZE)
        if not data:
            raise ConnectionError("the server closed the connection")
        buf += data


def lockserver_call(sock: socket.socket, buf: bytearray, request: Request) -> dict[str, Any]:
    """Send one request and return its decoded reply map (for set-up, not the hot path)."""
    sock.sendall(encode_request(request))
    reply: dict[str, Any] = msgpack.unpackb(read_frame(sock, buf), raw=False)
    if reply.get("type") == "error":
        raise RuntimeError(f"server error {reply.get('name')}: {reply.get('message')}")
    return reply


def lockserver_handshake(sock: socket.socket, buf: bytearray) -> dict[str, Any]:
    """Hello / Welcome; the welcome's map (the server's ``limits`` among its fields)."""
    return lockserver_call(sock, buf, Hello(0, client_name="lockbench-blast"))


def redis_load_scripts(sock: socket.socket, buf: bytearray) -> tuple[str, str]:
    """SCRIPT LOAD the mutex scripts; their SHA1s."""
    from ._redis import SCRIPTS

    shas = []
    for name in ("mutex_acquire", "mutex_release"):
        sock.sendall(resp("SCRIPT", "LOAD", SCRIPTS[name]))
        header = _read_line(sock, buf)
        if not header.startswith(b"$"):
            raise RuntimeError(f"SCRIPT LOAD failed: {header!r}")
        shas.append(_read_line(sock, buf).decode())
    return shas[0], shas[1]


# --- the worker -------------------------------------------------------------------------------


class ReplyGaps:
    """The longest stretch of the window in which no reply came, over every connection of a
    worker: what a stall of the server looks like from outside, whatever its length in
    requests. Fed each reply's arrival time (perf_counter_ns); replies arriving together
    count once."""

    __slots__ = ("last_ns", "longest_ns", "started_ns", "window_ns")

    def __init__(self) -> None:
        self.window_ns = 0  # when the window opened
        self.last_ns = 0  # the last reply's arrival, 0 before the first in the window
        self.longest_ns = 0
        self.started_ns = 0  # when the longest began

    def open(self, now_ns: int) -> None:
        """The window opens: forget the warm-up."""
        self.window_ns = now_ns
        self.last_ns = self.longest_ns = self.started_ns = 0

    def reply(self, t_ns: int) -> None:
        """A reply arrived at ``t_ns``."""
        last = self.last_ns
        if last and t_ns - last > self.longest_ns:
            self.longest_ns = t_ns - last
            self.started_ns = last
        self.last_ns = t_ns

    def report(self, report: WorkerReport) -> WorkerReport:
        """``report`` with the longest gap and its start (seconds into the window)."""
        at = (self.started_ns - self.window_ns) / 1e9 if self.longest_ns else 0.0
        return attrs.evolve(report, reply_gap_ns=self.longest_ns, reply_gap_at=round(at, 6))


def blast_worker(
    spec: BlastSpec, gate: Gate, publish: Callable[[Recorder], None] | None = None
) -> WorkerReport:
    """Connect, wait at the gate, blast until the window closes; report replies and latency."""
    conns: list[_Conn] = []
    try:
        for share in spec.shares:
            for i in range(share.connections):
                index = share.first_conn + i
                sock = connect(share.host, share.port)
                buf = bytearray()
                if spec.backend is Backend.LOCKSERVER:
                    lockserver_handshake(sock, buf)
                    frames = lockserver_ring(index, spec.run_id, share.namespaces)
                else:
                    frames = redis_ring(index, *redis_load_scripts(sock, buf))
                conns.append(_Conn(sock, frames, share.server))
        measure_at, end_at = gate.wait()
        return _blast_loop(spec, conns, measure_at, end_at, publish)
    finally:
        for c in conns:
            with contextlib.suppress(OSError):
                c.sock.close()


def _blast_loop(
    spec: BlastSpec,
    conns: list[_Conn],
    measure_at: float,
    end_at: float,
    publish: Callable[[Recorder], None] | None,
) -> WorkerReport:
    with select.epoll() as epoll:
        return _blast_epoll(spec, conns, measure_at, end_at, publish, epoll)


def _blast_epoll(
    spec: BlastSpec,
    conns: list[_Conn],
    measure_at: float,
    end_at: float,
    publish: Callable[[Recorder], None] | None,
    epoll: select.epoll,
) -> WorkerReport:
    rec = Recorder(spec.count, measure_at, end_at)  # rec.hist: latency from the actual send
    from_schedule = LatencyHistogram()  # paced mode: latency from the scheduled send
    lockserver = spec.backend is Backend.LOCKSERVER
    paced = spec.rate_per_conn is not None
    period = 1.0 / spec.rate_per_conn if spec.rate_per_conn else 0.0
    by_fd: dict[int, _Conn] = {}
    for c in conns:
        c.sock.setblocking(True)  # sends are bounded by the pipeline depth: never block long
        epoll.register(c.sock.fileno(), select.EPOLLIN)
        by_fd[c.sock.fileno()] = c
    mono, perf = time.monotonic, time.perf_counter_ns
    hist_record, schedule_record = rec.hist.record_ns, from_schedule.record_ns
    scheduled: dict[_Conn, collections.deque[int]] = {c: collections.deque() for c in conns}
    start = mono()
    waiting: list[tuple[float, int]] = []  # paced mode: (slot, connection) of idle connections
    for i, c in enumerate(conns):
        if paced:
            c.due = start + period * i / len(conns)
            heapq.heappush(waiting, (c.due, i))
        else:
            c.send(spec.pipeline, perf())
    index_of = {c: i for i, c in enumerate(conns)}
    per_server = [0] * spec.servers  # replies in the window, by server
    gaps = ReplyGaps()
    replies = 0  # all replies seen (for the 1-in-64 sampling)
    measuring = False
    next_publish = 0.0
    unpack_from = _HEADER.unpack_from
    while True:
        now = mono()
        if now >= end_at or rec.ops >= rec.limit or rec.errors >= 1000:
            break
        if not measuring and now >= measure_at:
            measuring = True
            rec.hist.reset()
            from_schedule.reset()
            rec.ops = rec.requests = rec.acquires = rec.acquired = 0
            per_server = [0] * spec.servers
            gaps.open(perf())
        if publish is not None and now >= next_publish:
            next_publish = now + 0.1
            publish(rec)
        if paced:
            # Send for every idle connection whose slot has come; sleep until the next slot.
            while waiting and waiting[0][0] <= now:
                due, i = heapq.heappop(waiting)
                c = conns[i]
                t_ns = perf()
                slot_ns = t_ns - int((mono() - due) * 1e9)  # the slot, in perf_counter terms
                # Busy at its slot: the server made it late, count from the slot. Idle: the
                # lateness is the blaster's, count from the actual send.
                scheduled[c].append(slot_ns if c.free_ns > slot_ns else t_ns)
                c.send(1, t_ns)
                c.due = due + period
                if c.due < now - 1.0:  # more than a second behind: do not burst
                    c.due = now
            timeout = max(0.0, min(end_at, waiting[0][0] if waiting else end_at) - mono())
        else:
            timeout = max(0.0, min(end_at, measure_at if not measuring else end_at) - now)
        for fd, _ in epoll.poll(min(timeout, 0.05)):
            c = by_fd[fd]
            data = c.sock.recv(RECV_SIZE)
            if not data:
                raise ConnectionError("the server closed a blast connection")
            if lockserver:
                # Walk the length prefixes; decode nothing but the 1-in-64 sample.
                buf: bytes | bytearray = data
                if c.rbuf:
                    c.rbuf += data
                    buf = c.rbuf
                pos, n, size_all = 0, 0, len(buf)
                while size_all - pos >= 4:
                    end = pos + 4 + unpack_from(buf, pos)[0]
                    if end > size_all:
                        break
                    if (replies + n) & SAMPLE_MASK == 0:
                        _check_lockserver(bytes(buf[pos + 4 : end]), rec)
                    pos = end
                    n += 1
                if buf is data:
                    if pos < size_all:
                        c.rbuf = bytearray(data[pos:])
                elif pos:
                    del c.rbuf[:pos]
            else:
                # Every reply of the two scripts is one line (":1", ":0" or "-ERR ...").
                # A failed acquire also fails its release (the uid does not match), so the
                # share of ":1" among all replies is the acquire success ratio.
                n = data.count(b"\n")
                errors = data.count(b"-")
                if errors:
                    rec.error(RuntimeError(data[:200].decode("utf-8", "replace")), errors)
                rec.acquires += n
                rec.acquired += n - errors - data.count(b":0")
            if n == 0:
                continue
            replies += n
            t = perf()
            if measuring:
                gaps.reply(t)
            sent = c.sent
            for _ in range(n):
                hist_record(t - sent.popleft())
            if paced:
                sched = scheduled[c]
                for _ in range(n):
                    schedule_record(t - sched.popleft())
            rec.ops += n
            rec.requests += n
            per_server[c.server] += n
            c.inflight -= n
            if not paced:
                c.send(n, t)
            elif c.inflight == 0:
                c.free_ns = t
                heapq.heappush(waiting, (c.due, index_of[c]))
    finished = mono()
    if publish is not None:
        publish(rec)
    report = gaps.report(attrs.evolve(rec.report(finished), per_server=tuple(per_server)))
    if paced:
        # The headline latency of a paced run is the one from the schedule; the one from the
        # actual send goes along as the "service" latency.
        report = attrs.evolve(
            report, histogram=from_schedule.encode(), extra_histogram=rec.hist.encode()
        )
    return report


def _check_lockserver(payload: bytes, rec: Recorder) -> None:
    """The 1-in-64 decoded reply: count acquire outcomes (odd request ids) and errors."""
    reply = msgpack.unpackb(payload, raw=False)
    if reply.get("type") == "error":
        rec.error(RuntimeError(f"{reply.get('name')}: {reply.get('message')}"), 1)
        return
    if reply.get("id", 0) % 2 == 1:  # acquires have odd ids (see lockserver_ring)
        rec.acquires += 1
        if reply.get("status") == _OK:
            rec.acquired += 1


# --- prefill and server figures ---------------------------------------------------------------


def prefill(
    backend: Backend,
    host: str,
    port: int,
    n: int,
    run_id: str,
    batches: Sequence[tuple[str, int, int]] | None = None,
) -> float:
    """Load ``n`` held entries; return the seconds it took. lockserver: ``batches`` says which
    transactions this server gets, as (namespace, first, stop) entry ranges (default: all
    ``n`` in the one namespace of a single-server blast)."""
    t0 = time.monotonic()
    sock = connect(host, port)
    sock.settimeout(120)
    buf = bytearray()
    try:
        if backend is Backend.LOCKSERVER:
            if batches is None:
                batches = prefill_batches(n, (NAMESPACE,), PREFILL_PER_TX)
            _prefill_lockserver(sock, buf, batches, run_id)
        else:
            _prefill_redis(sock, buf, n)
    finally:
        sock.close()
    return time.monotonic() - t0


def _prefill_lockserver(
    sock: socket.socket, buf: bytearray, batches: Sequence[tuple[str, int, int]], run_id: str
) -> None:
    lockserver_handshake(sock, buf)
    rid = 1
    in_flight = 0

    def collect(until: int) -> None:
        nonlocal in_flight
        while in_flight > until:
            reply = msgpack.unpackb(read_frame(sock, buf), raw=False)
            in_flight -= 1
            if reply.get("type") != "result" or reply.get("status") != _OK:
                raise RuntimeError(f"prefill transaction failed: {str(reply)[:300]}")

    for namespace, start, stop in batches:
        # Entry i's session is the same whatever server it lands on: at most
        # PREFILL_PER_SESSION entries per session on each.
        session = SessionSpec(
            f"prefill-{run_id}-{start // PREFILL_PER_SESSION}", max_age=PREFILL_MAX_AGE
        )
        statements = [Assert(SetVar("Mutex", f"pf:{i}", f"t{i}")) for i in range(start, stop)]
        sock.sendall(encode_request(Execute(rid, session, Transaction(namespace, statements))))
        rid += 1
        in_flight += 1
        collect(PREFILL_IN_FLIGHT)
    collect(0)


def _prefill_redis(sock: socket.socket, buf: bytearray, n: int) -> None:
    ttl = str(int(PREFILL_MAX_AGE * 1000))  # like the sessions of the lockserver prefill
    batch = 1000
    for start in range(0, n, batch):
        stop = min(n, start + batch)
        sock.sendall(
            b"".join(
                resp("SET", f"lb:m:pf:{i}", f"t{i}", "NX", "PX", ttl) for i in range(start, stop)
            )
        )
        for _ in range(start, stop):
            line = _read_line(sock, buf)
            if line != b"+OK":
                raise RuntimeError(f"prefill SET failed: {line!r}")


def server_entries(backend: Backend, host: str, port: int) -> int | None:
    """How many entries (lockserver) or keys (Redis) the server holds."""
    sock = connect(host, port)
    buf = bytearray()
    try:
        if backend is Backend.LOCKSERVER:
            lockserver_handshake(sock, buf)
            stats = lockserver_call(sock, buf, GetStatistics(1)).get("stats", {})
            entries = stats.get("engine", {}).get("entries")
            return int(entries) if isinstance(entries, int) else None
        sock.sendall(resp("DBSIZE"))
        return int(_read_line(sock, buf)[1:])
    finally:
        sock.close()
