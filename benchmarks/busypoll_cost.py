"""What ``busy_poll`` costs and earns: server CPU and latency with it at its default and at 0,
at fractions of the 64-connection capacity, for one checkout ("before") and another ("after"),
pinned, in one sitting.

Why: issue 19 found busy_poll spinning through every gap at half load (~100% of a core to
serve half of its capacity); the policy in ``lockserver/shell/_busypoll.py`` now spins within a
share of the time it serves. The claim to check is twofold: at 10% and 50% of capacity the
server's CPU with busy_poll is within ~15% of its CPU without, and at ~90% the latency gain
stays. So each cell is (checkout, busy_poll, load) and reports the server's CPU per second of
wall time and per transaction, the latency (p50, p99, from the paced schedule), and the
server's own ``busy_poll_seconds`` / hits / misses (statistics ``server``).

Procedure: the pinned layout by hand, as in ``scrape_cost.py`` (server ``taskset -c 0``,
lockbench ``taskset -c 1``; lockbench records such a run as pinned). Capacity first: unpaced
``lockbench blast --connections 64 --pipeline 1`` against the before checkout, busy_poll at
its default and at 0, ``--rounds`` each; the capacity is their median. Then every cell once
per round, rounds interleaved, each a fresh ``python -m lockserver --port 0`` started in its
checkout's directory with ``LOCKSERVER_BUSY_POLL`` set, driven by ``lockbench blast --rate
R --connections 64 --pipeline 1`` (this venv's lockbench), its statistics read before it is
stopped. ``--strict-rr`` adds one connection in strict request/response (unpaced), the
shape busy_poll was first measured on.

Run: ``python -m benchmarks.busypoll_cost --before /path/to/old/checkout [--after .]
[--rounds 3] [--duration 6] [--loads 0.1,0.5,0.9] [--strict-rr] [--also NAME=PATH ...]
[--json FILE]`` (``--also``: more checkouts at the default busy_poll, e.g. a variant). Prints
every run, then per cell the median and the range over the rounds. The machine's other load
is printed too (``other`` CPU %, from lockbench): a shared machine moves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from client import LockClient

DEFAULT = "0.0001"  # busy_poll's default (lockserver/_config.py)
VARIANTS = [("before", DEFAULT), ("before", "0"), ("after", DEFAULT)]


def _lockbench() -> str:
    beside = Path(sys.executable).with_name("lockbench")  # this venv's, activated or not
    return str(beside) if beside.exists() else shutil.which("lockbench") or "lockbench"


def one_run(
    tree: Path, busy_poll: str, shape: list[str], duration: float, out: Path
) -> dict[str, Any]:
    """One blast against a fresh pinned server of ``tree``: lockbench's figures and the
    server's busy-poll counters."""
    env = dict(os.environ, LOCKSERVER_BUSY_POLL=busy_poll)
    server = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "lockserver", "--port", "0",
         "--log-level", "WARNING"],
        cwd=tree, env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().strip().rpartition(":")[2])
        subprocess.run(
            ["taskset", "-c", "1", _lockbench(), "blast", "--target",
             f"lockserver://127.0.0.1:{port}", *shape, "--duration", str(duration),
             "--warmup", "1", "--json", str(out)],
            capture_output=True, check=True, timeout=duration + 120,
        )  # fmt: skip
        with LockClient("127.0.0.1", port, client_name="busypoll-cost", timeout=5.0) as probe:
            stats = dict(probe.statistics()["server"])
    finally:
        server.terminate()
        server.wait(10)
    result = json.loads(out.read_text())["results"][0]
    extra = result["extra"]
    return {
        "tx_s": result["ops_per_s"],
        "cpu_pct": extra.get("server_cpu_pct"),
        "us_tx": result["server_cpu_s_per_1k_ops"] * 1000,
        "p50": result["latency_us"]["p50"],
        "p99": result["latency_us"]["p99"],
        # the whole life of the server: warm-up, measured window, the statistics call
        "spin_s": stats["busy_poll_seconds"],
        "hits": stats["busy_poll_hits"],
        "misses": stats["busy_poll_misses"],
        # what a sleep and wake-up cost the poller (the after checkout's policy measures it)
        "wake_us": stats.get("busy_poll_wake_seconds", 0.0) * 1e6,
        "other_pct": extra.get("other_cpu_pct"),
        "layout": result["params"].get("layout"),
    }


def _shape(rate: float | None) -> list[str]:
    if rate is None:
        return ["--connections", "64", "--pipeline", "1"]
    return ["--connections", "64", "--pipeline", "1", "--rate", f"{rate:.0f}"]


def _spread(values: list[float], fmt: str) -> str:
    return (
        f"{format(statistics.median(values), fmt)} "
        f"[{format(min(values), fmt)}-{format(max(values), fmt)}]"
    )


def summarize(runs: list[dict[str, Any]], duration: float, max_other: float | None) -> None:
    """Per cell (by load) and variant: the median and range of each figure
    over the runs (only those where the machine's other load was at most ``max_other`` % of
    a core, when given). Spin per second is over the server's life, warm-up included."""
    if max_other is not None:
        runs = [r for r in runs if r["other_pct"] is not None and r["other_pct"] <= max_other]

    def order(key: tuple[str, str, str]) -> tuple[float, int, str]:
        cell, variant, busy = key
        load = -1.0 if cell == "capacity" else float(cell[:-1]) if cell.endswith("x") else 99.0
        known = VARIANTS.index((variant, busy)) if (variant, busy) in VARIANTS else 3
        return load, known, variant

    keys = sorted({(r["cell"], r["variant"], r["busy_poll"]) for r in runs}, key=order)
    for cell, variant, busy in keys:
        rs = [r for r in runs if (r["cell"], r["variant"], r["busy_poll"]) == (cell, variant, busy)]
        print(f"{cell:9} {variant:10} busy_poll={busy:6} n={len(rs)} "
              f"tx/s {_spread([r['tx_s'] for r in rs], '.0f')}  "
              f"cpu% {_spread([r['cpu_pct'] for r in rs], '.1f')}  "
              f"us/tx {_spread([r['us_tx'] for r in rs], '.1f')}  "
              f"p50 {_spread([r['p50'] for r in rs], '.0f')}  "
              f"p99 {_spread([r['p99'] for r in rs], '.0f')}  "
              f"spin s/s {_spread([r['spin_s'] / (duration + 1) for r in rs], '.3f')}  "
              f"wake us {_spread([r.get('wake_us', 0.0) for r in rs], '.0f')}  "
              f"other% {_spread([r['other_pct'] for r in rs], '.0f')}")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="the old checkout")
    parser.add_argument("--after", type=Path, default=Path("."), help="the new checkout (.)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per blast")
    parser.add_argument("--loads", default="0.1,0.5,0.9", help="fractions of the capacity")
    parser.add_argument("--capacity", type=float, help="tx/s: skip the capacity runs")
    parser.add_argument("--strict-rr", action="store_true", help="add 1 connection, unpaced")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="one more checkout, run at the default busy_poll in every cell",
    )
    parser.add_argument(
        "--summarize",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="run nothing: summarize the runs of these --json files together",
    )
    parser.add_argument(
        "--max-other", type=float, help="summarize only runs with at most this other load, %%"
    )
    args = parser.parse_args(argv)
    if args.summarize:
        sittings = [json.loads(f.read_text()) for f in args.summarize]
        pooled = [r for sitting in sittings for r in sitting["runs"]]
        durations = {sitting.get("duration", 6.0) for sitting in sittings}
        if len(durations) > 1:
            parser.error("--summarize: the sittings ran blasts of different durations")
        summarize(pooled, durations.pop(), args.max_other)
        return
    if args.before is None:
        parser.error("--before is required (or --summarize)")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    variants = list(VARIANTS)
    for also in args.also:
        name, _, path = also.partition("=")
        trees[name] = Path(path).resolve()
        variants.append((name, DEFAULT))
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch:

        def run(variant: str, busy: str, cell: str, shape: list[str], rnd: int) -> None:
            out = Path(scratch) / f"{len(runs)}.json"
            r = one_run(trees[variant], busy, shape, args.duration, out)
            r.update(variant=variant, busy_poll=busy, cell=cell, round=rnd)
            runs.append(r)
            print(f"round {rnd} {cell:9} {variant:7} busy_poll={busy:6} {r['tx_s']:7.0f} tx/s "
                  f"cpu {r['cpu_pct']:5.1f}% {r['us_tx']:6.1f} us/tx p50 {r['p50']:7.0f} "
                  f"p99 {r['p99']:8.0f} us spin {r['spin_s']:.3f} s ({r['hits']} hits, "
                  f"{r['misses']} misses; wake {r['wake_us']:.0f} us) other {r['other_pct']:.0f}% "
                  f"{r['layout']}",
                  flush=True)  # fmt: skip

        capacity = args.capacity
        if capacity is None:
            for rnd in range(args.rounds):
                for busy in (DEFAULT, "0"):
                    run("before", busy, "capacity", _shape(None), rnd)
            capacity = statistics.median(r["tx_s"] for r in runs)
            print(f"capacity (median of the unpaced runs): {capacity:.0f} tx/s", flush=True)
        cells = [
            (f"{load:g}x", _shape(capacity * load)) for load in map(float, args.loads.split(","))
        ]
        if args.strict_rr:
            cells.append(("strict-rr", ["--connections", "1", "--pipeline", "1"]))
        for rnd in range(args.rounds):
            for cell, shape in cells:
                for variant, busy in variants:
                    run(variant, busy, cell, shape, rnd)
    if args.json is not None:
        sitting = {"capacity": capacity, "duration": args.duration, "runs": runs}
        args.json.write_text(json.dumps(sitting, indent=1))
    print(f"\ncapacity {capacity:.0f} tx/s; median [min-max] over {args.rounds} rounds")
    summarize(runs, args.duration, None)


if __name__ == "__main__":
    main()
