"""The safety checker: record every critical section, then prove no lock was ever shared wrongly.

Why: a lock test that only counts successful acquires proves nothing about exclusion. This
module records, for every grant, the interval during which a client *believed* it held the
lock, with the grant's fence, from any number of tasks, threads or processes, and checks the
whole history afterwards:

- **exclusive overlap**: two writers (mode ``"w"``) of the same lock at the same time (more
  than the lock's write capacity, 1 by default);
- **reader/writer overlap**: a reader (``"r"``) and a writer of the same lock at once;
- **over capacity**: more readers than the read capacity, or more holders of a counted slot
  (``"s"``, semaphores) than its capacity;
- **fence order**: of two conflicting grants one of which ended before the other began, the
  later must carry the larger fence (writer after writer when the write capacity is 1, reader
  after writer, writer after reader); and no two grants of a lock share a fence.

Soundness: a client records an interval from *after its grant reply arrived* to *before its
release request is sent*, which lies strictly inside the server-side hold. So any overlap
reported is a real one (no false alarms from network delays), and the fence check catches
grants whose server-side holds overlapped even when the recorded intervals happen not to
(the later grant committed while the earlier one was still held).

Recording: :class:`Recorder` is thread-safe and keeps intervals in memory; given a path it
also appends one JSON line per interval to that file (use one file per process, then
:func:`load` them all). The clock defaults to ``time.monotonic``, which on Linux is
CLOCK_MONOTONIC, shared by every process of the machine; pass ``clock=`` to use another (the
same for every recorder whose intervals are compared).

The coordination recipes (issue 33) have a property each, checked from what their users
record the same way (taken before a request is sent, or after its reply arrived, so that the
server-side event lies inside what was recorded):

- **leaders** (:func:`check_leaders`): leaderships are exclusive intervals whose fence is the
  term: at most one leader at any time, each term once, and a later leader has a larger term;
- **reentrant** (:func:`check_reentrant`): each owner's acquires and releases balance (its
  count never goes below zero and ends at zero), nested holds carry the outer hold's fence,
  and the outermost holds of different owners never overlap;
- **barrier** (:func:`check_barrier`): no party passes early: every pass lies after an instant
  at which ``parties`` attempts (its own included) had arrived and none of them had passed
  yet;
- **latch** (:func:`check_latch`): no waiter passes before ``count`` count-downs were sent.

Command line: ``python -m lockbench.safety FILE.jsonl ...`` prints the report and exits 1
when there is a violation.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

import attrs

__all__ = [
    "EXCLUSIVE",
    "READ",
    "SLOT",
    "Attempt",
    "Interval",
    "Recorder",
    "Report",
    "Violation",
    "check",
    "check_barrier",
    "check_latch",
    "check_leaders",
    "check_reentrant",
    "load",
    "main",
]

EXCLUSIVE = "w"
READ = "r"
SLOT = "s"
_MODE_ALIASES = {"w": EXCLUSIVE, "x": EXCLUSIVE, "write": EXCLUSIVE, "r": READ, "read": READ}
_MODE_ALIASES.update({"s": SLOT, "slot": SLOT})
#: Violations of one kind kept per lock (the count is always complete).
MAX_EXAMPLES = 20


def _mode(value: object) -> str:
    mode = _MODE_ALIASES.get(value) if isinstance(value, str) else None
    if mode is None:
        raise ValueError(f"mode must be 'w' (exclusive), 'r' (read) or 's' (slot), got {value!r}")
    return mode


def _capacity(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"capacity must be an integer >= 1 or None, got {value!r}")
    return value


@attrs.frozen
class Interval:
    """One critical section: ``holder`` held ``lock`` in ``mode`` from ``start`` to ``end``
    (recorder clock) under the grant ``fence``; ``capacity``: how many may hold it in this
    mode at once (None: the mode's default)."""

    lock: str
    mode: str = attrs.field(converter=_mode)
    start: float
    end: float
    fence: int | None = None
    holder: str = ""
    capacity: int | None = attrs.field(default=None, converter=_capacity)

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map (one line of a recording file)."""
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Interval:
        """From a map written by :meth:`to_json` (ValueError/TypeError when malformed)."""
        fence = data.get("fence")
        if fence is not None and (isinstance(fence, bool) or not isinstance(fence, int)):
            raise ValueError(f"fence must be an integer or null, got {fence!r}")
        start, end = data["start"], data["end"]
        for what, t in (("start", start), ("end", end)):
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
                raise ValueError(f"{what} must be a finite number, got {t!r}")
        return cls(
            lock=str(data["lock"]),
            mode=data["mode"],
            start=float(start),
            end=float(end),
            fence=fence,
            holder=str(data.get("holder", "")),
            capacity=data.get("capacity"),
        )


class Recorder:
    """Collects intervals from any number of threads (and trio tasks); optionally appends
    each one as a JSON line to ``path`` as it is recorded.

    ``with recorder.hold(lock, mode, fence, holder):`` records the block's duration; or call
    :meth:`record` with times taken from :meth:`now`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self._mu = threading.Lock()
        self._intervals: list[Interval] = []
        self._file: IO[str] | None = None
        if path is not None:
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def now(self) -> float:
        """The recorder's clock."""
        return self.clock()

    def record(
        self,
        lock: str,
        mode: str,
        start: float,
        end: float,
        fence: int | None,
        holder: str = "",
        capacity: int | None = None,
    ) -> Interval:
        """Record one interval (thread-safe)."""
        interval = Interval(lock, mode, start, end, fence, holder, capacity)
        line = json.dumps(interval.to_json()) + "\n" if self._file is not None else ""
        with self._mu:
            self._intervals.append(interval)
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
        return interval

    @contextlib.contextmanager
    def hold(
        self,
        lock: str,
        mode: str,
        fence: int | None,
        holder: str = "",
        capacity: int | None = None,
    ) -> Iterator[None]:
        """Record the duration of the block (also when it raises). Enter it right after the
        grant, leave it right before the release."""
        start = self.clock()
        try:
            yield
        finally:
            self.record(lock, mode, start, self.clock(), fence, holder, capacity)

    @property
    def intervals(self) -> list[Interval]:
        """A copy of everything recorded so far."""
        with self._mu:
            return list(self._intervals)

    def check(self, capacities: Mapping[str, Mapping[str, int]] | None = None) -> Report:
        """:func:`check` over what this recorder holds."""
        return check(self.intervals, capacities=capacities)

    def close(self) -> None:
        """Close the file (if any); recording afterwards keeps to memory."""
        with self._mu:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def load(paths: Iterable[str | os.PathLike[str]]) -> list[Interval]:
    """Every interval of the given JSON-lines files (blank lines skipped). A malformed line
    raises ValueError naming its file and line."""
    out: list[Interval] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    out.append(Interval.from_json(json.loads(line)))
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"{os.fspath(path)}:{number}: {exc!r}") from exc
    return out


@attrs.frozen
class Violation:
    """One broken rule: ``kind`` (``exclusive-overlap``, ``reader-writer-overlap``,
    ``over-capacity``, ``fence-order``, ``duplicate-fence``, ``bad-interval``), the lock, a
    human explanation and the intervals involved."""

    kind: str
    lock: str
    detail: str
    intervals: tuple[Interval, ...]


@attrs.frozen
class Report:
    """The outcome of :func:`check`. ``counts`` has every violation kind's full count;
    ``violations`` up to MAX_EXAMPLES examples of each kind per lock."""

    intervals: int
    locks: int
    violations: tuple[Violation, ...]
    counts: dict[str, int]
    holders: dict[str, int]  # holder -> critical sections recorded
    max_holders: dict[str, dict[str, int]]  # lock -> mode -> most simultaneous holders seen

    @property
    def ok(self) -> bool:
        """True when nothing was violated."""
        return not self.counts

    def summary(self) -> str:
        """A few lines for humans."""
        lines = [
            f"{self.intervals} critical sections, {self.locks} locks, "
            f"{len(self.holders)} holders: "
            + (
                "OK"
                if self.ok
                else "VIOLATIONS " + ", ".join(f"{k}={n}" for k, n in self.counts.items())
            )
        ]
        for v in self.violations[:MAX_EXAMPLES]:
            lines.append(f"  {v.kind} on {v.lock!r}: {v.detail}")
        return "\n".join(lines)

    def assert_ok(self) -> None:
        """Raise AssertionError with the summary unless ok."""
        if not self.ok:
            raise AssertionError(self.summary())


_DEFAULT_CAPACITY = {EXCLUSIVE: 1, READ: sys.maxsize, SLOT: sys.maxsize}


def _capacities(
    lock: str, items: Sequence[Interval], overrides: Mapping[str, Mapping[str, int]] | None
) -> dict[str, int]:
    caps = dict(_DEFAULT_CAPACITY)
    for mode in caps:
        seen = [i.capacity for i in items if i.mode == mode and i.capacity is not None]
        if seen:
            caps[mode] = min(seen)
    if overrides is not None and lock in overrides:
        for mode, n in overrides[lock].items():
            caps[_mode(mode)] = n
    return caps


class _Findings:
    def __init__(self) -> None:
        self.examples: list[Violation] = []
        self.counts: Counter[str] = Counter()
        self._per_lock: Counter[tuple[str, str]] = Counter()

    def add(self, kind: str, lock: str, detail: str, *intervals: Interval) -> None:
        self.counts[kind] += 1
        self._per_lock[kind, lock] += 1
        if self._per_lock[kind, lock] <= MAX_EXAMPLES:
            self.examples.append(Violation(kind, lock, detail, intervals))


def _describe(i: Interval) -> str:
    return f"{i.holder or '?'}[{i.mode} {i.start:.6f}..{i.end:.6f} fence={i.fence}]"


def _sweep(
    lock: str, items: Sequence[Interval], caps: Mapping[str, int], out: _Findings
) -> dict[str, int]:
    """Overlaps and capacities, by a sweep over start/end events (an end at the same instant
    as a start comes first: touching intervals do not overlap)."""
    events = sorted(
        [(i.start, 1, n) for n, i in enumerate(items)]
        + [(i.end, 0, n) for n, i in enumerate(items)]
    )
    active: dict[str, dict[int, Interval]] = {EXCLUSIVE: {}, READ: {}, SLOT: {}}
    most = {EXCLUSIVE: 0, READ: 0, SLOT: 0}
    for _, is_start, n in events:
        interval = items[n]
        mode = interval.mode
        if not is_start:
            active[mode].pop(n, None)
            continue
        writers = list(active[EXCLUSIVE].values())
        readers = list(active[READ].values())
        if mode == EXCLUSIVE:
            if len(writers) >= caps[EXCLUSIVE]:
                out.add(
                    "exclusive-overlap",
                    lock,
                    f"{_describe(interval)} began while {len(writers)} writer(s) held it, "
                    f"e.g. {_describe(writers[0])}",
                    interval,
                    *writers,
                )
            if readers:
                out.add(
                    "reader-writer-overlap",
                    lock,
                    f"writer {_describe(interval)} began while {len(readers)} reader(s) held "
                    f"it, e.g. {_describe(readers[0])}",
                    interval,
                    *readers,
                )
        elif mode == READ:
            if writers:
                out.add(
                    "reader-writer-overlap",
                    lock,
                    f"reader {_describe(interval)} began while writer "
                    f"{_describe(writers[0])} held it",
                    interval,
                    *writers,
                )
            if len(readers) >= caps[READ]:
                out.add(
                    "over-capacity",
                    lock,
                    f"reader {_describe(interval)} made {len(readers) + 1} readers "
                    f"(capacity {caps[READ]})",
                    interval,
                    *readers,
                )
        else:
            slots = list(active[SLOT].values())
            if len(slots) >= caps[SLOT]:
                out.add(
                    "over-capacity",
                    lock,
                    f"{_describe(interval)} made {len(slots) + 1} holders (capacity {caps[SLOT]})",
                    interval,
                    *slots,
                )
        active[mode][n] = interval
        most[mode] = max(most[mode], len(active[mode]))
    return {mode: n for mode, n in most.items() if n}


def _order(
    lock: str, earlier: Sequence[Interval], later: Sequence[Interval], out: _Findings
) -> None:
    """For every ``b`` in ``later``: each ``a`` in ``earlier`` that ended strictly before
    ``b`` began must have a smaller fence (the largest such fence is what is compared)."""
    ends = sorted((a.end, a.fence, k) for k, a in enumerate(earlier) if a.fence is not None)
    end_times = [e[0] for e in ends]
    # prefix maximum of fences by end time
    best: list[tuple[int, int]] = []
    for _, fence, k in ends:
        assert fence is not None
        best.append((fence, k) if not best or fence > best[-1][0] else best[-1])
    for b in later:
        if b.fence is None:
            continue
        n = bisect.bisect_left(end_times, b.start)
        if n and best[n - 1][0] >= b.fence:
            a = earlier[best[n - 1][1]]
            out.add(
                "fence-order",
                lock,
                f"{_describe(b)} began after {_describe(a)} ended but has a fence that is not "
                "larger",
                a,
                b,
            )


def check(
    intervals: Iterable[Interval],
    *,
    capacities: Mapping[str, Mapping[str, int]] | None = None,
) -> Report:
    """Check a history (see the module docstring). ``capacities``: ``{lock: {mode: n}}``
    overriding the capacities recorded with the intervals and the defaults (writers 1,
    readers and slots unlimited)."""
    by_lock: dict[str, list[Interval]] = defaultdict(list)
    holders: Counter[str] = Counter()
    total = 0
    found = _Findings()
    for i in intervals:
        total += 1
        holders[i.holder] += 1
        if i.end < i.start:
            found.add("bad-interval", i.lock, f"{_describe(i)} ends before it starts", i)
            continue
        by_lock[i.lock].append(i)
    most: dict[str, dict[str, int]] = {}
    for lock, items in sorted(by_lock.items()):
        caps = _capacities(lock, items, capacities)
        most[lock] = _sweep(lock, items, caps, found)
        fences = Counter(i.fence for i in items if i.fence is not None)
        for fence, n in fences.items():
            if n > 1:
                same = tuple(i for i in items if i.fence == fence)
                found.add("duplicate-fence", lock, f"{n} grants carry fence {fence}", *same)
        writers = [i for i in items if i.mode == EXCLUSIVE]
        readers = [i for i in items if i.mode == READ]
        if caps[EXCLUSIVE] == 1:
            _order(lock, writers, writers, found)
        _order(lock, writers, readers, found)
        _order(lock, readers, writers, found)
    return Report(
        intervals=total,
        locks=len(by_lock),
        violations=tuple(found.examples),
        counts=dict(found.counts),
        holders=dict(holders),
        max_holders=most,
    )


# --- the coordination recipes ----------------------------------------------------------------


def check_leaders(leaderships: Iterable[Interval]) -> Report:
    """An election's history: each interval is one leadership (``lock`` = the election,
    mode ``"w"``, ``fence`` = the term, from after ``campaign`` returned to before
    ``resign`` was sent). At most one leader at any time (``exclusive-overlap``), no term
    twice (``duplicate-fence``), a later leader's term is larger (``fence-order``)."""
    items = list(leaderships)
    for i in items:
        if i.mode != EXCLUSIVE:
            raise ValueError(f"a leadership is exclusive (mode 'w'), got {_describe(i)}")
    return check(items)


#: One reentrant event: (time, lock, owner, +1 acquire / -1 release, fence of the grant).
ReentrantEvent = tuple[float, str, str, int, "int | None"]


def check_reentrant(events: Iterable[ReentrantEvent]) -> Report:
    """A reentrant mutex's history: ``(time, lock, owner, +1 or -1, fence)`` per acquire
    (recorded after it returned) and release (recorded before it was sent). Each owner's
    count never goes below zero (``unbalanced``) and is zero at the end (``still-held``),
    nested acquires carry the outermost hold's fence (``nested-fence``), and the outermost
    holds of different owners obey :func:`check` (no overlap, fences in order)."""
    found = _Findings()
    holds: list[Interval] = []
    open_: dict[tuple[str, str], tuple[int, float, int | None]] = {}
    total = 0
    owners: Counter[str] = Counter()
    for t, lock, owner, delta, fence in sorted(events, key=lambda e: e[0]):
        total += 1
        owners[owner] += 1
        key = (lock, owner)
        level, start, first = open_.get(key, (0, t, fence))
        probe = Interval(lock, EXCLUSIVE, t, t, fence, owner)
        if delta > 0:
            if level and fence != first:
                found.add(
                    "nested-fence",
                    lock,
                    f"{owner} acquired again with fence {fence}, its hold has {first}",
                    probe,
                )
            open_[key] = (level + 1, start if level else t, first if level else fence)
            continue
        if level == 0:
            found.add("unbalanced", lock, f"{owner} released more often than it acquired", probe)
            continue
        if level == 1:
            del open_[key]
            holds.append(Interval(lock, EXCLUSIVE, start, t, first, owner))
        else:
            open_[key] = (level - 1, start, first)
    for (lock, owner), (level, start, first) in open_.items():
        found.add(
            "still-held",
            lock,
            f"{owner} acquired {level} more time(s) than it released",
            Interval(lock, EXCLUSIVE, start, start, first, owner),
        )
    outer = check(holds)
    for v in outer.violations:
        found.examples.append(v)
    found.counts.update(outer.counts)
    return Report(
        intervals=total,
        locks=len({lock for lock, _ in open_} | {h.lock for h in holds}),
        violations=tuple(found.examples),
        counts=dict(found.counts),
        holders=dict(owners),
        max_holders=outer.max_holders,
    )


@attrs.frozen
class Attempt:
    """One party's attempt to pass a barrier: ``arrived`` (before its request was sent),
    ``passed`` (after it returned True; None when it did not pass: timed out, failed,
    dropped out) and ``ended`` (when a failed attempt was given up; defaults to ``passed``)."""

    barrier: str
    party: str
    arrived: float
    passed: float | None
    ended: float | None = None

    @property
    def end(self) -> float:
        if self.passed is not None:
            return self.passed
        return self.arrived if self.ended is None else self.ended


def check_barrier(attempts: Iterable[Attempt], parties: int | Mapping[str, int]) -> Report:
    """No party passes a barrier of ``parties`` (one number, or ``{barrier: n}``) early:
    for every attempt that passed there is an instant between its arrival and its pass at
    which at least ``parties`` attempts (its own included) had arrived and were still
    waiting (``early-pass`` otherwise). Sound: a barrier lets a party through only once N
    have arrived together, an instant every one of their recorded attempts contains."""
    found = _Findings()
    by_barrier: dict[str, list[Attempt]] = defaultdict(list)
    total = 0
    holders: Counter[str] = Counter()
    for a in attempts:
        total += 1
        holders[a.party] += 1
        by_barrier[a.barrier].append(a)
    most: dict[str, dict[str, int]] = {}
    for barrier, items in sorted(by_barrier.items()):
        n = parties if isinstance(parties, int) else parties[barrier]
        # waiting counts at each arrival instant: a party can only pass after the last of its
        # round arrived, so the instant that proves a pass is the arrival of some attempt (at
        # one instant, arrivals count before ends: a pass recorded at the very instant of the
        # last arrival is not taken for an early one).
        events = sorted([(a.arrived, 0) for a in items] + [(a.end, 1) for a in items])
        times: list[float] = []
        peaks: list[int] = []
        waiting = 0
        for t, is_end in events:
            if is_end:
                waiting -= 1
                continue
            waiting += 1
            times.append(t)
            peaks.append(waiting)
        most[barrier] = {"waiting": max(peaks, default=0)}
        for a in items:
            if a.passed is None:
                continue
            lo = bisect.bisect_left(times, a.arrived)
            hi = bisect.bisect_right(times, a.passed)
            best = max(peaks[lo:hi], default=0)
            if best < n:
                found.add(
                    "early-pass",
                    barrier,
                    f"{a.party} passed at {a.passed:.6f} (arrived {a.arrived:.6f}) with at most "
                    f"{best} of {n} parties there",
                    Interval(barrier, SLOT, a.arrived, a.passed, None, a.party),
                )
    return Report(
        intervals=total,
        locks=len(by_barrier),
        violations=tuple(found.examples),
        counts=dict(found.counts),
        holders=dict(holders),
        max_holders=most,
    )


def check_latch(
    count_downs: Iterable[tuple[str, float]],
    passes: Iterable[tuple[str, str, float]],
    count: int | Mapping[str, int],
) -> Report:
    """No waiter passes a latch early: ``count_downs`` are ``(latch, time sent)``,
    ``passes`` ``(latch, waiter, time wait returned True)``; every pass comes after the
    ``count``-th count-down was sent (``early-open`` otherwise)."""
    found = _Findings()
    sent: dict[str, list[float]] = defaultdict(list)
    for latch, t in count_downs:
        sent[latch].append(t)
    for times in sent.values():
        times.sort()
    total = 0
    holders: Counter[str] = Counter()
    latches: set[str] = set(sent)
    for latch, waiter, t in passes:
        total += 1
        holders[waiter] += 1
        latches.add(latch)
        n = count if isinstance(count, int) else count[latch]
        times = sent.get(latch, [])
        if len(times) < n or times[n - 1] > t:
            found.add(
                "early-open",
                latch,
                f"{waiter} passed at {t:.6f} when {bisect.bisect_right(times, t)} of {n} "
                "count-downs had been sent",
                Interval(latch, SLOT, t, t, None, waiter),
            )
    return Report(
        intervals=total,
        locks=len(latches),
        violations=tuple(found.examples),
        counts=dict(found.counts),
        holders=dict(holders),
        max_holders={},
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m lockbench.safety FILE...``: check recordings; exit 1 on a violation."""
    parser = argparse.ArgumentParser(prog="python -m lockbench.safety", description=__doc__)
    parser.add_argument("files", nargs="+", help="JSON-lines recordings (one per process)")
    args = parser.parse_args(argv)
    report = check(load(args.files))
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
