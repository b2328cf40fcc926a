"""A replicated group against a standalone server and against etcd's own lock, in one sitting
on one machine (issue 18's performance note).

Starts a one-member etcd (``lockbench.etcd``, etcd's default durability: every commit is
fsynced), then measures, interleaved over ``--rounds``:

- **standalone**: ``lockbench blast --spawn`` (one lockserver);
- **group**: three ``lockserver --replicate`` replicas on that etcd (``lockbench.replicas``),
  ``lockbench blast --target`` at one replica (every replica applies every transaction; the
  load enters through one of them);
- **etcd lock**: etcd's own lock from Python, the usual recipe -- per worker one lease, then
  per acquire a transaction "create the key if it does not exist, with the lease" and per
  release a delete -- through the ``lockserver.replication._etcd`` client (the same one the
  replicas use), on the same etcd, ``--etcd-workers`` concurrent workers.

Shapes (lockbench's: an acquire and a release alternate on each connection's keys, both count
as transactions): ``pipelined`` (1 connection x 64 in flight), ``c64`` (64 connections x 1),
and ``strict`` (1 connection x 1: the latency of one transaction, p50/p99). etcd's lock has
no pipelining over HTTP/1.1: its "pipelined" and "c64" figures are 64 concurrent workers, its
"strict" one worker.

Each run also reports the CPU per transaction of every process (each replica and etcd from
``/proc``, whichever system runs; the load from this process's children or, for etcd's lock,
this process), counted over the warm-up and the window: the machine's CPU per transaction is
what bounds a group whose replicas, etcd and load share the cores. ``--systems`` picks the
systems (e.g. ``group`` alone, to compare two versions of the code interleaved: the replicas
run the ``lockserver`` of ``$LOCKBENCH_SERVER_ROOT`` when it is set, lockbench's rule).
``--secret`` runs the group with a group secret (issue 29: every entry sealed and checked).

    python -m benchmarks.replication_bench --rounds 2 --duration 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

__all__ = ["main"]

SHAPES = {"pipelined": (1, 64), "c64": (64, 1), "strict": (1, 1)}
SYSTEMS = ("standalone", "group", "etcd lock")
WARMUP = 1.0
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for children (the load)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def blast(target: str | None, shape: str, duration: float, out: Path) -> dict[str, Any]:
    conns, pipeline = SHAPES[shape]
    where = ["--spawn"] if target is None else ["--target", target]
    cmd = [
        sys.executable,
        "-m",
        "lockbench",
        "blast",
        *where,
        "--connections",
        str(conns),
        "--pipeline",
        str(pipeline),
        "--duration",
        str(duration),
        "--warmup",
        str(WARMUP),
        "--json",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=duration + 120)
    r = json.loads(out.read_text())["results"][0]
    lat = r["latency_us"]
    return {
        "tx_per_s": r["ops_per_s"],
        "p50_us": lat["p50"],
        "p99_us": lat["p99"],
        "errors": r["errors"],
    }


async def _etcd_lock(endpoints: list[str], workers: int, duration: float) -> dict[str, Any]:
    import trio

    from lockserver.replication._etcd import Compare, Etcd, TxnPut

    latencies: list[float] = []
    counts = [0]
    granted = [0]

    async def worker(etcd: Etcd, lease: int, w: int, stop_at: float) -> None:
        k = 0
        while trio.current_time() < stop_at:
            key = b"/etcd-lock-bench/%d/%d" % (w, k % 512)
            k += 1
            t = time.perf_counter()
            result = await etcd.txn(
                [Compare(key, "create_revision", "==", 0)],
                [TxnPut(key, b"holder-%d" % w, lease)],
            )
            latencies.append(time.perf_counter() - t)
            granted[0] += int(result.succeeded)
            await etcd.delete(key)
            counts[0] += 2

    async with AsyncExitStack() as stack:
        # One client (one connection pool) per worker, as separate processes would have:
        # httpcore's pool assigns requests in time quadratic in its connections (measured:
        # 64 workers on one pool made 3.7 million is_idle calls in 3 s and reached half the
        # throughput of 8). Opened, with their leases, before anything is timed.
        clients = [
            await stack.enter_async_context(Etcd(endpoints, timeout=10.0, transport="gateway"))
            for _ in range(workers)
        ]
        leases = [(await c.lease_grant(60))[0] for c in clients]
        for stop_after in (1.0, duration):  # a warm-up, then the measured window
            latencies.clear()
            counts[0] = granted[0] = 0
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                for w in range(workers):
                    nursery.start_soon(worker, clients[w], leases[w], w, t0 + stop_after)
            elapsed = trio.current_time() - t0
        for c, lease in zip(clients, leases, strict=True):
            await c.lease_revoke(lease)
    lat = sorted(latencies)
    return {
        "tx_per_s": counts[0] / elapsed,
        "p50_us": lat[len(lat) // 2] * 1e6 if lat else None,
        "p99_us": lat[int(len(lat) * 0.99)] * 1e6 if lat else None,
        "errors": counts[0] // 2 - granted[0],
    }


def etcd_lock(endpoints: list[str], shape: str, duration: float, workers: int) -> dict[str, Any]:
    import trio

    n = 1 if shape == "strict" else workers
    t = time.process_time()
    r: dict[str, Any] = trio.run(_etcd_lock, endpoints, n, duration)
    r["load_cpu"] = time.process_time() - t
    return r


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster
    from lockbench.replicas import ReplicaGroup

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--etcd-workers", type=int, default=64)
    p.add_argument("--shapes", default="pipelined,c64,strict")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--json", default=None, help="write every run here")
    p.add_argument(
        "--secret",
        action="store_true",
        help="give the group a (random) group secret: every entry sealed and checked",
    )
    args = p.parse_args(argv)
    shapes = args.shapes.split(",")
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    work = Path(tempfile.mkdtemp(prefix="replication-bench-"))
    runs: list[dict[str, Any]] = []
    with EtcdCluster(work / "etcd") as etcd:
        etcd.start(1)
        with ReplicaGroup(
            etcd.endpoints,
            work / "replicas",
            n=3,
            group="bench",
            secret=secrets.token_hex(32) if args.secret else None,
        ) as group:
            group.start()
            target = f"lockserver://{group.addresses[0]}"
            for rnd in range(args.rounds):
                for shape in shapes:
                    for system in systems:
                        out = work / f"{rnd}-{shape}-{system.replace(' ', '_')}.json"
                        procs = [*(r.process for r in group.replicas), etcd.members[0].process]
                        names = [f"replica{i}" for i in range(len(group.replicas))] + ["etcd"]
                        pids = {n: p.pid for n, p in zip(names, procs, strict=True) if p}
                        before = {k: cpu_seconds(pid) for k, pid in pids.items()}
                        load_before = children_cpu()
                        if system == "standalone":
                            r = blast(None, shape, args.duration, out)
                        elif system == "group":
                            r = blast(target, shape, args.duration, out)
                        else:
                            r = etcd_lock(etcd.endpoints, shape, args.duration, args.etcd_workers)
                        cpu = {k: cpu_seconds(pid) - before[k] for k, pid in pids.items()}
                        cpu["load"] = r.pop("load_cpu", None) or children_cpu() - load_before
                        # CPU counts the warm-up too (blast's --warmup; etcd lock's 1 s)
                        txs = r["tx_per_s"] * (args.duration + WARMUP)
                        r["cpu_us_per_tx"] = {k: v / txs * 1e6 for k, v in cpu.items()}
                        r.update(round=rnd, shape=shape, system=system)
                        runs.append(r)
                        per = r["cpu_us_per_tx"]
                        print(
                            f"round {rnd} {shape:9} {system:10} {r['tx_per_s']:9,.0f} tx/s  "
                            f"p50 {r['p50_us'] or 0:8,.0f} µs  p99 {r['p99_us'] or 0:9,.0f} µs  "
                            f"errors {r['errors']}  CPU µs/tx "
                            + " ".join(f"{k} {v:,.0f}" for k, v in per.items())
                            + f" total {sum(per.values()):,.0f}",
                            flush=True,
                        )
    print("\nmedians over the rounds (tx/s; p50/p99 µs)")
    print(
        "| shape | standalone | group (3 replicas, 1 etcd) | etcd's lock from Python "
        "| group / etcd |"
    )
    print("|---|---|---|---|---|")
    for shape in shapes:
        cell = {}
        for system in SYSTEMS:
            rs = [r for r in runs if r["shape"] == shape and r["system"] == system]
            if not rs:
                continue
            cell[system] = (
                statistics.median(r["tx_per_s"] for r in rs),
                statistics.median(r["p50_us"] or 0 for r in rs),
                statistics.median(r["p99_us"] or 0 for r in rs),
            )
        if len(cell) < len(SYSTEMS):
            continue
        s, g, e = cell["standalone"], cell["group"], cell["etcd lock"]
        print(
            f"| {shape} | {s[0]:,.0f} ({s[1]:,.0f}/{s[2]:,.0f}) | {g[0]:,.0f} ({g[1]:,.0f}/"
            f"{g[2]:,.0f}) | {e[0]:,.0f} ({e[1]:,.0f}/{e[2]:,.0f}) | {g[0] / e[0]:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
