"""The nemesis's plan and the firewall rules it writes, without a lab: a plan is the same for
a seed, keeps its faults inside the run and apart, draws every kind asked before repeating
one, shapes partitions as named, and leaves out against etcd what needs replicas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockbench.faults._nemesis import KINDS, REPLICA_ONLY, expand, plan
from lockbench.faults._netns import Rules

NODES3 = ["n1", "n2", "n3"]
NODES5 = ["n1", "n2", "n3", "n4", "n5"]


def test_plan_is_the_same_for_a_seed_and_differs_across_seeds() -> None:
    """Replaying a seed replays its faults (kinds, times, targets)."""
    a = plan(list(KINDS), NODES5, 600, seed=7)
    b = plan(list(KINDS), NODES5, 600, seed=7)
    c = plan(list(KINDS), NODES5, 600, seed=8)
    assert a == b
    assert a != c


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    duration=st.floats(30, 2000),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=5, unique=True),
    five=st.booleans(),
)
def test_faults_stay_inside_the_run_one_at_a_time(
    seed: int, duration: float, kinds: list[str], five: bool
) -> None:
    """Faults start after the warm-up, end before the cool-down, never overlap, and each
    lasts as drawn; at least one fault is planned."""
    faults = plan(kinds, NODES5 if five else NODES3, duration, seed, warmup=5, cooldown=10)
    assert faults
    previous_end = 0.0
    for f in faults:
        assert f.start >= 5.0
        assert f.end <= duration - 10 + 1e-9
        assert f.start < f.end
        assert f.start >= previous_end
        previous_end = f.end


def test_every_kind_comes_once_per_round() -> None:
    """In each run of len(kinds) consecutive faults, every kind asked appears exactly once."""
    kinds = list(KINDS)
    faults = plan(kinds, NODES5, 3 * 20 * len(kinds), seed=3)
    drawn = [f.kind for f in faults]
    for r in range(len(drawn) // len(kinds)):
        chunk = drawn[r * len(kinds) : (r + 1) * len(kinds)]
        assert sorted(chunk) == sorted(kinds)


@pytest.mark.parametrize("nodes", [NODES3, NODES5])
def test_partitions_have_their_shape(nodes: list[str]) -> None:
    """isolate: one node alone; majority: the minority is less than half; bridge: two halves
    and a middle node, together every node once."""
    faults = plan(["isolate", "majority", "bridge"], nodes, 400, seed=1)
    for f in faults:
        members = [n for g in f.groups for n in g]
        assert sorted(members) == sorted(nodes)
        if f.kind == "isolate":
            assert len(f.groups[0]) == 1
            assert f.targets == f.groups[0]
        elif f.kind == "majority":
            minority, majority = f.groups
            assert len(minority) < len(majority)
            assert len(minority) == (len(nodes) - 1) // 2
        else:
            *halves, middle = f.groups
            assert len(middle) == 1
            assert abs(len(halves[0]) - len(halves[1])) <= 1
            assert f.detail.endswith(f"(bridged by {middle[0]})")


def test_clock_faults_carry_a_signed_offset() -> None:
    """clock-step and clock-skew move one replica's clock by +-clock_offset."""
    faults = plan(["clock-step", "clock-skew"], NODES3, 400, seed=2, clock_offset=90)
    assert faults
    for f in faults:
        assert abs(f.offset) == 90
        assert len(f.targets) == 1


def test_expand_all_and_what_etcd_leaves_out() -> None:
    """'all' is every kind; against etcd the replica-only kinds are left out and named."""
    kinds, left = expand(["all"], "lockserver")
    assert kinds == list(KINDS)
    assert left == []
    kinds, left = expand(["isolate", "clock-step", "kill"], "etcd")
    assert kinds == ["isolate", "kill"]
    assert left == ["clock-step"]
    assert set(REPLICA_ONLY) <= set(KINDS)


def test_an_unknown_nemesis_is_refused_with_the_known_ones() -> None:
    """A typo names every known kind."""
    with pytest.raises(ValueError, match=r"unknown nemesis 'isolat'.*isolate"):
        expand(["isolat"], "lockserver")


def test_no_kinds_no_faults() -> None:
    assert plan([], NODES3, 100, seed=1) == []


def test_rules_render_partition_loss_and_the_etcd_cut() -> None:
    """The nftables script replaces the lab's table atomically and says each rule."""
    empty = Rules().render()
    assert empty.startswith("add table inet lab\ndelete table inet lab\n")
    assert "drop" not in empty
    text = Rules(blocked=frozenset({"10.77.0.2", "10.77.0.1"})).render()
    assert "ip saddr { 10.77.0.1, 10.77.0.2 } drop" in text
    assert "ip daddr { 10.77.0.1, 10.77.0.2 } drop" in text
    lossy = Rules(lossy=frozenset({"10.77.0.3"}), loss_percent=30).render()
    assert "ip saddr { 10.77.0.3 } numgen random mod 100 < 30 drop" in lossy
    assert "daddr" not in lossy  # one-way: only what comes in
    cut = Rules(cut_uid=64001).render()
    assert "meta skuid 64001 tcp dport 2379 ct mark set 0x4c" in cut
    assert cut.count("ct mark 0x4c drop") == 2  # both ways, established connections too


@pytest.mark.parametrize("sign", [1, -1])
def test_a_clock_direction_can_be_fixed(sign: int) -> None:
    """clock_sign +1 / -1 moves every clock fault's clock that way (a reproducible scenario)."""
    faults = plan(["clock-skew", "clock-step"], NODES3, 400, seed=4, clock_sign=sign)
    assert faults and all(f.offset == sign * 3600 for f in faults)
    assert all(f.detail.endswith(f"{sign * 3600:+d} s") for f in faults)
