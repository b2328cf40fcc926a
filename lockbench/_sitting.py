"""``lockbench sitting``: every measurement of benchmarks/README.md in one go, on one machine.

Why: "measured in one sitting" is only reproducible if the sitting is a command. This runs the
end-to-end comparisons (our client + server vs redis-py + Redis), every workload on both
backends, and the blast suites (with 1,000,000 entries prefilled) on both servers and on
``shards`` lockserver shards (``lockserver --processes N``, the same suite with its
connections per shard and the entries spread by placement: the "N shards" rows next to
"1 server"); and issue 19's stall shape (``lockbench blast --bigtable``), closed loop and
then paced at half of what the closed loop served (``--rate``). Every measurement
runs in each layout asked for (:mod:`._layout`: ``pinned``, the server on one CPU and the
load on the others, and ``unpinned``), interleaved; the shards suite and the profiles run
unpinned only (one CPU for several shards would measure the CPU). Writes the JSON results
(every result names its layout), the plots, the server profile, and ``summary.md`` — both
layouts side by side for every shape, then each layout's tables and each issue target
marked met / not met with its figure (:mod:`._summary`). Nothing here tunes anything:
every run uses the same options a user would type (the README lists them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from ._bigtable import BIG_CONNECTIONS
from ._blast import BlastConfig, run_blast
from ._layout import LAYOUTS, PINNED, UNPINNED
from ._report import print_results
from ._results import Result, ResultDocument, machine_info, write_document
from ._runner import RunConfig, run
from ._spawn import redis_server_path
from ._summary import (
    BIGTABLE_FILE,
    E2E_SHAPES,
    WORKLOAD_SHAPE,
    Shape,
    blast_file,
    server_name,
    write_summary,
)
from ._targets import Backend, Target
from ._workloads import WORKLOADS, WorkloadParams

__all__ = ["PARTS_ALL", "Sitting", "run_sitting"]


PARTS_ALL = ("e2e", "workloads", "blast", "bigtable", "profile")


@attrs.frozen
class Sitting:
    """Options of a sitting."""

    out: Path
    duration: float = 10.0
    warmup: float = 1.0
    prefill: int = 1_000_000
    parts: tuple[str, ...] = PARTS_ALL
    repeats: int = 3  # end-to-end pairs, interleaved; the tables show the median
    blast_repeats: int = 3  # blast suites per server, interleaved; judged by the median
    shards: int = 2  # lockserver shards of the "N shards" blast suite; 1: none
    layouts: tuple[str, ...] = LAYOUTS  # each measurement runs in each (pinned needs 2 CPUs)


def _e2e(
    sitting: Sitting,
    backend: Backend,
    workload: str,
    shape: Shape,
    console: Console,
    profile: str | None = None,
    layout: str = UNPINNED,
) -> Result:
    config = RunConfig(
        workload=workload,
        target=Target(backend),
        spawn=True,
        connections=shape.connections,
        concurrency=shape.concurrency,
        pipeline=shape.pipeline,
        duration=sitting.duration,
        warmup=sitting.warmup,
        params=WorkloadParams(seed=1),
        profile=profile,
        pin=layout == PINNED,
    )
    console.print(f"[bold]{backend} {workload} {shape.key}, {layout}")
    result = run(config)
    return attrs.evolve(result, extra={**result.extra, "shape": shape.key})


def run_sitting(sitting: Sitting, console: Console) -> dict[str, Any]:
    """Run the parts asked for (all by default); write files into ``sitting.out``; rebuild
    ``summary.md`` and the plots from every result file present there.

    Profiles are taken in runs of their own, after the measurements: py-spy costs the
    machine CPU (2 cores!), so a profiled run is not a measurement.
    """
    out = sitting.out
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    backends = [Backend.LOCKSERVER]
    if redis_server_path() is not None:
        backends.append(Backend.REDIS)
    else:
        console.print("[yellow]redis-server not installed: lockserver only")

    layouts = list(sitting.layouts)
    if "e2e" in sitting.parts:
        machine["loadavg_before"] = os.getloadavg()
        # Interleaved (ours, Redis, Redis, ours, ...; pinned, unpinned, unpinned, pinned) so
        # a slow spell of the shared machine hits every side; each pair gives one ratio, and
        # the median pair is reported.
        e2e = []
        for shape in E2E_SHAPES:
            for rep in range(sitting.repeats):
                for layout in _turn(layouts, rep):
                    for backend in _turn(backends, rep):
                        r = _e2e(
                            sitting, backend, "mutex-uncontended", shape, console, None, layout
                        )
                        e2e.append(attrs.evolve(r, extra={**r.extra, "repeat": rep}))
        write_document(out / "e2e.json", ResultDocument(tuple(e2e), _stamp(machine)))
        print_results(console, e2e, "end to end: mutex-uncontended (acquire+release pairs)")
    if "workloads" in sitting.parts:
        machine["loadavg_before"] = os.getloadavg()
        workloads = [
            _e2e(sitting, backend, workload, WORKLOAD_SHAPE, console, None, layout)
            for workload in WORKLOADS
            for layout in layouts
            for backend in backends
        ]
        write_document(out / "workloads.json", ResultDocument(tuple(workloads), _stamp(machine)))
        print_results(console, workloads, f"every workload, {WORKLOAD_SHAPE.summary}")
    if "blast" in sitting.parts:
        # Repeated and interleaved like the end-to-end pairs: one 10 s window's p99 on a
        # shared 2-core VM swings by 10x with what else runs, so one run is not a figure.
        machine["loadavg_before"] = os.getloadavg()
        runs = [(backend, 1, layout) for layout in layouts for backend in backends]
        if sitting.shards > 1:  # unpinned only: one CPU for N shards would measure the CPU
            runs.append((Backend.LOCKSERVER, sitting.shards, UNPINNED))
        suites: dict[tuple[Backend, int], list[Result]] = {(b, n): [] for b, n, _ in runs}
        for rep in range(sitting.blast_repeats):
            for backend, shards, layout in _turn(runs, rep):
                results = _blast_suite(
                    sitting, backend, console, profile=None, shards=shards, layout=layout
                )
                name = server_name(str(backend), shards)
                print_results(console, results, f"{name} blast suite, {layout}, run {rep + 1}")
                suites[backend, shards] += [
                    attrs.evolve(r, extra={**r.extra, "repeat": rep}) for r in results
                ]
        for (backend, shards), results in suites.items():
            write_document(
                out / blast_file(str(backend), shards),
                ResultDocument(tuple(results), _stamp(machine)),
            )
    if "bigtable" in sitting.parts:
        machine["loadavg_before"] = os.getloadavg()
        big = []
        for rep in range(sitting.blast_repeats):
            for layout in _turn(layouts, rep):
                (r,) = _bigtable(sitting, console, layout)
                print_results(console, [r], f"lockserver bigtable, {layout}, run {rep + 1}")
                # The same shape paced at half of what the closed loop just served: a stall
                # shows without the closed loop's queue of 64 requests in every latency.
                (p,) = _bigtable(sitting, console, layout, rate=_half(r.requests_per_s))
                print_results(console, [p], f"lockserver paced bigtable, {layout}, run {rep + 1}")
                big += [attrs.evolve(x, extra={**x.extra, "repeat": rep}) for x in (r, p)]
        write_document(out / BIGTABLE_FILE, ResultDocument(tuple(big), _stamp(machine)))
    if "profile" in sitting.parts:
        profiles = out / "profiles"
        for shape in E2E_SHAPES:
            prefix = str(profiles / f"lockserver-e2e-{shape.key}")
            _e2e(sitting, Backend.LOCKSERVER, "mutex-uncontended", shape, console, prefix)
        _blast_suite(sitting, Backend.LOCKSERVER, console, str(profiles / "lockserver-blast"))
    return write_summary(out, console)


def _stamp(machine: dict[str, Any]) -> dict[str, Any]:
    return {**machine, "loadavg_after": os.getloadavg()}


def _turn(items: list[Any], rep: int) -> list[Any]:
    """``items`` in order on even repeats, reversed on odd ones (ABBA interleaving)."""
    return items if rep % 2 == 0 else items[::-1]


def _blast_suite(
    sitting: Sitting,
    backend: Backend,
    console: Console,
    profile: str | None,
    shards: int = 1,
    layout: str = UNPINNED,
) -> list[Result]:
    name = server_name(str(backend), shards)
    console.print(f"[bold]{name} blast suite, {layout}, prefill {sitting.prefill:,}")
    return run_blast(
        BlastConfig(
            Target(backend),
            spawn=True,
            duration=sitting.duration,
            warmup=sitting.warmup,
            prefill=sitting.prefill,
            suite=True,
            profile=profile,
            shards=shards,
            pin=layout == PINNED,
        ),
        console,
    )


def _half(rate: float) -> float:
    """Half of a measured rate, rounded down to 100/s (at least 100/s)."""
    return max(100.0, rate // 200 * 100)


def _bigtable(
    sitting: Sitting, console: Console, layout: str, rate: float | None = None
) -> list[Result]:
    paced = "" if rate is None else f", paced at {rate:,.0f}/s"
    console.print(f"[bold]lockserver bigtable, {layout}, prefill {sitting.prefill:,}{paced}")
    return run_blast(
        BlastConfig(
            Target(Backend.LOCKSERVER),
            spawn=True,
            connections=BIG_CONNECTIONS,
            pipeline=1,
            duration=sitting.duration,
            warmup=sitting.warmup,
            prefill=sitting.prefill,
            rate=rate,
            bigtable=True,
            pin=layout == PINNED,
        ),
        console,
    )
