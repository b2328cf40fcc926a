"""The lab's lock checkers: the interval rules (carried over from lockbench.safety with full
counts), overlapping holds classified by fences and guarantees, fences over grants, grants made
while the previous holder's guarantee ran, and the fenced resource's own view."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from lockbench.faults import History, Op, ResourceWrite
from lockbench.faults._locks import check_locks, guarantee_of
from lockbench.safety import MAX_EXAMPLES, Interval


def history(
    ops: Sequence[Op] = (),
    holds: Sequence[Interval] = (),
    writes: Sequence[ResourceWrite] = (),
) -> History:
    return History(None, tuple(ops), tuple(holds), tuple(writes), ())


def grant(
    process: str,
    fence: int,
    invoke: float,
    complete: float,
    valid_until: float | None = None,
    mode: str | None = None,
    key: str = "L",
    workload: str = "mutex",
) -> Op:
    value: dict[str, Any] = {}
    if valid_until is not None:
        value["valid_until"] = valid_until
    if mode is not None:
        value["mode"] = mode
    return Op(process, workload, "acquire", key, value or None, invoke, complete, "ok", fence)


def release(process: str, invoke: float, key: str = "L", workload: str = "mutex") -> Op:
    return Op(process, workload, "release", key, None, invoke, invoke + 0.01, "ok")


def test_a_clean_mutex_history_is_valid() -> None:
    """Grants in turn, each released before the next, fences growing, resource writes in
    order: nothing to report, and everything counted."""
    ops, holds, writes = [], [], []
    for n in range(10):
        t = float(n)
        ops += [grant(f"c{n % 3}", 10 + n, t, t + 0.1, t + 5), release(f"c{n % 3}", t + 0.5)]
        holds.append(Interval("L", "w", t + 0.1, t + 0.5, 10 + n, f"c{n % 3}"))
        writes.append(ResourceWrite("L", f"c{n % 3}", 10 + n, t + 0.2, True, 9 + n if n else None))
    result = check_locks(history(ops, holds, writes))
    assert result.status == "valid" and result.counts == {} and result.findings == ()
    assert (result.grants, result.holds, result.writes, result.refused) == (10, 10, 10, 0)
    assert result.overlaps == 0 and result.locks == 1 and result.checked == 30


def test_overlapping_holds_with_distinct_fences_are_caught_by_fences() -> None:
    """Two writers at once is a violation; with distinct fences a fenced resource would have
    refused the stale one, and the pair is counted as caught."""
    holds = [Interval("L", "w", 0, 2, 1, "a"), Interval("L", "w", 1, 3, 2, "b")]
    result = check_locks(history(holds=holds))
    assert result.status == "invalid"
    assert result.counts == {"exclusive-overlap": 1}
    assert (result.overlaps, result.overlaps_caught, result.overlaps_past_guarantee) == (1, 1, 0)
    (finding,) = result.findings
    assert finding.kind == "exclusive-overlap" and finding.time == 1
    assert [r["holder"] for r in finding.records] == ["b", "a"]


@pytest.mark.parametrize(("fa", "fb"), [(1, 1), (None, None), (1, None)])
def test_overlaps_without_distinct_fences_are_not_caught(fa: int | None, fb: int | None) -> None:
    """Equal or missing fences: nothing downstream can tell the stale holder."""
    holds = [Interval("L", "w", 0, 2, fa, "a"), Interval("L", "w", 1, 3, fb, "b")]
    result = check_locks(history(holds=holds))
    assert (result.overlaps, result.overlaps_caught) == (1, 0)
    assert result.counts["exclusive-overlap"] == 1


def test_an_overlap_after_the_older_holders_guarantee_is_classified_so() -> None:
    """The older holder (smaller fence) kept going past its own valid_until: the overlap
    still counts, and is classified as past the guarantee."""
    ops = [grant("a", 1, 0, 0.1, valid_until=1.0), grant("b", 2, 1.4, 1.5, valid_until=5)]
    holds = [Interval("L", "w", 0.1, 3, 1, "a"), Interval("L", "w", 1.5, 4, 2, "b")]
    result = check_locks(history(ops, holds))
    assert (result.overlaps, result.overlaps_caught, result.overlaps_past_guarantee) == (1, 1, 1)
    assert "granted-during-guarantee" not in result.counts


def test_touching_holds_do_not_overlap() -> None:
    """One ends at the very instant the next begins."""
    holds = [Interval("L", "w", 0, 1, 1, "a"), Interval("L", "w", 1, 2, 2, "b")]
    assert check_locks(history(holds=holds)).status == "valid"


def test_readers_writer_and_semaphore_rules_come_from_safety() -> None:
    """A reader beside a writer, a third holder of a two-permit semaphore, readers together
    (fine): each counted under safety's kind."""
    holds = [
        Interval("RW", "r", 0, 2, 1, "r1"),
        Interval("RW", "r", 0.5, 2, 2, "r2"),
        Interval("RW", "w", 1, 3, 3, "w1"),
        Interval("S", "s", 0, 2, 1, "s1", 2),
        Interval("S", "s", 0, 2, 2, "s2", 2),
        Interval("S", "s", 1, 2, 3, "s3", 2),
    ]
    result = check_locks(history(holds=holds))
    assert result.counts == {"reader-writer-overlap": 1, "over-capacity": 1}
    assert result.overlaps == 2  # the writer with each reader; readers do not conflict


def test_counts_are_complete_past_the_examples_safety_keeps() -> None:
    """safety keeps MAX_EXAMPLES examples per lock; the count carried over is the full one."""
    holds = [Interval("L", "w", 0, 100, 0, "long")]
    holds += [Interval("L", "w", 1 + i, 1.5 + i, 1 + i, f"c{i}") for i in range(MAX_EXAMPLES + 10)]
    result = check_locks(history(holds=holds))
    assert result.counts["exclusive-overlap"] == MAX_EXAMPLES + 10
    assert len([f for f in result.findings if f.kind == "exclusive-overlap"]) == MAX_EXAMPLES


# --- grants during a guarantee ----------------------------------------------------------------


def test_a_grant_before_the_previous_guarantee_ran_out_is_a_violation() -> None:
    """a holds until 10 (guarantee) and sends no release before 12; b is granted by 5."""
    ops = [
        grant("a", 1, 0, 0.1, valid_until=10.0),
        release("a", 12.0),
        grant("b", 2, 4, 5, valid_until=15.0),
    ]
    result = check_locks(history(ops))
    assert result.counts == {"granted-during-guarantee": 1}
    (finding,) = result.findings
    assert finding.time == 5 and "a guarantee until 10.000000" in finding.detail
    assert [r["process"] for r in finding.records] == ["a", "b"]


@pytest.mark.parametrize(
    ("valid_until", "released", "b_complete"),
    [
        (10.0, 4.0, 5.0),  # a had sent its release before b's grant: it may have been applied
        (4.9, 12.0, 5.0),  # a's guarantee had run out
        (None, 12.0, 5.0),  # no guarantee recorded: not judged
        (10.0, 12.0, 10.0),  # granted exactly when the guarantee ran out
    ],
)
def test_grants_that_the_contract_allows_are_not_flagged(
    valid_until: float | None, released: float, b_complete: float
) -> None:
    """Only a grant that certainly happened while a's guarantee ran and before a let go."""
    ops = [
        grant("a", 1, 0, 0.1, valid_until=valid_until),
        release("a", released),
        grant("b", 2, b_complete - 1, b_complete, valid_until=20.0),
    ]
    assert check_locks(history(ops)).counts == {}


def test_the_guarantee_rule_follows_modes() -> None:
    """Reader after writer and writer after reader conflict; readers together do not;
    semaphore slots are left to the capacity rule. The mode comes from the acquire's value,
    else from the hold with the same fence."""

    def case(first: str, second: str) -> dict[str, int]:
        ops = [
            grant("a", 1, 0, 0.1, 10.0, first if first != "hold-w" else None, "RW", "rw"),
            grant("b", 2, 4, 5, 20.0, second, "RW", "rw"),
        ]
        holds = [Interval("RW", "w", 0.1, 8.0, 1, "a")] if first == "hold-w" else []
        return dict(check_locks(history(ops, holds)).counts)

    assert case("w", "r") == {"granted-during-guarantee": 1}
    assert case("r", "w") == {"granted-during-guarantee": 1}
    assert case("hold-w", "r") == {"granted-during-guarantee": 1}
    assert case("r", "r") == {}
    assert case("s", "s") == {}


def test_a_release_by_another_process_does_not_end_a_guarantee() -> None:
    """Releases are matched to the holder by process and lock."""
    ops = [
        grant("a", 1, 0, 0.1, valid_until=10.0),
        release("z", 1.0),
        release("a", 1.0, key="other"),
        grant("b", 2, 4, 5),
    ]
    assert check_locks(history(ops)).counts == {"granted-during-guarantee": 1}


def test_guarantee_of_reads_only_a_finite_number() -> None:
    """Anything else in the value is "not recorded"."""
    for value, expected in [
        ({"valid_until": 3}, 3.0),
        ({"valid_until": 2.5}, 2.5),
        ({"valid_until": True}, None),
        ({"valid_until": "3"}, None),
        ({"valid_until": float("inf")}, None),
        ([3], None),
        (None, None),
    ]:
        op = Op("a", "mutex", "acquire", "L", value, 0, 1, "ok", 1)
        assert guarantee_of(op) == expected


# --- fences over grants -----------------------------------------------------------------------


def test_a_later_grant_with_a_smaller_fence_is_a_violation() -> None:
    """b was asked for after a's grant completed, yet carries a smaller fence."""
    ops = [grant("a", 5, 0, 1), grant("b", 3, 2, 3)]
    result = check_locks(history(ops))
    assert result.counts == {"grant-fence-order": 1}


def test_concurrent_grants_may_carry_fences_in_either_order() -> None:
    """b was asked for before a's grant completed: no order is implied."""
    ops = [grant("a", 5, 0, 1), grant("b", 3, 0.5, 3)]
    assert check_locks(history(ops)).counts == {}


def test_two_grants_with_one_fence_are_a_violation() -> None:
    """A fence names one grant of a lock."""
    ops = [grant("a", 5, 0, 1), grant("b", 5, 0.5, 3)]
    result = check_locks(history(ops))
    assert result.counts == {"grant-duplicate-fence": 1}


def test_register_ops_and_ungranted_acquires_are_not_lock_grants() -> None:
    """Only ok acquires with a fence are grants."""
    ops = [
        Op("r", "register", "write", "L", 1, 0, 1, "ok", 7),
        Op("a", "mutex", "acquire", "L", None, 0, 1, "fail", None),
        Op("b", "mutex", "acquire", "L", None, 0, None, "unknown", None),
    ]
    result = check_locks(history(ops))
    assert result.grants == 0 and result.status == "valid"


# --- the resource's view ----------------------------------------------------------------------


def test_refused_writes_are_counted_not_violations() -> None:
    """A stale holder's write refused is the fence doing its job."""
    writes = [
        ResourceWrite("L", "b", 2, 1.0, True, None),
        ResourceWrite("L", "a", 1, 1.5, False, 2),
    ]
    result = check_locks(history(writes=writes))
    assert result.status == "valid" and result.refused == 1
    (refusal,) = result.refusals
    assert refusal.kind == "refused-write" and "fence 1 (highest seen 2)" in refusal.detail


def test_interleaved_accepted_writes_are_a_violation() -> None:
    """The resource took a's write, then b's, then a's again (same grant): both wrote at once
    where it matters."""
    writes = [
        ResourceWrite("L", "a", 3, 1.0, True, None),
        ResourceWrite("L", "b", 3, 1.5, True, 3),
        ResourceWrite("L", "a", 3, 2.0, True, 3),
    ]
    result = check_locks(history(writes=writes))
    assert result.counts == {"resource-interleaved": 1}


def test_a_new_grant_of_the_same_holder_is_not_an_interleaving() -> None:
    """a, then b, then a again under a newer grant (a larger fence): serial."""
    writes = [
        ResourceWrite("L", "a", 1, 1.0, True, None),
        ResourceWrite("L", "b", 2, 1.5, True, 1),
        ResourceWrite("L", "a", 3, 2.0, True, 2),
    ]
    assert check_locks(history(writes=writes)).counts == {}


@pytest.mark.parametrize(
    ("fence", "highest", "accepted"),
    [(1, 2, True), (2, 2, False), (3, 2, False)],
)
def test_a_resource_breaking_its_own_rule_is_reported(
    fence: int, highest: int, accepted: bool
) -> None:
    """Accepting a fence below the highest, or refusing one at least the highest, is a bug
    in the lab's resource, reported as such."""
    writes = [ResourceWrite("L", "a", fence, 1.0, accepted, highest)]
    assert check_locks(history(writes=writes)).counts == {"resource-inconsistent": 1}


def test_a_release_belongs_to_the_grant_it_follows() -> None:
    """a's first grant has no release of its own (a released only after its second grant):
    the end of the first grant's hold stands in for it, so b's grant after that hold is
    fine; without the hold the first grant is never let go, and b's grant is flagged."""
    ops = [
        grant("a", 1, 0, 0.1, valid_until=10.0),
        grant("a", 3, 6, 6.1, valid_until=16.0),
        release("a", 7.0),
        grant("b", 2, 4, 5),
    ]
    holds = [Interval("L", "w", 0.1, 2.0, 1, "a")]
    assert check_locks(history(ops, holds)).counts == {}
    flagged = check_locks(history(ops)).counts
    assert flagged["granted-during-guarantee"] == 1
