"""The workload generators: seeded, reproducible, and shaped as their names promise."""

from __future__ import annotations

import itertools

import pytest

from lockbench._workloads import (
    MDS_PATIENTS,
    MULTI_SIZE,
    WORKLOADS,
    OpKind,
    WorkloadParams,
    op_stream,
    take,
)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_same_seed_same_sequence(workload: str) -> None:
    """Two streams with the same (workload, seed, task) yield identical ops."""
    a = take(op_stream(workload, WorkloadParams(seed=7), 3), 500)
    b = take(op_stream(workload, WorkloadParams(seed=7), 3), 500)
    assert a == b


@pytest.mark.parametrize("workload", [w for w in WORKLOADS if w != "ping"])
def test_different_seed_different_sequence(workload: str) -> None:
    """Changing the seed changes the key/op sequence (ping has no keys to vary)."""
    a = take(op_stream(workload, WorkloadParams(seed=1), 0), 200)
    b = take(op_stream(workload, WorkloadParams(seed=2), 0), 200)
    assert [op.keys for op in a] != [op.keys for op in b]


@pytest.mark.parametrize("workload", [w for w in WORKLOADS if w != "ping"])
def test_tasks_differ(workload: str) -> None:
    """Each task has its own stream."""
    a = take(op_stream(workload, WorkloadParams(seed=1), 0), 200)
    b = take(op_stream(workload, WorkloadParams(seed=1), 1), 200)
    assert a != b


def test_tickets_are_unique_and_reproducible() -> None:
    """Tickets name the task and the cycle: unique within and across tasks."""
    ops = take(op_stream("mutex-contended", WorkloadParams(), 5), 100)
    assert [op.ticket for op in ops] == [f"t5.{n}" for n in range(100)]


def test_uncontended_keys_are_private_and_windowed_distinct() -> None:
    """mutex-uncontended: keys belong to the task and any K consecutive ops are distinct."""
    keys = 50
    ops = take(op_stream("mutex-uncontended", WorkloadParams(keys=keys), 2), 3 * keys)
    assert all(op.kind is OpKind.MUTEX and op.keys[0].startswith("u2:") for op in ops)
    for start in range(len(ops) - keys):
        window = [op.keys[0] for op in ops[start : start + keys]]
        assert len(set(window)) == keys
    other = take(op_stream("mutex-uncontended", WorkloadParams(keys=keys), 3), keys)
    assert not {op.keys for op in ops} & {op.keys for op in other}


def test_contended_keys_are_shared_and_bounded() -> None:
    """mutex-contended: every task draws from the same K hot keys."""
    seen = set()
    for task in range(4):
        for op in take(op_stream("mutex-contended", WorkloadParams(keys=3), task), 200):
            seen.add(op.keys[0])
    assert seen == {"hot:0", "hot:1", "hot:2"}


def test_rwlock_write_ratio() -> None:
    """rwlock: the share of writers follows --write-ratio (0 and 1 are exact)."""
    ops = take(op_stream("rwlock", WorkloadParams(write_ratio=0.25), 0), 4000)
    writers = sum(op.kind is OpKind.WRITE for op in ops)
    assert 800 < writers < 1200
    assert {
        op.kind for op in take(op_stream("rwlock", WorkloadParams(write_ratio=0.0), 0), 100)
    } == {OpKind.READ}
    assert {
        op.kind for op in take(op_stream("rwlock", WorkloadParams(write_ratio=1.0), 0), 100)
    } == {OpKind.WRITE}


def test_multilock_takes_distinct_sorted_sets() -> None:
    """multilock: each op names MULTI_SIZE distinct keys in a canonical (sorted) order."""
    for op in take(op_stream("multilock", WorkloadParams(keys=8), 0), 300):
        assert op.kind is OpKind.MULTI
        assert len(op.keys) == MULTI_SIZE == len(set(op.keys))
        assert list(op.keys) == sorted(op.keys, key=lambda k: int(k.split(":")[1]))


def test_multilock_needs_enough_keys() -> None:
    """Fewer keys than a set needs is refused up front."""
    with pytest.raises(ValueError, match="--keys >= 4"):
        op_stream("multilock", WorkloadParams(keys=3), 0)


def test_mds_mix_and_shapes() -> None:
    """mds: mostly entries, some reviews, rare month-ends; month-end names only a facility."""
    ops = take(op_stream("mds", WorkloadParams(keys=4), 0), 5000)
    counts = {k: sum(op.kind is k for op in ops) for k in (OpKind.MDS_ENTRY, OpKind.MDS_REVIEW)}
    month_end = [op for op in ops if op.kind is OpKind.MDS_MONTH_END]
    assert counts[OpKind.MDS_ENTRY] > 3500
    assert 500 < counts[OpKind.MDS_REVIEW] < 1300
    assert 30 < len(month_end) < 200
    assert all(len(op.keys) == 1 for op in month_end)
    patients = {op.keys[1] for op in ops if len(op.keys) == 2}
    assert patients <= {f"P{i}" for i in range(MDS_PATIENTS)}
    assert {op.keys[0] for op in ops} == {"F0", "F1", "F2", "F3"}


def test_ping_has_no_keys() -> None:
    """ping ops lock nothing."""
    assert all(
        op.kind is OpKind.PING and op.keys == ()
        for op in itertools.islice(op_stream("ping", WorkloadParams(), 0), 10)
    )


def test_unknown_workload_and_bad_params() -> None:
    """Unknown names and out-of-range knobs are refused with the knob's name."""
    with pytest.raises(ValueError, match="unknown workload"):
        op_stream("nope", WorkloadParams(), 0)
    with pytest.raises(ValueError, match="--keys"):
        WorkloadParams(keys=0)
    with pytest.raises(ValueError, match="--write-ratio"):
        WorkloadParams(write_ratio=1.5)
