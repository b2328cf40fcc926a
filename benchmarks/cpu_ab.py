"""Server CPU per transaction of several source trees, interleaved (issue 19).

``python -m benchmarks.cpu_ab [--rounds N] [--duration S] NAME=DIR [NAME=DIR ...]`` runs, in
each round and for each tree, ``lockbench blast --spawn --pin`` in the two shapes of the
issue's CPU target -- 64 unpipelined connections (``c64``) and one connection with 64 in
flight (``p64``) -- and prints every run's server CPU per transaction (user + kernel, from
psutil, as lockbench reports it) and throughput, then the medians. DIR is a source tree (a
checkout, or a copy made with ``git archive``): lockbench is run from it, so the server it
spawns runs that tree's code (``_spawn.py``: the packages next to lockbench). The order of
the trees alternates from round to round.

Why this shape of measurement: the machine has 2 cores that other jobs share, so single runs
and wall-clock throughput move with whatever else runs. CPU time per transaction of the
pinned server moves much less, and interleaving the trees spreads any drift over all of
them; compare medians of one sitting, never figures of different sittings.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SHAPES: dict[str, list[str]] = {
    "c64": ["--connections", "64", "--pipeline", "1"],
    "p64": ["--connections", "1", "--pipeline", "64"],
}


def blast(
    tree: Path, shape: list[str], duration: float, env: dict[str, str]
) -> tuple[float, float]:
    """One pinned blast run of ``tree``'s server: (server CPU µs per transaction, tx/s)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "blast.json"
        cmd = [sys.executable, "-P", "-m", "lockbench", "blast", "--spawn", "--pin", *shape]
        cmd += ["--duration", str(duration), "--warmup", "1", "--json", str(out)]
        subprocess.run(
            cmd,
            env={**os.environ, **env, "PYTHONPATH": str(tree)},
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        result = json.loads(out.read_text())["results"][0]
    return result["server_cpu_s_per_1k_ops"] * 1000, result["ops_per_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME:VAR=VALUE",
        help="an environment variable for one tree's servers (repeatable)",
    )
    parser.add_argument("trees", nargs="+", metavar="NAME=DIR")
    args = parser.parse_args(argv)
    trees = [(name, Path(d).resolve()) for name, d in (t.split("=", 1) for t in args.trees)]
    envs: dict[str, dict[str, str]] = {name: {} for name, _ in trees}
    for item in args.env:
        name, assignment = item.split(":", 1)
        var, value = assignment.split("=", 1)
        envs[name][var] = value
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        order = trees if r % 2 == 0 else trees[::-1]
        for shape, shape_args in SHAPES.items():
            for name, tree in order:
                us, tps = blast(tree, shape_args, args.duration, envs[name])
                runs.setdefault((name, shape), []).append((us, tps))
                print(f"round {r} {shape} {name}: {us:.2f} us/tx {tps:,.0f} tx/s", flush=True)
    print("median server CPU per tx, median tx/s, every run's us/tx:")
    for shape in SHAPES:
        for name, _ in trees:
            got = runs[name, shape]
            us = statistics.median(u for u, _ in got)
            tps = statistics.median(t for _, t in got)
            each = " ".join(f"{u:.1f}" for u, _ in got)
            print(f"  {shape} {name}: {us:.2f} us/tx  {tps:,.0f} tx/s  [{each}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
