"""The safety properties of the coordination recipes (lockbench.safety, issue 33), on made-up
histories: each one accepts a correct history and names what is wrong in a broken one; then
on real ones recorded from the recipes against a server."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recipes_support import NS, ThreadedServer

from client import Barrier, CountDownLatch, Election, LockClient, ReentrantMutex
from lockbench.safety import (
    Attempt,
    Interval,
    Recorder,
    check_barrier,
    check_latch,
    check_leaders,
    check_reentrant,
)
from lockserver import RunningServer


def test_leaders_one_at_a_time_with_increasing_terms() -> None:
    """Leaderships one after the other with growing terms pass; two leaders at once, a term
    used twice, and a later leader with a smaller term are each named."""
    ok = [Interval("e", "w", 0, 1, 10, "a"), Interval("e", "w", 2, 3, 12, "b")]
    assert check_leaders(ok).ok
    both = [Interval("e", "w", 0, 2, 10, "a"), Interval("e", "w", 1, 3, 12, "b")]
    assert check_leaders(both).counts == {"exclusive-overlap": 1}
    same = [Interval("e", "w", 0, 1, 10, "a"), Interval("e", "w", 2, 3, 10, "b")]
    assert set(check_leaders(same).counts) == {"duplicate-fence", "fence-order"}
    back = [Interval("e", "w", 0, 1, 12, "a"), Interval("e", "w", 2, 3, 10, "b")]
    assert check_leaders(back).counts == {"fence-order": 1}
    with pytest.raises(ValueError, match="exclusive"):
        check_leaders([Interval("e", "r", 0, 1, 1)])


def test_reentrant_counts_balance() -> None:
    """Nested holds that balance pass; a release too many, a hold never released, a nested
    acquire under another fence, and two owners' outer holds overlapping are each named."""
    ok = [
        (0.0, "m", "t1", +1, 5),
        (0.1, "m", "t1", +1, 5),
        (0.2, "m", "t1", -1, 5),
        (0.3, "m", "t1", -1, 5),
        (0.4, "m", "t2", +1, 6),
        (0.5, "m", "t2", -1, 6),
    ]
    report = check_reentrant(ok)
    assert report.ok and report.intervals == 6
    assert check_reentrant([*ok, (0.6, "m", "t2", -1, 6)]).counts == {"unbalanced": 1}
    assert check_reentrant([*ok, (0.6, "m", "t3", +1, 9)]).counts == {"still-held": 1}
    nested = [(0.0, "m", "t1", +1, 5), (0.1, "m", "t1", +1, 7), (0.2, "m", "t1", -1, 7)]
    assert check_reentrant([*nested, (0.3, "m", "t1", -1, 5)]).counts == {"nested-fence": 1}
    overlap = [
        (0.0, "m", "t1", +1, 5),
        (0.1, "m", "t2", +1, 6),
        (0.2, "m", "t1", -1, 5),
        (0.3, "m", "t2", -1, 6),
    ]
    assert check_reentrant(overlap).counts == {"exclusive-overlap": 1}


def test_barrier_nobody_passes_early() -> None:
    """Three parties that all arrived before anyone passed are fine (twice in a row); a party
    that passed while only two had arrived is named; a failed attempt (no pass) is not
    counted while it is not waiting any more."""
    ok = [
        Attempt("b", "p1", 0.0, 3.1),
        Attempt("b", "p2", 1.0, 3.0),
        Attempt("b", "p3", 3.0, 3.05),
        Attempt("b", "p1", 4.0, 6.0),
        Attempt("b", "p2", 4.5, 6.0),
        Attempt("b", "p3", 5.0, 6.1),
    ]
    assert check_barrier(ok, 3).ok
    early = [
        Attempt("b", "p1", 0.0, 1.5),
        Attempt("b", "p2", 1.0, 1.6),
        Attempt("b", "p3", 2.0, 2.1),
    ]
    report = check_barrier(early, 3)
    assert report.counts == {"early-pass": 3}
    gave_up = [
        Attempt("b", "p1", 0.0, None, ended=0.5),
        Attempt("b", "p2", 1.0, 1.2),
        Attempt("b", "p3", 1.1, 1.2),
    ]
    assert check_barrier(gave_up, 3).counts == {"early-pass": 2}
    assert check_barrier(gave_up, {"b": 2}).ok


@settings(max_examples=200, deadline=None)
@given(
    st.integers(2, 5),
    st.lists(st.floats(0, 100, allow_nan=False), min_size=2, max_size=5),
    st.floats(0, 10, allow_nan=False),
)
def test_barrier_a_round_that_waits_for_its_last_party_passes(
    parties: int, arrivals: list[float], delay: float
) -> None:
    """Hypothesis: whatever the arrival times, a round whose parties all pass after the last
    arrival is accepted when it has ``parties`` attempts, refused when it has fewer."""
    last = max(arrivals)
    attempts = [Attempt("b", f"p{i}", t, last + delay) for i, t in enumerate(arrivals)]
    report = check_barrier(attempts, parties)
    assert report.ok == (len(arrivals) >= parties)


def test_latch_opens_after_the_last_count_down() -> None:
    """Waiters that pass after the count-th count-down was sent are fine; one that passed
    before is named."""
    downs = [("l", 1.0), ("l", 2.0), ("l", 3.0)]
    assert check_latch(downs, [("l", "w1", 3.5), ("l", "w2", 9.0)], 3).ok
    assert check_latch(downs, [("l", "w1", 2.5)], 3).counts == {"early-open": 1}
    assert check_latch(downs[:2], [("l", "w1", 9.0)], {"l": 3}).counts == {"early-open": 1}


def test_recorded_histories_of_the_recipes_are_safe(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """Real histories, recorded around the sync recipes by threads with sessions of their
    own: elections (5 rounds, 3 candidates), a reentrant mutex (3 threads, nested twice), a
    barrier of 3 (5 rounds) and a latch of 3: every property holds."""
    recorder = Recorder()
    reentrant: list[tuple[float, str, str, int, int | None]] = []
    attempts: list[Attempt] = []
    downs: list[tuple[str, float]] = []
    passes: list[tuple[str, str, float]] = []
    mu = threading.Lock()
    with LockClient(port=threaded_server.port) as c:
        sessions = [c.session() for _ in range(3)]
        rm = ReentrantMutex(sessions[0], NS, "rm")

        def worker(i: int) -> None:
            s = sessions[i]
            election = Election(s, NS, "e")
            for _ in range(5):
                term = election.campaign(f"n{i}", timeout=20)
                assert term is not None
                with recorder.hold("e", "w", term, f"n{i}"):
                    pass
                election.resign()
            for _ in range(3):
                with rm:
                    with mu:
                        reentrant.append((recorder.now(), "rm", f"t{i}", +1, rm.fence))
                    with rm, mu:
                        reentrant.append((recorder.now(), "rm", f"t{i}", +1, rm.fence))
                        reentrant.append((recorder.now(), "rm", f"t{i}", -1, rm.fence))
                    with mu:
                        reentrant.append((recorder.now(), "rm", f"t{i}", -1, rm.fence))
            barrier = Barrier(s, NS, "b", parties=3)
            for _ in range(5):
                arrived = recorder.now()
                assert barrier.wait(timeout=20)
                with mu:
                    attempts.append(Attempt("b", f"p{i}", arrived, recorder.now()))
            latch = CountDownLatch(s, NS, "l", count=3)
            with mu:
                downs.append(("l", recorder.now()))
            latch.count_down()
            assert latch.wait(timeout=20)
            with mu:
                passes.append(("l", f"w{i}", recorder.now()))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
    check_leaders(recorder.intervals).assert_ok()
    assert len(recorder.intervals) == 15
    check_reentrant(reentrant).assert_ok()
    check_barrier(attempts, 3).assert_ok()
    assert len(attempts) == 15
    check_latch(downs, passes, 3).assert_ok()
