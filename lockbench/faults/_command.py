"""The ``lockbench faults`` command: ``run`` one lab (hosts, system, workloads, faults,
verdict) and ``check`` a history again.

Exit statuses: 0 the history is valid, 1 a violation (or the run failed), 2 a bad option or a
lab that cannot run on this machine (the reason in one line: not root, a missing tool).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._judge import check_command, judge
from ._lab import DEFAULT_WORKLOADS, LabConfig, lab_refusal, run_lab
from ._nemesis import KINDS, REPLICA_ONLY
from ._workloads import WorkloadSettings

__all__ = ["add_parser", "main"]

_EPILOG = f"""\
nemeses (comma-separated, or all): {", ".join(KINDS)}.
  isolate: one node (and its client host) cut from the others; majority: a minority of nodes
  cut from the majority; bridge: two halves that only see a middle node; etcd-cut: one
  replica cut from etcd while its clients still reach it; loss: one node stops hearing the
  others (one-way, --loss-percent); kill / pause: a node's replica and etcd member SIGKILLed
  and restarted / SIGSTOPped and continued (-replica, -etcd: only that process);
  clock-step: one replica's wall clock stepped by +-CLOCK_OFFSET while it runs; clock-skew:
  one replica restarted with its clock off by that much.
  Against etcd, {", ".join(sorted(REPLICA_ONLY))} are left out (they need replicas).
  No delay or jitter: this kernel has no netem.
workloads: lockserver {DEFAULT_WORKLOADS["lockserver"]}; etcd {DEFAULT_WORKLOADS["etcd"]}
  (threads per client host; one client host per node).
output: DIR/history.jsonl (every operation, critical section, resource write and fault),
  DIR/logs/ (every process), and the report (summary.txt, verdict.jsonl, plots).
needs: root (network namespaces), iproute2, nftables, etcd, faketime (Debian packages).
"""


def _pair(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition(",")
    try:
        a, b = float(lo), float(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}") from None
    if not 0 < a <= b:
        raise argparse.ArgumentTypeError(f"expected 0 < MIN <= MAX, got {text!r}")
    return a, b


def _offset(text: str) -> tuple[float, int]:
    """``3600`` (direction drawn per fault), ``+3600`` or ``-3600`` (always that way)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if seconds == 0:
        raise argparse.ArgumentTypeError("a clock offset of 0 is no fault")
    sign = 0 if text.strip()[0] not in "+-" else (1 if seconds > 0 else -1)
    return abs(seconds), sign


def _workloads(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in text.split(","):
        name, _, count = item.strip().partition("=")
        try:
            out[name] = int(count) if count else 1
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME=THREADS, got {item!r}") from None
    return out


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``faults`` (with ``run`` and ``check``) to the ``lockbench`` command."""
    p = sub.add_parser(
        "faults",
        help="the fault lab: partitions, crashes, pauses and clock faults, every operation "
        "recorded and checked",
        description="The fault lab (docs/replication.md, 'The fault lab').",
    )
    inner = p.add_subparsers(dest="faults_command", required=True)
    r = inner.add_parser(
        "run",
        help="run one lab and judge its history",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    r.add_argument(
        "--system",
        choices=("lockserver", "etcd"),
        default="lockserver",
        help="our replicated group, or etcd's own lock and KV (the reference)",
    )
    r.add_argument("--nodes", type=int, default=3, help="nodes (etcd member + replica each)")
    r.add_argument("--duration", type=float, default=90.0, help="seconds of load")
    r.add_argument(
        "--nemesis",
        default="isolate,kill,clock-step",
        help="faults to inject, comma-separated, or 'all' (see below); '' for none",
    )
    r.add_argument("--seed", type=int, default=1, help="the schedule's and workloads' seed")
    r.add_argument("--out", required=True, help="directory for the history, logs and report")
    r.add_argument("--warmup", type=float, default=5.0, help="seconds before the first fault")
    r.add_argument(
        "--cooldown", type=float, default=10.0, help="seconds without faults at the end (recovery)"
    )
    r.add_argument(
        "--fault-time",
        type=_pair,
        default=(8.0, 14.0),
        metavar="MIN,MAX",
        help="seconds a fault lasts",
    )
    r.add_argument(
        "--quiet-time",
        type=_pair,
        default=(6.0, 10.0),
        metavar="MIN,MAX",
        help="seconds between faults",
    )
    r.add_argument(
        "--clock-offset",
        type=_offset,
        default=(3600.0, 0),
        help="seconds a clock fault moves a replica's clock: 3600 (forward or back, drawn), "
        "+3600 or -3600 (always that way)",
    )
    r.add_argument(
        "--loss-percent",
        type=int,
        default=100,
        help="the 'loss' fault's drop probability in percent",
    )
    r.add_argument("--lease-ttl", type=int, default=2, help="the replicas' etcd lease TTL")
    r.add_argument(
        "--target-watched",
        action="store_true",
        help="pause-etcd and kill-etcd stop the etcd member most replicas watch the log on "
        "at the fault's start (their stats), not the planned one",
    )
    r.add_argument(
        "--session-max-age",
        type=float,
        default=WorkloadSettings().max_age,
        help="lock sessions' max age (etcd: the lease TTL)",
    )
    r.add_argument(
        "--workloads",
        type=_workloads,
        help="NAME=THREADS,... per client host (default: every workload)",
    )
    c = inner.add_parser("check", help="judge history files again", add_help=False)
    c.add_argument("args", nargs=argparse.REMAINDER)


def main(args: argparse.Namespace) -> int:
    """Run the parsed ``faults`` command."""
    if args.faults_command == "check":
        return check_command(args.args)
    nemesis = tuple(k.strip() for k in args.nemesis.split(",") if k.strip())
    config = LabConfig(
        out=Path(args.out),
        system=args.system,
        nodes=args.nodes,
        duration=args.duration,
        nemesis=nemesis,
        seed=args.seed,
        warmup=args.warmup,
        cooldown=args.cooldown,
        fault_time=args.fault_time,
        quiet_time=args.quiet_time,
        clock_offset=args.clock_offset[0],
        clock_sign=args.clock_offset[1],
        loss_percent=args.loss_percent,
        lease_ttl=args.lease_ttl,
        target_watched=args.target_watched,
        workloads=args.workloads,
        settings=WorkloadSettings(max_age=args.session_max_age),
    )
    config.validate()
    why = lab_refusal(config.system)
    if why is not None:
        print(f"lockbench faults: cannot run here: {why}", file=sys.stderr)
        return 2
    run = run_lab(config)
    bad = {name: s for name, s in run.worker_status.items() if s != 0}
    valid, summary = judge(run.history, config.out)
    print(summary, end="")
    print(f"history: {run.history_path}")
    if bad:
        print(
            f"lockbench faults: client workers failed: {bad} (see {config.out}/logs)",
            file=sys.stderr,
        )
        return 1
    return 0 if valid else 1


def run_command(argv: Sequence[str]) -> int:
    """``lockbench faults ...`` from an argument list (for tests)."""
    parser = argparse.ArgumentParser(prog="lockbench")
    add_parser(parser.add_subparsers(dest="command", required=True))
    return main(parser.parse_args(["faults", *argv]))
