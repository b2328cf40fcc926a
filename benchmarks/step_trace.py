"""Run a lockserver with every trio task step timed: where did the server's time go during a
slow reply? (issue 19's stall investigation).

``python -m benchmarks.step_trace --out FILE [--threshold-ms MS] -- [lockserver options]``
starts the ``lockserver`` command in this process with a trio instrument and a collector
callback installed, and on exit (SIGINT / SIGTERM, as the server stops) writes FILE (JSON):

- ``steps``: every task step of at least the threshold: start (``perf_counter`` seconds),
  wall and thread-CPU milliseconds, the task's name, and the collector passes inside it;
- ``holes``: every gap of at least the threshold between two steps of the poller task
  (``Reader.poll_loop``): its wall and thread-CPU milliseconds and how many steps of other
  tasks ran in it. A hole with CPU near zero and no other step is the server asleep in
  ``epoll_wait``: no request had arrived (the load generator was not sending);
- ``gc``: per generation, collections, total and longest pause (ms);
- ``nivcsw`` / ``nvcsw``: the process's involuntary / voluntary context switches.

Pin it like a spawned server (``taskset -c 0 python -m benchmarks.step_trace ...``) and point
``lockbench blast --target lockserver://127.0.0.1:PORT`` at it (``--bigtable`` needs the
server started with ``--max-entries-per-session 10000000``). The instrument costs two clock
reads per task step: a traced server is a little slower than a plain one; compare the
traced figures with each other, not with an untraced run.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

import trio

import lockserver.__main__ as server_main


class StepTrace(trio.abc.Instrument):
    """Collects the long task steps, the holes between the poller's steps and the
    collector's passes (see the module header)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.steps: list[tuple[float, float, float, str]] = []
        self.holes: list[tuple[float, float, float, int]] = []
        self.passes: list[tuple[float, float, int]] = []
        self._t0 = self._c0 = 0.0
        self._poll_end = self._poll_cpu = 0.0
        self._others = 0
        self._gc_start = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._c0 = time.thread_time()
        self._t0 = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        t1 = time.perf_counter()
        if t1 - self._t0 >= self.threshold:
            self.steps.append((self._t0, t1 - self._t0, time.thread_time() - self._c0, task.name))
        if not task.name.endswith("poll_loop"):
            self._others += 1
            return
        if self._poll_end and self._t0 - self._poll_end >= self.threshold:
            self.holes.append(
                (self._poll_end, self._t0 - self._poll_end, self._c0 - self._poll_cpu, self._others)
            )
        self._poll_end, self._poll_cpu, self._others = t1, time.thread_time(), 0

    def collector(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` entry: the start and stop of every collection."""
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.passes.append((self._gc_start, time.perf_counter(), int(info["generation"])))

    def report(self) -> dict[str, Any]:
        def ms(seconds: float) -> float:
            return round(seconds * 1000, 3)

        gc_by_gen: dict[int, list[float]] = {}
        for start, stop, gen in self.passes:
            figures = gc_by_gen.setdefault(gen, [0, 0.0, 0.0])
            figures[0] += 1
            figures[1] += ms(stop - start)
            figures[2] = max(figures[2], ms(stop - start))
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return {
            "threshold_ms": ms(self.threshold),
            "steps": [
                {
                    "t": t,
                    "ms": ms(wall),
                    "cpu_ms": ms(cpu),
                    "task": name,
                    "gc": [
                        {"at_ms": ms(a - t), "ms": ms(b - a), "generation": g}
                        for a, b, g in self.passes
                        if a >= t and b <= t + wall
                    ],
                }
                for t, wall, cpu, name in self.steps
            ],
            "holes": [
                {"t": t, "ms": ms(wall), "cpu_ms": ms(cpu), "other_steps": n}
                for t, wall, cpu, n in self.holes
            ],
            "gc": {str(g): f for g, f in sorted(gc_by_gen.items())},
            "nivcsw": usage.ru_nivcsw,
            "nvcsw": usage.ru_nvcsw,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the JSON report")
    parser.add_argument("--threshold-ms", type=float, default=2.0)
    parser.add_argument("server_args", nargs="*", help="lockserver options (after --)")
    args = parser.parse_args(argv)
    trace = StepTrace(args.threshold_ms / 1000)
    gc.callbacks.append(trace.collector)
    run = trio.run

    def traced_run(*a: Any, **k: Any) -> Any:
        k["instruments"] = [*k.get("instruments", ()), trace]
        return run(*a, **k)

    trio.run = traced_run  # type: ignore[assignment]  # the lockserver command calls it once
    try:
        code = server_main.main(args.server_args)
    finally:
        trio.run = run
        gc.callbacks.remove(trace.collector)
        args.out.write_text(json.dumps(trace.report(), indent=1) + "\n", encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
