"""One broken rule as every checker of the fault lab reports it, and the examples kept of each.

A :class:`Finding` is what the verdict, the summary, the timeline's markers and
``verdict.jsonl`` share: which checker, what kind, on which key or lock, when (lab clock, for
the marker), a sentence saying what happened, and the records involved as their history JSON.
Counts are always complete; examples are capped per (kind, key) so a run with a million
broken grants still gives a readable report.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import attrs

from lockbench.safety import Interval

from ._history import Op, ResourceWrite

__all__ = ["MAX_EXAMPLES", "Finding", "Findings", "record_json"]

#: Examples kept per (kind, key); counts are complete.
MAX_EXAMPLES: Final = 20


def record_json(record: Op | Interval | ResourceWrite) -> dict[str, Any]:
    """A record as its history line's map (``type`` included)."""
    if isinstance(record, Interval):
        return {"type": "hold", **record.to_json()}
    return record.to_json()


@attrs.frozen
class Finding:
    """One broken rule: ``checker`` (``linearizability``, ``locks``), ``kind``, the ``key`` or
    lock, ``time`` on the lab clock (where the timeline marks it), a human ``detail`` and the
    ``records`` involved (history maps)."""

    checker: str
    kind: str
    key: str
    time: float
    detail: str
    records: tuple[Mapping[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map."""
        return {
            "checker": self.checker,
            "kind": self.kind,
            "key": self.key,
            "time": self.time,
            "detail": self.detail,
            "records": [dict(r) for r in self.records],
        }


class Findings:
    """Collects findings: every one counted by kind, up to MAX_EXAMPLES kept per (kind, key)."""

    def __init__(self, checker: str) -> None:
        self.checker = checker
        self.counts: Counter[str] = Counter()
        self.examples: list[Finding] = []
        self._per_key: Counter[tuple[str, str]] = Counter()

    def add(
        self,
        kind: str,
        key: str,
        time: float,
        detail: str,
        *records: Op | Interval | ResourceWrite,
    ) -> None:
        """Count one finding and keep it as an example while the (kind, key) cap allows."""
        self.counts[kind] += 1
        self._per_key[kind, key] += 1
        if self._per_key[kind, key] <= MAX_EXAMPLES:
            self.examples.append(
                Finding(self.checker, kind, key, time, detail, tuple(map(record_json, records)))
            )
