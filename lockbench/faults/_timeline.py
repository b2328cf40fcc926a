"""The fault lab's timeline picture: what the clients saw, second by second, under which fault.

One column per history (two when the same lab ran against our group and against etcd's lock,
with shared axes so the columns compare at a glance), two rows in each: **operations per
second** per workload (succeeded solid, failed or unknown dashed) and **latency** per workload
(median solid; 99th percentile thin, where a bin holds enough samples; log scale), over the
lab clock. Fault windows are shaded in one colour per kind (the legend names the kinds; each
window is labelled when there are few), violations are red lines with their kind. A bottom
row compares the **availability** per fault kind (ok / completed) of every history side by
side.

matplotlib (the ``bench`` extra) is imported lazily with the non-interactive Agg backend.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from ._availability import ALL
from ._history import History
from ._verdict import Verdict

__all__ = ["plot_timeline"]

_STEPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0)
_MAX_BINS = 150  # a lock workload does a few operations a second: wider bins, steadier lines
_P99_SAMPLES = 20  # a bin's 99th percentile is drawn only from at least this many samples
_LABELLED_WINDOWS = 12  # label each window when there are at most this many
_LABELLED_VIOLATIONS = 6


def _bin_width(span: float) -> float:
    for step in _STEPS:
        if span / step <= _MAX_BINS:
            return step
    return math.ceil(span / _MAX_BINS)


# fault kinds' shades: no red (violations are red) and none of the workloads' colours
_KIND_COLORS = (
    "tab:blue",
    "tab:purple",
    "tab:olive",
    "tab:cyan",
    "tab:brown",
    "tab:pink",
    "gold",
    "tab:gray",
    "navy",
    "teal",
)


def _kind_colors(kinds: Sequence[str]) -> dict[str, Any]:
    return {kind: _KIND_COLORS[i % len(_KIND_COLORS)] for i, kind in enumerate(kinds)}


def plot_timeline(
    histories: Sequence[History], verdicts: Sequence[Verdict], output: str | os.PathLike[str]
) -> None:
    """Draw the timeline of ``histories`` (with their ``verdicts``) into ``output`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter

    if not histories or len(histories) != len(verdicts):
        raise ValueError("one verdict per history, at least one history")
    cols = len(histories)
    kinds = sorted({f.kind for h in histories for f in h.faults})
    colors = _kind_colors(kinds)
    workloads = sorted({op.workload for h in histories for op in h.ops})
    wcolors = {w: matplotlib.colormaps["Dark2"](i % 8) for i, w in enumerate(workloads)}
    start = min(v.span[0] for v in verdicts)
    end = max(v.span[1] for v in verdicts)
    width = _bin_width(max(end - start, 1e-9))
    edges = np.arange(start, end + width, width)
    if len(edges) < 2:
        edges = np.array([start, start + width])

    fig = plt.figure(figsize=(7.5 * cols + 1.5, 10.5), layout="constrained")
    grid = fig.add_gridspec(3, cols, height_ratios=[3, 3, 2.2])
    rate_axes = [fig.add_subplot(grid[0, c]) for c in range(cols)]
    lat_axes = [fig.add_subplot(grid[1, c], sharex=rate_axes[c]) for c in range(cols)]
    for ax in rate_axes[1:]:
        ax.sharey(rate_axes[0])
    for ax in lat_axes[1:]:
        ax.sharey(lat_axes[0])
    for ax in lat_axes:
        ax.set_yscale("log")
    # Limits are set before anything is drawn, from the data, so autoscaling never runs: a tiny
    # history (one instant, one latency) would give it a singular range. The y limits are
    # provisional here and final after the loop; the axes share them across columns.
    for ax in rate_axes:
        ax.set_xlim(start, max(end, start + width))
    highest_rate = 0.0
    latencies: list[float] = []

    def set_y_limits() -> None:
        rate_axes[0].set_ylim(0, max(1.0, highest_rate * 1.08))
        low = max(min(latencies, default=1.0), 1e-3)
        high = max(max(latencies, default=10.0), low * 4)
        lat_axes[0].set_ylim(low / 1.5, high * 1.5)

    set_y_limits()
    for c, (history, verdict) in enumerate(zip(histories, verdicts, strict=True)):
        rate, lat = rate_axes[c], lat_axes[c]
        by_workload: dict[str, list[Any]] = defaultdict(list)
        for op in history.ops:
            by_workload[op.workload].append(op)
        for w, ops in sorted(by_workload.items()):
            ok_t = np.array([op.complete for op in ops if op.outcome == "ok"], dtype=float)
            bad_t = np.array(
                [
                    op.complete if op.complete is not None else op.invoke
                    for op in ops
                    if op.outcome != "ok"
                ],
                dtype=float,
            )
            centers = (edges[:-1] + edges[1:]) / 2
            ok_n, _ = np.histogram(ok_t, bins=edges)
            bad_n, _ = np.histogram(bad_t, bins=edges)
            highest_rate = max(highest_rate, float(ok_n.max()) / width, float(bad_n.max()) / width)
            rate.plot(centers, ok_n / width, color=wcolors[w], lw=1.2, label=f"{w} ok")
            if bad_n.any():
                rate.plot(
                    centers,
                    bad_n / width,
                    color=wcolors[w],
                    lw=1.0,
                    ls="--",
                    label=f"{w} failed/unknown",
                )
            done = [op for op in ops if op.complete is not None and op.outcome != "unknown"]
            if done:
                t = np.array([op.complete for op in done], dtype=float)
                ms = np.array([(op.complete - op.invoke) * 1000 for op in done], dtype=float)
                idx = np.clip(((t - start) // width).astype(int), 0, len(edges) - 2)
                order = np.argsort(idx, kind="stable")
                idx, ms = idx[order], ms[order]
                bounds = np.flatnonzero(np.diff(idx)) + 1
                groups = np.split(ms, bounds)
                where = centers[idx[np.r_[0, bounds]]]
                p50 = [float(np.median(g)) for g in groups]
                p99 = [
                    float(np.percentile(g, 99)) if len(g) >= _P99_SAMPLES else math.nan
                    for g in groups
                ]
                latencies += [min(p50), max([*p50, *(x for x in p99 if not math.isnan(x))])]
                lat.plot(where, p50, color=wcolors[w], lw=1.2, label=f"{w} median")
                lat.plot(where, p99, color=wcolors[w], lw=0.6, alpha=0.7, label=f"{w} p99")
        for ax in (rate, lat):
            for f in history.faults:
                f_end = f.end if f.end is not None else verdict.span[1]
                ax.axvspan(
                    f.start, max(f_end, f.start + width / 4), color=colors[f.kind], alpha=0.18, lw=0
                )
        if len(history.faults) <= _LABELLED_WINDOWS:
            for f in history.faults:
                label = f.kind + (f" {' '.join(f.targets)}" if f.targets else "")
                rate.text(
                    f.start,
                    0.98,
                    f" {label}",
                    transform=rate.get_xaxis_transform(),
                    rotation=90,
                    va="top",
                    ha="left",
                    fontsize=7,
                    color="0.25",
                )
        labelled: set[str] = set()
        for finding in verdict.findings:
            for ax in (rate, lat):
                ax.axvline(finding.time, color="red", lw=0.5, alpha=0.35, zorder=1.5)
            if finding.kind not in labelled and len(labelled) < _LABELLED_VIOLATIONS:
                labelled.add(finding.kind)
                lat.text(
                    finding.time,
                    0.02 + 0.16 * (len(labelled) - 1),
                    f" {finding.kind}",
                    transform=lat.get_xaxis_transform(),
                    va="bottom",
                    ha="left",
                    fontsize=7,
                    color="red",
                    bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 1},
                )
        if verdict.findings:
            rate.plot(
                [f.time for f in verdict.findings],
                [0.97] * len(verdict.findings),
                "v",
                color="red",
                ms=6,
                transform=rate.get_xaxis_transform(),
                label="violation",
            )
        state = verdict.status.upper()
        violations = sum(verdict.counts.values())
        title = f"{verdict.system}: {state}" + (f", {violations} violations" if violations else "")
        rate.set_title(title, color="red" if verdict.status == "invalid" else "black", fontsize=11)
        rate.set_ylabel(f"operations / s ({width:g} s bins)")
        lat.set_ylabel("latency, ms (log)")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        lat.yaxis.set_major_formatter(plain)
        lat.tick_params(axis="y", which="minor", labelsize=7)
        lat.set_xlabel("lab clock, s")
        rate.grid(alpha=0.3)
        lat.grid(alpha=0.3, which="both")

        if c == cols - 1:
            for ax in (rate, lat):
                if ax.get_legend_handles_labels()[0]:  # nothing drawn: no legend (a warning)
                    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    set_y_limits()
    low, high = lat_axes[0].get_ylim()
    for ax in lat_axes:  # minor labels only when the range is short of two decades
        ax.yaxis.set_minor_formatter(
            FuncFormatter(lambda v, _: f"{v:g}") if high / low < 100 else NullFormatter()
        )

    bars = fig.add_subplot(grid[2, :])
    scopes = ["no fault", *kinds]
    step = 0.8 / cols
    for c, verdict in enumerate(verdicts):
        av = verdict.availability
        counts = [av.baseline.get(ALL)] + [av.by_kind.get(k, {}).get(ALL) for k in kinds]
        shares = [
            100 * (x.share or 0.0) if x is not None and x.share is not None else 0.0 for x in counts
        ]
        xs = [i + (c - (cols - 1) / 2) * step for i in range(len(scopes))]
        hatch = [None, "//", "..", "xx"][c % 4]
        drawn = bars.bar(
            xs,
            shares,
            width=step * 0.95,
            label=verdict.system,
            hatch=hatch,
            color=["0.6", *[colors[k] for k in kinds]],
            edgecolor="0.2",
            lw=0.5,
        )
        for rect, x in zip(drawn, counts, strict=True):
            text = "-" if x is None or x.share is None else f"{100 * x.share:.0f}%"
            if x is not None and x.unknown:
                text += f"\n{x.unknown} unk."
            bars.text(
                rect.get_x() + rect.get_width() / 2,
                rect.get_height() + 1,
                text,
                ha="center",
                va="bottom",
                fontsize=7,
            )
    bars.set_xticks(range(len(scopes)), scopes, fontsize=8)
    bars.set_ylim(0, 118)
    bars.set_ylabel("ok / completed, %")
    bars.set_title(
        "availability per fault kind (operations invoked during the windows)", fontsize=10
    )
    if cols > 1:
        hatches = [None, "//", "..", "xx"]
        bars.legend(
            handles=[
                Patch(facecolor="white", edgecolor="0.2", hatch=hatches[c % 4], label=v.system)
                for c, v in enumerate(verdicts)
            ],
            fontsize=8,
            loc="upper right",
        )
    if kinds:
        fig.legend(
            handles=[Patch(color=colors[k], alpha=0.35, label=k) for k in kinds],
            loc="outside upper center",
            ncol=min(len(kinds), 8),
            fontsize=8,
            title="fault windows",
        )
    fig.savefig(output, dpi=110)
    plt.close(fig)
