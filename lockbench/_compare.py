"""``lockbench compare A.json B.json``: ratios of B to A, result by result.

Why: the issue's targets are ratios ("our client+server vs redis-py+Redis >= 1.5x"), so the
tool computes them the same way every time. Results are paired by ``(name, kind, params)`` when
both files have one such result, else by position. For throughput a ratio above 1 means B is
faster; for latency and CPU, *below* 1 means B is better — the table says which is which.
"""

from __future__ import annotations

from typing import Any

import attrs

from ._results import Result, ResultDocument

__all__ = ["Comparison", "compare", "ratio"]

THROUGHPUT = ("ops_per_s", "requests_per_s")
LATENCY = ("p50", "p90", "p99", "p99.9", "max")


def ratio(b: float | None, a: float | None) -> float | None:
    """b / a, None when either is missing or a is 0."""
    if a is None or b is None or a == 0:
        return None
    return b / a


@attrs.frozen
class Comparison:
    """One pair of results and the ratios B/A."""

    a: Result
    b: Result
    ratios: dict[str, float | None]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {"a": self.a.label, "b": self.b.label, "ratios": dict(self.ratios)}


def _key(r: Result) -> tuple[str, str, str]:
    params = {k: v for k, v in r.params.items() if k not in ("duration", "count", "warmup")}
    return r.name, r.kind, repr(sorted(params.items()))


def _pairs(a: ResultDocument, b: ResultDocument) -> list[tuple[Result, Result]]:
    by_key_a: dict[Any, list[Result]] = {}
    for r in a.results:
        by_key_a.setdefault(_key(r), []).append(r)
    by_key_b: dict[Any, list[Result]] = {}
    for r in b.results:
        by_key_b.setdefault(_key(r), []).append(r)
    matched = [
        (ra[0], by_key_b[k][0])
        for k, ra in by_key_a.items()
        if len(ra) == 1 and len(by_key_b.get(k, [])) == 1
    ]
    if len(matched) == min(len(a.results), len(b.results)):
        return matched
    return list(zip(a.results, b.results, strict=False))


def compare(a: ResultDocument, b: ResultDocument) -> list[Comparison]:
    """Pair the results of two files and compute B/A for throughput, latency, CPU."""
    out = []
    for ra, rb in _pairs(a, b):
        ratios: dict[str, float | None] = {
            k: ratio(getattr(rb, k), getattr(ra, k)) for k in THROUGHPUT
        }
        for k in LATENCY:
            ratios[f"latency_{k}"] = ratio(rb.latency_us.get(k), ra.latency_us.get(k))
        ratios["server_cpu_s_per_1k_ops"] = ratio(
            rb.server_cpu_s_per_1k_ops, ra.server_cpu_s_per_1k_ops
        )
        ratios["acquire_success_ratio"] = ratio(rb.acquire_success_ratio, ra.acquire_success_ratio)
        out.append(Comparison(ra, rb, ratios))
    return out
