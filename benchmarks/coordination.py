"""Election failover and barrier rounds, beside etcd's election API, in one sitting (issue 33).

    python -m benchmarks.coordination [--kills 8] [--resigns 200] [--max-age 2 5]

For each layout (``pinned``: the servers on CPU 0 and the load on CPU 1; ``unpinned``), starts
a private lockserver and a one-member etcd (loopback, free ports) and measures
(``lockbench._coordination``):

- **failover after kill -9**: the leader is a process that campaigned with a session of
  ``--max-age`` seconds (etcd: a lease of that TTL) and keeps it alive; it is killed at a
  random moment of its keepalive period; from the kill to the standby's first act (a
  proclaim). Bounded by the max age: between 2/3 and all of it, plus a round trip;
- **failover after a clean resign**: from just before the resignation is sent to the
  standby's first act;
- **barrier rounds**: a cyclic barrier of 2, 4 and 8 processes, ``--rounds`` rounds: the time
  per round.

Prints the figures (median, p90, max, in ms) and writes them as JSON to ``--out``. Run it in a
quiet sitting (``/work/bin/quiet-run``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockbench._coordination import barrier_rounds, etcd_failover, failover
from lockbench._layout import load_on, pin_plan, thread_on
from lockbench._spawn import spawned
from lockbench._targets import Backend
from lockbench.etcd import EtcdCluster


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median_ms": statistics.median(ordered) * 1000,
        "p90_ms": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] * 1000,
        "min_ms": ordered[0] * 1000,
        "max_ms": ordered[-1] * 1000,
    }


def _trials(what: str, n: int, one: Callable[[], float]) -> dict[str, float]:
    values = [one() for _ in range(n)]
    figures = _stats(values)
    print(
        f"  {what:<34} n={n:<4} median {figures['median_ms']:9.2f} ms  p90 "
        f"{figures['p90_ms']:9.2f}  min {figures['min_ms']:9.2f}  max {figures['max_ms']:9.2f}",
        flush=True,
    )
    return figures


def run_layout(layout: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    plan = pin_plan() if layout == "pinned" else None
    server_cpus = None if plan is None else plan.server
    load_cpus = None if plan is None else plan.load
    out: dict[str, Any] = {}
    print(f"layout {layout}: servers on {sorted(server_cpus or [])}, load on "
          f"{sorted(load_cpus or [])}", flush=True)  # fmt: skip
    with (
        spawned(Backend.LOCKSERVER, cpus=server_cpus) as server,
        EtcdCluster(workdir / f"etcd-{layout}") as etcd,
    ):
        with thread_on(server_cpus):
            etcd.start(1)
        endpoint = etcd.endpoints[0]
        with load_on(load_cpus):
            for age in args.max_age:
                kills = max(2, round(args.kills * min(args.max_age) / age))
                out[f"lockserver_kill_{age:g}s"] = _trials(
                    f"lockserver kill -9 (max age {age:g} s)",
                    kills,
                    functools.partial(failover, server.port, "kill", max_age=age),
                )
                out[f"etcd_kill_{age:g}s"] = _trials(
                    f"etcd kill -9 (lease TTL {int(age)} s)",
                    kills,
                    functools.partial(etcd_failover, endpoint, "kill", ttl=int(age)),
                )
            out["lockserver_resign"] = _trials(
                "lockserver clean resign",
                args.resigns,
                lambda: failover(server.port, "resign", max_age=10.0),
            )
            out["etcd_resign"] = _trials(
                "etcd clean resign",
                args.etcd_resigns,
                lambda: etcd_failover(endpoint, "resign", ttl=10),
            )
            for parties in args.parties:
                per_round = barrier_rounds(server.port, parties, args.rounds)
                out[f"barrier_{parties}"] = {"round_ms": per_round * 1000, "rounds": args.rounds}
                print(
                    f"  barrier of {parties} processes, {args.rounds} rounds: "
                    f"{per_round * 1000:.3f} ms per round ({1 / per_round:,.0f} rounds/s)",
                    flush=True,
                )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kills", type=int, default=8, help="kill -9 failovers per system at the shortest max age"
    )
    p.add_argument("--resigns", type=int, default=200, help="clean resignations (lockserver)")
    p.add_argument("--etcd-resigns", type=int, default=50, help="clean resignations (etcd)")
    p.add_argument(
        "--max-age",
        type=float,
        nargs="+",
        default=[2.0, 5.0],
        help="session max ages / lease TTLs (s, whole): fewer kills for the longer ones",
    )
    p.add_argument("--rounds", type=int, default=500, help="barrier rounds per party count")
    p.add_argument("--parties", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--layouts", nargs="+", default=["pinned", "unpinned"])
    p.add_argument("--out", default="benchmarks/results/coordination.json")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="coordination-bench-"))
    results = {layout: run_layout(layout, args, workdir) for layout in args.layouts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
