"""Availability under faults: operations by outcome per fault window, per kind (windows merged)
and outside every fault, and the recovery of the clients a fault left down."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lockbench.faults import Counts, Fault, History, Op
from lockbench.faults._availability import ALL, check_availability, client_of


def op(
    process: str,
    invoke: float,
    complete: float | None,
    outcome: str = "ok",
    workload: str = "register",
) -> Op:
    return Op(process, workload, "write", "k", 1, invoke, complete, outcome)  # type: ignore[arg-type]


def history(ops: Sequence[Op], faults: Sequence[Fault]) -> History:
    return History(None, tuple(ops), (), (), tuple(faults))


def test_counts_share_is_ok_over_completed() -> None:
    """Unknown outcomes stand beside the share, never in it; no completed op, no share."""
    assert Counts(3, 1, 5).share == 0.75
    assert (Counts(3, 1, 5).completed, Counts(3, 1, 5).total) == (4, 9)
    assert Counts(0, 0, 2).share is None
    assert Counts(1, 1, 0).to_json() == {"ok": 1, "fail": 1, "unknown": 0, "share": 0.5}


def test_operations_count_in_the_window_they_were_invoked_in() -> None:
    """Per window, per workload and all together; [start, end) by invoke time."""
    ops = [
        op("a", 0.5, 0.6),  # before
        op("a", 1.0, 1.1),  # at the start: in
        op("b", 1.5, 3.0, "fail"),
        op("c", 1.6, None, "unknown", "mutex"),
        op("a", 2.0, 2.1),  # at the end: out
    ]
    result = check_availability(history(ops, [Fault("isolate", ("n1",), 1.0, 2.0)]))
    (window,) = result.windows
    assert window.counts[ALL] == Counts(1, 1, 1)
    assert window.counts["register"] == Counts(1, 1, 0)
    assert window.counts["mutex"] == Counts(0, 0, 1)
    assert result.by_kind["isolate"][ALL] == Counts(1, 1, 1)
    assert result.baseline[ALL] == Counts(2, 0, 0)


def test_windows_of_one_kind_are_merged_so_an_op_counts_once() -> None:
    """Two overlapping isolates count their shared operations once for the kind, and once in
    each window; a kill window beside them counts on its own."""
    ops = [op("a", t, t + 0.1) for t in (1.0, 2.5, 4.5, 7.0)]
    faults = [
        Fault("isolate", ("n1",), 0.0, 3.0),
        Fault("isolate", ("n2",), 2.0, 5.0),
        Fault("kill", ("n3",), 4.0, 6.0),
    ]
    result = check_availability(history(ops, faults))
    assert [w.counts[ALL].ok for w in result.windows] == [2, 2, 1]
    assert result.by_kind["isolate"][ALL].ok == 3
    assert result.by_kind["kill"][ALL].ok == 1
    assert result.baseline[ALL].ok == 1


def test_an_open_fault_lasts_to_the_end_of_the_history() -> None:
    """A fault never healed covers everything after its start."""
    ops = [op("a", 1.0, 1.1), op("a", 5.0, 9.0, "fail")]
    result = check_availability(history(ops, [Fault("pause", ("n1",), 2.0, None)]))
    (window,) = result.windows
    assert window.end == 9.0 and window.counts[ALL] == Counts(0, 1, 0)
    assert result.baseline[ALL] == Counts(1, 0, 0)


def test_recovery_counts_the_clients_down_at_the_heal() -> None:
    """a's last op before the heal timed out (renamed a.1 afterwards, still client a), b's
    was still running at the heal, c was fine throughout: a is back 0.5 s after, b 1.0 s
    after; first 0.5, last 1.0, two affected."""
    ops = [
        op("a", 1.0, 3.0, "unknown"),
        op("a.1", 4.0, 10.5),
        op("b", 8.0, 11.0),
        op("c", 9.0, 9.1),
        op("c", 10.1, 10.2),
    ]
    result = check_availability(history(ops, [Fault("isolate", ("n1",), 2.0, 10.0)]))
    (window,) = result.windows
    recovery = window.recovery[ALL]
    assert recovery.affected == 2
    assert (recovery.first, recovery.last) == pytest.approx((0.5, 1.0))


def test_a_client_never_back_leaves_last_none() -> None:
    """One of two down clients had no ok afterwards: first is known, last is None."""
    ops = [
        op("a", 1.0, 3.0, "fail"),
        op("a", 10.5, 10.6),
        op("b", 1.0, 3.0, "fail"),
        op("b", 10.5, 10.6, "fail"),
    ]
    result = check_availability(history(ops, [Fault("kill", ("n1",), 2.0, 10.0)]))
    recovery = result.windows[0].recovery[ALL]
    assert recovery.affected == 2 and recovery.last is None
    assert recovery.first == pytest.approx(0.6)


def test_a_fault_that_hurt_no_one_recovers_at_once() -> None:
    """Clients that succeeded through the fault, or were idle since before it, are not
    counted."""
    ops = [op("idle", 0.0, 0.1), op("a", 5.0, 5.1), op("a", 10.2, 10.3)]
    result = check_availability(history(ops, [Fault("clock-step", ("n1",), 2.0, 10.0)]))
    assert result.windows[0].recovery[ALL].affected == 0
    assert result.windows[0].recovery[ALL].last == 0.0
    assert result.recoveries("clock-step")[0].first == 0.0


def test_recovery_is_per_workload_too() -> None:
    """The register's clients and the mutex's recover on their own clocks."""
    ops = [
        op("r", 1.0, 3.0, "unknown"),
        op("r", 10.2, 10.3),
        op("m", 1.0, 3.0, "fail", "mutex"),
        op("m", 12.0, 12.5, "ok", "mutex"),
    ]
    result = check_availability(history(ops, [Fault("isolate", ("n1",), 2.0, 10.0)]))
    rec = result.windows[0].recovery
    assert rec["register"].last == pytest.approx(0.3)
    assert rec["mutex"].last == pytest.approx(2.5)
    assert rec[ALL].last == pytest.approx(2.5)
    assert [r.affected for r in result.recoveries("isolate", "mutex")] == [1]


def test_client_names_strip_only_renaming_suffixes() -> None:
    """``name.N`` (any depth) is ``name``; other dots stay."""
    assert client_of("c1-reg0") == "c1-reg0"
    assert client_of("c1-reg0.1") == "c1-reg0"
    assert client_of("c1-reg0.1.12") == "c1-reg0"
    assert client_of("host.example") == "host.example"


def test_no_faults_and_no_ops_are_fine() -> None:
    """An empty history has empty figures."""
    result = check_availability(history([], []))
    assert result.windows == () and result.by_kind == {} and result.baseline == {}
