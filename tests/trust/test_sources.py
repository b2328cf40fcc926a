"""Tests for the per-source cap of lockserver._trust: one peer cannot steer the norm (issue 14,
item 8).

Every test drives the monitor with explicit ``now`` values and named sources; nothing sleeps or
reads a clock. Floods are recorded in batches (``record_call(now, n, source)``), which counts
exactly like ``n`` separate calls.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver._trust import TrustMonitor, TrustSettings, TrustStatistics

#: The issue's numbers: one connection sent 928k empty executes over 8 s, then stopped.
FLOOD_RATE = 116_000
FLOOD_SECONDS = 8
#: The legitimate client beside it: 20 calls/s, demanding min_trust=0.3.
CLIENT_RATE = 20
MIN_TRUST = 0.3

Event = tuple[float, Hashable, int]  # (now, source, calls)


def steady(source: Hashable, start: float, end: float, rate: float) -> list[Event]:
    """``rate`` calls/s from ``source`` spread evenly over [start, end), none on a boundary."""
    count = round((end - start) * rate)
    return [(start + (k + 0.5) / rate, source, 1) for k in range(count)]


def flood(source: Hashable, start: float, end: float, rate: int) -> list[Event]:
    """``rate`` calls/s from ``source`` over [start, end), recorded in 100 batches a second."""
    batches = round((end - start) * 100)
    return [(start + (k + 0.5) / 100, source, rate // 100) for k in range(batches)]


def play(
    monitor: TrustMonitor, events: Iterable[Event], sample_times: Iterable[float]
) -> dict[float, TrustStatistics]:
    """Feed calls and take statistics in time order; a sample at t sees calls before t."""
    timeline = sorted(
        [(t, 1, source, n) for t, source, n in events] + [(t, 0, None, 0) for t in sample_times],
        key=lambda event: (event[0], event[1]),
    )
    samples: dict[float, TrustStatistics] = {}
    for now, is_call, source, n in timeline:
        if is_call:
            monitor.record_call(now, n, source)
        else:
            samples[now] = monitor.statistics(now)
    return samples


def seconds(start: int, end: int) -> list[float]:
    """Whole seconds in [start, end]."""
    return [float(s) for s in range(start, end + 1)]


def issue_scenario(source_cap: float) -> dict[float, TrustStatistics]:
    """The client at 20 calls/s from t=0; the peer floods 116,000 calls/s over [10, 18)."""
    monitor = TrustMonitor(TrustSettings(source_cap=source_cap), started_at=0.0)
    traffic = steady("client", 0.0, 60.0, CLIENT_RATE) + flood(
        "peer", 10.0, 10.0 + FLOOD_SECONDS, FLOOD_RATE
    )
    return play(monitor, traffic, seconds(1, 60))


# -- the attack --------------------------------------------------------------------------------


def test_issue_flood_then_silence_no_longer_refuses_the_client() -> None:
    """The issue's attack, with the default cap of 1: in every tick the peer counts at most as
    much as the client (the lower median of two sources is the smaller), so each tick counts
    at most 2 x 20 calls and NORM never exceeds 40; the client always counts in full, so the
    load stays >= 20 and trust >= load / 40, about 0.5, during the flood and after it. The
    client demanding 0.3 is never refused."""
    samples = issue_scenario(source_cap=1.0)
    limit = 2 * CLIENT_RATE
    for t in seconds(1, 60):
        assert samples[t].norm <= limit, t
        assert CLIENT_RATE <= samples[t].last_tick_rate <= limit, t
        assert samples[t].calls_total == pytest.approx(
            t * CLIENT_RATE + FLOOD_RATE * min(FLOOD_SECONDS, max(0.0, t - 10.0))
        )
    for t in seconds(10, 60):  # the client has been calling for 10 s
        stats = samples[t]
        assert stats.rate >= CLIENT_RATE * (1 - 1e-3)
        assert stats.trust >= min(1.0, stats.rate / limit)
        assert stats.trust >= 0.5 * (1 - 1e-3)
        assert stats.trust >= MIN_TRUST
    # The worst moment, right after the flood stops, is an equal honest client leaving.
    assert min(samples[t].trust for t in seconds(10, 60)) == pytest.approx(0.57, abs=0.01)


def test_issue_flood_reproduced_without_the_cap() -> None:
    """Counting every call (source_cap = inf, the behaviour before sources) reproduces the
    issue: NORM follows the flood, trust falls to 0.00 and stays below 0.3 for over 30 s."""
    samples = issue_scenario(source_cap=math.inf)
    assert max(s.norm for s in samples.values()) > 50_000
    assert min(s.trust for s in samples.values()) < 0.005
    refused = [t for t in seconds(10, 60) if samples[t].trust < MIN_TRUST]
    assert len(refused) > 30


def test_flood_then_trickle_cannot_clip_the_client() -> None:
    """A peer that floods, then drops to 1 call/s, becomes the smaller of two sources and so
    the lower median: with this tick's median alone it would clip the client to 1 call/s
    while NORM still expected 40 (trust 0.07). The typical level is held like NORM (it sinks
    with the same half-life), so the client's count falls no faster than NORM and its trust
    stays >= 0.5 throughout."""
    monitor = TrustMonitor(started_at=0.0)
    traffic = (
        steady("client", 0.0, 120.0, CLIENT_RATE)
        + flood("peer", 10.0, 18.0, FLOOD_RATE)
        + steady("peer", 18.0, 120.0, 1.0)
    )
    samples = play(monitor, traffic, seconds(10, 120))
    assert all(s.norm <= 2 * CLIENT_RATE + 1 for s in samples.values())
    assert min(s.trust for s in samples.values()) >= 0.5


def test_peer_calling_while_the_client_is_silent_is_still_capped() -> None:
    """A bursty client (40 calls every other tick) stays present through its silent ticks, so
    a peer flooding exactly in those ticks is capped at the client's level (40): no tick
    counts more than 40 and NORM stays at 40. Counting only active sources, the peer would be
    a lone source there and NORM would follow the flood (as it does with no cap)."""

    def run(source_cap: float) -> dict[float, TrustStatistics]:
        monitor = TrustMonitor(TrustSettings(source_cap=source_cap), started_at=0.0)
        client: list[Event] = [(t + 0.5, "client", 40) for t in range(0, 60, 2)]
        peer: list[Event] = [(t + 0.5, "peer", 100_000) for t in range(11, 20, 2)]
        return play(monitor, client + peer, seconds(1, 60))

    capped = run(1.0)
    assert max(s.last_tick_rate for s in capped.values()) == 40.0
    assert max(s.norm for s in capped.values()) <= 40.0
    assert min(capped[t].trust for t in seconds(10, 60)) >= MIN_TRUST
    assert max(s.norm for s in run(math.inf).values()) > 50_000


# -- one client, many alike ----------------------------------------------------------------------


def test_a_lone_named_source_counts_exactly_like_unattributed_calls() -> None:
    """The seed's drop (20 calls/s, then 2 calls/s) from one named source gives exactly the
    statistics of the same calls recorded without a source: a lone source counts fully."""
    times = [t for t, _, _ in steady("x", 0.0, 20.0, 20.0) + steady("x", 20.0, 60.0, 2.0)]
    named = play(TrustMonitor(started_at=0.0), [(t, "alice", 1) for t in times], seconds(1, 60))
    anonymous = TrustMonitor(started_at=0.0)
    pending = iter(times)
    call = next(pending, None)
    for sample in seconds(1, 60):
        while call is not None and call < sample:
            anonymous.record_call(call)  # no source at all
            call = next(pending, None)
        assert named[sample] == anonymous.statistics(sample), sample
    assert named[22.0].trust < 0.3  # the drop is still felt


def test_many_similar_clients_count_exactly_like_one() -> None:
    """Ten clients at 2 calls/s each give exactly the statistics of one client at 20 calls/s;
    when nine of them are cut off (the network problem trust exists to detect), trust falls
    exactly as in the seed's 20 -> 2 calls/s drop and recovers as NORM decays."""
    spread = [  # client k calls at s + 0.1 + k/100 and s + 0.6 + k/100 of every second s
        (s + half + 0.1 + k / 100, f"client-{k}", 1)
        for k in range(10)
        for s in range(20)
        for half in (0.0, 0.5)
    ]
    survivor = [(t, "client-0", 1) for t, _, _ in steady("_", 20.0, 80.0, 2.0)]
    many = play(TrustMonitor(started_at=0.0), spread + survivor, seconds(1, 80))
    one_times = sorted(t for t, _, _ in spread + survivor)
    one = play(TrustMonitor(started_at=0.0), [(t, "solo", 1) for t in one_times], seconds(1, 80))
    assert many == one
    assert many[20.0].norm == pytest.approx(20.0, rel=0.01)
    assert many[22.0].trust < 0.3
    assert many[46.0].trust >= 0.5


def test_a_source_counts_at_most_source_cap_times_the_typical_one() -> None:
    """Three sources at 10 calls in a tick and one at 1,000: the big one counts 10 (cap 1),
    20 (cap 2) or 1,000 (cap inf); the others count in full, calls_total counts everything."""
    for source_cap, expected in [(1.0, 40.0), (2.0, 50.0), (math.inf, 1_030.0)]:
        monitor = TrustMonitor(TrustSettings(source_cap=source_cap), started_at=0.0)
        for name in ("a", "b", "c"):
            monitor.record_call(0.5, 10, name)
        monitor.record_call(0.5, 1_000, "big")
        stats = monitor.statistics(1.0)
        assert stats.last_tick_rate == expected, source_cap
        assert stats.calls_total == 1_030


def test_zero_calls_do_not_make_a_source_active() -> None:
    """record_call(now, 0, source) counts nothing and does not make the source present: it
    cannot drag the median to 0 and clip the sources that did call."""
    monitor = TrustMonitor(started_at=0.0)
    monitor.record_call(0.5, 0, "idle")
    monitor.record_call(0.5, 0, "idle-too")
    monitor.record_call(0.5, 10, "busy")
    stats = monitor.statistics(1.0)
    assert (stats.last_tick_rate, stats.calls_total) == (10.0, 10)


def test_sources_are_forgotten_after_a_long_gap() -> None:
    """After an idle gap longer than the spike window, nobody is present any more and the
    held typical level has decayed: a new lone source counts fully at once."""
    monitor = TrustMonitor(started_at=0.0)
    for t in range(10):
        for name in range(10):
            monitor.record_call(t + 0.5, 1, name)
    monitor.record_call(1_000.5, 50, "newcomer")
    assert monitor.statistics(1_001.0).last_tick_rate == 50.0


# -- properties ----------------------------------------------------------------------------------

#: (time step, calls, source index) triples.
traces = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
        st.integers(min_value=0, max_value=5_000),
        st.integers(min_value=0, max_value=5),
    ),
    max_size=80,
)


def run_trace(
    trace: Sequence[tuple[float, int, int]],
    names: Sequence[Hashable],
    *,
    source_cap: float = 1.0,
    query_each_step: bool = True,
) -> list[TrustStatistics]:
    """Play ``trace`` from t=0 with source i called ``names[i]``; statistics after each step."""
    monitor = TrustMonitor(TrustSettings(source_cap=source_cap), started_at=0.0)
    now = 0.0
    out: list[TrustStatistics] = []
    for dt, n, i in trace:
        now += dt
        monitor.record_call(now, n, names[i])
        if query_each_step:
            out.append(monitor.statistics(now))
    for extra in (1.0, 3.0, 100.0):
        out.append(monitor.statistics(now + extra))
    return out


@given(traces, st.permutations(range(6)), st.sampled_from([1.0, 2.0, math.inf]))
def test_property_same_calls_same_trust(
    trace: list[tuple[float, int, int]], relabel: list[int], source_cap: float
) -> None:
    """The same call sequence gives the same trust trace; so does the same sequence with the
    sources renamed (other objects, other order of first calls): only how many calls each
    source made in each tick matters. Trust stays in [0, 1] and calls_total counts all."""
    names: list[Hashable] = [f"s{i}" for i in range(6)]
    first = run_trace(trace, names, source_cap=source_cap)
    assert run_trace(trace, names, source_cap=source_cap) == first
    objects: list[Hashable] = [object() for _ in range(6)]
    renamed = [objects[relabel[i]] for i in range(6)]
    assert run_trace(trace, renamed, source_cap=source_cap) == first
    assert all(0.0 <= s.trust <= 1.0 and s.norm >= 0.0 for s in first)
    assert first[-1].calls_total == sum(n for _, n, _ in trace)


@given(traces)
def test_property_counted_never_exceeds_raw_and_querying_changes_nothing(
    trace: list[tuple[float, int, int]],
) -> None:
    """With sources, the counted tick rate is never above the raw one (the cap only removes
    calls) and never below it with source_cap = inf; querying after every call or only at the
    end gives the same final state."""
    names: list[Hashable] = list(range(6))
    capped = run_trace(trace, names)
    raw = run_trace(trace, names, source_cap=math.inf)
    for a, b in zip(capped, raw, strict=True):
        assert a.last_tick_rate <= b.last_tick_rate
        assert a.calls_total == b.calls_total
    lazy = run_trace(trace, names, query_each_step=False)[-1]
    for field in ("trust", "norm", "rate", "last_tick_rate", "calls_total"):
        assert getattr(lazy, field) == pytest.approx(getattr(capped[-1], field), rel=1e-9)


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0, 1, 2, 5, 10, 19, 20, 21, 40, 100]),
            st.integers(min_value=0, max_value=200_000),
        ),
        min_size=1,
        max_size=90,
    )
)
def test_property_one_peer_beside_a_steady_client(attack: list[int]) -> None:
    """Whatever one peer sends, tick by tick (floods, trickles, silences, in any order), beside
    a client steady at 20 calls/s: no tick counts more than 2 x 20 calls, NORM never exceeds
    40, and the client's trust never falls below 0.3 once it has called for 10 s."""
    monitor = TrustMonitor(started_at=0.0)
    peer = [0] * 10 + attack + [0] * 60
    for t, calls in enumerate(peer):
        monitor.record_call(t + 0.5, CLIENT_RATE, "client")
        if calls:
            monitor.record_call(t + 0.5, calls, "peer")
        stats = monitor.statistics(t + 1.0)
        assert stats.last_tick_rate <= 2 * CLIENT_RATE
        assert stats.norm <= 2 * CLIENT_RATE
        if t >= 10:
            assert stats.trust >= MIN_TRUST, (t, stats)


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, 0.5, -1.0, math.nan, True, "1"])
def test_bad_source_cap_raises_value_error(value: object) -> None:
    """source_cap must be a number >= 1 (below 1 even a lone source would be clipped)."""
    with pytest.raises(ValueError, match=r"TrustSettings\.source_cap must be a number >= 1"):
        TrustSettings(source_cap=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1, 1.0, 2.5, math.inf])
def test_good_source_cap_is_accepted(value: float) -> None:
    """1, fractional caps above it and inf (no cap) are valid."""
    assert TrustSettings(source_cap=value).source_cap == value
