"""What a person sees: the live progress bar while a run goes, and the summary table after.

Why: a benchmark you cannot watch hides stalls and warm-up effects; a summary you cannot read at
a glance gets misquoted. The progress bar shows the window's elapsed time and the *current* ops/s
(from the sampler's last tick); the table shows ops/s, the acquire success ratio, latency
percentiles (HDR, µs), server CPU per 1k ops and errors — the same figures the JSON file holds;
each row's label ends with its layout (pinned, unpinned: :mod:`._layout`), and a blast's notes
give the largest gap between consecutive replies.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._results import Result
from ._sampler import Sample

__all__ = ["LiveProgress", "fmt_rate", "print_results", "results_table"]


def fmt_rate(value: float | None) -> str:
    """12345.6 -> "12,346"; None -> "-"."""
    return "-" if value is None else f"{value:,.0f}"


def _fmt_us(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:,.1f} ms"
    return f"{value:,.0f}"


class LiveProgress:
    """A rich progress bar fed by sampler ticks (thread-safe)."""

    def __init__(self, console: Console, label: str, duration: float, count: int) -> None:
        self.duration = duration
        self.count = count
        self._lock = threading.Lock()
        self._prev: Sample | None = None
        self._last_rate = "-"
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[phase]}"),
            TextColumn("[cyan]{task.fields[rate]} ops/s"),
            TextColumn("{task.fields[trust]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID = self._progress.add_task(
            label, total=1.0, phase="connecting", rate="-", trust=""
        )

    def __enter__(self) -> LiveProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def update(self, sample: Sample, measure_at: float | None) -> None:
        """Show one sampler tick."""
        with self._lock:
            prev, self._prev = self._prev, sample
            rate = "-"
            if prev is not None and sample.at - prev.at < 0.2:  # the final, off-beat tick
                self._prev = prev
                prev = None
                rate = self._last_rate
            elif prev is not None:
                d = sample.ops - prev.ops if sample.ops >= prev.ops else sample.ops
                rate = self._last_rate = fmt_rate(d / (sample.at - prev.at))
            trust = "" if sample.trust is None else f"trust {sample.trust:.2f}"
            if measure_at is None:
                phase, done = "connecting", 0.0
            elif sample.at < measure_at:
                phase, done = "warm-up", 0.0
            else:
                phase = "measuring"
                done = max((sample.at - measure_at) / self.duration, sample.ops / self.count)
            self._progress.update(
                self._task, completed=min(done, 1.0), phase=phase, rate=rate, trust=trust
            )


def results_table(results: Sequence[Result], title: str = "lockbench") -> Table:
    """The summary table of one or more results."""
    table = Table(title=title, show_lines=False)
    for col, justify in (
        ("run", "left"),
        ("ops/s", "right"),
        ("req/s", "right"),
        ("ok %", "right"),
        ("p50 µs", "right"),
        ("p90", "right"),
        ("p99", "right"),
        ("p99.9", "right"),
        ("max", "right"),
        ("srv CPU s/1k ops", "right"),
        ("errors", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in results:
        lat = r.latency_us
        ratio = r.acquire_success_ratio
        table.add_row(
            r.label,
            fmt_rate(r.ops_per_s),
            fmt_rate(r.requests_per_s),
            "-" if ratio is None else f"{100 * ratio:.1f}",
            _fmt_us(lat["p50"]),
            _fmt_us(lat["p90"]),
            _fmt_us(lat["p99"]),
            _fmt_us(lat["p99.9"]),
            _fmt_us(lat["max"]),
            "-" if r.server_cpu_s_per_1k_ops is None else f"{r.server_cpu_s_per_1k_ops:.4f}",
            str(r.errors) if r.errors == 0 else f"[red]{r.errors}",
        )
    return table


def print_results(console: Console, results: Sequence[Result], title: str = "lockbench") -> None:
    """Print the summary table, then error samples and notable extras."""
    console.print(results_table(results, title))
    for r in results:
        for sample in r.error_samples:
            console.print(f"[red]{r.label}: {sample}")
        notes = []
        if "trust_min" in r.extra:
            notes.append(f"trust min {r.extra['trust_min']:.3f}")
        if r.server_rss_bytes is not None:
            notes.append(f"server RSS {r.server_rss_bytes / 2**20:,.1f} MiB")
        for key in ("bytes_per_entry", "prefill_entries"):
            if key in r.extra:
                notes.append(f"{key.replace('_', ' ')} {r.extra[key]:,.0f}")
        if "reply_gap_max_us" in r.extra:
            notes.append(
                f"largest gap between replies {r.extra['reply_gap_max_us'] / 1000:,.1f} ms, "
                f"{r.extra.get('reply_gap_at_s', 0):.2f} s into the window"
            )
        arrival = r.extra.get("arrival_latency_us")
        if isinstance(arrival, dict) and arrival.get("count"):
            notes.append(
                f"latency to the reply's arrival in the kernel p99 {arrival['p99']:,.0f} µs, "
                f"max {arrival['max']:,.0f} µs; a reply lay unread at most "
                f"{r.extra.get('client_read_delay_max_us', 0) / 1000:,.1f} ms"
            )
        passes = r.extra.get("server_passes")
        if isinstance(passes, dict) and isinstance(passes.get("over_ms"), dict):
            notes.append(
                f"server read passes {passes.get('passes', 0):,}, longer than "
                + ", ".join(f"{ms} ms: {n:,}" for ms, n in passes["over_ms"].items())
            )
        held, after = r.extra.get("entries_held"), r.extra.get("entries_held_after")
        if isinstance(held, int) and isinstance(after, int):
            notes.append(f"entries held {held:,} -> {after:,}")
        if notes:
            console.print(f"  {r.label}: " + ", ".join(notes))
