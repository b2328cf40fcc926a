"""Availability under faults: which share of the operations succeeded while each fault lasted,
per fault kind across the run and outside every fault, and how long the clients a fault hurt
took to succeed again after it healed.

Rules kept:

- An operation belongs to a fault window when it was **invoked** inside ``[start, end)``; a
  fault still open at the end of the history lasts until the history's last instant. Per kind,
  the windows of that kind are merged first, so an operation counts once per kind; "no fault"
  is every operation invoked outside all windows.
- The **share** is ``ok / (ok + fail)``: the completed operations that succeeded. Unknown
  outcomes (timeouts, lost connections) are counted beside it, never in it: whether they took
  effect is exactly what nobody knows.
- **Recovery** after a heal, per workload and for all together, counts the clients that were
  *down at the heal*: those whose last operation invoked before the heal failed, is unknown,
  or was still running at the heal (a client blocked by the fault). ``first`` is the time
  from the heal to the first ``ok`` completion among them, ``last`` the time until every one
  of them had one (None when one never did before the history ended); a heal with no client
  down recovers in 0 s. ``last`` is the figure to read: ``first`` is small whenever any
  client was merely mid-operation. Counting only clients down at the heal keeps the ones the
  fault never touched (the majority side of a partition) from making recovery look instant.
- **A client** is a process together with its renamings: a process that had an unknown
  operation continues under a new name (``c1-reg0`` -> ``c1-reg0.1``, as Jepsen retires a
  process whose operation is in doubt), so ``name``, ``name.1``, ``name.2``... are one client.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from ._history import Fault, History, Op

__all__ = [
    "ALL",
    "AvailabilityResult",
    "Counts",
    "FaultWindow",
    "Recovery",
    "check_availability",
    "client_of",
]

#: The workload name under which every workload's figures are summed.
ALL: Final = "all"
_RENAMED: Final = re.compile(r"(\.\d+)+$")


@attrs.frozen
class Counts:
    """Operations by outcome; ``share`` is ok / completed (None when none completed)."""

    ok: int = 0
    fail: int = 0
    unknown: int = 0

    @property
    def completed(self) -> int:
        """ok + fail."""
        return self.ok + self.fail

    @property
    def total(self) -> int:
        """Every operation counted."""
        return self.ok + self.fail + self.unknown

    @property
    def share(self) -> float | None:
        """The share of completed operations that succeeded."""
        return self.ok / self.completed if self.completed else None

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map (``share`` included)."""
        return {"ok": self.ok, "fail": self.fail, "unknown": self.unknown, "share": self.share}


@attrs.frozen
class Recovery:
    """After one heal: ``affected`` processes, seconds to the ``first`` ok completion among
    them and until the ``last`` of them had one (None: not before the history ended)."""

    affected: int
    first: float | None
    last: float | None

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map."""
        return attrs.asdict(self)


@attrs.frozen
class FaultWindow:
    """One fault's window (``end``: the fault's, or the history's last instant while it was
    still open), its operations by workload (and :data:`ALL`), and the recovery after it."""

    fault: Fault
    end: float
    counts: Mapping[str, Counts]
    recovery: Mapping[str, Recovery]

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map."""
        return {
            "fault": self.fault.to_json(),
            "end": self.end,
            "counts": {w: c.to_json() for w, c in self.counts.items()},
            "recovery": {w: r.to_json() for w, r in self.recovery.items()},
        }


@attrs.frozen
class AvailabilityResult:
    """Per fault window, per fault kind (merged windows) and outside every fault
    (``baseline``), operations by workload and :data:`ALL`."""

    windows: tuple[FaultWindow, ...]
    by_kind: Mapping[str, Mapping[str, Counts]]
    baseline: Mapping[str, Counts]

    def recoveries(self, kind: str, workload: str = ALL) -> list[Recovery]:
        """The recoveries after every window of ``kind`` (for ``workload``)."""
        return [
            w.recovery[workload]
            for w in self.windows
            if w.fault.kind == kind and workload in w.recovery
        ]


def _count(ops: Iterable[Op]) -> dict[str, Counts]:
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    index = {"ok": 0, "fail": 1, "unknown": 2}
    for op in ops:
        n = index[op.outcome]
        tally[op.workload][n] += 1
        tally[ALL][n] += 1
    return {w: Counts(*t) for w, t in sorted(tally.items())}


def _merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def client_of(process: str) -> str:
    """The client a process name belongs to: the name without its renaming suffixes."""
    return _RENAMED.sub("", process)


def _recovery(
    end: float,
    start: float,
    last_before: Mapping[tuple[str, str], Op],
    oks: Mapping[tuple[str, str], Sequence[float]],
) -> dict[str, Recovery]:
    """``last_before``: each client's last operation invoked before the heal."""
    down: dict[str, list[tuple[str, str]]] = defaultdict(list)
    workloads = {ALL}
    for who, op in last_before.items():
        if op.complete is not None and op.complete < start and op.outcome == "ok":
            continue  # finished well before the fault: this client was simply idle
        workloads.add(op.workload)
        if op.outcome != "ok" or op.complete is None or op.complete > end:
            down[op.workload].append(who)
            down[ALL].append(who)
    out = {}
    for workload in sorted(workloads):
        hurt = down.get(workload, [])
        if not hurt:
            out[workload] = Recovery(0, 0.0, 0.0)
            continue
        back: list[float | None] = []
        for who in hurt:
            times = oks.get(who, ())
            n = bisect.bisect_left(times, end)
            back.append(times[n] - end if n < len(times) else None)
        seen = [t for t in back if t is not None]
        out[workload] = Recovery(
            affected=len(hurt),
            first=min(seen) if seen else None,
            last=max(seen) if len(seen) == len(back) else None,
        )
    return out


def check_availability(history: History) -> AvailabilityResult:
    """The figures of the module header for ``history``."""
    ops = sorted(history.ops, key=lambda op: op.invoke)
    invokes = [op.invoke for op in ops]
    last = max(
        [op.complete or op.invoke for op in ops]
        + [f.end if f.end is not None else f.start for f in history.faults]
        + [0.0]
    )
    oks: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_client: dict[tuple[str, str], list[Op]] = defaultdict(list)  # in invoke order
    for op in ops:
        who = (op.workload, client_of(op.process))
        by_client[who].append(op)
        if op.outcome == "ok" and op.complete is not None:
            oks[who].append(op.complete)
    for times in oks.values():
        times.sort()

    client_invokes = {
        who: [op.invoke for op in client_ops] for who, client_ops in by_client.items()
    }

    def last_before(t: float) -> dict[tuple[str, str], Op]:
        out = {}
        for who, client_ops in by_client.items():
            n = bisect.bisect_left(client_invokes[who], t)
            if n:
                out[who] = client_ops[n - 1]
        return out

    def between(start: float, end: float) -> list[Op]:
        return ops[bisect.bisect_left(invokes, start) : bisect.bisect_left(invokes, end)]

    windows = []
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for fault in sorted(history.faults, key=lambda f: f.start):
        end = fault.end if fault.end is not None else max(last, fault.start)
        inside = between(fault.start, end)
        recovery = _recovery(end, fault.start, last_before(end), oks)
        windows.append(FaultWindow(fault, end, _count(inside), recovery))
        spans[fault.kind].append((fault.start, end))
    by_kind = {
        kind: _count(op for s, e in _merge(kind_spans) for op in between(s, e))
        for kind, kind_spans in sorted(spans.items())
    }
    merged = _merge(span for kind_spans in spans.values() for span in kind_spans)
    outside: list[Op] = []
    cursor = -float("inf")
    for start, end in merged:
        outside.extend(between(cursor, start))
        cursor = end
    outside.extend(ops[bisect.bisect_left(invokes, cursor) :])
    return AvailabilityResult(windows=tuple(windows), by_kind=by_kind, baseline=_count(outside))
