"""The verdict over a whole history: every checker folded into one frozen answer, valid only
when all passed and something was checked, written as strict JSON lines."""

from __future__ import annotations

import json

import attrs
import pytest
from lab_histories import FAULTS, lab_history

from lockbench.faults import History, Op, Verdict, check


def test_a_clean_lab_run_is_valid() -> None:
    """The simulated run without faults of the system's own making: valid, every checker
    ran, the faults counted by kind and the span covers the run."""
    h = lab_history()
    verdict = check(h)
    assert verdict.status == "valid" and verdict.valid
    assert [c.name for c in verdict.checkers] == ["linearizability", "locks"]
    assert all(c.status == "valid" and c.checked > 0 for c in verdict.checkers)
    assert verdict.faults == {"clock-step": 1, "isolate": 1, "kill-replica": 1}
    assert verdict.span[0] < 1.0 and verdict.span[1] > 99.0
    assert verdict.ops == len(h.ops) and verdict.system == "lockserver"
    assert verdict.findings == () and verdict.counts == {} and verdict.reasons == ()


def test_violations_of_every_checker_make_it_invalid() -> None:
    """A double grant under the partition and a stale read: invalid, with each kind counted
    and examples in time order."""
    verdict = check(lab_history("etcd", double_grant=True, stale_read=True))
    assert verdict.status == "invalid" and not verdict.valid
    assert set(verdict.counts) == {
        "nonlinearizable",
        "exclusive-overlap",
        "granted-during-guarantee",
    }
    times = [f.time for f in verdict.findings]
    assert times == sorted(times)
    (stale,) = [f for f in verdict.findings if f.kind == "nonlinearizable"]
    assert stale.key == "k0" and stale.checker == "linearizability"
    assert any(r["process"] == "r9" for r in stale.records)


def test_a_search_bound_makes_it_unknown_and_says_why() -> None:
    """Never a silent pass: the key whose search was cut short is named."""
    verdict = check(lab_history(), max_states=5)
    assert verdict.status == "unknown" and not verdict.valid
    assert verdict.reasons and all("search bound hit: 5 states" in r for r in verdict.reasons)


def test_invalid_wins_over_unknown() -> None:
    """A violation found is reported even when another part could not be decided."""
    verdict = check(lab_history(double_grant=True), max_states=5)
    assert verdict.status == "invalid" and verdict.reasons


def test_nothing_to_check_is_unknown() -> None:
    """An empty history (or one holding only faults) never passes."""
    empty = History(None, (), (), (), FAULTS)
    verdict = check(empty)
    assert verdict.status == "unknown" and verdict.system == "?"
    assert verdict.reasons == ("nothing to check: no register operations, grants, holds or writes",)


def test_a_malformed_register_operation_is_an_error_not_a_verdict() -> None:
    """The history is not judged when a register op cannot be read."""
    bad = Op("p", "register", "cas", "k", 7, 0, 1, "ok")
    with pytest.raises(ValueError, match="a cas needs value"):
        check(History(None, (bad,), (), (), ()))


def test_the_verdict_is_frozen_and_strict_json_lines() -> None:
    """Every line is a JSON object (no NaN or infinity), typed; the first is the verdict."""
    verdict = check(lab_history("etcd", double_grant=True, stale_read=True))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        verdict.status = "valid"  # type: ignore[misc]
    lines = list(verdict.to_json_lines())
    text = [json.dumps(line, allow_nan=False) for line in lines]
    back = [json.loads(t) for t in text]
    assert back[0]["type"] == "verdict" and back[0]["status"] == "invalid"
    assert back[0]["counts"] == verdict.counts and back[0]["system"] == "etcd"
    kinds = [line["type"] for line in back]
    assert kinds.count("checker") == 2
    assert kinds.count("finding") == len(verdict.findings)
    assert kinds.count("window") == len(FAULTS)
    assert kinds.count("availability") == 4  # three kinds and "none"
    checker = next(line for line in back if line.get("name") == "locks")
    assert checker["figures"]["overlaps"] == verdict.locks.overlaps


def test_verdict_is_the_public_type() -> None:
    """check returns the package's Verdict."""
    assert isinstance(check(lab_history(duration=5.0)), Verdict)


def test_the_checkers_are_the_packages_public_names() -> None:
    """``lockbench.faults`` re-exports the checkers' names (the lab adds its own beside them),
    each importable from the package."""
    import lockbench.faults

    names = {
        "AvailabilityResult",
        "CheckerResult",
        "Counts",
        "FaultWindow",
        "Finding",
        "GUARANTEE_FIELD",
        "KeyResult",
        "LinearizabilityResult",
        "LockResult",
        "Recovery",
        "ReportFiles",
        "Verdict",
        "Witness",
        "check",
        "check_main",
        "check_register",
        "write_report",
    }
    assert names <= set(lockbench.faults.__all__)
    for name in lockbench.faults.__all__:
        assert getattr(lockbench.faults, name) is not None
    assert lockbench.faults.GUARANTEE_FIELD == "valid_until"
