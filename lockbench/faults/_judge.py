"""Judging a lab history: the checkers' verdict and report when they are installed
(``lockbench.faults.check`` / ``write_report`` / ``check_main``), else an interim judgement
with what :mod:`lockbench.safety` already checks.

The interim judgement checks the lock rules over the recorded critical sections (exclusive
and reader/writer overlaps, capacities, fence order, duplicate fences) and counts what the
fenced resource refused, the operations by outcome and the faults; it says plainly that the
register history's linearizability was not checked. It is replaced, without a change here,
by the full checkers once the package exports them.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lockbench.safety import check as check_holds

from ._history import History, read_history

__all__ = ["check_command", "judge"]


def _checkers() -> tuple[Any, Any, Any]:
    package = importlib.import_module("lockbench.faults")
    return (
        getattr(package, "check", None),
        getattr(package, "write_report", None),
        getattr(package, "check_main", None),
    )


def judge(history: History, out_dir: Path) -> tuple[bool, str]:
    """Judge ``history``, write the report into ``out_dir``; ``(valid, one-screen summary)``."""
    check, write_report, _ = _checkers()
    out_dir.mkdir(parents=True, exist_ok=True)
    if check is not None and write_report is not None:
        verdict = check(history)
        write_report(history, verdict, out_dir)
        summary_path = out_dir / "summary.txt"
        summary = summary_path.read_text(encoding="utf-8") if summary_path.exists() else ""
        return bool(verdict.valid), summary or str(verdict)
    return _interim(history, out_dir)


def _interim(history: History, out_dir: Path) -> tuple[bool, str]:
    report = check_holds(history.holds)
    refused = [w for w in history.writes if not w.accepted]
    outcomes = Counter((op.workload, op.f, op.outcome) for op in history.ops)
    faults = Counter(f.kind for f in history.faults)
    meta = history.meta
    lines = [
        f"system {meta.system if meta else '?'}, nodes {' '.join(meta.nodes) if meta else '?'}, "
        f"seed {meta.seed if meta else '?'}",
        f"operations: {len(history.ops)}; critical sections: {len(history.holds)}; "
        f"resource writes: {len(history.writes)} ({len(refused)} refused by their fence)",
        "faults: " + (", ".join(f"{k} x{n}" for k, n in sorted(faults.items())) or "none"),
        "lock rules: " + report.summary(),
        "linearizability of the register: not checked (the lab's checkers are not installed)",
    ]
    for (workload, f, outcome), n in sorted(outcomes.items()):
        lines.append(f"  {workload:9} {f:8} {outcome:8} {n}")
    summary = "\n".join(lines) + "\n"
    (out_dir / "summary.txt").write_text(summary, encoding="utf-8")
    verdict = {
        "type": "verdict",
        "valid": report.ok,
        "checked": ["lock-rules"],
        "not_checked": ["linearizability"],
        "violations": report.counts,
        "refused_writes": len(refused),
    }
    (out_dir / "verdict.jsonl").write_text(json.dumps(verdict) + "\n", encoding="utf-8")
    return report.ok, summary


def check_command(argv: Sequence[str]) -> int:
    """``lockbench faults check HISTORY... [--out DIR]``: the checkers' command when
    installed, else the interim judgement; exit 0 valid, 1 violation, 2 unreadable input."""
    _, _, check_main = _checkers()
    if check_main is not None:
        return int(check_main(list(argv)))
    parser = argparse.ArgumentParser(prog="lockbench faults check")
    parser.add_argument("histories", nargs="+", help="history files of one run")
    parser.add_argument("--out", help="directory for the report (default: the first file's)")
    args = parser.parse_args(list(argv))
    try:
        history = read_history(args.histories, tolerate_torn_tail=True)
    except (OSError, ValueError) as exc:
        print(f"lockbench faults check: {exc}")
        return 2
    out = Path(args.out) if args.out else Path(args.histories[0]).parent
    valid, summary = judge(history, out)
    print(summary, end="")
    return 0 if valid else 1
