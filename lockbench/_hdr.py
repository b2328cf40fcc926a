"""Latency histograms: HDR histograms in microseconds, and their percentile summaries.

Why: a benchmark that keeps every sample runs out of memory at millions of requests, and one that
keeps an average hides the tail. An HDR histogram records any value from 1 µs to 60 s with 3
significant digits in a fixed ~200 KiB, merges exactly (worker processes send theirs to the
parent encoded), and answers any percentile afterwards (Gil Tene's HdrHistogram; the
``hdrhistogram`` package is its Python port).

Values are recorded in whole microseconds (``ns // 1000``), clamped to the trackable range so a
stray 0 µs or a 2-minute stall is still counted rather than dropped. The hot path only bumps a
dict counter (~60 ns, against ~600 ns for ``HdrHistogram.record_value``); the counts are moved
into the HDR histogram in bulk whenever it is read or the dict grows past a few thousand distinct
values, so the blaster can time every request without becoming the bottleneck.
"""

from __future__ import annotations

import base64
from typing import Any

from hdrh.histogram import HdrHistogram  # type: ignore[import-untyped, unused-ignore]

__all__ = [
    "PERCENTILES",
    "LatencyHistogram",
    "LatencySummary",
]

LOWEST_US = 1
HIGHEST_US = 60_000_000  # 60 s
SIGNIFICANT_DIGITS = 3
_MAX_PENDING = 4096
PERCENTILES = (50.0, 90.0, 99.0, 99.9)

LatencySummary = dict[str, float]
"""Keys: count, min, mean, p50, p90, p99, p99.9, max (all in µs except count)."""


class LatencyHistogram:
    """An HDR histogram of latencies in µs."""

    __slots__ = ("_h", "_pending")

    def __init__(self) -> None:
        self._h = HdrHistogram(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)
        self._pending: dict[int, int] = {}

    def record_ns(self, ns: int) -> None:
        """Record one latency given in nanoseconds."""
        us = ns // 1000
        pending = self._pending
        pending[us] = pending.get(us, 0) + 1
        if len(pending) > _MAX_PENDING:
            self._flush()

    def record_us(self, us: int, count: int = 1) -> None:
        """Record ``count`` latencies of ``us`` microseconds."""
        pending = self._pending
        pending[us] = pending.get(us, 0) + count
        if len(pending) > _MAX_PENDING:
            self._flush()

    def _flush(self) -> None:
        """Move the pending counts into the HDR histogram (clamped to 1 µs .. 60 s)."""
        record = self._h.record_value
        for us, count in self._pending.items():
            record(min(max(us, LOWEST_US), HIGHEST_US), count)
        self._pending.clear()

    @property
    def count(self) -> int:
        """Number of recorded values."""
        self._flush()
        return int(self._h.get_total_count())

    def percentile(self, p: float) -> int:
        """The value (µs) at percentile ``p`` (0..100); 0 when empty."""
        if self.count == 0:
            return 0
        return int(self._h.get_value_at_percentile(p))

    def merge(self, other: LatencyHistogram) -> None:
        """Add every value of ``other`` to this histogram."""
        self._flush()
        other._flush()
        self._h.add(other._h)

    def reset(self) -> None:
        """Forget every recorded value (after the warm-up)."""
        self._pending.clear()
        self._h.reset()

    def summary(self) -> LatencySummary:
        """count, min, mean, p50, p90, p99, p99.9, max; zeros when empty."""
        n = self.count
        out: LatencySummary = {"count": float(n)}
        if n == 0:
            out.update({"min": 0.0, "mean": 0.0, "max": 0.0})
            out.update({_pkey(p): 0.0 for p in PERCENTILES})
            return out
        out["min"] = float(self._h.get_min_value())
        out["mean"] = round(float(self._h.get_mean_value()), 3)
        for p in PERCENTILES:
            out[_pkey(p)] = float(self._h.get_value_at_percentile(p))
        out["max"] = float(self._h.get_max_value())
        return out

    def encode(self) -> str:
        """A compact text form (HdrHistogram's compressed V2 encoding, base64) for JSON and for
        sending between processes."""
        if self.count == 0:
            return ""
        raw: Any = self._h.encode()
        return raw.decode("ascii") if isinstance(raw, bytes) else str(raw)

    @classmethod
    def decode(cls, text: str) -> LatencyHistogram:
        """The inverse of :meth:`encode` (an empty string is an empty histogram)."""
        out = cls()
        if text:
            base64.b64decode(text, validate=True)  # a clear error on garbage, before hdrh's
            out._h = HdrHistogram.decode(text.encode("ascii"))
        return out


def _pkey(p: float) -> str:
    """50.0 -> "p50", 99.9 -> "p99.9"."""
    return f"p{p:g}"
