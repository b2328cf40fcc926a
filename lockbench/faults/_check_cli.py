"""``lockbench faults check HISTORY... [--out DIR]``: judge lab histories, print the summary,
write the report.

The files given are grouped by run (their ``meta`` record's lab clock origin): the files of
one run (one per process, say) make one history; several runs are judged each on its own and
reported side by side (the lab's runs against our group and against etcd's lock). Exit
status: 0 when every history is valid, 1 when any has a violation or could not be decided
(``unknown``: a search bound hit, nothing to check), 2 when an input cannot be read (a missing
file, a malformed record, files of several runs without a meta record to tell them apart) or
the report cannot be written; errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ._history import History, read_history
from ._linear import DEFAULT_MAX_STATES
from ._report import summary, write_report
from ._verdict import Verdict, check

__all__ = ["check_main", "group_histories"]

PROG = "lockbench faults check"
#: The whole linearizability search's default time bound, seconds.
DEFAULT_TIME_LIMIT = 1800.0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command's options (``--help`` says everything)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Check fault-lab histories (linearizability of the register workload, "
        "mutual exclusion, readers-writer and semaphore rules, fences, grants during a "
        "holder's guarantee, availability), print a one-screen summary and write the report "
        "(summary.txt, timeline.png, verdict.jsonl). Several runs are reported side by side. "
        "Exit 0: valid; 1: a violation or an undecided (unknown) verdict; 2: unreadable input.",
    )
    parser.add_argument(
        "histories",
        nargs="+",
        metavar="HISTORY",
        help="history files (JSON lines); the files of one run are checked together",
    )
    parser.add_argument(
        "--out",
        metavar="DIR",
        help="where to write the report (default: the first history's directory)",
    )
    parser.add_argument(
        "--max-states",
        type=_positive_int,
        default=DEFAULT_MAX_STATES,
        help="linearizability: configurations explored per key before the verdict is "
        f"'unknown' (default {DEFAULT_MAX_STATES:,})",
    )
    parser.add_argument(
        "--time-limit",
        type=_positive_float,
        default=DEFAULT_TIME_LIMIT,
        help="linearizability: seconds for the whole search before the verdict is 'unknown' "
        f"(default {DEFAULT_TIME_LIMIT:g})",
    )
    parser.add_argument(
        "--tolerate-torn-tail",
        action="store_true",
        help="skip a torn last line (a lab killed mid-write) instead of refusing the file",
    )
    return parser


def _merge(parts: Sequence[History]) -> History:
    return History(
        meta=next((p.meta for p in parts if p.meta is not None), None),
        ops=tuple(op for p in parts for op in p.ops),
        holds=tuple(h for p in parts for h in p.holds),
        writes=tuple(w for p in parts for w in p.writes),
        faults=tuple(f for p in parts for f in p.faults),
    )


def group_histories(
    paths: Sequence[str | os.PathLike[str]], *, tolerate_torn_tail: bool = False
) -> list[History]:
    """Read ``paths`` and merge the files of each run (same lab clock origin) into one history,
    in the order the runs first appear. Files without a meta record join the only run there
    is; with several runs they are ambiguous (ValueError), as is anything unreadable."""
    runs: dict[float, list[History]] = {}
    loose: list[tuple[str, History]] = []
    for path in paths:
        part = read_history(path, tolerate_torn_tail=tolerate_torn_tail)
        if part.meta is None:
            loose.append((os.fspath(path), part))
        else:
            runs.setdefault(part.meta.origin_monotonic, []).append(part)
    if loose and len(runs) > 1:
        raise ValueError(
            f"{loose[0][0]} has no meta record: with {len(runs)} runs given, it is unclear "
            "which one it belongs to"
        )
    groups = list(runs.values()) or [[]]
    groups[0].extend(part for _, part in loose)
    return [_merge(g) for g in groups]


def check_main(argv: Sequence[str] | None = None) -> int:
    """The command's body (see the module header); returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        histories = group_histories(args.histories, tolerate_torn_tail=args.tolerate_torn_tail)
        verdicts: list[Verdict] = [
            check(h, max_states=args.max_states, time_limit=args.time_limit) for h in histories
        ]
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSON errors included
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(summary(histories, verdicts), end="")
    out = args.out if args.out is not None else os.path.dirname(args.histories[0]) or "."
    try:
        files = write_report(histories, verdicts, out)
    except OSError as exc:
        print(f"{PROG}: error: cannot write the report: {exc}", file=sys.stderr)
        return 2
    print(f"report: {files.summary}, {files.timeline}, {files.verdict}")
    return 0 if all(v.valid for v in verdicts) else 1
