"""The ``lockbench`` command: run, blast, sitting, faults, compare, plot.

Why: one entry point with the issue's options, errors as one readable line (exit 2 for a bad
option or a refused target, 1 when the run itself fails), and results both on screen (rich
table) and, with ``--json``, in a validated file that compare/plot read back.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence

from rich.console import Console

from ._bigtable import BIG_CONNECTIONS, BIG_PREFILL
from ._blast import BlastConfig, run_blast
from ._compare import compare
from ._layout import LAYOUTS, PINNED, LayoutError, pin_plan
from ._report import LiveProgress, print_results
from ._results import ResultDocument, SchemaError, machine_info, read_document, write_document
from ._runner import DEFAULT_COUNT, DEFAULT_DURATION, RunConfig, run
from ._spawn import SpawnError
from ._targets import Backend, Target, TargetError, parse_target
from ._workloads import WORKLOADS, WorkloadParams
from .faults._command import add_parser as add_faults_parser
from .faults._command import main as faults_main

__all__ = ["build_parser", "main"]


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        help="lockserver://HOST:PORT or redis://HOST:PORT (loopback only); several lockserver "
        "shards: lockserver://HOST:FIRST-LAST or a comma list; with --spawn the scheme alone "
        "(e.g. redis://) selects what to start",
    )
    p.add_argument(
        "--spawn",
        action="store_true",
        help="start a private server on a free loopback port and stop it afterwards",
    )


def _add_pin(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pin",
        action="store_true",
        help="the pinned layout: the spawned server on CPU 0 (the first CPU lockbench may "
        "use), lockbench's load on the others (needs --spawn and 2 CPUs); without it nothing "
        "is pinned. Results name their layout either way",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and --help)."""
    parser = argparse.ArgumentParser(
        prog="lockbench",
        description="Load generator for lockserver, side by side with Redis (loopback only).",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a seeded workload through the Python clients")
    p.add_argument("workload", choices=list(WORKLOADS))
    _add_target(p)
    p.add_argument("--connections", type=_positive_int, default=1)
    p.add_argument("--concurrency", type=_positive_int, help="tasks (default: --connections)")
    p.add_argument("--pipeline", type=_positive_int, default=1, help="requests in flight per task")
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION, help="seconds")
    p.add_argument("--count", type=_positive_int, default=DEFAULT_COUNT, help="max cycles")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds, not measured")
    p.add_argument("--keys", type=_positive_int, help="key space (default: per workload)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--processes", type=_positive_int, default=1)
    p.add_argument("--hold", type=float, default=0.0, help="seconds held in the critical section")
    p.add_argument("--write-ratio", type=float, default=0.2, help="rwlock: share of writers")
    p.add_argument(
        "--client",
        choices=("auto", "sync", "async"),
        default="auto",
        help="client face (auto: sync for one unpipelined task on one connection)",
    )
    p.add_argument("--json", metavar="FILE", help="write the result here")
    p.add_argument("--quiet", action="store_true", help="no live progress bar")
    p.add_argument(
        "--profile",
        metavar="PREFIX",
        help="py-spy the spawned server: PREFIX.raw.txt and PREFIX.top.txt",
    )
    _add_pin(p)

    p = sub.add_parser("blast", help="measure server capacity with a minimal raw client")
    _add_target(p)
    p.add_argument(
        "--connections",
        type=_positive_int,
        help=f"default 1 ({BIG_CONNECTIONS} with --bigtable)",
    )
    p.add_argument(
        "--pipeline",
        type=_positive_int,
        help="requests in flight per connection (default 64; --bigtable: 1, the only choice)",
    )
    p.add_argument("--duration", type=float, default=DEFAULT_DURATION, help="seconds")
    p.add_argument("--count", type=_positive_int, default=DEFAULT_COUNT, help="max requests")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds, not measured")
    p.add_argument("--processes", type=_positive_int, default=1)
    p.add_argument(
        "--shards",
        type=_positive_int,
        default=1,
        help="with --spawn: start N lockserver shards (lockserver --processes N); "
        "--connections is then per server",
    )
    p.add_argument(
        "--prefill",
        type=int,
        help=f"entries held before measuring (default 0; {BIG_PREFILL:,} with --bigtable)",
    )
    p.add_argument("--rate", type=float, help="paced mode: total requests/s (needs --pipeline 1)")
    p.add_argument(
        "--suite",
        action="store_true",
        help="the issue's four capacity measurements in one go (ignores the shape options)",
    )
    p.add_argument(
        "--bigtable",
        action="store_true",
        help="issue 19's stall shape: prefill one table through 16 sessions of 250-statement "
        "executes, then unique-var acquires, never released, 1 in flight per connection "
        "(scale it with --prefill, --connections, --duration)",
    )
    p.add_argument(
        "--profile",
        metavar="PREFIX",
        help="py-spy the server during the phases: PREFIX.raw.txt and PREFIX.top.txt",
    )
    p.add_argument("--json", metavar="FILE", help="write the results here")
    _add_pin(p)

    p = sub.add_parser("sitting", help="every README measurement in one go")
    p.add_argument("--out", default="benchmarks/results", help="directory for the results")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--prefill", type=int, default=1_000_000)
    p.add_argument(
        "--repeats", type=_positive_int, default=3, help="end-to-end pairs per shape (median)"
    )
    p.add_argument(
        "--blast-repeats",
        type=_positive_int,
        default=3,
        help="blast suites per server, interleaved (each phase judged by its median run)",
    )
    p.add_argument(
        "--shards",
        type=_positive_int,
        default=2,
        help="lockserver shards of the blast part's 'N shards' suite (1: skip it)",
    )
    p.add_argument(
        "--parts",
        default="e2e,workloads,blast,bigtable,profile",
        help="comma-separated subset of e2e,workloads,blast,bigtable,profile (the summary is "
        "rebuilt from every result file in --out)",
    )
    p.add_argument(
        "--layouts",
        help="comma-separated subset of pinned,unpinned: the layouts each measurement runs in "
        "(default both; pinned is left out, with a note, on a machine with 1 CPU)",
    )

    add_faults_parser(sub)

    p = sub.add_parser("compare", help="ratios B/A of two result files")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--json", metavar="FILE", help="write the ratios here")

    p = sub.add_parser("plot", help="draw result files into a PNG")
    p.add_argument("files", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--title", default="")
    return parser


def _target(args: argparse.Namespace) -> Target:
    if args.target is None:
        if not args.spawn:
            raise TargetError("give --target lockserver://HOST:PORT (or redis://...), or --spawn")
        return Target(Backend.LOCKSERVER)
    return parse_target(args.target, spawn=args.spawn)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the stack, so spawned servers are stopped by their context managers.
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return the exit code."""
    args = build_parser().parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return _main(args)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return _main(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _main(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # a pipe or file: room for the whole table
        console = Console(width=170)
    try:
        if args.command == "run":
            return _cmd_run(args, console)
        if args.command == "blast":
            return _cmd_blast(args, console)
        if args.command == "sitting":
            return _cmd_sitting(args, console)
        if args.command == "compare":
            return _cmd_compare(args, console)
        if args.command == "faults":
            return faults_main(args)
        return _cmd_plot(args, console)
    except (TargetError, ValueError, SchemaError) as exc:
        print(f"lockbench: error: {exc}", file=sys.stderr)
        return 2
    except (SpawnError, RuntimeError, OSError) as exc:
        print(f"lockbench: failed: {exc}", file=sys.stderr)
        return 1


def _cmd_run(args: argparse.Namespace, console: Console) -> int:
    config = RunConfig(
        workload=args.workload,
        target=_target(args),
        spawn=args.spawn,
        connections=args.connections,
        concurrency=args.concurrency,
        pipeline=args.pipeline,
        duration=args.duration,
        count=args.count,
        warmup=args.warmup,
        params=WorkloadParams(seed=args.seed, keys=args.keys, write_ratio=args.write_ratio),
        hold=args.hold,
        processes=args.processes,
        client=args.client,
        profile=args.profile,
        pin=args.pin,
    )
    config.validate()
    label = f"{config.target.backend} {config.workload}"
    if args.quiet:
        result = run(config)
    else:
        with LiveProgress(console, label, config.duration, config.count) as live:
            result = run(config, live.update)
    print_results(console, [result])
    if args.json:
        write_document(args.json, ResultDocument((result,), machine_info()))
        console.print(f"wrote {args.json}")
    return 0


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def _cmd_blast(args: argparse.Namespace, console: Console) -> int:
    if args.bigtable and args.pipeline not in (None, 1):
        raise ValueError("--bigtable keeps one request in flight per connection: drop --pipeline")
    config = BlastConfig(
        target=_target(args),
        spawn=args.spawn,
        connections=_or(args.connections, BIG_CONNECTIONS if args.bigtable else 1),
        pipeline=_or(args.pipeline, 1 if args.bigtable else 64),
        duration=args.duration,
        count=args.count,
        warmup=args.warmup,
        processes=args.processes,
        prefill=_or(args.prefill, BIG_PREFILL if args.bigtable else 0),
        rate=args.rate,
        suite=args.suite,
        profile=args.profile,
        shards=args.shards,
        pin=args.pin,
        bigtable=args.bigtable,
    )
    results = run_blast(config, console)
    print_results(console, results, "lockbench blast")
    if args.json:
        write_document(args.json, ResultDocument(tuple(results), machine_info()))
        console.print(f"wrote {args.json}")
    return 0


def _cmd_sitting(args: argparse.Namespace, console: Console) -> int:
    from pathlib import Path

    from ._sitting import PARTS_ALL, Sitting, run_sitting

    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    unknown = sorted(set(parts) - set(PARTS_ALL))
    if unknown:
        raise ValueError(f"unknown --parts {', '.join(unknown)} (known: {', '.join(PARTS_ALL)})")
    layouts = _layouts(args.layouts, console)
    run_sitting(
        Sitting(
            Path(args.out),
            duration=args.duration,
            warmup=args.warmup,
            prefill=args.prefill,
            parts=parts,
            repeats=args.repeats,
            blast_repeats=args.blast_repeats,
            shards=args.shards,
            layouts=layouts,
        ),
        console,
    )
    return 0


def _layouts(text: str | None, console: Console) -> tuple[str, ...]:
    """The sitting's layouts: those asked for (pinned refused on 1 CPU), or by default both
    (pinned left out, with a note, on 1 CPU)."""
    if text is None:
        try:
            pin_plan()
        except LayoutError as exc:
            console.print(f"[yellow]the pinned layout is left out: {exc}")
            return tuple(x for x in LAYOUTS if x != PINNED)
        return LAYOUTS
    layouts = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = sorted(set(layouts) - set(LAYOUTS))
    if unknown or not layouts:
        raise ValueError(
            f"unknown --layouts {', '.join(unknown) or '(none)'} (known: {', '.join(LAYOUTS)})"
        )
    if PINNED in layouts:
        pin_plan()
    return layouts


def _cmd_compare(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    a, b = read_document(args.a), read_document(args.b)
    comparisons = compare(a, b)
    table = Table(title=f"B / A   (A = {args.a}, B = {args.b})")
    for col in ("A", "B", "ops/s", "p50", "p99", "p99.9", "CPU/1k ops", "ok ratio"):
        table.add_column(col, justify="left" if col in ("A", "B") else "right")

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    for c in comparisons:
        r = c.ratios
        table.add_row(
            c.a.label,
            c.b.label,
            f(r["ops_per_s"]),
            f(r["latency_p50"]),
            f(r["latency_p99"]),
            f(r["latency_p99.9"]),
            f(r["server_cpu_s_per_1k_ops"]),
            f(r["acquire_success_ratio"]),
        )
    console.print(table)
    console.print("ops/s above 1x: B is faster; latency and CPU below 1x: B is better")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([c.to_json() for c in comparisons], fh, indent=1)
    return 0


def _cmd_plot(args: argparse.Namespace, console: Console) -> int:
    from ._plot import plot

    results = [r for path in args.files for r in read_document(path).results]
    plot(results, args.output, args.title)
    console.print(f"wrote {args.output}")
    return 0
