"""What listing a million held entries costs (issue 16), and many tables (issue 30): per page
in the door, and the worst stall another client sees while an operator pages through them
on a real server.

- ``door``: ``--entries`` entries behind a LockCore, in one table (``--shape table``, a
  BigTable: 256 shards) or one per table (``--shape tables``: as many one-variable tables in
  one namespace, a sharded namespace); page through all of them (``--limit`` per page) and
  report the time per page (median, p99, max), the first page against the last (a page must
  cost O(page), not O(position) nor O(tables)), and a filter that matches nothing (each page
  then stops after PAGE_SCAN looks).
- ``server``: a ``lockserver`` subprocess holding ``--entries`` entries of that shape (filled
  over the wire); one connection pages through every holder while another, in a process of
  its own (so decoding the pages never delays its pings), pings in a loop every millisecond;
  report the pings' round trips while paging against a baseline without paging.

Run from the repository root::

    python -m benchmarks.inspect_paging [--entries 1000000] [--shape table|tables]
        [--limit 1000] [--skip-server] [--skip-door] [--pin] [--label TEXT]

To measure an older checkout with this script, put it first on the path (its ``lockserver``
and ``protocol``, also for the server subprocess), e.g.
``PYTHONPATH=/tmp/before python benchmarks/inspect_paging.py --label before ...``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Hashable
from pathlib import Path
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


SHAPE = "table"  # "table": every entry in table L; "tables": entry i alone in table t<i>
LABEL = ""


def _fill_statements(start: int, stop: int) -> list[Any]:
    if SHAPE == "tables":
        return [AnywayContinueAfter(SetVar(f"t{i:07}", "v", i)) for i in range(start, stop)]
    return [AnywayContinueAfter(SetVar("L", f"v{i:07}", i)) for i in range(start, stop)]


def _summary(label: str, seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{LABEL}{label:<44} n={len(ms):<6} median {statistics.median(ms):7.3f} ms  "
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
    print(
        f"{LABEL}door: {entries:,} entries held, shape {SHAPE} "
        f"({time.perf_counter() - started:.1f} s to fill)"
    )
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
            f"{LABEL}{'':<44} first page {times[0] * 1000:.3f} ms, last page "
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


def _pinger(port: int, ready: Any, stop: Any, out: Any) -> None:
    """Ping the server every millisecond until ``stop`` is set (its own process, a blocking
    socket), setting ``ready`` once connected; put the round trips (s) on ``out``."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = Connection(Role.CLIENT)

    def call(message: Any) -> None:
        sock.sendall(proto.send(message))
        while proto.next_message() is None:
            proto.receive_data(sock.recv(65536))

    call(Hello(0))
    ready.set()
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
    print(
        f"{LABEL}server: {entries:,} entries held, shape {SHAPE} "
        f"({time.perf_counter() - started:.1f} s to fill)"
    )
    operator = await _Conn.open(port)
    ctx = multiprocessing.get_context("spawn")

    async def pinging(during: Any) -> list[float]:
        """The pinger's round trips while ``during()`` runs."""
        ready, stop = ctx.Event(), ctx.Event()
        results = ctx.Queue()
        proc = ctx.Process(target=_pinger, args=(port, ready, stop, results))
        proc.start()
        # A spawned interpreter takes a while to start on a busy machine: wait until it pings.
        assert await trio.to_thread.run_sync(ready.wait, 60.0), "the pinger never connected"
        await trio.sleep(0.2)
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
        f"{LABEL}server: paged {entries:,} holders in {len(page_times)} pages of {limit} "
        f"in {time.perf_counter() - t0:.1f} s (with the pinger's start)"
    )
    print(_summary("server: one page, round trip (operator)", page_times))
    print(_summary("server: ping round trip while paging", rtts))
    stats = await operator.call(GetStatistics(operator.rid()))
    gc_stats = stats.values["gc"]
    print(
        f"{LABEL}server: collector pauses since start, per generation: longest "
        f"{gc_stats['pause_max_ms']} ms, collections {gc_stats['collections']}"
    )


def server(entries: int, limit: int, pin: bool) -> None:
    port = _free_port()
    command = [sys.executable, "-m", "lockserver", "--port", str(port), "--log-level", "WARNING"]
    if pin:  # the server on CPU 0, this process (operator) and the pinger on CPU 1
        command = ["taskset", "-c", "0", *command]
        os.sched_setaffinity(0, {1})
    print(f"{LABEL}server: layout {'pinned (server CPU 0, clients CPU 1)' if pin else 'free'}")
    # `-m lockserver` looks in the working directory first: run the server from the tree this
    # process imported, so a `PYTHONPATH=<older checkout>` run measures that checkout's server.
    proc = subprocess.Popen(command, cwd=_code_root())
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


def _code_root() -> Path:
    """The checkout whose ``lockserver`` this process imported."""
    return Path(sys.modules["lockserver"].__file__ or ".").resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=("table", "tables"), default="table")
    parser.add_argument("--limit", type=int, default=1000)
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--skip-door", action="store_true")
    parser.add_argument("--label", default="", help="a prefix for every line printed")
    parser.add_argument(
        "--pin", action="store_true", help="server on CPU 0 (taskset), the clients on CPU 1"
    )
    args = parser.parse_args()
    global SHAPE, LABEL  # noqa: PLW0603 - set once, before anything runs
    SHAPE = args.shape
    LABEL = f"[{args.label}] " if args.label else ""
    print(f"{LABEL}code: {_code_root()}")
    if not args.skip_door:
        door(args.entries, args.limit)
    if not args.skip_server:
        server(args.entries, args.limit, args.pin)


if __name__ == "__main__":
    main()
