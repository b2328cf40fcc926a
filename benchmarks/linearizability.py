"""How long the fault lab's linearizability checker takes on histories of the lab's shape.

Why: the lab records a register workload for up to an hour; its checker (a search that can
be exponential) must finish in minutes on this machine. This script simulates the workload
(no server): ``--processes`` clients each run one operation at a time on ``--keys`` keys
(half reads, a quarter writes of fresh values, a quarter compare-and-sets expecting the value
the client last read), each taking effect at one instant inside its window on one register
per key, so the history is linearizable by construction. Windows average ``--latency``
seconds (and so do the pauses between them); every ``--fault-every`` seconds a
``--fault-for``-second window makes the operations of ``--fault-share`` of the processes (a
partition's minority side) time out after ``--timeout`` seconds with an unknown outcome, half
of those having taken effect and seen by the other processes (these are what make the search
hard). Per run, it prints the time to read the history file back (the baseline any checker
pays) and the checker's time, as a ratio to it and as operations per second, with the
configurations explored; with ``--report``, the whole verdict's and the report's times once;
then the process's peak RSS.

Run from the repository root::

    python -m benchmarks.linearizability [--ops 20000] [--keys 5] [--processes 10]
        [--seed 1] [--repeat 3] [--fault-every 20] [--fault-for 5] [--timeout 1]
        [--latency 0.01] [--fault-share 0.5] [--report]

Layout: pure Python, single thread; pin it with ``taskset -c 1`` for steady figures.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from lockbench.faults import (
    HistoryWriter,
    Op,
    check,
    check_register,
    read_history,
    write_report,
)


def simulate(
    ops: int,
    keys: int,
    processes: int,
    seed: int,
    fault_every: float,
    fault_for: float,
    timeout: float,
    latency: float = 0.01,
    fault_share: float = 0.5,
) -> list[Op]:
    """A linearizable register history of ``ops`` operations (see the module header)."""
    rng = random.Random(seed)
    names = [f"k{i}" for i in range(keys)]
    # first the windows and the instants, process by process
    plan: list[tuple[float, float, float | None, str, str, bool]] = []
    per = ops // processes
    cut = max(1, round(processes * fault_share))  # the processes a fault cuts off
    for p in range(processes):
        t = rng.uniform(0, 0.01)
        for _ in range(per):
            invoke = t
            in_fault = (
                p < cut and fault_every > 0 and (invoke % fault_every) >= fault_every - fault_for
            )
            if in_fault:
                complete: float | None = invoke + timeout
                applied = rng.random() < 0.5
                point = rng.uniform(invoke, invoke + timeout) if applied else -1.0
            else:
                complete = invoke + rng.expovariate(1 / latency) + 0.0005
                point = rng.uniform(invoke, complete)
            key = rng.choice(names)
            plan.append((point, invoke, complete, f"p{p}", key, in_fault))
            assert complete is not None
            t = complete + rng.expovariate(1 / latency)
    # then the effects, in the order of the instants
    state: dict[str, Any] = dict.fromkeys(names)
    last_read: dict[tuple[str, str], Any] = {}
    counter = 0
    history: list[Op] = []
    ordered = sorted(plan, key=lambda x: x[0] if x[0] >= 0 else float("inf"))
    for point, invoke, complete, process, key, in_fault in ordered:
        applied = point >= 0
        r = rng.random()
        if r < 0.5:
            f, value = "read", state[key] if applied else None
            outcome = "unknown" if in_fault else "ok"
            if applied and not in_fault:
                last_read[process, key] = state[key]
        elif r < 0.75:
            counter += 1
            f, value = "write", counter
            if applied:
                state[key] = counter
            outcome = "unknown" if in_fault else "ok"
        else:
            counter += 1
            expected = last_read.get((process, key))
            f, value = "cas", [expected, counter]
            if applied and state[key] == expected:
                state[key] = counter
                outcome = "unknown" if in_fault else "ok"
            else:
                outcome = "unknown" if in_fault and not applied else "fail"
        history.append(
            Op(process, "register", f, key, value, invoke, complete, outcome)  # type: ignore[arg-type]
        )
    return history


def main(argv: Sequence[str] | None = None) -> None:
    """Simulate, check, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--processes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fault-every", type=float, default=20.0)
    parser.add_argument("--fault-for", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--fault-share", type=float, default=0.5)
    parser.add_argument(
        "--report",
        action="store_true",
        help="also time the whole verdict (check) and the report (write_report) once",
    )
    args = parser.parse_args(argv)
    history = simulate(
        args.ops,
        args.keys,
        args.processes,
        args.seed,
        args.fault_every,
        args.fault_for,
        args.timeout,
        args.latency,
        args.fault_share,
    )
    outcomes = {o: sum(op.outcome == o for op in history) for o in ("ok", "fail", "unknown")}
    span = max(op.complete or op.invoke for op in history)
    print(
        f"history: {len(history):,} ops over {span:,.0f} s of lab time, {args.keys} keys, "
        f"{args.processes} processes; outcomes {outcomes}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "history.jsonl")
        with HistoryWriter(path) as w:
            for op in history:
                w.write(op)
        size = os.path.getsize(path)
        for run in range(args.repeat):
            # the baseline: reading the history file back (what any checker must do)
            started = time.perf_counter()
            read = read_history(path)
            reading = time.perf_counter() - started
            started = time.perf_counter()
            result = check_register(read.ops)
            took = time.perf_counter() - started
            states = sum(k.states for k in result.keys)
            kept = sum(k.unknown for k in result.keys)
            pruned = sum(k.pruned for k in result.keys)
            print(
                f"run {run + 1}: read {size / 1e6:,.0f} MB in {reading:.2f} s; checked: "
                f"{result.verdict} in {took:.2f} s ({took / reading:.2f}x the read, "
                f"{len(history) / took:,.0f} ops/s), {states:,} states, unknown ops kept "
                f"{kept} / pruned {pruned}"
            )
            del read, result
        if args.report:
            read = read_history(path)
            started = time.perf_counter()
            verdict = check(read)
            checking = time.perf_counter() - started
            started = time.perf_counter()
            write_report(read, verdict, os.path.join(tmp, "report"))
            reporting = time.perf_counter() - started
            print(
                f"whole verdict ({verdict.status}) in {checking:.2f} s, report (summary, "
                f"timeline, verdict.jsonl) in {reporting:.2f} s"
            )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:,.0f} MB")


if __name__ == "__main__":
    main()
