"""What the operator's side costs the hot path: ``lockbench blast`` against a server of one
checkout ("before") and of another ("after"), the after server's ``/metrics`` scraped every
second, in one sitting.

Why: issue 16 asks that inspection and metrics cost the hot path nothing measurable (within 3 %
of before, pipelined and at 64 connections, while ``/metrics`` is scraped every second). The
two servers run the same lockbench blaster (this checkout's), interleaved round by round, in
both layouts: ``pinned`` (server ``taskset -c 0``, blaster ``taskset -c 1``) and ``free``
(neither bound). Each server is a fresh ``python -m lockserver`` started in its checkout's
directory, so that checkout's code runs.

Run: ``python -m benchmarks.scrape_cost --before /path/to/old/checkout [--after .]
[--rounds 3] [--duration 6]``. Prints every run, then the medians and the ratios after/before
of throughput and of server CPU per transaction.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

SHAPES = {
    "c1/p64": ["--connections", "1", "--pipeline", "64"],
    "c64/p1": ["--connections", "64", "--pipeline", "1"],
}
LAYOUTS = ("pinned", "free")


def scrape(port: int, stop: threading.Event, counts: list[int]) -> None:
    """GET /metrics every second until ``stop``; counts[0] answered, counts[1] failed."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                reply.read()
            counts[0] += 1
        except OSError:
            counts[1] += 1
        stop.wait(1.0)


def one_run(
    tree: Path, layout: str, shape: str, duration: float, scraped: bool, out: Path
) -> tuple[float, float, list[int]]:
    """(transactions/s, server CPU µs per transaction, scrapes) of one blast."""
    pin_server = ["taskset", "-c", "0"] if layout == "pinned" else []
    pin_load = ["taskset", "-c", "1"] if layout == "pinned" else []
    server = subprocess.Popen(
        [*pin_server, sys.executable, "-m", "lockserver", "--port", "0", "--log-level", "WARNING"],
        cwd=tree,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        port = int(line.rpartition(":")[2])
        stop = threading.Event()
        counts = [0, 0]
        scraper = threading.Thread(target=scrape, args=(port, stop, counts))
        if scraped:
            scraper.start()
        beside = Path(sys.executable).with_name("lockbench")  # this venv's, activated or not
        lockbench = str(beside) if beside.exists() else shutil.which("lockbench") or "lockbench"
        subprocess.run(
            [*pin_load, lockbench, "blast", "--target", f"lockserver://127.0.0.1:{port}",
             *SHAPES[shape], "--duration", str(duration), "--warmup", "1", "--json", str(out)],
            capture_output=True, check=True, timeout=duration + 120,
        )  # fmt: skip
        stop.set()
        if scraped:
            scraper.join()
    finally:
        server.terminate()
        server.wait(10)
    result = json.loads(out.read_text())["results"][0]
    return result["ops_per_s"], result["server_cpu_s_per_1k_ops"] * 1000, counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the old checkout")
    parser.add_argument("--after", type=Path, default=Path("."), help="the new checkout (.)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per blast")
    args = parser.parse_args(argv)
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for rnd in range(args.rounds):
            for layout in LAYOUTS:
                for variant, tree in (("before", args.before), ("after", args.after)):
                    for shape in SHAPES:
                        out = (
                            Path(scratch)
                            / f"{rnd}-{layout}-{variant}-{shape.replace('/', '')}.json"
                        )
                        rate, cpu, counts = one_run(
                            tree.resolve(), layout, shape, args.duration, variant == "after", out
                        )
                        results.setdefault((layout, shape, variant), []).append((rate, cpu))
                        print(f"round {rnd} {layout:6} {shape:6} {variant:6} {rate:8.0f} tx/s "
                              f"{cpu:6.2f} us/tx scrapes {counts}", flush=True)  # fmt: skip
    print()
    for layout in LAYOUTS:
        for shape in SHAPES:
            before = results[(layout, shape, "before")]
            after = results[(layout, shape, "after")]
            rate_b = statistics.median(r for r, _ in before)
            rate_a = statistics.median(r for r, _ in after)
            cpu_b = statistics.median(c for _, c in before)
            cpu_a = statistics.median(c for _, c in after)
            print(f"{layout:6} {shape:6} before {rate_b:8.0f} tx/s {cpu_b:6.2f} us/tx | after "
                  f"{rate_a:8.0f} tx/s {cpu_a:6.2f} us/tx | throughput {rate_a / rate_b:.3f} "
                  f"cpu {cpu_a / cpu_b:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
