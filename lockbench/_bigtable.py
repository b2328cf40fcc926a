"""``lockbench blast --bigtable``: issue 19's stall shape, so that a stall with a million
entries held cannot come back unseen.

Why: an outside harness saw one 43-50 ms stall in every 10 s window with 1,000,000 entries
held, while lockbench's own blast (release/acquire pairs over a small ring of keys, after a
prefill of 400-entry transactions over sessions of 50,000) never did: its shape keeps the
store still. This is the outside shape, measured the blaster's way:

- **prefill**: ``BIG_SESSIONS`` (16) sessions, one connection each, every ``execute``
  holding ``BIG_BATCH`` (250) ``Assert(SetVar("Big", unique_var))`` statements, all in ONE
  table of namespace ``lockbench``, until N entries are held (execute *j* goes to session
  *j* mod 16, two in flight per connection; every reply is checked). 1,000,000 entries put
  62,500 in each session; a spawned server gets ``--max-entries-per-session``
  ``PER_SESSION_LIMIT`` so N can be scaled up, and a running server's limits (its welcome)
  are checked first.
- **load**: C connections (64 by default), each with its own session, sending unique-var
  ``Assert(SetVar("Big", var))`` acquires into that table, **never released**, one in flight
  each, for the window: the table keeps growing, as in the outside harness. Closed loop by
  default (saturated: the queue of C requests is in every latency); with ``--rate R`` each
  connection sends on a fixed schedule (R/C per second), so a stall shows without the
  queue, and latency counts from the scheduled send when the connection was still waiting
  at its slot (no coordinated omission), as the paced blast does. Every reply is
  decoded and checked: a ``result`` with status TransactionOK and the id just sent.

What it reports beyond a blast's figures: the largest gap between consecutive replies
(any connection; :class:`._blaster.ReplyGaps`) and when in the window it began, the
store's entry count before and after, against the acquires that succeeded, and on Linux the
latency to each reply's arrival in this machine's kernel and the longest a reply lay unread
(:class:`Arrivals`): what of the worst latency was the blaster's own delay.

Requests are not encoded one by one with the codec (~15 µs each: the load generator would
be the bottleneck): each connection encodes one template with the codec, finds where the
variable's 10-digit counter and the 4-byte request id sit by encoding it again with other
values and comparing, and then writes those bytes in place for every request. The template
is checked against the codec for a few counters when it is made; a codec change that moved
or resized them fails there, not silently.
"""

from __future__ import annotations

import collections
import heapq
import math
import select
import socket
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs
import msgpack

from protocol import Assert, Execute, SessionSpec, SetVar, Transaction

from ._blaster import (
    NAMESPACE,
    RECV_SIZE,
    BlastSpec,
    ReplyGaps,
    connect,
    encode_request,
    lockserver_handshake,
    read_frame,
)
from ._hdr import LatencyHistogram
from ._worker import MAX_ERRORS, Gate, Recorder, WorkerReport

__all__ = [
    "BIG_BATCH",
    "BIG_CONNECTIONS",
    "BIG_PREFILL",
    "BIG_SESSIONS",
    "BIG_TABLE",
    "PER_SESSION_LIMIT",
    "AcquireFrames",
    "bigtable_worker",
    "check_limits",
    "prefill_bigtable",
    "server_args",
]

BIG_SESSIONS = 16
BIG_BATCH = 250
BIG_TABLE = "Big"
BIG_CONNECTIONS = 64
BIG_PREFILL = 1_000_000
#: The spawned server's --max-entries-per-session: its default --max-entries, i.e. a session
#: may hold as much as the store (the default 100,000 would stop a prefill past 1.6M).
PER_SESSION_LIMIT = 10_000_000
SESSION_MAX_AGE = 3600.0  # the server's default --max-session-age: held for the whole run
PREFILL_DEPTH = 2  # executes in flight per prefill connection
_OK = 2  # Status.TRANSACTION_OK on the wire
_DIGITS = 10  # the acquire counter's width in the variable's name
_FIRST_ID = 1 << 16  # request ids from here below 2**32 are all msgpack uint32: 5 bytes
_ID_SPAN = (1 << 32) - _FIRST_ID
_U32 = struct.Struct(">I")
_HEADER = struct.Struct(">I")


def server_args() -> tuple[str, ...]:
    """The options of a server spawned for the phase."""
    return ("--max-entries-per-session", str(PER_SESSION_LIMIT))


def _session_loads(n: int) -> list[int]:
    """Entries each prefill session gets (execute j of 250 to session j mod 16)."""
    executes = math.ceil(n / BIG_BATCH)
    sessions = min(BIG_SESSIONS, executes)
    loads = [0] * sessions
    for j in range(executes):
        loads[j % sessions] += min(BIG_BATCH, n - j * BIG_BATCH)
    return loads


def check_limits(limits: Mapping[str, Any], n: int) -> None:
    """ValueError when a server with these limits (its welcome's) cannot hold the prefill."""
    need = max(_session_loads(n), default=0)
    per_session = limits.get("max_entries_per_session")
    if isinstance(per_session, int) and per_session < need:
        raise ValueError(
            f"the server allows {per_session:,} entries per session; the bigtable prefill puts "
            f"{need:,} in each of its sessions: start it with --max-entries-per-session "
            f"{PER_SESSION_LIMIT} (lockbench does with --spawn), or prefill less"
        )
    total = limits.get("max_entries")
    if isinstance(total, int) and total < n:
        raise ValueError(
            f"the server holds at most {total:,} entries (--max-entries): prefill less"
        )
    max_ops = limits.get("max_ops")
    if isinstance(max_ops, int) and max_ops < 2 * BIG_BATCH:
        raise ValueError(
            f"the server takes {max_ops} operations per transaction (--max-ops); the prefill's "
            f"executes have {2 * BIG_BATCH}"
        )


def prefill_bigtable(host: str, port: int, n: int, run_id: str) -> tuple[float, int]:
    """Hold ``n`` entries in table ``Big``: (seconds it took, sessions used)."""
    t0 = time.monotonic()
    loads = _session_loads(n)
    socks: list[socket.socket] = []
    try:
        for _ in loads:
            sock = connect(host, port)
            sock.settimeout(120)
            socks.append(sock)
        bufs = [bytearray() for _ in socks]
        for i, (sock, buf) in enumerate(zip(socks, bufs, strict=True)):
            welcome = lockserver_handshake(sock, buf)
            if i == 0:
                check_limits(welcome.get("limits") or {}, n)
        _prefill_executes(socks, bufs, n, run_id)
    finally:
        for sock in socks:
            sock.close()
    return time.monotonic() - t0, len(loads)


def _prefill_executes(
    socks: list[socket.socket], bufs: list[bytearray], n: int, run_id: str
) -> None:
    sessions = len(socks)
    todo: list[collections.deque[bytes]] = [collections.deque() for _ in socks]
    for j in range(math.ceil(n / BIG_BATCH)):
        s = j % sessions
        spec = SessionSpec(f"big-{run_id}-p{s}", max_age=SESSION_MAX_AGE)
        statements = [
            Assert(SetVar(BIG_TABLE, f"{run_id}.p{i}"))
            for i in range(j * BIG_BATCH, min(n, (j + 1) * BIG_BATCH))
        ]
        todo[s].append(encode_request(Execute(j + 1, spec, Transaction(NAMESPACE, statements))))
    in_flight = [0] * sessions
    for s, sock in enumerate(socks):
        while todo[s] and in_flight[s] < PREFILL_DEPTH:
            sock.sendall(todo[s].popleft())
            in_flight[s] += 1
    # Lockstep over the connections: one reply from each busy one, then its next execute.
    while any(in_flight):
        for s, sock in enumerate(socks):
            if not in_flight[s]:
                continue
            reply = msgpack.unpackb(read_frame(sock, bufs[s]), raw=False)
            in_flight[s] -= 1
            if reply.get("type") != "result" or reply.get("status") != _OK:
                raise RuntimeError(f"bigtable prefill execute failed: {str(reply)[:300]}")
            if todo[s]:
                sock.sendall(todo[s].popleft())
                in_flight[s] += 1


class AcquireFrames:
    """One connection's acquires: ``Execute(id, its session, Transaction("lockbench",
    [Assert(SetVar("Big", "<run>.a<conn>.<k, 10 digits>"))]))`` for k = 0, 1, ..., framed,
    made from one template (see the module's header)."""

    __slots__ = ("_id_at", "_template", "_var_at", "conn_index", "run_id", "session")

    def __init__(self, conn_index: int, run_id: str) -> None:
        self.conn_index = conn_index
        self.run_id = run_id
        self.session = SessionSpec(f"big-{run_id}-a{conn_index}", max_age=SESSION_MAX_AGE)
        self._template = self.encoded(0)
        self._var_at = _changed_span(self._template, self.encoded(10**_DIGITS - 1, 0), _DIGITS)
        self._id_at = _changed_span(self._template, self.encoded(0, _ID_SPAN - 1), 4)
        for k in (1, 12, 99_999, 1_234_567_890, 2 * _ID_SPAN + 7):
            if self.frame(k) != self.encoded(k):
                raise RuntimeError("the bigtable acquire template does not match the codec")

    @staticmethod
    def request_id(k: int) -> int:
        """The request id of acquire ``k``."""
        return _FIRST_ID + k % _ID_SPAN

    def var(self, k: int) -> str:
        """The variable of acquire ``k``."""
        return f"{self.run_id}.a{self.conn_index}.{k % 10**_DIGITS:0{_DIGITS}d}"

    def encoded(self, k: int, id_k: int | None = None) -> bytes:
        """Acquire ``k`` through the codec (id of ``id_k``, default ``k``)."""
        statement = Assert(SetVar(BIG_TABLE, self.var(k)))
        rid = self.request_id(k if id_k is None else id_k)
        return encode_request(Execute(rid, self.session, Transaction(NAMESPACE, [statement])))

    def frame(self, k: int) -> bytearray:
        """Acquire ``k``, framed: the template with its counter and id written in."""
        buf = bytearray(self._template)
        at = self._var_at
        buf[at : at + _DIGITS] = b"%010d" % (k % 10**_DIGITS)
        _U32.pack_into(buf, self._id_at, _FIRST_ID + k % _ID_SPAN)
        return buf


def _changed_span(a: bytes, b: bytes, width: int) -> int:
    """Where two encodings of the same length differ: one span of at most ``width`` bytes;
    its start, counted so that ``width`` bytes from there cover it."""
    if len(a) != len(b):
        raise RuntimeError("the bigtable acquire's encoding changes length with its values")
    diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if not diff or diff[-1] - diff[0] >= width:
        raise RuntimeError("the bigtable acquire's encoding does not hold its values in place")
    return diff[-1] - width + 1


class _Conn:
    """One load connection: its frames, the next counter, the one request in flight."""

    __slots__ = ("due", "frames", "in_flight", "k", "rbuf", "sent_ns", "sock")

    def __init__(self, sock: socket.socket, frames: AcquireFrames) -> None:
        self.sock = sock
        self.frames = frames
        self.k = 0
        self.in_flight = False
        self.sent_ns = 0
        self.rbuf = bytearray()
        self.due = 0  # paced: the next send's slot (perf_counter ns)

    def send(self, now_ns: int) -> None:
        self.sock.sendall(self.frames.frame(self.k))
        self.sent_ns = now_ns
        self.in_flight = True


def bigtable_worker(
    spec: BlastSpec, gate: Gate, publish: Callable[[Recorder], None] | None = None
) -> WorkerReport:
    """Connect, wait at the gate, send unique-var acquires until the window closes."""
    conns: list[_Conn] = []
    try:
        for share in spec.shares:
            for i in range(share.connections):
                sock = connect(share.host, share.port)
                lockserver_handshake(sock, bytearray())
                conns.append(_Conn(sock, AcquireFrames(share.first_conn + i, spec.run_id)))
        measure_at, end_at = gate.wait()
        with select.epoll() as epoll:
            return _loop(spec, conns, measure_at, end_at, publish, epoll)
    finally:
        for c in conns:
            c.sock.close()


def _loop(
    spec: BlastSpec,
    conns: list[_Conn],
    measure_at: float,
    end_at: float,
    publish: Callable[[Recorder], None] | None,
    epoll: select.epoll,
) -> WorkerReport:
    rec = Recorder(spec.count, measure_at, end_at)
    gaps = ReplyGaps()
    arrivals = Arrivals(conns) if Arrivals.supported() else None
    by_fd = {c.sock.fileno(): c for c in conns}
    for fd in by_fd:
        epoll.register(fd, select.EPOLLIN)
    mono, perf = time.monotonic, time.perf_counter_ns
    record = rec.hist.record_ns
    paced = spec.rate_per_conn is not None
    period_ns = round(1e9 / spec.rate_per_conn) if spec.rate_per_conn else 0
    waiting: list[tuple[int, int]] = []  # paced: (slot, connection) of idle connections
    index_of = {c: i for i, c in enumerate(conns)}
    start_ns = perf()
    for i, c in enumerate(conns):
        if paced:
            c.due = start_ns + period_ns * i // len(conns)
            heapq.heappush(waiting, (c.due, i))
        else:
            c.send(perf())
    acquired_total = 0
    measuring = False
    next_publish = 0.0
    while True:
        now = mono()
        if now >= end_at or rec.ops >= rec.limit or rec.errors >= MAX_ERRORS:
            break
        if not measuring and now >= measure_at:
            measuring = True
            rec.hist.reset()
            rec.ops = rec.requests = rec.acquires = rec.acquired = 0
            gaps.open(perf())
        if now >= next_publish:
            next_publish = now + 0.1
            if publish is not None:
                publish(rec)
            if arrivals is not None:
                arrivals.resync()
        timeout = max(0.0, (end_at if measuring else measure_at) - now)
        if paced:
            t_ns = perf()
            while waiting and waiting[0][0] <= t_ns:
                # Idle at its slot: any lateness is the blaster's timer, not the server's,
                # so the latency counts from the actual send.
                conns[heapq.heappop(waiting)[1]].send(t_ns)
            if waiting:
                timeout = min(timeout, max(0.0, (waiting[0][0] - perf()) / 1e9))
        for fd, _ in epoll.poll(min(timeout, 0.05)):
            c = by_fd[fd]
            if arrivals is None:
                data = c.sock.recv(RECV_SIZE)
                arrived = 0
            else:
                data, arrived = arrivals.receive(c.sock)
            if not data:
                raise ConnectionError("the server closed a bigtable connection")
            t = perf()
            buf = c.rbuf
            buf += data
            if len(buf) < 4 or len(buf) < 4 + _HEADER.unpack_from(buf, 0)[0]:
                continue
            end = 4 + _HEADER.unpack_from(buf, 0)[0]
            if len(buf) != end or not c.in_flight:
                raise RuntimeError("a bigtable connection got a reply it did not ask for")
            payload = bytes(buf[4:end])
            buf.clear()
            record(t - c.sent_ns)
            if arrivals is not None:
                arrivals.record(arrived, c.sent_ns, t, measuring)
            ok = _check(payload, c, rec)
            acquired_total += ok
            if measuring:
                gaps.reply(t)
                rec.ops += 1
                rec.requests += 1
                rec.acquires += 1
                rec.acquired += ok
            c.k += 1
            if not paced:
                c.send(t)
                continue
            c.due += period_ns
            if c.due < t - 1_000_000_000:  # more than a second behind: do not burst
                c.due = t
            if c.due <= t:  # its slot passed while it waited: send now, counted from the slot
                c.send(t)
                c.sent_ns = c.due
            else:
                heapq.heappush(waiting, (c.due, index_of[c]))
    finished = mono()
    if publish is not None:
        publish(rec)
    report = gaps.report(rec.report(finished))
    unanswered = sum(c.in_flight for c in conns)
    report = attrs.evolve(report, acquired_total=acquired_total, unanswered=unanswered)
    if arrivals is not None:
        report = attrs.evolve(
            report,
            arrival_histogram=arrivals.hist.encode(),
            read_delay_max_ns=arrivals.read_delay_max_ns,
            arrival_unstamped=arrivals.unstamped,
        )
    return report


#: Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS), which Python's socket module does not name.
_SO_TIMESTAMPNS: Final = 35
_TIMESPEC = struct.Struct("@qq")


class Arrivals:
    """When each reply reached this machine's kernel (``SO_TIMESTAMPNS``: the receive
    timestamp of the data ``recvmsg`` returns), so a latency can be split into what came
    before the arrival (the server, the network) and how long the reply lay in the socket
    before the blaster read it (this process: its own work, its collector, the scheduler).
    Why: on a shared machine the load generator's own delays show up as the server's worst
    latency; the arrival latency is what a client that reads at once would have seen.

    The kernel stamps with the real-time clock; latencies here are ``perf_counter`` (the
    monotonic clock): the offset between the two is taken again every 0.1 s (``resync``), so
    a clock slew moves it by microseconds, not milliseconds."""

    __slots__ = ("_anc", "_offset_ns", "hist", "read_delay_max_ns", "unstamped")

    def __init__(self, conns: list[_Conn]) -> None:
        for c in conns:
            c.sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self._anc = socket.CMSG_SPACE(_TIMESPEC.size)
        self._offset_ns = 0
        self.hist = LatencyHistogram()
        self.read_delay_max_ns = 0
        self.unstamped = 0  # replies measured that came without a stamp
        self.resync()

    @staticmethod
    def supported() -> bool:
        return sys.platform == "linux"

    def resync(self) -> None:
        self._offset_ns = time.time_ns() - time.perf_counter_ns()

    def receive(self, sock: socket.socket) -> tuple[bytes, int]:
        """``recv``, and the data's arrival as a ``perf_counter_ns`` value (0: no stamp)."""
        data, anc, _flags, _addr = sock.recvmsg(RECV_SIZE, self._anc)
        for level, kind, stamp in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack(stamp[: _TIMESPEC.size])
                return data, sec * 1_000_000_000 + nsec - self._offset_ns
        return data, 0

    def record(self, arrived_ns: int, sent_ns: int, read_ns: int, measuring: bool) -> None:
        """One reply, sent (or scheduled) at ``sent_ns``, arrived at ``arrived_ns`` (0: it
        came without a stamp, counted in ``unstamped``), read at ``read_ns``."""
        if not measuring:
            return
        if not arrived_ns:
            self.unstamped += 1
            return
        self.hist.record_ns(max(0, arrived_ns - sent_ns))
        self.read_delay_max_ns = max(self.read_delay_max_ns, read_ns - arrived_ns)


def _check(payload: bytes, c: _Conn, rec: Recorder) -> int:
    """1 when the reply is the success of the acquire just sent; else count an error, 0."""
    c.in_flight = False
    reply = msgpack.unpackb(payload, raw=False)
    if (
        type(reply) is dict
        and reply.get("type") == "result"
        and reply.get("status") == _OK
        and reply.get("id") == c.frames.request_id(c.k)
    ):
        return 1
    rec.error(RuntimeError(f"unexpected reply to a bigtable acquire: {str(reply)[:300]}"), 1)
    return 0
