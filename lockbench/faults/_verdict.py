"""The fault lab's verdict over one history: every checker run, one frozen answer.

``check(history)`` runs the register workload's linearizability checker
(:mod:`lockbench.faults._linear`), the lock checkers (:mod:`lockbench.faults._locks`) and the
availability figures (:mod:`lockbench.faults._availability`), and folds them into a
:class:`Verdict`:

- ``invalid`` when any checker found a violation;
- else ``unknown`` when any could not decide (the linearizability search hit its bound), or
  when the history holds nothing to check at all -- an empty or truncated run never passes;
- else ``valid``.

A verdict is written as JSON lines (:meth:`Verdict.to_json_lines`): one ``verdict`` line, one
``checker`` line per checker, one ``finding`` line per example violation, one ``window`` line
per fault window and one ``availability`` line per fault kind (and ``"none"`` outside every
fault).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import attrs

from ._availability import AvailabilityResult, check_availability
from ._findings import Finding, record_json
from ._history import History, Meta
from ._linear import DEFAULT_MAX_STATES, LinearizabilityResult, check_register
from ._locks import LockResult, check_locks

__all__ = ["CheckerResult", "Status", "Verdict", "check"]

Status = Literal["valid", "invalid", "unknown"]


@attrs.frozen
class CheckerResult:
    """One checker's line of the verdict: its ``status``, how many records it ``checked``,
    its violations by kind (``counts``) and anything else worth keeping (``figures``)."""

    name: str
    status: Status
    checked: int
    counts: Mapping[str, int]
    figures: Mapping[str, Any] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As a JSON-able map."""
        return {"type": "checker", **attrs.asdict(self, recurse=False)}


@attrs.frozen
class Verdict:
    """What the lab's checkers concluded about one history (see the module header).

    ``system`` and ``meta`` say what ran; ``span`` the first and last instants recorded;
    ``ops`` the operations recorded; ``faults`` the faults injected by kind; ``checkers`` one
    line per checker; ``findings`` the example violations of all of them, in time order;
    ``reasons`` why the status is unknown."""

    status: Status
    system: str
    meta: Meta | None
    span: tuple[float, float]
    ops: int
    faults: Mapping[str, int]
    checkers: tuple[CheckerResult, ...]
    findings: tuple[Finding, ...]
    reasons: tuple[str, ...]
    linearizability: LinearizabilityResult
    locks: LockResult
    availability: AvailabilityResult

    @property
    def valid(self) -> bool:
        """True only when every checker passed."""
        return self.status == "valid"

    @property
    def counts(self) -> dict[str, int]:
        """Every violation kind of every checker with its full count."""
        total: Counter[str] = Counter()
        for c in self.checkers:
            total.update(c.counts)
        return dict(total)

    def to_json_lines(self) -> Iterator[dict[str, Any]]:
        """The verdict as JSON-able maps, one per line (see the module header)."""
        meta = self.meta
        yield {
            "type": "verdict",
            "status": self.status,
            "valid": self.valid,
            "system": self.system,
            "nodes": list(meta.nodes) if meta else [],
            "seed": meta.seed if meta else None,
            "span": list(self.span),
            "ops": self.ops,
            "faults": dict(self.faults),
            "counts": self.counts,
            "reasons": list(self.reasons),
        }
        for c in self.checkers:
            yield c.to_json()
        for f in self.findings:
            yield {"type": "finding", **f.to_json()}
        for w in self.availability.windows:
            yield {"type": "window", **w.to_json()}
        scopes = [*self.availability.by_kind.items(), ("none", self.availability.baseline)]
        for kind, counts in scopes:
            yield {
                "type": "availability",
                "kind": kind,
                "counts": {w: c.to_json() for w, c in counts.items()},
            }


def _span(history: History) -> tuple[float, float]:
    times = [op.invoke for op in history.ops] + [op.complete or op.invoke for op in history.ops]
    times += [h.start for h in history.holds] + [h.end for h in history.holds]
    times += [w.time for w in history.writes]
    times += [f.start for f in history.faults] + [f.end for f in history.faults if f.end]
    return (min(times), max(times)) if times else (0.0, 0.0)


def _linear_findings(result: LinearizabilityResult) -> list[Finding]:
    out = []
    for w in result.witnesses:
        records = (*w.prefix_tail, w.blocker, *w.candidates)
        out.append(
            Finding(
                "linearizability",
                "nonlinearizable",
                w.key,
                w.blocker.complete if w.blocker.complete is not None else w.blocker.invoke,
                w.explanation,
                tuple(map(record_json, records)),
            )
        )
    return out


def check(
    history: History,
    *,
    max_states: int = DEFAULT_MAX_STATES,
    time_limit: float | None = None,
) -> Verdict:
    """Run every checker over ``history`` (see the module header). ``max_states`` and
    ``time_limit`` bound the linearizability search (per key, and in all); ValueError names
    a malformed register operation."""
    linear = check_register(history.ops, max_states=max_states, time_limit=time_limit)
    locks = check_locks(history)
    availability = check_availability(history)
    reasons = [f"linearizability of {k.key!r}: {k.reason}" for k in linear.keys if k.reason]
    linear_counts = {"nonlinearizable": len(linear.witnesses)} if linear.witnesses else {}
    checkers = (
        CheckerResult(
            "linearizability",
            linear.verdict,
            linear.ops,
            linear_counts,
            {"keys": [k.to_json() for k in linear.keys]},
        ),
        CheckerResult(
            "locks",
            locks.status,
            locks.checked,
            dict(locks.counts),
            {
                "locks": locks.locks,
                "grants": locks.grants,
                "holds": locks.holds,
                "writes": locks.writes,
                "refused": locks.refused,
                "overlaps": locks.overlaps,
                "overlaps_caught": locks.overlaps_caught,
                "overlaps_past_guarantee": locks.overlaps_past_guarantee,
            },
        ),
    )
    statuses = {c.status for c in checkers}
    if not linear.ops and not locks.checked:
        reasons.append("nothing to check: no register operations, grants, holds or writes")
        statuses.add("unknown")
    status: Status = (
        "invalid" if "invalid" in statuses else "unknown" if "unknown" in statuses else "valid"
    )
    findings = sorted([*_linear_findings(linear), *locks.findings], key=lambda f: f.time)
    meta = history.meta
    return Verdict(
        status=status,
        system=meta.system if meta is not None else "?",
        meta=meta,
        span=_span(history),
        ops=len(history.ops),
        faults=dict(sorted(Counter(f.kind for f in history.faults).items())),
        checkers=checkers,
        findings=tuple(findings),
        reasons=tuple(reasons),
        linearizability=linear,
        locks=locks,
        availability=availability,
    )
