"""Pauses of Python's cyclic garbage collector, as the server's statistics report them.

Why: a collector pass stops the event loop; with ~10**6 held entries a full pass can take
tens of milliseconds, which is invisible in throughput but is the p99 of every request queued
behind it. Operators need to see it (statistics section ``gc``) to tell a GC pause from a
network or client problem, and to judge the settings in ``__main__._tune_gc``.

Theory: ``gc.callbacks`` calls us at the start and stop of every collection; the pause is
the ``perf_counter`` difference (this is the shell layer: it may read clocks). Per generation
we keep a count, the total and the longest pause. Cost: two callbacks per collection,
nothing per request.

The frozen-object count is taken once, when the server starts (:meth:`GcPauses.install`),
not per ``stats`` request: ``gc.get_freeze_count()`` walks the whole frozen generation
(~26,000 objects after ``__main__._tune_gc``, ~0.27 ms a call), and anybody may send
thousands of ``stats`` in one 64 KiB write (issue 14: 3,000 cost ~1 s of server CPU). It
only changes when ``gc.freeze()`` / ``gc.unfreeze()`` is called, which the server does
before it starts. For the same reason the millisecond figures are rounded once per
collection, not per request.
"""

from __future__ import annotations

import gc
import time
from typing import Any

__all__ = ["GcPauses"]


class GcPauses:
    """Collects pause figures while installed (see :meth:`install` / :meth:`uninstall`)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.collected = 0  # unreachable objects found (a lock server should make few)
        self.frozen = 0  # gc.get_freeze_count() when installed (it walks every frozen object)
        self._ms: tuple[list[float], list[float]] | None = None  # to_wire's, until a collection
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start measuring (idempotent); count the frozen objects now."""
        if not self._installed:
            self.frozen = gc.get_freeze_count()
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        """Stop measuring (idempotent)."""
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = int(info.get("generation", 2))
        if not 0 <= generation <= 2:
            return
        self.collections[generation] += 1
        self.total[generation] += pause
        self.longest[generation] = max(self.longest[generation], pause)
        self.collected += int(info.get("collected", 0))
        self._ms = None

    def to_wire(self) -> dict[str, Any]:
        """The ``gc`` statistics section (milliseconds, per generation 0, 1, 2)."""
        ms = self._ms
        if ms is None:
            ms = self._ms = (
                [round(t * 1000, 3) for t in self.total],
                [round(t * 1000, 3) for t in self.longest],
            )
        return {
            "collections": list(self.collections),
            "pause_total_ms": list(ms[0]),
            "pause_max_ms": list(ms[1]),
            "collected": self.collected,
            "thresholds": list(gc.get_threshold()),
            "frozen_objects": self.frozen,
        }
