"""The safety soak: many processes and threads fight over a few locks; every grant is recorded
and the whole history is checked for exclusion and fence order (issue #8).

Why: a lock server is only as good as the proof that no lock was ever held twice. This spawns
one server (``python -m lockserver --port 0``), starts ``--processes`` worker processes of
``--threads`` threads each, every thread with its own session, doing contended blocking
acquisitions of a few Mutexes, ReadWriteLocks (read or write) and Semaphores (``--permits``)
with the sync client and recipes, and records each critical section with
:class:`lockbench.safety.Recorder` into one JSON-lines file per process. When ``--grants``
grants are done (or ``--seconds`` have passed) the files are loaded and checked by
:func:`lockbench.safety.check`; the exit status is 1 on any violation.

    python -m benchmarks.safety_soak --grants 1000000 --seconds 600
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from lockbench.safety import EXCLUSIVE, READ, SLOT, Recorder, check, load

__all__ = ["main"]

NAMESPACE = "soak"


def _thread(
    port: int,
    recorder: Recorder,
    quota: int,
    stop_at: float,
    seed: int,
    locks: int,
    permits: int,
    counts: list[int],
    index: int,
) -> None:
    from client import LockClient, Mutex, ReadWriteLock, Semaphore

    rng = random.Random(seed)
    holder = f"p{seed}"
    with LockClient("127.0.0.1", port, timeout=60.0) as c, c.session(max_age=60.0) as s:
        done = 0
        while done < quota and time.monotonic() < stop_at:
            kind = rng.randrange(3)
            k = rng.randrange(locks)
            lock: Any
            if kind == 0:
                name, mode, capacity = f"mutex-{k}", EXCLUSIVE, None
                lock = Mutex(s, NAMESPACE, name)
            elif kind == 1:
                name = f"rw-{k}"
                rw = ReadWriteLock(s, NAMESPACE, name)
                if rng.random() < 0.7:
                    mode, lock = READ, rw.read
                else:
                    mode, lock = EXCLUSIVE, rw.write
                capacity = None
            else:
                name, mode, capacity = f"sem-{k}", SLOT, permits
                lock = Semaphore(s, NAMESPACE, name, permits=permits)
            if not lock.acquire(timeout=10.0):
                continue
            with recorder.hold(name, mode, lock.fence, holder, capacity):
                if rng.random() < 0.1:
                    time.sleep(0.0005)
            lock.release()
            done += 1
            counts[index] = done


def _process(
    port: int, path: str, quota: int, stop_at: float, seed: int, threads: int, args: Any, q: Any
) -> None:
    counts = [0] * threads
    with Recorder(path) as recorder:
        per = [quota // threads + (1 if i < quota % threads else 0) for i in range(threads)]
        workers = [
            threading.Thread(
                target=_thread,
                args=(
                    port,
                    recorder,
                    per[i],
                    stop_at,
                    seed * 1000 + i,
                    args.locks,
                    args.permits,
                    counts,
                    i,
                ),
            )
            for i in range(threads)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    q.put(sum(counts))


def main(argv: list[str] | None = None) -> int:
    # The harness's private server spawner: these repository scripts share lockbench's
    # internals on purpose (psutil, the bench extra, is imported only here).
    from lockbench._spawn import spawned
    from lockbench._targets import Backend

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grants", type=int, default=1_000_000, help="total grants to record")
    p.add_argument("--seconds", type=float, default=600.0, help="time bound of the load")
    p.add_argument("--processes", type=int, default=4)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--locks", type=int, default=3, help="locks of each kind")
    p.add_argument("--permits", type=int, default=3, help="semaphore capacity")
    p.add_argument("--dir", default=None, help="where the JSON-lines files go (default: temp)")
    p.add_argument("--port", type=int, default=0, help="use a running server")
    args = p.parse_args(argv)

    workdir = Path(args.dir or tempfile.mkdtemp(prefix="safety-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)

    def run(port: int) -> int:
        ctx = multiprocessing.get_context("spawn")
        q: Any = ctx.Queue()
        t0 = time.monotonic()
        stop_at = t0 + args.seconds
        per = args.grants // args.processes
        paths = [str(workdir / f"grants-{i}.jsonl") for i in range(args.processes)]
        for path in paths:
            Path(path).unlink(missing_ok=True)
        procs = [
            ctx.Process(
                target=_process,
                args=(port, paths[i], per, stop_at, i + 1, args.threads, args, q),
            )
            for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        granted = sum(q.get() for _ in procs)
        for proc in procs:
            proc.join()
        elapsed = time.monotonic() - t0
        intervals = load(paths)
        report = check(intervals)
        print(
            f"processes={args.processes} threads={args.threads} locks={args.locks}x3 "
            f"permits={args.permits}"
        )
        print(f"grants: {granted:,} in {elapsed:.1f} s ({granted / elapsed:,.0f}/s)")
        print(f"intervals checked: {len(intervals):,} (files in {workdir})")
        print(report.summary())
        bad = not report.ok or any(proc.exitcode != 0 for proc in procs)
        print("FAILED" if bad else "OK")
        return 1 if bad else 0

    if args.port:
        return run(args.port)
    with spawned(Backend.LOCKSERVER) as server:
        return run(server.port)


if __name__ == "__main__":
    sys.exit(main())
