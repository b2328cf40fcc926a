"""``lockbench plot FILE.json... -o out.png``: throughput, latency percentiles, trust timeline.

Why: the README's results need pictures a reader trusts at a glance: one bar per result for
throughput (ops/s), grouped bars for p50/p90/p99/p99.9 latency (log scale: the tail spans
decades), and, when any lockserver result carries trust samples, the trust (and ops/s) timeline
over the run. matplotlib is imported lazily, with the non-interactive Agg backend.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ._results import Result

__all__ = ["plot"]

PCTS = ("p50", "p90", "p99", "p99.9")


def plot(results: Sequence[Result], output: str | os.PathLike[str], title: str = "") -> None:
    """Draw ``results`` into ``output`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("nothing to plot")
    timelines = [r for r in results if any(p.get("trust") is not None for p in r.timeline)]
    rows = 3 if timelines else 2
    fig, axes = plt.subplots(rows, 1, figsize=(11, 4 + 3.2 * rows), squeeze=False)
    labels = [r.label for r in results]
    colors = ["tab:blue" if r.backend == "lockserver" else "tab:red" for r in results]
    y = range(len(results))

    ax = axes[0][0]
    ax.barh(list(y), [r.ops_per_s for r in results], color=colors)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ops/s (workload cycles per second; higher is better)")
    ax.set_title(title or "lockbench: throughput")
    for i, r in enumerate(results):
        ax.text(r.ops_per_s, i, f" {r.ops_per_s:,.0f}", va="center", fontsize=7)

    ax = axes[1][0]
    width = 0.8 / len(PCTS)
    for j, pct in enumerate(PCTS):
        ax.barh(
            [i + (j - 1.5) * width for i in y],
            [max(r.latency_us[pct], 1.0) for r in results],
            height=width,
            label=pct,
        )
    ax.set_xscale("log")
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("request latency, µs (log scale; lower is better)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("latency percentiles (HDR histogram)")

    if timelines:
        ax = axes[2][0]
        twin = ax.twinx()
        for r in timelines:
            pts = [p for p in r.timeline if p.get("trust") is not None]
            ax.plot([p["t"] for p in pts], [p["trust"] for p in pts], label=f"trust: {r.label}")
            rate = [p for p in r.timeline if p.get("ops_per_s") is not None]
            twin.plot(
                [p["t"] for p in rate],
                [p["ops_per_s"] for p in rate],
                linestyle=":",
                alpha=0.6,
                label=f"ops/s: {r.label}",
            )
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("seconds since the measurement window opened (negative: warm-up)")
        ax.set_ylabel("server trust")
        twin.set_ylabel("ops/s (dotted)")
        ax.legend(fontsize=7, loc="lower left")
        ax.set_title("trust reported by the server, sampled every 0.5 s")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    plt.close(fig)
