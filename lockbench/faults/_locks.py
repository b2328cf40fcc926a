"""The lock workloads' checkers over a whole history: mutual exclusion as the holders and as the
fenced resource saw it, readers-writer and semaphore invariants, fences, and grants made while
the previous holder's guarantee still ran.

What a lock workload records (see :mod:`lockbench.faults._history`): ``acquire`` and
``release`` ops, one ``hold`` (:class:`lockbench.safety.Interval`) per critical section, and the
fenced resource's ``write`` records. A granted acquire carries its ``fence`` and, in ``value``,
a map ``{"valid_until": t}`` -- the holder's guarantee deadline on the lab clock, computed from
the grant's ``valid_until`` as the client recipes do -- and optionally ``"mode"`` (``"w"``,
``"r"`` or ``"s"``; else the mode of the hold with the same fence, else ``"w"`` for the
``mutex`` workload).

Rules kept, each a violation kind:

- **The interval rules**, by :func:`lockbench.safety.check` over the holds (not rewritten here):
  ``exclusive-overlap``, ``reader-writer-overlap``, ``over-capacity``, ``fence-order``,
  ``duplicate-fence``, ``bad-interval``. Every overlapping conflicting pair is also
  classified: *caught by fences* when both carry distinct fences (a fenced resource orders
  their writes, so it refuses the stale one's), and *past the guarantee* when the older
  holder's guarantee had already run out when the newer one's hold began (the older holder
  overran its own deadline; the lock kept its word).
- **Fences strictly increasing per lock over grants** (``grant-fence-order``,
  ``grant-duplicate-fence``): an acquire that completed before another was invoked carries
  the smaller fence; no two grants of a lock share one.
- **No grant while the previous holder's guarantee ran** (``granted-during-guarantee``):
  grants are ordered by fence; a grant conflicting with an earlier one is a violation when it
  completed before that earlier holder's ``valid_until`` and before the earlier holder even
  sent its release. Both bounds are certain (the grant happened at or before its reply; the
  release cannot have been applied before it was sent), so no false alarm comes from network
  delay; a guarantee the lab did not record is not judged. The lab must record every way a
  holder lets go as a ``release`` op; where it recorded none for a grant, the end of the
  grant's hold stands in for it (the holder may have ended its session instead).
- **The resource's own view**: writes it refused are counted (each one is a stale holder the
  fences stopped; not a violation); ``resource-interleaved`` when it accepted writes of one
  grant, then another's, then the first's again (mutual exclusion broken where it matters);
  ``resource-inconsistent`` when it broke its own rule (accepted a fence below the highest,
  or refused one at least the highest): a lab bug, reported as such.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

import attrs

from lockbench import safety
from lockbench.safety import EXCLUSIVE, READ, SLOT, Interval

from ._availability import client_of
from ._findings import Finding, Findings
from ._history import History, Op, ResourceWrite

__all__ = ["GUARANTEE_FIELD", "LockResult", "check_locks", "guarantee_of"]

#: The key of an acquire op's ``value`` map holding the holder's guarantee deadline.
GUARANTEE_FIELD: Final = "valid_until"
LOCK_WORKLOADS: Final = ("mutex", "rw", "semaphore")
#: Refused writes kept as examples.
MAX_REFUSALS: Final = 20

_INF = math.inf


def guarantee_of(op: Op) -> float | None:
    """The holder's guarantee deadline an acquire op recorded (lab clock), or None."""
    value = op.value
    if isinstance(value, Mapping):
        t = value.get(GUARANTEE_FIELD)
        if isinstance(t, int | float) and not isinstance(t, bool) and math.isfinite(t):
            return float(t)
    return None


@attrs.frozen
class LockResult:
    """The lock checkers' outcome. ``overlaps``: conflicting pairs of holds that overlapped
    in real time, of which ``overlaps_caught`` carried distinct fences (a fenced resource
    refuses the stale one) and ``overlaps_past_guarantee`` began after the older holder's
    guarantee ran out. ``refused``: writes the fenced resource refused (examples in
    ``refusals``). ``counts``: every violation kind's full count; ``findings``: examples."""

    status: Literal["valid", "invalid"]
    locks: int
    holds: int
    grants: int
    writes: int
    refused: int
    overlaps: int
    overlaps_caught: int
    overlaps_past_guarantee: int
    counts: Mapping[str, int]
    findings: tuple[Finding, ...]
    refusals: tuple[Finding, ...]
    safety: safety.Report

    @property
    def checked(self) -> int:
        """Records this checker judged (grants, holds and resource writes)."""
        return self.grants + self.holds + self.writes


@attrs.frozen
class _Grant:
    op: Op
    fence: int
    mode: str | None
    valid_until: float | None
    released: float  # when the holder sent its release (inf: never)


def _conflict(a: str | None, b: str | None) -> bool:
    return (a == EXCLUSIVE and b in (EXCLUSIVE, READ)) or (a == READ and b == EXCLUSIVE)


def _grants(ops: Sequence[Op], holds: Sequence[Interval]) -> dict[str, list[_Grant]]:
    """Granted acquires by lock, in fence order, with mode, guarantee and release time: the
    holder's first release of the lock after the grant and before its next grant of it; with
    none recorded, the end of the grant's hold (the holder stopped there and may have let go
    another way, say by ending its session); with neither, never."""
    hold_of = {(h.lock, h.fence): h for h in holds if h.fence is not None}
    releases: dict[tuple[str, str], list[float]] = defaultdict(list)
    granted: dict[tuple[str, str], list[float]] = defaultdict(list)
    for op in ops:
        if op.f == "release":
            releases[op.process, op.key].append(op.invoke)
        elif op.f == "acquire" and op.outcome == "ok" and op.complete is not None:
            granted[op.process, op.key].append(op.complete)
    for times in [*releases.values(), *granted.values()]:
        times.sort()
    out: dict[str, list[_Grant]] = defaultdict(list)
    for op in ops:
        if op.f != "acquire" or op.outcome != "ok" or op.fence is None:
            continue
        assert op.complete is not None
        hold = hold_of.get((op.key, op.fence))
        mode: str | None = None
        if isinstance(op.value, Mapping) and op.value.get("mode") in (EXCLUSIVE, READ, SLOT):
            mode = op.value["mode"]
        if mode is None and hold is not None:
            mode = hold.mode
        if mode is None and op.workload == "mutex":
            mode = EXCLUSIVE
        times = releases.get((op.process, op.key), [])
        n = bisect.bisect_left(times, op.complete)
        later = granted[op.process, op.key]
        m = bisect.bisect_right(later, op.complete)
        next_grant = later[m] if m < len(later) else _INF
        if n < len(times) and times[n] < next_grant:
            released = times[n]
        else:
            released = hold.end if hold is not None else _INF
        out[op.key].append(_Grant(op, op.fence, mode, guarantee_of(op), released))
    for grants in out.values():
        grants.sort(key=lambda g: g.fence)
    return out


def _check_guarantees(grants: Mapping[str, Sequence[_Grant]], found: Findings) -> None:
    for lock, items in sorted(grants.items()):
        # per mode and client, the latest "still held and guaranteed" instant of its earlier
        # grants (a client granted again while it holds is not two holders)
        best: dict[str, dict[str, tuple[float, _Grant]]] = {EXCLUSIVE: {}, READ: {}}
        for g in items:
            assert g.op.complete is not None
            me = client_of(g.op.process)
            clash = [
                (until, a)
                for mode, clients in best.items()
                if _conflict(mode, g.mode)
                for client, (until, a) in clients.items()
                if client != me and until > g.op.complete
            ]
            if clash:
                until, a = max(clash, key=lambda c: c[0])
                found.add(
                    "granted-during-guarantee",
                    lock,
                    g.op.complete,
                    f"{g.op.process} was granted {lock!r} (fence {g.fence}) by "
                    f"{g.op.complete:.6f}, while {a.op.process} (fence {a.fence}) still held "
                    f"it with a guarantee until {a.valid_until:.6f} and had not let go",
                    a.op,
                    g.op,
                )
            if g.valid_until is not None and g.mode in best:
                until = min(g.valid_until, g.released)
                if until > best[g.mode].get(me, (-_INF, g))[0]:
                    best[g.mode][me] = (until, g)


def _check_grant_fences(grants: Mapping[str, Sequence[_Grant]], found: Findings) -> None:
    for lock, items in sorted(grants.items()):
        seen: dict[int, _Grant] = {}
        for g in items:
            if g.fence in seen:
                found.add(
                    "grant-duplicate-fence",
                    lock,
                    g.op.invoke,
                    f"{seen[g.fence].op.process} and {g.op.process} were both granted "
                    f"{lock!r} with fence {g.fence}",
                    seen[g.fence].op,
                    g.op,
                )
            seen.setdefault(g.fence, g)
        by_complete = sorted(items, key=lambda g: g.op.complete or 0.0)
        ends = [g.op.complete or 0.0 for g in by_complete]
        prefix: list[_Grant] = []  # the largest fence among the first i to complete
        for g in by_complete:
            prefix.append(g if not prefix or g.fence > prefix[-1].fence else prefix[-1])
        for b in items:
            n = bisect.bisect_left(ends, b.op.invoke)
            if n and prefix[n - 1].fence >= b.fence:
                a = prefix[n - 1]
                found.add(
                    "grant-fence-order",
                    lock,
                    b.op.invoke,
                    f"{b.op.process}'s grant of {lock!r} (fence {b.fence}) was asked for after "
                    f"{a.op.process}'s grant (fence {a.fence}) completed, yet its fence is not "
                    "larger",
                    a.op,
                    b.op,
                )


def _check_safety(report: safety.Report, found: Findings) -> None:
    """Carry :func:`lockbench.safety.check`'s findings over, counts complete."""
    examples: dict[str, list[safety.Violation]] = defaultdict(list)
    for v in report.violations:
        examples[v.kind].append(v)
    for kind, count in report.counts.items():
        kept = examples.get(kind, [])
        for v in kept:
            found.add(kind, v.lock, max(i.start for i in v.intervals), v.detail, *v.intervals)
        found.counts[kind] += count - len(kept)  # the ones safety counted but did not keep


def _classify_overlaps(
    holds: Iterable[Interval], guarantees: Mapping[tuple[str, int], float]
) -> tuple[int, int, int]:
    """(overlapping conflicting pairs, of which with distinct fences, of which begun after
    the older holder's guarantee ran out). Touching intervals do not overlap."""
    by_lock: dict[str, list[Interval]] = defaultdict(list)
    for h in holds:
        if h.end >= h.start and h.mode in (EXCLUSIVE, READ):
            by_lock[h.lock].append(h)
    pairs = caught = past = 0
    for items in by_lock.values():
        items.sort(key=lambda h: h.start)
        active: list[Interval] = []
        for h in items:
            active = [a for a in active if a.end > h.start]
            for a in active:
                if not _conflict(a.mode, h.mode):
                    continue
                if a.mode == h.mode and max(a.capacity or 1, h.capacity or 1) > 1:
                    continue  # writers of a lock that admits several: over-capacity's business
                pairs += 1
                if a.fence is not None and h.fence is not None and a.fence != h.fence:
                    caught += 1
                older, newer = (a, h)
                if a.fence is not None and h.fence is not None and h.fence < a.fence:
                    older, newer = h, a
                deadline = (
                    guarantees.get((older.lock, older.fence)) if older.fence is not None else None
                )
                if deadline is not None and deadline <= newer.start:
                    past += 1
            active.append(h)
    return pairs, caught, past


def _check_resource(writes: Sequence[ResourceWrite], found: Findings) -> tuple[int, list[Finding]]:
    refused = 0
    refusals: list[Finding] = []
    by_lock: dict[str, list[ResourceWrite]] = defaultdict(list)
    for w in writes:
        by_lock[w.lock].append(w)
        if w.fence is not None and w.highest is not None and w.accepted != (w.fence >= w.highest):
            found.add(
                "resource-inconsistent",
                w.lock,
                w.time,
                f"the resource {'accepted' if w.accepted else 'refused'} {w.holder}'s write "
                f"with fence {w.fence} when the highest it had seen was {w.highest}",
                w,
            )
        if not w.accepted:
            refused += 1
            if len(refusals) < MAX_REFUSALS:
                refusals.append(
                    Finding(
                        "locks",
                        "refused-write",
                        w.lock,
                        w.time,
                        f"the resource refused {w.holder}'s write with fence {w.fence} "
                        f"(highest seen {w.highest})",
                        (w.to_json(),),
                    )
                )
    for lock, items in sorted(by_lock.items()):
        items.sort(key=lambda w: w.time)
        seen: dict[tuple[str, int], ResourceWrite] = {}
        last: tuple[str, int] | None = None
        for w in items:
            if not w.accepted or w.fence is None:
                continue
            grant = (w.holder, w.fence)
            if grant != last and grant in seen and last is not None:
                other = seen[last]
                found.add(
                    "resource-interleaved",
                    lock,
                    w.time,
                    f"the resource accepted writes of {w.holder} (fence {w.fence}), then of "
                    f"{other.holder} (fence {other.fence}), then of {w.holder} again",
                    seen[grant],
                    other,
                    w,
                )
            seen[grant] = w
            last = grant
    return refused, refusals


def check_locks(history: History) -> LockResult:
    """Every lock rule of the module header over ``history``'s lock ops, holds and resource
    writes. ``status`` is ``invalid`` when any violation kind has a count."""
    ops = [op for op in history.ops if op.workload != "register"]
    found = Findings("locks")
    report = safety.check(history.holds)
    _check_safety(report, found)
    grants = _grants(ops, history.holds)
    _check_grant_fences(grants, found)
    _check_guarantees(grants, found)
    guarantees = {
        (lock, g.fence): g.valid_until
        for lock, items in grants.items()
        for g in items
        if g.valid_until is not None
    }
    pairs, caught, past = _classify_overlaps(history.holds, guarantees)
    refused, refusals = _check_resource(history.writes, found)
    locks = {h.lock for h in history.holds} | set(grants) | {w.lock for w in history.writes}
    return LockResult(
        status="invalid" if found.counts else "valid",
        locks=len(locks),
        holds=len(history.holds),
        grants=sum(len(g) for g in grants.values()),
        writes=len(history.writes),
        refused=refused,
        overlaps=pairs,
        overlaps_caught=caught,
        overlaps_past_guarantee=past,
        counts=dict(found.counts),
        findings=tuple(sorted(found.examples, key=lambda f: f.time)),
        refusals=tuple(refusals),
        safety=report,
    )
