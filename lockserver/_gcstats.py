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

from .engine import BigTable

__all__ = ["POLICY", "GcPauses", "freeze_big_tables"]


class _Policy:
    """Whether a table that grows big is frozen out of the collector's sight (see
    :meth:`GcPauses.after_pass`). Off unless the ``lockserver`` command turns it on
    (``__main__._tune_gc``): ``gc.freeze()`` acts on the whole process, and a program that
    embeds ``serve`` owns its own collector policy."""

    freeze_big_tables = False


POLICY = _Policy()


def freeze_big_tables(enabled: bool = True) -> None:
    """Turn the big-table freeze on (the ``lockserver`` command does) or off."""
    POLICY.freeze_big_tables = enabled


class GcPauses:
    """Collects pause figures while installed (see :meth:`install` / :meth:`uninstall`)."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.collected = 0  # unreachable objects found (a lock server should make few)
        self.frozen = 0  # gc.get_freeze_count() when installed (it walks every frozen object)
        self.freezes = 0  # gc.freeze() calls since, one per table grown big (after_pass)
        self._big_seen = BigTable.made
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

    def after_pass(self) -> None:
        """Called after every read pass that served requests: when a table grew big since
        the last pass (and the policy is on), ``gc.freeze()`` now.

        Why: a big table's 256 shards are new, tracked containers, and the first collection
        of generation 1 that follows walks every entry in them, ~1M entries in one 47-50 ms
        pause (issue 19: every closed-loop run with 1M held showed one such stall). Frozen,
        they are never walked again. ``gc.freeze()`` costs microseconds whatever the heap
        (it moves lists); what it freezes is never collected as cyclic garbage, which the
        server makes none of on its paths (measured: 0 found after 3,000 churned
        connections, expired sessions and malformed frames), and the entries inside are
        freed by reference counting as ever. A pass is at most one read's requests, far from
        the 20 young collections that trigger generation 1, so the freeze comes first."""
        made = BigTable.made
        if made != self._big_seen:
            self._big_seen = made
            if POLICY.freeze_big_tables:
                gc.freeze()
                self.freezes += 1

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
            "freezes": self.freezes,
        }
