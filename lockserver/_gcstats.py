"""Pauses of Python's cyclic garbage collector, as the server's statistics report them.

Why: a collector pass stops the event loop; with ~10**6 held entries a full pass can take
tens of milliseconds, which is invisible in throughput but is the p99 of every request queued
behind it. Operators need to see it (statistics section ``gc``) to tell a GC pause from a
network or client problem, and to judge the settings in ``__main__._tune_gc``.

Theory: ``gc.callbacks`` calls us at the start and stop of every collection; the pause is
the ``perf_counter`` difference (this is the shell layer: it may read clocks). Per generation
we keep a count, the total and the longest pause. Cost: two callbacks per collection,
nothing per request.
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
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        """Start measuring (idempotent)."""
        if not self._installed:
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

    def to_wire(self) -> dict[str, Any]:
        """The ``gc`` statistics section (milliseconds, per generation 0, 1, 2)."""
        return {
            "collections": list(self.collections),
            "pause_total_ms": [round(t * 1000, 3) for t in self.total],
            "pause_max_ms": [round(t * 1000, 3) for t in self.longest],
            "collected": self.collected,
            "thresholds": list(gc.get_threshold()),
            "frozen_objects": gc.get_freeze_count(),
        }
