"""The replication soak: contended grants through a replicated group while faults are injected
every few seconds; every critical section is recorded and the whole history checked (no
overlapping exclusive holders, fences strictly increasing) -- issue 18.

Starts a real etcd cluster (``--etcd-members`` 1 or 3, ``lockbench.etcd``) and ``--replicas``
``lockserver --replicate`` processes (``lockbench.replicas``) on loopback ports, then
``--processes`` worker processes of ``--threads`` threads each: every thread has its own
client given the whole group (it fails over by itself) and its own session, and takes a few
mutexes (``--locks``) in turn, recording each critical section (``lockbench.safety``) into one
JSON-lines file per process. Every ``--fault-every`` seconds one fault, in turn:

- ``kill``: SIGKILL a replica, start it again a moment later;
- ``stop``: SIGSTOP a replica for longer than its lease, then SIGCONT;
- ``clock``: step a replica's clocks an hour forward, or back where a previous step left
  them (its wall *and* monotonic clock: the replicas run under libfaketime, file-driven, the
  Debian ``faketime`` package; issue 29 -- a replica whose clock leaps must expire no session
  early);
- ``etcd``: (three members only) SIGKILL an etcd member, restart it a moment later.

The group runs with a group secret (a fresh random one; ``--no-secret`` for none).

It ends when ``--grants`` critical sections are recorded (or after ``--seconds``), checks the
files and exits 1 on any violation::

    python -m benchmarks.replication_soak --grants 100000 --etcd-members 3
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import secrets
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _worker(
    addresses: list[str], path: str, threads: int, locks: int, seed: int, count: Any, stop: Any
) -> None:
    from lockbench.replicas import Contention
    from lockbench.safety import Recorder

    with Recorder(path) as recorder:
        c = Contention(
            addresses, recorder, threads=threads, locks=locks, seed=seed, max_age=10.0
        ).start()
        while not stop.is_set():
            time.sleep(0.2)
            count.value = c.grants
        c.stop()
        count.value = c.grants
    print(f"worker {seed}: {c.grants:,} grants, errors {c.error_kinds}", flush=True)


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster
    from lockbench.replicas import FAKETIME_LIBRARY, ReplicaGroup
    from lockbench.safety import check, load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grants", type=int, default=100_000, help="critical sections to record")
    p.add_argument("--seconds", type=float, default=1800.0, help="time bound")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--etcd-members", type=int, default=1, choices=(1, 3))
    p.add_argument("--processes", type=int, default=3)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--locks", type=int, default=3, help="mutexes contended for")
    p.add_argument("--fault-every", type=float, default=4.0, help="seconds between faults")
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=2000,
        help="applied entries between snapshots (a restarted replica replays the log after it)",
    )
    p.add_argument("--dir", default=None, help="where logs and JSON-lines go (default: temp)")
    p.add_argument(
        "--no-secret",
        action="store_true",
        help="run the group without a group secret (its log not authenticated)",
    )
    p.add_argument(
        "--no-clock",
        action="store_true",
        help="no clock faults (and no libfaketime under the replicas)",
    )
    args = p.parse_args(argv)

    workdir = Path(args.dir or tempfile.mkdtemp(prefix="replication-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    clock = not args.no_clock
    if clock and FAKETIME_LIBRARY is None:
        print("clock faults need libfaketime (apt-get install faketime), or --no-clock")
        return 2
    kinds = ["kill", "stop"] + (["clock"] if clock else [])
    kinds += ["etcd"] if args.etcd_members == 3 else []
    faults: dict[str, int] = dict.fromkeys(kinds, 0)
    with (
        EtcdCluster(workdir / "etcd") as etcd,
        ReplicaGroup(
            etcd.start(args.etcd_members).endpoints,
            workdir / "replicas",
            n=args.replicas,
            group="soak",
            snapshot_every=args.snapshot_every,
            secret=None if args.no_secret else secrets.token_hex(32),
            faketime=set(range(args.replicas)) if clock else set(),
        ) as group,
    ):
        group.start()
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        counts = [ctx.Value("q", 0) for _ in range(args.processes)]
        paths = [str(workdir / f"grants-{i}.jsonl") for i in range(args.processes)]
        for path in paths:
            Path(path).unlink(missing_ok=True)
        procs = [
            ctx.Process(
                target=_worker,
                args=(group.addresses, paths[i], args.threads, args.locks, i + 1, counts[i], stop),
            )
            for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        t0 = time.monotonic()
        next_fault = t0 + args.fault_every
        turn = itertools.cycle(kinds)
        victim = itertools.cycle(range(args.replicas))
        members = itertools.cycle(range(args.etcd_members))
        last_report = t0
        while True:
            now = time.monotonic()
            granted = sum(c.value for c in counts)
            if granted >= args.grants or now - t0 >= args.seconds:
                break
            if now - last_report >= 10:
                print(f"{now - t0:6.1f} s: {granted:,} grants, faults {faults}", flush=True)
                last_report = now
            if now >= next_fault:
                kind = next(turn)
                faults[kind] += 1
                if kind == "kill":
                    i = next(victim)
                    group.kill(i)
                    time.sleep(0.5)
                    group.start([i])
                elif kind == "stop":
                    i = next(victim)
                    group.stop(i)
                    time.sleep(group.lease_ttl + 1.0)  # past its lease: it must rejoin
                    group.cont(i)
                elif kind == "clock":
                    i = next(victim)
                    # an hour forward, or back where the last step left it (±1 h)
                    offset = 3600 if group.replicas[i].clock_offset == 0 else 0
                    group.step_clock(i, offset)
                else:
                    m = next(members)
                    etcd.kill(m)
                    time.sleep(1.0)
                    etcd.restart(m)
                next_fault = time.monotonic() + args.fault_every
            time.sleep(0.05)
        stop.set()
        for proc in procs:
            proc.join(60)
        elapsed = time.monotonic() - t0
        granted = sum(c.value for c in counts)
        intervals = load(paths)
        report = check(intervals)
        print(
            f"replicas={args.replicas} etcd members={args.etcd_members} "
            f"processes={args.processes} threads={args.threads} locks={args.locks}"
        )
        print(f"grants: {granted:,} in {elapsed:.1f} s ({granted / elapsed:,.0f}/s)")
        print(f"faults injected: {faults} (one every {args.fault_every:g} s)")
        print(f"group secret: {'none' if args.no_secret else 'yes (random)'}")
        print(f"intervals checked: {len(intervals):,} (files in {workdir})")
        print(report.summary())
        halted = _replica_figures(group.addresses)
        bad = not report.ok or any(proc.exitcode != 0 for proc in procs) or halted
        print("FAILED" if bad else "OK")
        return 1 if bad else 0


def _replica_figures(addresses: list[str]) -> bool:
    """Print each replica's clock and authentication figures; True when one has halted."""
    from client import LockClient, LockClientError

    halted = False
    for address in addresses:
        try:
            with LockClient(servers=[[address]], timeout=5) as c:
                r = c.statistics()["replication"]
        except LockClientError as exc:
            print(f"replica {address}: no statistics ({exc})")
            continue
        halted = halted or r["halted"] is not None
        print(
            f"replica {address}: revision {r['revision']}, clamped stamps "
            f"{r['clamped_stamps']}, clock resets {r['clock_resets']}, time jumps "
            f"{r['time_jumps']}, rejected {r['rejected_entries']}, halted {r['halted']}"
        )
    return halted


if __name__ == "__main__":
    sys.exit(main())
