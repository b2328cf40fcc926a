"""The fault lab's report: a one-screen summary, the timeline picture and the verdict as JSON
lines, for one history or several side by side (the same lab against our group and against
etcd's lock).

``summary.txt`` fits one screen (about 45 lines of at most 100 columns): what ran, the
verdict, what was checked, the faults injected by kind, the violations by kind, availability
and recovery per fault kind, the first example violations and why a verdict is unknown; one
column per history. Every detail cut short here is whole in ``verdict.jsonl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from ._availability import ALL, Counts, Recovery
from ._findings import Finding
from ._history import History
from ._timeline import plot_timeline
from ._verdict import Verdict

__all__ = ["ReportFiles", "summary", "write_report"]

WIDTH = 100
_LABEL = 34
_EXAMPLES = 6  # example violations shown per history (the first of each kind)


@attrs.frozen
class ReportFiles:
    """Where :func:`write_report` wrote the summary, the timeline and the verdict."""

    summary: Path
    timeline: Path
    verdict: Path


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _share(c: Counts | None) -> str:
    if c is None or c.total == 0:
        return "-"
    share = "-" if c.share is None else f"{100 * c.share:.1f}%"
    return f"{share} of {c.completed:,}" + (f", {c.unknown:,} unk." if c.unknown else "")


def _seconds(t: float | None) -> str:
    return "never" if t is None else f"{t:.1f}"


def _recovery(rs: Sequence[Recovery]) -> str:
    if not rs:
        return "-"
    firsts = [r.first for r in rs]
    lasts = [r.last for r in rs]
    worst_first = None if None in firsts else max(t for t in firsts if t is not None)
    worst_last = None if None in lasts else max(t for t in lasts if t is not None)
    return f"{_seconds(worst_first)} / {_seconds(worst_last)} s"


def _labels(verdicts: Sequence[Verdict]) -> list[str]:
    names = [v.system for v in verdicts]
    if len(set(names)) == len(names):
        return names
    return [f"{v.system} #{i + 1}" for i, v in enumerate(verdicts)]


def _first_of_each(verdict: Verdict) -> list[Finding]:
    """The first example of each violation kind, in time order, at most _EXAMPLES."""
    seen: dict[str, Finding] = {}
    for f in verdict.findings:
        seen.setdefault(f.kind, f)
    return sorted(seen.values(), key=lambda f: f.time)[:_EXAMPLES]


def summary(histories: Sequence[History], verdicts: Sequence[Verdict]) -> str:
    """The one-screen summary of the module header, one column per history."""
    if not verdicts or len(histories) != len(verdicts):
        raise ValueError("one verdict per history, at least one history")
    labels = _labels(verdicts)
    col = max(22, (WIDTH - _LABEL) // len(verdicts) - 1)
    rows: list[str] = []

    def row(label: str, cells: Sequence[str]) -> None:
        text = f"{label:<{_LABEL}}" + " ".join(f"{_cut(c, col):<{col}}" for c in cells)
        rows.append(text.rstrip())

    row("fault lab", labels)
    rows.append("-" * min(WIDTH, _LABEL + (col + 1) * len(verdicts)))
    row(
        "run",
        [
            f"{len(v.meta.nodes)} nodes, seed {v.meta.seed}" if v.meta else "(no meta record)"
            for v in verdicts
        ],
    )
    row("lab time", [f"{v.span[1] - v.span[0]:,.0f} s" for v in verdicts])
    row(
        "VERDICT",
        [
            v.status.upper() + (f" ({sum(v.counts.values()):,} violations)" if v.counts else "")
            for v in verdicts
        ],
    )
    rows.append("checked")
    row(
        "  register ops / keys",
        [f"{v.linearizability.ops:,} / {len(v.linearizability.keys)}" for v in verdicts],
    )
    row("  linearizable", [v.linearizability.verdict for v in verdicts])
    row("  lock grants / holds", [f"{v.locks.grants:,} / {v.locks.holds:,}" for v in verdicts])
    row(
        "  resource writes / refused",
        [f"{v.locks.writes:,} / {v.locks.refused:,}" for v in verdicts],
    )
    row("  overlapping holds (pairs)", [f"{v.locks.overlaps:,}" for v in verdicts])
    if any(v.locks.overlaps for v in verdicts):
        row(
            "    caught by fences / past guar.",
            [
                f"{v.locks.overlaps_caught:,} / {v.locks.overlaps_past_guarantee:,}"
                for v in verdicts
            ],
        )
    kinds = sorted({k for v in verdicts for k in v.faults})
    row("faults injected", [f"{sum(v.faults.values()):,}" for v in verdicts])
    for kind in kinds:
        row(f"  {kind}", [f"{v.faults.get(kind, 0):,}" for v in verdicts])
    row("violations", [f"{sum(v.counts.values()):,}" for v in verdicts])
    for kind in sorted({k for v in verdicts for k in v.counts}):
        row(f"  {kind}", [f"{v.counts.get(kind, 0):,}" for v in verdicts])
    rows.append("availability: ok / completed")
    row("  no fault", [_share(v.availability.baseline.get(ALL)) for v in verdicts])
    for kind in kinds:
        row(f"  {kind}", [_share(v.availability.by_kind.get(kind, {}).get(ALL)) for v in verdicts])
    if kinds:
        rows.append("recovery after heal (worst): first ok / every client back")
        for kind in kinds:
            row(f"  {kind}", [_recovery(v.availability.recoveries(kind)) for v in verdicts])
    examples = [
        (label, f) for label, v in zip(labels, verdicts, strict=True) for f in _first_of_each(v)
    ]
    if examples:
        rows.append("first violation of each kind (all examples in verdict.jsonl)")
        for label, f in examples:
            prefix = f"  {label if len(verdicts) > 1 else ''} {f.time:.3f} {f.kind} {f.key!r}: "
            rows.append(_cut(prefix.replace("   ", "  ", 1) + f.detail, WIDTH))
    reasons = [(label, r) for label, v in zip(labels, verdicts, strict=True) for r in v.reasons]
    if reasons:
        rows.append("why unknown")
        for label, r in reasons:
            rows.append(_cut(f"  {label}: {r}", WIDTH))
    return "\n".join(rows) + "\n"


def write_report(
    history: History | Sequence[History],
    verdict: Verdict | Sequence[Verdict],
    out_dir: str | os.PathLike[str],
) -> ReportFiles:
    """Write ``summary.txt``, ``timeline.png`` and ``verdict.jsonl`` into ``out_dir``
    (created if needed) for one history and its verdict, or for several side by side (one
    verdict each, in the same order)."""
    histories = [history] if isinstance(history, History) else list(history)
    verdicts = [verdict] if isinstance(verdict, Verdict) else list(verdict)
    text = summary(histories, verdicts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out / "summary.txt", out / "timeline.png", out / "verdict.jsonl")
    files.summary.write_text(text, encoding="utf-8")
    with open(files.verdict, "w", encoding="utf-8") as f:
        for v in verdicts:
            for line in v.to_json_lines():
                f.write(json.dumps({**line, "system": v.system}, separators=(",", ":")) + "\n")
    plot_timeline(histories, verdicts, files.timeline)
    return files
