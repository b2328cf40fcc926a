"""Another client's ping while one client attacks the server (issue 30): from the outside.

Each measurement starts a fresh server (``python -m lockserver --port 0``; another checkout's
with ``LOCKBENCH_SERVER_ROOT=DIR``, as every lockbench spawn), a *pinger* (a thread with its
own connection: a ``ping`` every 10 ms, each round trip recorded) and one attack:

- ``healthz``, ``metrics``, ``status``, ``index``: one HTTP connection writes 20,000
  ``GET /healthz`` (3,000 ``/metrics``, 2,000 ``/v1/status``, 5,000 ``/``) in one write and
  reads every response;
- ``stats``: one protocol connection writes 3,000 ``stats`` requests in one write and reads
  every reply;
- ``idle``: 64 kept-alive HTTP connections (``http_max_connections``), each after one
  request, then a new connection asks ``GET /healthz``: its status is reported;
- ``fanout``: 100 connections (a 4 KiB receive buffer each) subscribe 64 times each to one
  namespace and never read again; another client runs transactions there one after the other
  (each a change every subscription hears) until every subscriber's events are dropped (the
  server's ``feed_events_dropped`` grows by 6,400 a transaction: the buffers are full, the
  state the issue describes; at most FAN_WARMUP_MAX), then 200 more: their latency is
  reported beside the ping, with the warm-up's length.

For each: the pinger's round trips while the attack ran (from its first byte sent to its
last reply read), as count, p50, p99 and worst, in milliseconds. Replies are counted, not
decoded (a length prefix, a Content-Length), so the attacker's own CPU stays small.

Run from the repository root::

    python -m benchmarks.fairness [--only healthz,stats,...] [--pin] [--json FILE]
    python -m benchmarks.fairness --summarize before-*.json after-*.json   # the table
    LOCKBENCH_SERVER_ROOT=/tmp/before python -m benchmarks.fairness ...   # another checkout

``--pin``: the server on CPU 0, this process (attacker and pinger) on the others.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lockbench._layout import load_on, pin_plan
from lockbench._spawn import ServerProcess, spawned
from lockbench._targets import Backend
from protocol import (
    Assert,
    Connection,
    DeleteVar,
    Execute,
    GetStatistics,
    Hello,
    Ping,
    Role,
    SessionSpec,
    SetVar,
    Subscribe,
    Transaction,
)

PING_EVERY = 0.010
ATTACKS = ("healthz", "metrics", "status", "index", "stats", "idle", "fanout")
HTTP_ATTACKS = {
    "healthz": ("/healthz", 20_000),
    "metrics": ("/metrics", 3_000),
    "status": ("/v1/status", 2_000),
    "index": ("/", 5_000),
}
STATS_COUNT = 3_000
IDLE_CONNECTIONS = 64
FAN_CONNECTIONS = 100
FAN_PER_CONNECTION = 64
FAN_WARMUP_MAX = 2_000
FAN_MEASURED = 200
SMALL_RCVBUF = 4096
BOUND = 120.0  # seconds: no attack may take longer (a hang guard)


def _frame_len(buf: bytearray) -> int | None:
    """Bytes of the first whole frame in ``buf`` (header included), None: not whole yet."""
    if len(buf) < 4:
        return None
    size = 4 + int.from_bytes(buf[:4], "big")
    return size if len(buf) >= size else None


class Wire:
    """One blocking protocol connection (hello done)."""

    def __init__(self, port: int, name: str, rcvbuf: int | None = None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.settimeout(BOUND)
        if rcvbuf is not None:  # before connect: the window is agreed at the handshake
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.proto = Connection(Role.CLIENT)
        self.buf = bytearray()
        self.rid = 0
        self.call(lambda rid: Hello(rid, client_name=name))

    def next_rid(self) -> int:
        self.rid += 1
        return self.rid

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> bytes:
        while (size := _frame_len(self.buf)) is None:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.buf += chunk
        frame = bytes(self.buf[:size])
        del self.buf[:size]
        return frame

    def call(self, make: Callable[[int], Any]) -> Any:
        """Send one request, return its reply (events before it are skipped)."""
        rid = self.next_rid()
        self.send(self.proto.send(make(rid)))
        while True:
            self.proto.receive_data(self.read_frame())
            msg = self.proto.next_message()
            if getattr(msg, "request_id", None) == rid:
                return msg

    def close(self) -> None:
        self.sock.close()


class Pinger:
    """A thread that pings every PING_EVERY seconds and records (sent at, round trip)."""

    def __init__(self, port: int) -> None:
        self.wire = Wire(port, "pinger")
        self.samples: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        clock = time.perf_counter
        wire = self.wire
        while not self.stop.is_set():
            sent = clock()
            wire.call(Ping)
            self.samples.append((sent, clock() - sent))
            self.stop.wait(max(0.0, PING_EVERY - (clock() - sent)))

    def between(self, start: float, end: float) -> list[float]:
        """Round trips (s) of the pings sent in [start, end], or still out at ``start``."""
        return [rtt for sent, rtt in self.samples if start <= sent + rtt and sent <= end]

    @contextmanager
    def running(self) -> Iterator[Pinger]:
        self.thread.start()
        try:
            time.sleep(0.3)  # a quiet baseline before the attack
            yield self
        finally:
            self.stop.set()
            self.thread.join(BOUND)
            self.wire.close()


def _summary(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(x * 1000 for x in seconds)
    if not ms:
        return {"count": 0}
    return {
        "count": len(ms),
        "p50": round(statistics.median(ms), 2),
        "p99": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
        "worst": round(ms[-1], 2),
    }


def _read_http(sock: socket.socket, count: int) -> int:
    """Read ``count`` HTTP responses (head, then Content-Length bytes); return the bytes."""
    buf = bytearray()
    got = total = 0
    while got < count:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {got} of {count} responses")
        total += len(chunk)
        buf += chunk
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end]).lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 : head.find(b"\r\n", at) if b"\r\n" in head[at:] else None])
            if len(buf) < end + 4 + length:
                break
            del buf[: end + 4 + length]
            got += 1
    return total


def http_attack(port: int, path: str, count: int) -> dict[str, Any]:
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    burst = request * count
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    try:
        start = time.perf_counter()
        sender = threading.Thread(target=sock.sendall, args=(burst,), daemon=True)
        sender.start()
        received = _read_http(sock, count)
        sender.join(BOUND)
        return {"start": start, "end": time.perf_counter(), "received_bytes": received}
    finally:
        sock.close()


def stats_attack(port: int) -> dict[str, Any]:
    wire = Wire(port, "attacker")
    try:
        burst = b"".join(
            wire.proto.send(GetStatistics(wire.next_rid())) for _ in range(STATS_COUNT)
        )
        start = time.perf_counter()
        wire.send(burst)
        for _ in range(STATS_COUNT):
            wire.read_frame()
        return {"start": start, "end": time.perf_counter()}
    finally:
        wire.close()


def idle_attack(port: int) -> dict[str, Any]:
    idle = []
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        for _ in range(IDLE_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
            s.sendall(request)
            _read_http(s, 1)
            idle.append(s)
        start = time.perf_counter()
        probe = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        head = b""
        while b"\r\n" not in head:
            chunk = probe.recv(4096)
            if not chunk:
                break
            head += chunk
        probe.close()
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else None
        return {"start": start, "end": time.perf_counter(), "probe_status": status}
    finally:
        for s in idle:
            s.close()


def _dropped(wire: Wire) -> int:
    """The server's ``feed_events_dropped``."""
    return int(wire.call(GetStatistics).body.values["server"]["feed_events_dropped"])


def fanout_attack(port: int) -> dict[str, Any]:
    subscribers = []
    total = FAN_CONNECTIONS * FAN_PER_CONNECTION
    try:
        for i in range(FAN_CONNECTIONS):
            w = Wire(port, f"sub{i}", rcvbuf=SMALL_RCVBUF)
            burst = b"".join(
                w.proto.send(Subscribe(w.next_rid(), "fan", None))
                for _ in range(FAN_PER_CONNECTION)
            )
            w.send(burst)
            for _ in range(FAN_PER_CONNECTION):
                w.read_frame()  # the subscription's reply
            subscribers.append(w)  # never read again
        worker = Wire(port, "worker")
        session = SessionSpec("fan-worker", 60.0)
        k = 0

        def transaction() -> float:
            nonlocal k
            op = SetVar("t", f"v{k}") if k % 2 == 0 else DeleteVar("t", f"v{k - 1}")
            tx = Transaction("fan", [Assert(op)])
            k += 1
            sent = time.perf_counter()
            reply = worker.call(lambda rid: Execute(rid, session, tx))
            took = time.perf_counter() - sent
            if not getattr(reply.body, "ok", False):
                raise RuntimeError(f"transaction {k - 1} failed: {reply!r}")
            return took

        warm_until = time.perf_counter() + BOUND / 2
        dropped = _dropped(worker)
        all_dropping = False
        while k < FAN_WARMUP_MAX and time.perf_counter() < warm_until:
            transaction()
            now_dropped = _dropped(worker)
            all_dropping = now_dropped - dropped >= total
            dropped = now_dropped
            if all_dropping and k % 2 == 0:
                break
        warmup = k
        start = time.perf_counter()
        latencies = [transaction() for _ in range(FAN_MEASURED)]
        end = time.perf_counter()
        dropped_measured = _dropped(worker) - dropped
        worker.close()
        return {
            "start": start,
            "end": end,
            "subscriptions": total,
            "warmup_transactions": warmup,
            "all_dropping": all_dropping,
            "dropped_per_transaction": round(dropped_measured / FAN_MEASURED, 1),
            "transaction_ms": _summary(latencies),
        }
    finally:
        for w in subscribers:
            w.close()


def run_one(attack: str, cpus: Any) -> dict[str, Any]:
    with spawned(Backend.LOCKSERVER, cpus=None if cpus is None else cpus.server) as server:
        return _measure(attack, server, cpus)


def _measure(attack: str, server: ServerProcess, cpus: Any) -> dict[str, Any]:
    with load_on(None if cpus is None else cpus.load):
        pinger = Pinger(server.port)
        with pinger.running():
            if attack in HTTP_ATTACKS:
                path, count = HTTP_ATTACKS[attack]
                out = http_attack(server.port, path, count)
            elif attack == "stats":
                out = stats_attack(server.port)
            elif attack == "idle":
                out = idle_attack(server.port)
            else:
                out = fanout_attack(server.port)
            time.sleep(0.05)
        out["ping_ms"] = _summary(pinger.between(out["start"], out["end"]))
        out["attack_s"] = round(out.pop("end") - out.pop("start"), 3)
        return out


def summarize(paths: Sequence[str]) -> str:
    """A Markdown table of saved ``--json`` runs: per attack and layout, each side's ping p99
    and worst (ms), every run's in file order, a side being the file name's ``before`` or
    ``after`` (else the file's name); the idle probe's status and the fan-out's transaction
    p50 under "other"."""
    rows: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
    sides: list[str] = []
    for path in paths:
        name = Path(path).name
        side = next((s for s in ("before", "after") if s in name), name)
        if side not in sides:
            sides.append(side)
        with open(path) as f:
            for run in json.load(f):
                rows.setdefault((run["attack"], run["layout"]), {}).setdefault(side, []).append(run)
    head = (
        "| attack | layout | "
        + " | ".join(f"{s}: ping p99 / worst ms" for s in sides)
        + " | other |"
    )
    lines = [head, "|" + "---|" * (len(sides) + 3)]
    for (attack, layout), by_side in sorted(
        rows.items(), key=lambda kv: (ATTACKS.index(kv[0][0]), kv[0][1])
    ):
        cells, other = [], []
        for side in sides:
            runs = by_side.get(side, [])
            if not runs:
                cells.append("")
                continue
            figures = ", ".join(
                f"{r['ping_ms'].get('p99', '-')} / {r['ping_ms'].get('worst', '-')}" for r in runs
            )
            cells.append(figures)
            if attack == "idle":
                other.append(f"{side}: probe " + ", ".join(str(r["probe_status"]) for r in runs))
            if attack == "fanout":
                other.append(
                    f"{side}: tx p50 "
                    + ", ".join(str(r["transaction_ms"]["p50"]) for r in runs)
                    + " ms"
                )
        lines.append(
            f"| {attack} | {layout} | " + " | ".join(cells) + " | " + "; ".join(other) + " |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fairness", description=__doc__)
    p.add_argument(
        "--only", default=",".join(ATTACKS), help=f"comma-separated: {', '.join(ATTACKS)}"
    )
    p.add_argument("--pin", action="store_true", help="server on CPU 0, this process on the others")
    p.add_argument("--repeat", type=int, default=1, help="runs of each attack")
    p.add_argument("--json", help="write every run as a JSON list to this file")
    p.add_argument(
        "--summarize", nargs="+", metavar="FILE", help="print the table of saved --json files"
    )
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    chosen = [a for a in args.only.split(",") if a]
    unknown = [a for a in chosen if a not in ATTACKS]
    if unknown:
        p.error(f"unknown attack(s): {', '.join(unknown)}")
    cpus = pin_plan() if args.pin else None
    runs = []
    for _ in range(args.repeat):
        for attack in chosen:
            result = {"attack": attack, "layout": "pinned" if cpus else "unpinned"}
            result.update(run_one(attack, cpus))
            runs.append(result)
            print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
