"""The fault lab's long sitting: several ``lockbench faults run`` segments back to back (both
systems, 3 and 5 nodes, every nemesis), each judged, their histories gzipped beside their
reports, and an index of the whole sitting.

Usage (as root; a correctness run, not a benchmark: it runs beside other work)::

    python -m benchmarks.faults_sitting --out benchmarks/results/faults \
        [--minutes 15,15,10,10] [--runner "/path/to/shared-run"] [--seed 1]

Segments, in order: lockserver 3 nodes, lockserver 5 nodes, etcd 3 nodes, etcd 5 nodes, each
with ``--nemesis all`` for its share of ``--minutes``. ``--runner`` prefixes each segment's
command (a wrapper that queues it behind other jobs of a shared machine). A segment's
directory keeps ``history.jsonl.gz`` (``gunzip -k`` it, then ``lockbench faults check
history.jsonl`` judges it again), its report and its processes' logs (gzipped); ``index.md``
lists the segments with their verdicts and the machine's load average before each.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

SEGMENTS = (("lockserver", 3), ("lockserver", 5), ("etcd", 3), ("etcd", 5))


def _gzip(path: Path) -> None:
    """``path`` -> ``path.gz`` (the original removed)."""
    with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()


def _gzip_logs(logs: Path) -> None:
    """Every process log of a segment gzipped in place (they are mostly repeated lines)."""
    if logs.is_dir():
        for log in sorted(logs.glob("*.log")):
            _gzip(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.faults_sitting")
    parser.add_argument("--out", default="benchmarks/results/faults")
    parser.add_argument("--minutes", default="15,15,10,10", help="per segment, in order")
    parser.add_argument("--runner", default="", help="command prefix for each segment")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", help="run only these segments (e.g. etcd-3n,lockserver-5n)")
    args = parser.parse_args(argv)
    minutes = [float(m) for m in args.minutes.split(",")]
    if len(minutes) != len(SEGMENTS):
        parser.error(f"--minutes needs {len(SEGMENTS)} values")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for (system, nodes), mins in zip(SEGMENTS, minutes, strict=True):
        name = f"{system}-{nodes}n"
        if args.only and name not in args.only.split(","):
            continue
        target = out / name
        shutil.rmtree(target, ignore_errors=True)
        cmd = [
            *shlex.split(args.runner),
            sys.executable,
            "-m",
            "lockbench",
            "faults",
            "run",
            "--system",
            system,
            "--nodes",
            str(nodes),
            "--duration",
            str(mins * 60),
            "--nemesis",
            "all",
            "--seed",
            str(args.seed),
            "--out",
            str(target),
        ]
        load = os.getloadavg()
        started = time.time()
        print(f"=== {name}: {' '.join(cmd)}", flush=True)
        done = subprocess.run(cmd, check=False)
        took = time.time() - started
        history = target / "history.jsonl"
        if history.exists():
            _gzip(history)
        _gzip_logs(target / "logs")
        rows.append((name, mins, done.returncode, took, load))
        print(f"=== {name}: exit {done.returncode} in {took:.0f} s", flush=True)
    with open(out / "index.md", "a", encoding="utf-8") as index:
        index.write(f"\n## sitting of {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC\n\n")
        index.write("| segment | minutes | exit (0 valid, 1 not) | took | load avg before |\n")
        index.write("|---|---|---|---|---|\n")
        for name, mins, code, took, load in rows:
            index.write(
                f"| {name} | {mins:g} | {code} | {took:.0f} s | "
                f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f} |\n"
            )
    return max((r[2] for r in rows), default=0)


if __name__ == "__main__":
    sys.exit(main())
