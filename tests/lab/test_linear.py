"""The register workload's linearizability checker: it accepts every history made from a real
sequential execution (hypothesis), agrees with a brute-force search on small random
histories, rejects each kind of violation (subtle ones built by hand) with a witness naming
the key and the operation that could not be placed, accepts the known tricky valid cases, and
ends in an explicit "unknown" when its search bound is hit."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockbench.faults import Op, check_register
from lockbench.faults._linear import describe_op


def op(
    process: str,
    f: str,
    value: Any,
    invoke: float,
    complete: float | None,
    outcome: str = "ok",
    key: str = "x",
) -> Op:
    return Op(process, "register", f, key, value, invoke, complete, outcome)  # type: ignore[arg-type]


# --- histories from a real sequential execution ---------------------------------------------


@st.composite
def linearizable(draw: st.DrawFn) -> list[Op]:
    """Operations applied one after another to a register per key, each at its own instant
    ``t``, then given a random window around ``t`` (wide windows make many concurrent); some
    outcomes become unknown (taken effect or not) or fail (not taken effect), unknown reads
    carry garbage. Values come from a small set so that repeats are common."""
    keys = draw(st.sampled_from([["x"], ["x", "y"], ["x", "y", "z"]]))
    n = draw(st.integers(min_value=0, max_value=40))
    values = st.integers(min_value=0, max_value=3) | st.none()
    state: dict[str, Any] = dict.fromkeys(keys)
    t = 0.0
    out: list[Op] = []
    for i in range(n):
        t += draw(st.sampled_from([0.001, 0.01, 0.1, 1.0]))
        key = draw(st.sampled_from(keys))
        left = draw(st.sampled_from([0.0, 0.0005, 0.05, 0.5, 3.0]))
        right = draw(st.sampled_from([0.0, 0.0005, 0.05, 0.5, 3.0]))
        invoke, complete = max(0.0, t - left), t + right
        f = draw(st.sampled_from(["read", "write", "cas"]))
        fate = draw(st.sampled_from(["ok", "ok", "ok", "unknown-applied", "unknown-not", "fail"]))
        p = f"p{i}"
        if f == "read":
            if fate in {"ok", "unknown-applied"}:
                out.append(op(p, "read", state[key], invoke, complete, key=key))
            else:
                outcome = "fail" if fate == "fail" else "unknown"
                out.append(op(p, "read", draw(values), invoke, complete, outcome, key))
        elif f == "write":
            v = draw(values)
            if fate in ("ok", "unknown-applied"):
                state[key] = v
            outcome = "ok" if fate == "ok" else "fail" if fate == "fail" else "unknown"
            gone = outcome == "unknown" and draw(st.booleans())
            out.append(op(p, "write", v, invoke, None if gone else complete, outcome, key))
        else:
            expected = state[key] if draw(st.booleans()) else draw(values)
            new = draw(values)
            matches = state[key] == expected
            if matches and fate in ("ok", "unknown-applied"):
                state[key] = new
                outcome = "ok" if fate == "ok" else "unknown"
            elif fate in {"ok", "fail"}:
                outcome = "fail"  # found another value, or refused: not taken effect
            else:
                outcome = "unknown"  # never took effect
            out.append(op(p, "cas", [expected, new], invoke, complete, outcome, key))
    return draw(st.permutations(out))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(linearizable())
def test_every_history_of_a_sequential_execution_is_accepted(history: list[Op]) -> None:
    """A history whose operations took effect one by one inside their windows is valid,
    whatever the overlap, the unknown outcomes (taken effect or not) and the order of the
    records."""
    result = check_register(history)
    assert result.verdict == "valid", [k.witness for k in result.keys]


# --- agreement with a brute-force search on small random histories --------------------------


def brute_force(ops: Sequence[Op]) -> bool:
    """Every order of the ok operations plus any subset of the unknown writes/cas that keeps
    real-time order (a completed before b began: a first), simulated on one register."""
    known = [o for o in ops if o.outcome == "ok"]
    maybe = [o for o in ops if o.outcome == "unknown" and o.f != "read"]
    for r in range(len(maybe) + 1):
        for subset in itertools.combinations(maybe, r):
            chosen = [*known, *subset]
            for order in itertools.permutations(chosen):
                if _respects_real_time(order) and _explains(order):
                    return True
    return False


def _respects_real_time(order: Sequence[Op]) -> bool:
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            if b.complete is not None and b.outcome == "ok" and b.complete < a.invoke:
                return False  # b finished before a began, yet a is placed first
    return True


def _explains(order: Sequence[Op]) -> bool:
    state: Any = None
    for o in order:
        if o.f == "read":
            if o.value != state:
                return False
        elif o.f == "write":
            state = o.value
        else:
            if state != o.value[0]:
                return False
            state = o.value[1]
    return True


@st.composite
def small_random(draw: st.DrawFn) -> list[Op]:
    """Up to 6 arbitrary operations on one key: values 0-2 or absent, windows anywhere in
    [0, 6], any outcome; valid and invalid alike."""
    n = draw(st.integers(min_value=1, max_value=6))
    values = st.integers(min_value=0, max_value=2) | st.none()
    out = []
    for i in range(n):
        invoke = float(draw(st.integers(min_value=0, max_value=5)))
        complete = invoke + draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
        f = draw(st.sampled_from(["read", "write", "cas"]))
        value: Any = [draw(values), draw(values)] if f == "cas" else draw(values)
        outcome = draw(st.sampled_from(["ok", "ok", "ok", "unknown", "fail"]))
        gone = outcome == "unknown" and draw(st.booleans())
        out.append(op(f"p{i}", f, value, invoke, None if gone else complete, outcome))
    return out


@settings(max_examples=600, deadline=None)
@given(small_random())
def test_the_checker_agrees_with_brute_force(history: list[Op]) -> None:
    """On small random histories (valid or not), the search says valid exactly when some
    order of the operations explains them."""
    result = check_register(history)
    assert (result.verdict == "valid") == brute_force(history), [describe_op(o) for o in history]


# --- violations built by hand ----------------------------------------------------------------


def rejected(history: Sequence[Op], key: str = "x") -> str:
    """Check, assert invalid on ``key`` only, return the explanation."""
    result = check_register(history)
    assert result.verdict == "invalid"
    bad = [k for k in result.keys if k.verdict == "invalid"]
    assert [k.key for k in bad] == [key]
    witness = bad[0].witness
    assert witness is not None and witness.key == key
    return witness.explanation


def test_a_stale_read_is_rejected() -> None:
    """A read that began after a write of 2 completed returns the 1 written before it."""
    explanation = rejected(
        [
            op("a", "write", 1, 0, 1),
            op("b", "write", 2, 2, 3),
            op("c", "read", 1, 4, 5),
        ]
    )
    assert "c read x -> 1" in explanation and "holds 2" in explanation


def test_a_lost_write_is_rejected() -> None:
    """A write acknowledged ok, and a read that began afterwards finds the key absent."""
    result = check_register([op("a", "write", 1, 0, 1), op("b", "read", None, 2, 3)])
    assert result.verdict == "invalid"
    witness = result.witnesses[0]
    assert witness.blocker.process == "b" and witness.state == 1


def test_a_cas_on_a_value_already_overwritten_is_rejected() -> None:
    """cas 1 -> 3 succeeds after 1 was overwritten by 2."""
    explanation = rejected(
        [
            op("a", "write", 1, 0, 1),
            op("b", "write", 2, 2, 3),
            op("c", "cas", [1, 3], 4, 5),
        ]
    )
    assert "expected 1" in explanation


def test_two_concurrent_cas_on_the_same_value_cannot_both_succeed() -> None:
    """Both found the key absent and both wrote: one of them must have seen the other."""
    rejected([op("a", "cas", [None, 1], 0, 1), op("b", "cas", [None, 2], 0.5, 1.5)])


def test_a_read_of_a_value_never_written_is_rejected() -> None:
    """The explanation says so in as many words."""
    explanation = rejected([op("a", "write", 1, 0, 1), op("b", "read", 99, 0.5, 2)])
    assert "99, a value no operation wrote" in explanation


def test_a_read_going_back_in_time_is_rejected_amid_other_keys() -> None:
    """Both reads overlap the write of 1, so each alone is fine, but the later one sees the
    key absent again after the earlier saw 1; busy traffic on other keys changes nothing
    and is not blamed."""
    noise = []
    for i in range(40):
        key = "yz"[i % 2]
        noise.append(op(f"n{i}", "write", i, i * 0.25, i * 0.25 + 0.3, key=key))
        noise.append(op(f"m{i}", "read", i, i * 0.25 + 0.31, i * 0.25 + 0.4, key=key))
    history = [
        op("w", "write", 1, 0, 10),
        op("r1", "read", 1, 1, 2),
        op("r2", "read", None, 3, 4),
        *noise,
    ]
    explanation = rejected(history)
    assert "r2 read x -> None" in explanation


def test_reads_disagreeing_on_the_order_of_two_concurrent_writes_are_rejected() -> None:
    """1 then 2 then 1 again: the writes each took effect once."""
    rejected(
        [
            op("a", "write", 1, 0, 10),
            op("b", "write", 2, 0, 10),
            op("c", "read", 1, 1, 2),
            op("d", "read", 2, 3, 4),
            op("e", "read", 1, 5, 6),
        ]
    )


def test_an_unknown_write_takes_effect_at_most_once() -> None:
    """The timed-out write of 1 was seen, then overwritten by 2: a later read of 1 would
    need it to take effect a second time."""
    rejected(
        [
            op("a", "write", 1, 0, None, "unknown"),
            op("b", "read", 1, 5, 6),
            op("c", "write", 2, 7, 8),
            op("d", "read", 1, 9, 10),
        ]
    )


def test_an_unknown_write_cannot_take_effect_before_it_was_invoked() -> None:
    """A read finds 1 before the (timed-out) write of 1 was even sent."""
    rejected([op("b", "read", 1, 0, 1), op("a", "write", 1, 2, None, "unknown")])


def test_a_failed_write_never_took_effect() -> None:
    """A write that certainly failed cannot explain a read of its value."""
    rejected([op("a", "write", 1, 0, 1, "fail"), op("b", "read", 1, 2, 3)])


def test_the_witness_lists_the_prefix_and_the_candidates() -> None:
    """The witness carries the longest linearizable prefix's length and last operations, the
    register's value after it, and the operations that could still have come first."""
    history = [
        op("a", "write", 1, 0, 1),
        op("b", "write", 2, 2, 3),
        op("c", "read", 2, 3.5, 4),
        op("d", "write", 3, 4.5, 6),
        op("e", "read", 1, 5, 7),
        op("f", "read", 7, 4.6, 10),
    ]
    (witness,) = check_register(history).witnesses
    assert witness.blocker.process == "e"
    assert witness.prefix_length == 4
    assert [o.process for o in witness.prefix_tail] == ["a", "b", "c", "d"]
    assert witness.state == 3
    assert [o.process for o in witness.candidates] == ["f"]
    assert witness.to_json()["blocker"]["process"] == "e"


# --- tricky valid histories ------------------------------------------------------------------


def test_an_unknown_write_observed_much_later_is_accepted() -> None:
    """A write that timed out at the start may take effect any time after it was sent: here
    just before a read a hundred seconds later, after other writes and reads."""
    history = [op("a", "write", 1, 0, None, "unknown")]
    for i in range(50):
        history.append(op("b", "write", 100 + i, 1 + 2 * i, 1.5 + 2 * i))
        history.append(op("c", "read", 100 + i, 1.6 + 2 * i, 2 + 2 * i))
    history.append(op("d", "read", 1, 101, 102))
    result = check_register(history)
    assert result.verdict == "valid"
    assert result.keys[0].unknown == 1


def test_concurrent_writes_may_be_read_in_either_order() -> None:
    """Two writes overlapping in time, read as 1 then 2 by one client and (in another
    history) as 2 then 1."""
    for first, second in [(1, 2), (2, 1)]:
        history = [
            op("a", "write", 1, 0, 10),
            op("b", "write", 2, 0, 10),
            op("c", "read", first, 1, 2),
            op("d", "read", second, 3, 4),
        ]
        assert check_register(history).verdict == "valid"


def test_an_unknown_write_that_never_took_effect_is_accepted() -> None:
    """A timed-out write of 1, then reads that never see it: it never happened."""
    history = [
        op("a", "write", 1, 0, 0.5, "unknown"),
        op("b", "read", None, 1, 2),
        op("c", "write", 2, 3, 4),
        op("d", "read", 2, 5, 6),
    ]
    result = check_register(history)
    assert result.verdict == "valid"
    assert result.keys[0].pruned == 1  # nothing ever observed 1


def test_touching_intervals_count_as_concurrent() -> None:
    """A read that began at the very instant a write completed may still precede it."""
    history = [op("a", "write", 1, 0, 1), op("b", "read", None, 1, 2)]
    assert check_register(history).verdict == "valid"


def test_an_unknown_cas_may_or_may_not_have_taken_effect() -> None:
    """A timed-out cas 1 -> 2: a read of 2 after it, and (in another history) of 1."""
    for seen in (1, 2):
        history = [
            op("a", "write", 1, 0, 1),
            op("b", "cas", [1, 2], 2, 3, "unknown"),
            op("c", "read", seen, 4, 5),
        ]
        assert check_register(history).verdict == "valid"


def test_other_workloads_are_ignored_and_an_empty_history_is_valid() -> None:
    """Only register operations are checked; nothing to check is valid with no keys."""
    lock = Op("c1", "mutex", "acquire", "L", None, 0, 1, "ok", fence=3)
    result = check_register([lock])
    assert result.verdict == "valid" and result.keys == () and result.ops == 0


# --- bad input and bounds ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("f", "value", "message"),
    [
        ("cas", 3, r"a cas needs value \[expected, new\]"),
        ("cas", [1, 2, 3], r"a cas needs value \[expected, new\]"),
        ("increment", 1, "the register workload has read, write and cas"),
    ],
)
def test_a_malformed_register_operation_is_named(f: str, value: Any, message: str) -> None:
    """A register op the model cannot read is a ValueError naming it, not a verdict."""
    with pytest.raises(ValueError, match=message):
        check_register([op("p7", f, value, 0, 1)])


def _hard_history(n: int) -> list[Op]:
    """n writes all concurrent, then a read of a value none wrote: the search must try
    many orders before it can say no."""
    history = [op(f"w{i}", "write", i, 0, 100) for i in range(n)]
    history += [op(f"r{i}", "read", i, 50 + 0.01 * i, 60) for i in range(n)]
    history.append(op("z", "read", -1, 200, 201))
    return history


def test_the_state_bound_ends_in_unknown_never_a_pass() -> None:
    """Past ``max_states`` configurations the key's verdict is unknown, saying which bound."""
    result = check_register(_hard_history(12), max_states=50)
    assert result.verdict == "unknown"
    (key,) = result.keys
    assert key.reason == "search bound hit: 50 states explored" and key.states == 50
    assert key.witness is None


def test_the_time_bound_ends_in_unknown_never_a_pass() -> None:
    """A clock that runs past the time limit mid-search stops it with "unknown"; keys not
    reached are unknown too."""
    ticks = itertools.count()

    def clock() -> float:
        return float(next(ticks))  # one second per look

    history = [*_hard_history(12), op("a", "write", 1, 0, 1, key="y")]
    result = check_register(history, time_limit=3.5, clock=clock)
    assert result.verdict == "unknown"
    reasons = {k.key: k.reason for k in result.keys}
    assert reasons["x"].startswith("search bound hit: time limit")
    assert reasons["y"] == "search bound hit: time limit reached before this key"


def test_max_states_must_be_positive() -> None:
    """A bound of 0 is misuse."""
    with pytest.raises(ValueError, match="max_states must be >= 1"):
        check_register([], max_states=0)


def test_an_invalid_key_wins_over_an_unknown_one() -> None:
    """One key invalid, another past its bound: the verdict is invalid."""
    history = [*_hard_history(12), op("a", "write", 1, 0, 1, key="y")]
    history.append(op("b", "read", 5, 2, 3, key="y"))
    result = check_register(history, max_states=50)
    assert result.verdict == "invalid"
    assert {k.key: k.verdict for k in result.keys} == {"x": "unknown", "y": "invalid"}
