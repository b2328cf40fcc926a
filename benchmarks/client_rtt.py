"""Round trips per second through the Python client, against a private server.

Why: the client's request path is the cost users see; redis-py's lock (acquire+release on one
sync connection, ~3.8k pairs/s on the dev box) is the bar for the sync face. This script starts
its own server (a subprocess, ``python -m lockserver --port 0``, reading the
``lockserver listening on HOST:PORT`` line; ``--in-thread`` runs it in a thread of this process
instead, which then shares the GIL with the client) and measures three scenarios, each bounded
by a pair count and a time limit, repeated (3 times by default), printing the median and the
spread (min..max):

1. ``sync``: one LockClient, one session, acquire+release pairs on distinct keys:
   ``[Assert(Not(Exists(T, k))), Assert(SetVar(T, k, ticket))]`` then
   ``[AnywayContinueAfter(DeleteVar(T, k, ticket))]``.
2. ``async-1conn``: 64 trio tasks (a session each) sharing one connection, same pairs.
3. ``async-8conn``: 64 tasks over 8 connections (8 tasks per client).
4. ``asyncio-1conn`` / ``asyncio-8conn``: the same two, the async face under asyncio (the
   scenario is written on anyio, as the face is, and run on each loop).

Every scenario spreads its work over 16 namespaces (task ``i`` uses namespace ``i % 16``; the
sync loop takes them in turn), so that ``--shards N`` (N server subprocesses, the client given
all of them: docs/client.md#several-servers) spreads it over the servers as placement
(PROTOCOL.md §12) decides; ``--shards 1`` (the default) is the host/port client.

Run: ``python benchmarks/client_rtt.py [--pairs N] [--seconds S] [--repeat R] [--in-thread]
[--shards N]``. A pair is two requests: requests/s = 2 x pairs/s.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import anyio
import trio

from client import (
    AnywayContinueAfter,
    Assert,
    AsyncSession,
    DeleteVar,
    Exists,
    LockClient,
    Not,
    SetVar,
    open_lock_client,
)

NAMESPACES = [f"bench-{k}" for k in range(16)]
TABLE = "T"
TASKS = 64


def acquire(key: str, ticket: str) -> list[Any]:
    return [Assert(Not(Exists(TABLE, key))), Assert(SetVar(TABLE, key, ticket))]


def release(key: str, ticket: str) -> list[Any]:
    return [AnywayContinueAfter(DeleteVar(TABLE, key, ticket))]


# --- the server -----------------------------------------------------------------------------------


@contextmanager
def subprocess_server() -> Iterator[tuple[str, int]]:
    """``python -m lockserver --port 0`` in a subprocess; yields (host, port)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockserver", "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        prefix = "lockserver listening on "
        if not line.startswith(prefix):
            raise RuntimeError(f"unexpected first line from the server: {line!r}")
        host, _, port = line[len(prefix) :].rpartition(":")
        yield host.strip("[]"), int(port)
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def thread_server() -> Iterator[tuple[str, int]]:
    """The server in a thread of this process (its own trio.run)."""
    from lockserver import ServerConfig, serve

    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(serve, ServerConfig(port=0, log_level="WARNING"))
            box["addr"] = (running.host, running.port)
            box["token"] = trio.lowlevel.current_trio_token()
            box["scope"] = nursery.cancel_scope
            ready.set()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the server thread did not start")
    try:
        yield box["addr"]
    finally:
        trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])
        thread.join(10)


# --- scenarios (each returns (pairs done, seconds)) --------------------------------------------


def run_sync(servers: list[str], pairs: int, seconds: float, rep: int) -> tuple[int, float]:
    with LockClient(servers=servers, client_name="bench-sync") as c, c.session() as s:
        done = 0
        start = time.perf_counter()
        deadline = start + seconds
        while done < pairs and time.perf_counter() < deadline:
            key = f"s{rep}-{done}"
            namespace = NAMESPACES[done % len(NAMESPACES)]
            if not s.execute(namespace, acquire(key, "t")).ok:
                raise RuntimeError(f"acquire of a fresh key {key} failed")
            s.execute(namespace, release(key, "t"))
            done += 1
        return done, time.perf_counter() - start


async def _tasks(
    servers: list[str], connections: int, pairs: int, seconds: float, rep: int
) -> tuple[int, float]:
    """64 tasks, a session each, over ``connections`` clients; runs on trio or asyncio."""
    per_task = max(1, pairs // TASKS)
    counts = [0] * TASKS

    async def worker(i: int, s: AsyncSession, deadline: float) -> None:
        n = 0
        namespace = NAMESPACES[i % len(NAMESPACES)]
        while n < per_task and anyio.current_time() < deadline:
            key = f"a{rep}-{i}-{n}"
            if not (await s.execute(namespace, acquire(key, "t"))).ok:
                raise RuntimeError(f"acquire of a fresh key {key} failed")
            await s.execute(namespace, release(key, "t"))
            n += 1
        counts[i] = n

    async with anyio.create_task_group() as outer:
        clients = []
        for _ in range(connections):
            clients.append(await _enter(outer, servers))
        sessions = [clients[i % connections].session() for i in range(TASKS)]
        start = time.perf_counter()
        deadline = anyio.current_time() + seconds
        async with anyio.create_task_group() as group:
            for i, s in enumerate(sessions):
                group.start_soon(worker, i, s, deadline)
        elapsed = time.perf_counter() - start
        for s in sessions:
            await s.end()
        outer.cancel_scope.cancel()
    return sum(counts), elapsed


async def _enter(group: anyio.abc.TaskGroup, servers: list[str]) -> Any:
    """Open a client whose block lives in ``group`` until it is cancelled."""
    ready = anyio.Event()
    box: list[Any] = []

    async def hold() -> None:
        async with open_lock_client(servers=servers, client_name="bench-async") as c:
            box.append(c)
            ready.set()
            await anyio.sleep_forever()

    group.start_soon(hold)
    await ready.wait()
    return box[0]


def run_async(
    connections: int, backend: str = "trio"
) -> Callable[[list[str], int, float, int], tuple[int, float]]:
    def run(servers: list[str], pairs: int, seconds: float, rep: int) -> tuple[int, float]:
        if backend == "trio":
            return trio.run(_tasks, servers, connections, pairs, seconds, rep)
        result: tuple[int, float] = anyio.run(
            _tasks, servers, connections, pairs, seconds, rep, backend=backend
        )
        return result

    return run


SCENARIOS: dict[str, Callable[[list[str], int, float, int], tuple[int, float]]] = {
    "sync": run_sync,
    "async-1conn": run_async(1),
    "async-8conn": run_async(8),
    "asyncio-1conn": run_async(1, "asyncio"),
    "asyncio-8conn": run_async(8, "asyncio"),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20_000, help="pairs per run (upper bound)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time per run (upper bound)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--in-thread", action="store_true", help="server in a thread")
    parser.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    parser.add_argument(
        "--shards", type=int, default=1, help="server subprocesses, the client given all of them"
    )
    args = parser.parse_args(argv)
    if args.shards < 1 or (args.in_thread and args.shards != 1):
        parser.error("--shards must be >= 1, and 1 with --in-thread")
    with ExitStack() as stack:
        if args.in_thread:
            addresses = [stack.enter_context(thread_server())]
        else:
            addresses = [stack.enter_context(subprocess_server()) for _ in range(args.shards)]
        servers = [f"{host}:{port}" for host, port in addresses]
        kind = "thread" if args.in_thread else "subprocess"
        print(f"servers {','.join(servers)} ({kind}, {len(servers)} shard(s))")
        print(f"{'scenario':<14} {'pairs/s median':>15} {'spread':>17} {'requests/s':>11}")
        for name in args.only or list(SCENARIOS):
            rates = []
            for rep in range(args.repeat):
                done, elapsed = SCENARIOS[name](servers, args.pairs, args.seconds, rep)
                rates.append(done / elapsed)
            med = statistics.median(rates)
            spread = f"{min(rates):.0f}..{max(rates):.0f}"
            print(f"{name:<14} {med:>15.0f} {spread:>17} {2 * med:>11.0f}", flush=True)


if __name__ == "__main__":
    main()
