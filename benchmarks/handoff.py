"""Hand-off latency and waiter load: how fast a released lock reaches the next waiter, and how
many requests blocked waiters cost the server (issue #5's measurements).

    python -m benchmarks.handoff [--contenders 2 64] [--handoffs 2000] [--idle 5]

Starts a private ``lockserver`` (subprocess, loopback, port 0). For each contender count, C
trio tasks (one connection and one session each) loop on
``AsyncMutex.acquire()`` (server-side waiting) then release at once; the hand-off latency is
the time from the holder sending its release to the next holder's grant arriving (one process,
one monotonic clock). Then one task holds the lock while 64 others wait, and the server's own
request counter says how many requests per second the waiters cost. Bounded in count and time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

import trio

from client import AsyncMutex, open_lock_client


def _start_server() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockserver", "--port", "0", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("lockserver listening on "):
        raise SystemExit(f"server did not start: {line!r}")
    return proc, int(line.rpartition(":")[2])


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def handoffs(port: int, contenders: int, count: int, limit_s: float) -> list[float]:
    """Hand-off latencies (seconds) between consecutive holders of one mutex."""
    latencies: list[float] = []
    released_at = [0.0]
    done = trio.Event()
    deadline = trio.current_time() + limit_s

    async def worker(i: int) -> None:
        async with open_lock_client("127.0.0.1", port) as c, c.session() as s:
            lock = AsyncMutex(s, "bench", "handoff")
            while not done.is_set():
                with trio.move_on_at(deadline):
                    granted = await lock.acquire(timeout=5.0)
                if not granted or done.is_set():
                    if granted:
                        await lock.release()
                    return
                now = time.perf_counter()
                if released_at[0]:
                    latencies.append(now - released_at[0])
                if len(latencies) >= count or trio.current_time() >= deadline:
                    done.set()
                released_at[0] = time.perf_counter()
                await lock.release()

    async with trio.open_nursery() as nursery:
        for i in range(contenders):
            nursery.start_soon(worker, i)
    return latencies


async def waiter_load(port: int, waiters: int, seconds: float) -> float:
    """Requests per second the server receives while ``waiters`` tasks wait for a held lock."""
    async with open_lock_client("127.0.0.1", port) as admin, admin.session() as s:
        holder = AsyncMutex(s, "bench", "held")
        assert await holder.acquire()
        async with trio.open_nursery() as nursery:

            async def wait_one() -> None:
                async with open_lock_client("127.0.0.1", port) as c, c.session() as ws:
                    lock = AsyncMutex(ws, "bench", "held")
                    if await lock.acquire(timeout=seconds + 30):
                        await lock.release()

            for _ in range(waiters):
                nursery.start_soon(wait_one)
            await trio.sleep(2.0)  # everyone connected and parked
            before = (await admin.statistics())["server"]["requests_total"]
            await trio.sleep(seconds)
            after = (await admin.statistics())["server"]["requests_total"]
            await holder.release()  # the waiters then take it one after another and leave
    # The two statistics calls themselves are in the window once: subtract one.
    return float(after - before - 1) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contenders", type=int, nargs="+", default=[2, 64])
    parser.add_argument("--handoffs", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=30.0, help="time bound per run")
    parser.add_argument("--idle", type=float, default=5.0, help="waiter-load window, s")
    args = parser.parse_args()
    proc, port = _start_server()
    try:
        for c in args.contenders:
            lat = trio.run(handoffs, port, c, args.handoffs, args.seconds)
            us = [x * 1e6 for x in lat]
            print(
                f"{c:>3} contenders: {len(us)} hand-offs, p50 {_pct(us, 50):.0f} us, "
                f"p99 {_pct(us, 99):.0f} us, mean {statistics.mean(us):.0f} us"
            )
        rate = trio.run(waiter_load, port, 64, args.idle)
        print(f"64 blocked waiters: {rate:.2f} requests/s seen by the server")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
