"""HDR histograms and percentile summaries: known inputs give known percentiles."""

from __future__ import annotations

import pytest

from lockbench._hdr import HIGHEST_US, LatencyHistogram


def filled(values: list[int]) -> LatencyHistogram:
    h = LatencyHistogram()
    for v in values:
        h.record_us(v)
    return h


def test_uniform_1_to_1000() -> None:
    """1..1000 µs once each: p50 = 500, p90 = 900, p99 = 990, p99.9 = 999, max = 1000."""
    s = filled(list(range(1, 1001))).summary()
    assert s == {
        "count": 1000.0,
        "min": 1.0,
        "mean": 500.5,
        "p50": 500.0,
        "p90": 900.0,
        "p99": 990.0,
        "p99.9": 999.0,
        "max": 1000.0,
    }


def test_tail_is_kept() -> None:
    """999 fast requests and one slow one: p99 stays fast, p99.9 and max see the outlier
    (within the 3 significant digits of the histogram)."""
    s = filled([100] * 999 + [50_000]).summary()
    assert s["p50"] == s["p99"] == 100.0
    assert s["p99.9"] == 100.0  # the 999th of 1000 values
    assert s["max"] == pytest.approx(50_000, rel=1e-3)


def test_nanoseconds_are_truncated_to_microseconds() -> None:
    """record_ns(1999) counts as 1 µs."""
    h = LatencyHistogram()
    h.record_ns(1_999)
    h.record_ns(2_000)
    assert (h.summary()["min"], h.summary()["max"]) == (1.0, 2.0)


def test_out_of_range_values_are_clamped_not_dropped() -> None:
    """0 µs counts as 1 µs; beyond 60 s counts as 60 s (within HDR precision)."""
    h = filled([0, 10**12])
    assert h.count == 2
    assert h.summary()["min"] == 1.0
    assert h.summary()["max"] == pytest.approx(HIGHEST_US, rel=1e-3)


def test_empty_summary_is_zeros() -> None:
    """An empty histogram summarises to zeros, encodes to "" and decodes back."""
    h = LatencyHistogram()
    assert set(h.summary().values()) == {0.0}
    assert h.encode() == ""
    assert LatencyHistogram.decode("").count == 0
    assert h.percentile(99) == 0


def test_encode_decode_round_trip_and_merge() -> None:
    """Encoded histograms decode to the same summary; merging adds counts exactly."""
    a = filled(list(range(1, 501)))
    b = filled(list(range(501, 1001)))
    a2 = LatencyHistogram.decode(a.encode())
    assert a2.summary() == a.summary()
    a2.merge(LatencyHistogram.decode(b.encode()))
    assert a2.summary() == filled(list(range(1, 1001))).summary()


def test_many_distinct_values_flush_correctly() -> None:
    """More distinct values than the pending buffer holds are all counted."""
    h = LatencyHistogram()
    for v in range(1, 20_001):
        h.record_ns(v * 1000)
    assert h.count == 20_000
    assert h.percentile(50) == pytest.approx(10_000, rel=1e-3)


def test_reset() -> None:
    """reset forgets pending and recorded values."""
    h = filled([5, 6, 7])
    h.summary()
    h.record_us(8)
    h.reset()
    assert h.count == 0


def test_decode_rejects_garbage() -> None:
    """A corrupt histogram string is an error, not an empty histogram."""
    with pytest.raises(ValueError):
        LatencyHistogram.decode("not base64!")
