"""What listing a million held entries costs (issue 16): per page in the door, and the worst
stall another client sees while an operator pages through them on a real server.

- ``door``: ``--entries`` entries in one table (a BigTable: 256 shards) behind a LockCore;
  page through all of them (``--limit`` per page) and report the time per page (median,
  p99, max), the first page against the last (a page must cost O(page), not O(position)),
  and a filter that matches nothing (each page then stops after PAGE_SCAN looks).
- ``server``: a ``lockserver`` subprocess holding ``--entries`` entries (filled over the
  wire); one connection pages through every holder while another, in a process of its own
  (so decoding the pages never delays its pings), pings in a loop every millisecond; report
  the pings' round trips while paging against a baseline without paging.

Run from the repository root::

    python -m benchmarks.inspect_paging [--entries 1000000] [--limit 1000] [--skip-server]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Hashable
from typing import Any

import trio

from lockserver.engine import LockCore
from protocol import (
    AnywayContinueAfter,
    Connection,
    Execute,
    GetStatistics,
    Hello,
    HoldersPage,
    ListHolders,
    ListQuery,
    Ping,
    Reply,
    Role,
    SessionSpec,
    SetVar,
    Transaction,
)

BATCH = 500  # SetVars per filling transaction (each wrapped: 2 ops, max_ops is 1,000)


def _fill_statements(start: int, stop: int) -> list[Any]:
    return [AnywayContinueAfter(SetVar("L", f"v{i:07}", i)) for i in range(start, stop)]


def _summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{label:<44} n={len(ms):<6} median {statistics.median(ms):7.3f} ms  "
        f"p99 {p99:7.3f} ms  max {ms[-1]:7.3f} ms"
    )


# --- in the door ------------------------------------------------------------------------------


def door(entries: int, limit: int) -> None:
    core: LockCore[Hashable] = LockCore(started_at=0.0, fence_epoch=1_795_000_000_000_000)
    now = 1.0
    started = time.perf_counter()
    for start in range(0, entries, BATCH):
        tx = Transaction("ns", _fill_statements(start, min(entries, start + BATCH)))
        session = SessionSpec(f"s{start // 50_000}", 3600.0)  # 50,000 entries per session
        core.execute("filler", start, session, tx, None, now, 1.0, "")
    print(f"door: {entries:,} entries held ({time.perf_counter() - started:.1f} s to fill)")
    for label, query in (("all holders", ListQuery(limit=limit)),):
        times = []
        listed = 0
        cursor = None
        rid = 0
        while True:
            rid += 1
            q = ListQuery(limit=query.limit, cursor=cursor, match=query.match)
            t0 = time.perf_counter()
            [(_, page)] = core.listing("op", rid, "holders", q, now=now, trust=1.0)
            times.append(time.perf_counter() - t0)
            assert isinstance(page, HoldersPage), page
            listed += len(page.holders)
            cursor = page.cursor
            if cursor is None:
                break
        assert listed == entries, (listed, entries)
        print(_summary(f"door: {label}, limit {limit}", times))
        print(
            f"{'':<44} first page {times[0] * 1000:.3f} ms, last page "
            f"{times[-1] * 1000:.3f} ms, {len(times)} pages, total {sum(times):.2f} s"
        )
    times = []
    cursor = None
    while True:
        t0 = time.perf_counter()
        query = ListQuery(match="nobody", cursor=cursor)
        [(_, page)] = core.listing("op", 0, "holders", query, now=now, trust=1.0)
        times.append(time.perf_counter() - t0)
        assert isinstance(page, HoldersPage), page
        cursor = page.cursor
        if cursor is None:
            break
    print(_summary("door: a filter matching nothing (PAGE_SCAN)", times))


# --- on a server ------------------------------------------------------------------------------


class _Conn:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT, max_frame=64 * 1024 * 1024)
        self.next_id = 0
        self.inbox: dict[int, Any] = {}

    @classmethod
    async def open(cls, port: int) -> _Conn:
        c = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await c.call(Hello(c.rid()))
        return c

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    async def send(self, *messages: Any) -> None:
        await self.stream.send_all(b"".join(self.proto.send(m) for m in messages))

    async def reply(self, rid: int) -> Any:
        while rid not in self.inbox:
            data = await self.stream.receive_some(1 << 20)
            assert data, "server closed"
            self.proto.receive_data(data)
            while (msg := self.proto.next_message()) is not None:
                if isinstance(msg, Reply):
                    self.inbox[msg.request_id] = msg.body
                else:
                    raise AssertionError(msg)
        return self.inbox.pop(rid)

    async def call(self, message: Any) -> Any:
        await self.send(message)
        return await self.reply(message.request_id)


def _pinger(port: int, stop: Any, out: Any) -> None:
    """Ping the server every millisecond until ``stop`` is set (its own process, a blocking
    socket); put the round trips (s) on ``out``."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = Connection(Role.CLIENT)

    def call(message: Any) -> None:
        sock.sendall(proto.send(message))
        while proto.next_message() is None:
            proto.receive_data(sock.recv(65536))

    call(Hello(0))
    rtts = []
    rid = 0
    while not stop.is_set():
        rid += 1
        t0 = time.perf_counter()
        call(Ping(rid))
        rtts.append(time.perf_counter() - t0)
        time.sleep(0.001)
    sock.close()
    out.put(rtts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _server_run(port: int, entries: int, limit: int) -> None:
    filler = await _Conn.open(port)
    started = time.perf_counter()
    pending = []
    for start in range(0, entries, BATCH):
        tx = Transaction("ns", _fill_statements(start, min(entries, start + BATCH)))
        msg = Execute(filler.rid(), SessionSpec(f"s{start // 50_000}", 3600.0), tx)
        pending.append(msg.request_id)
        await filler.send(msg)
        if len(pending) >= 20:
            await filler.reply(pending.pop(0))
    for rid in pending:
        await filler.reply(rid)
    print(f"server: {entries:,} entries held ({time.perf_counter() - started:.1f} s to fill)")
    operator = await _Conn.open(port)
    ctx = multiprocessing.get_context("spawn")

    async def pinging(during: Any) -> list[float]:
        """The pinger's round trips while ``during()`` runs."""
        stop = ctx.Event()
        results = ctx.Queue()
        proc = ctx.Process(target=_pinger, args=(port, stop, results))
        proc.start()
        await trio.sleep(1.0)  # the pinger is connected and pinging
        await during()
        stop.set()
        rtts: list[float] = await trio.to_thread.run_sync(results.get)
        proc.join()
        return rtts

    async def idle() -> None:
        await trio.sleep(2.0)

    print(_summary("server: ping round trip, nobody paging", await pinging(idle)))
    page_times: list[float] = []

    async def page_all() -> None:
        cursor = None
        listed = 0
        while True:
            t0 = time.perf_counter()
            page = await operator.call(
                ListHolders(operator.rid(), ListQuery(limit=limit, cursor=cursor))
            )
            page_times.append(time.perf_counter() - t0)
            listed += len(page.holders)
            cursor = page.cursor
            if cursor is None:
                break
        assert listed == entries, (listed, entries)

    t0 = time.perf_counter()
    rtts = await pinging(page_all)
    print(
        f"server: paged {entries:,} holders in {len(page_times)} pages of {limit} "
        f"in {time.perf_counter() - t0:.1f} s (with the pinger's start)"
    )
    print(_summary("server: one page, round trip (operator)", page_times))
    print(_summary("server: ping round trip while paging", rtts))
    stats = await operator.call(GetStatistics(operator.rid()))
    gc_stats = stats.values["gc"]
    print(
        f"server: collector pauses since start, per generation: longest "
        f"{gc_stats['pause_max_ms']} ms, collections {gc_stats['collections']}"
    )


def server(entries: int, limit: int) -> None:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockserver", "--port", str(port), "--log-level", "WARNING"]
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        trio.run(_server_run, port, entries, limit)
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--skip-door", action="store_true")
    args = parser.parse_args()
    if not args.skip_door:
        door(args.entries, args.limit)
    if not args.skip_server:
        server(args.entries, args.limit)


if __name__ == "__main__":
    main()
