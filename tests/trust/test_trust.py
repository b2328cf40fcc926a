"""Tests for lockserver._trust: the call-norm / TRUST monitor.

Every test drives the monitor with explicit ``now`` values; nothing sleeps or reads a clock.
Traffic is played as evenly spaced calls, so each scenario is exact and repeatable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockserver._trust import TrustMonitor, TrustSettings, TrustStatistics

#: The recovery time docs/trust.md and the module header state for the seed's drop: 20 calls/s
#: until NORM has settled, then 2 calls/s from a tick boundary T; trust first reads >= 0.5 at
#: T + 26 s (2 ticks of median delay + 10 s * log2(5) of decay, rounded up to a whole tick).
DROP_RECOVERY = 26.0


def calls(start: float, end: float, rate: float) -> list[float]:
    """Times of ``rate`` calls/s spread evenly over [start, end), none on a tick boundary."""
    count = round((end - start) * rate)
    return [start + (k + 0.5) / rate for k in range(count)]


def play(
    monitor: TrustMonitor, call_times: Iterable[float], sample_times: Iterable[float]
) -> dict[float, TrustStatistics]:
    """Feed calls and take statistics in time order; a sample at t sees calls before t."""
    events = sorted(
        [(t, 1) for t in call_times] + [(t, 0) for t in sample_times],
        key=lambda event: event,
    )
    samples: dict[float, TrustStatistics] = {}
    for now, is_call in events:
        if is_call:
            monitor.record_call(now)
        else:
            samples[now] = monitor.statistics(now)
    return samples


def seconds(start: int, end: int) -> list[float]:
    """Whole seconds in [start, end]."""
    return [float(s) for s in range(start, end + 1)]


# -- the seed's story ------------------------------------------------------------------------


def test_idle_server_has_full_trust() -> None:
    """A server that has had no calls at all trusts itself fully, at any age."""
    monitor = TrustMonitor(started_at=0.0)
    assert monitor.trust(0.0) == 1.0
    assert monitor.trust(0.5) == 1.0
    assert monitor.trust(1_000.0) == 1.0
    stats = monitor.statistics(1_000.0)
    assert (stats.norm, stats.rate, stats.last_tick_rate, stats.calls_total) == (0.0, 0.0, 0.0, 0)


def test_steady_traffic_sets_norm_and_full_trust() -> None:
    """20 calls/s held for 5 s from an idle start: NORM is ~20 and trust ~1 (the seed's story)."""
    monitor = TrustMonitor(started_at=0.0)
    stats = play(monitor, calls(0.0, 5.0, 20.0), [5.0])[5.0]
    assert stats.norm == pytest.approx(20.0, rel=0.10)
    assert stats.rate == pytest.approx(20.0, rel=0.10)
    assert stats.trust >= 0.9
    assert stats.last_tick_rate == 20.0
    assert stats.calls_total == 100


def test_norm_rise_needs_a_majority_of_the_spike_window() -> None:
    """A genuine rise reaches NORM only once it fills 3 of the 5 median ticks (two ticks late)."""
    monitor = TrustMonitor(started_at=0.0)
    samples = play(monitor, calls(0.0, 3.0, 20.0), [1.0, 2.0, 3.0])
    assert samples[1.0].norm == 0.0
    assert samples[2.0].norm == 0.0
    assert samples[3.0].norm > 10.0


@pytest.mark.parametrize("warm_up", [5.0, 20.0])
def test_sudden_drop_takes_trust_down_within_two_seconds(warm_up: float) -> None:
    """After 20 calls/s, a fall to 2 calls/s takes trust below 0.3 within 2 s: a client
    demanding 0.5 is refused."""
    monitor = TrustMonitor(started_at=0.0)
    drop = warm_up
    traffic = calls(0.0, drop, 20.0) + calls(drop, drop + 5.0, 2.0)
    samples = play(monitor, traffic, [drop, drop + 2.0])
    assert samples[drop].trust >= 0.9
    assert samples[drop + 2.0].trust < 0.3
    assert samples[drop + 2.0].trust < 0.5  # min_trust 0.5 would be refused


def test_trust_recovers_as_norm_decays_at_the_stated_time() -> None:
    """After the 20 -> 2 calls/s drop, trust stays below 0.5 until the documented recovery time
    (T + 26 s) and reaches 0.5 exactly then: a NORM that fell instantly would fail the first
    half, a NORM that never decayed would fail the second. Trust is 1 again by T + 36 s."""
    monitor = TrustMonitor(started_at=0.0)
    drop = 20.0
    traffic = calls(0.0, drop, 20.0) + calls(drop, drop + 60.0, 2.0)
    samples = play(monitor, traffic, seconds(20, 80))

    refused = [t for t, s in samples.items() if drop < t < drop + DROP_RECOVERY]
    assert all(samples[t].trust < 0.5 for t in refused)
    assert samples[drop + DROP_RECOVERY - 1.0].trust < 0.5  # not long before: 1 s before
    assert samples[drop + DROP_RECOVERY].trust >= 0.5
    # NORM halves every 10 s once the median has let the drop through (T + 2 s); trust only
    # climbs once the load estimate has settled on the new rate (T + 5 s).
    assert samples[drop + 12.0].norm == pytest.approx(10.0, rel=0.01)
    trusts = [samples[t].trust for t in seconds(25, 80)]
    assert trusts == sorted(trusts)
    assert samples[drop + 35.0].trust < 0.99
    assert samples[drop + 36.0].trust == pytest.approx(1.0)
    assert samples[drop + 60.0].norm == pytest.approx(2.0)


@pytest.mark.parametrize(
    "burst_start",
    [
        pytest.param(20.0, id="inside-one-tick"),
        pytest.param(20.9, id="straddling-a-tick-boundary"),
    ],
)
def test_split_second_burst_barely_moves_norm(burst_start: float) -> None:
    """1,000 calls within 0.2 s on a server at 5 calls/s: NORM stays below twice its prior
    value and trust stays >= 0.8 while traffic continues at 5/s. An instant-jump NORM (the
    original code: NORM = the highest tick rate seen) would have collapsed trust."""
    monitor = TrustMonitor(started_at=0.0)
    burst = [burst_start + 0.2 * k / 1_000 for k in range(1_000)]
    traffic = calls(0.0, 40.0, 5.0) + burst
    samples = play(monitor, traffic, seconds(20, 40))

    prior = samples[20.0]
    assert prior.norm == pytest.approx(5.0)
    after = [samples[t] for t in seconds(21, 40)]
    assert all(s.norm < 2 * prior.norm for s in after)
    assert all(s.trust >= 0.8 for s in after)
    assert max(s.rate for s in after) > 100.0  # the load estimate did see the burst

    # Contrast: NORM = max tick rate seen, trust = load / NORM with load = last tick's rate.
    instant_norm = max(s.last_tick_rate for s in after)
    assert instant_norm >= 500.0
    instant_trust_afterwards = samples[30.0].last_tick_rate / instant_norm
    assert instant_trust_afterwards < 0.05


def test_total_outage_recovers_smoothly() -> None:
    """When calls stop altogether, trust falls near 0 and then climbs monotonically to 1 as
    NORM decays to the floor: the load is clamped to the floor too, so trust has no cliff
    from 0 to 1 when NORM crosses it."""
    monitor = TrustMonitor(started_at=0.0)
    samples = play(monitor, calls(0.0, 20.0, 20.0), seconds(20, 80))
    assert samples[23.0].trust < 0.1
    trusts = [samples[t].trust for t in seconds(24, 80)]
    assert trusts == sorted(trusts)
    steps = [b - a for a, b in itertools.pairwise(trusts)]
    assert max(steps) < 0.1
    assert samples[65.0].trust < 1.0  # NORM 20 takes 2 + 10 * log2(20) s to reach the floor
    assert samples[66.0].trust == 1.0
    assert samples[80.0].norm < monitor.settings.norm_floor


# -- time ------------------------------------------------------------------------------------


def test_uptime_counts_from_started_at() -> None:
    """uptime(now) = now - started_at, never negative; statistics() reports the same."""
    monitor = TrustMonitor(started_at=100.0)
    assert monitor.uptime(110.0) == 10.0
    assert monitor.uptime(100.0) == 0.0
    assert monitor.uptime(90.0) == 0.0
    assert monitor.statistics(110.0).uptime == 10.0


def test_ticks_are_counted_from_started_at() -> None:
    """Tick boundaries are started_at + k * tick: a call just before one closes into that tick."""
    monitor = TrustMonitor(started_at=100.25)
    monitor.record_call(101.24, n=7)
    assert monitor.statistics(101.24).last_tick_rate == 0.0
    assert monitor.statistics(101.25).last_tick_rate == 7.0


def test_long_idle_gap_is_cheap_and_forgotten() -> None:
    """An hour without calls after busy traffic leaves trust 1 with NORM below the floor; a gap
    of 10^12 s (which a per-tick loop could never finish) is handled just the same."""
    monitor = TrustMonitor(started_at=0.0)
    play(monitor, calls(0.0, 20.0, 20.0), [])
    stats = monitor.statistics(20.0 + 3_600.0)
    assert stats.trust == 1.0
    assert stats.norm < monitor.settings.norm_floor
    assert stats.calls_total == 400

    huge = TrustMonitor(started_at=0.0)
    play(huge, calls(0.0, 20.0, 20.0), [])
    assert huge.trust(1e12) == 1.0
    huge.record_call(1e12 + 0.5)
    assert huge.statistics(1e12 + 1.0).calls_total == 401


def test_closed_form_idle_decay_matches_tick_by_tick() -> None:
    """Catching up a long gap in one call gives the same NORM, load and trust as ticking
    through it second by second (the closed form is exact, up to rounding)."""
    traffic = calls(0.0, 20.0, 20.0)
    lazy = TrustMonitor(started_at=0.0)
    eager = TrustMonitor(started_at=0.0)
    play(lazy, traffic, [])
    play(eager, traffic, seconds(20, 80))
    a, b = lazy.statistics(80.0), eager.statistics(80.0)
    assert a.norm == pytest.approx(b.norm, rel=1e-9)
    assert a.rate == pytest.approx(b.rate, rel=1e-9)
    assert a.trust == pytest.approx(b.trust, rel=1e-9)


def test_tick_is_idempotent() -> None:
    """tick(now) closes each elapsed tick once; repeating it, or querying, changes nothing."""
    monitor = TrustMonitor(started_at=0.0)
    play(monitor, calls(0.0, 3.0, 20.0), [])
    monitor.tick(3.5)
    first = monitor.statistics(3.5)
    monitor.tick(3.5)
    monitor.tick(3.0)
    assert monitor.statistics(3.5) == first


def test_late_timestamps_count_into_the_tick_in_progress() -> None:
    """A call stamped before the current tick (clock jitter) is counted, never an error."""
    monitor = TrustMonitor(started_at=0.0)
    monitor.tick(5.5)
    monitor.record_call(4.0, n=3)
    assert monitor.statistics(6.0).last_tick_rate == 3.0


def test_record_call_n_counts_n_calls() -> None:
    """record_call(now, n) counts like n separate calls; calls_total includes the open tick."""
    batched = TrustMonitor(started_at=0.0)
    single = TrustMonitor(started_at=0.0)
    batched.record_call(0.5, n=12)
    for _ in range(12):
        single.record_call(0.5)
    assert batched.statistics(0.9).calls_total == 12
    assert batched.statistics(1.0) == single.statistics(1.0)


def test_rates_are_per_second_whatever_the_tick() -> None:
    """With a 0.25 s tick, 20 calls/s still reads as 20 calls/s."""
    monitor = TrustMonitor(TrustSettings(tick=0.25), started_at=0.0)
    stats = play(monitor, calls(0.0, 10.0, 20.0), [10.0])[10.0]
    assert stats.last_tick_rate == 20.0
    assert stats.norm == pytest.approx(20.0, rel=0.01)


def test_statistics_is_a_frozen_record() -> None:
    """statistics() returns a value that cannot be modified."""
    stats = TrustMonitor(started_at=0.0).statistics(1.0)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.trust = 0.0  # type: ignore[misc]


def test_non_finite_times_are_rejected() -> None:
    """started_at and a catch-up ``now`` must be finite times."""
    with pytest.raises(ValueError, match="started_at"):
        TrustMonitor(started_at=math.nan)
    with pytest.raises(ValueError, match="now"):
        TrustMonitor(started_at=0.0).trust(math.inf)


# -- properties ------------------------------------------------------------------------------

steps = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
        st.integers(min_value=0, max_value=2_000),
    ),
    max_size=60,
)

valid_settings = st.builds(
    TrustSettings,
    tick=st.floats(min_value=0.05, max_value=5.0),
    load_alpha=st.floats(min_value=0.01, max_value=1.0),
    spike_window=st.sampled_from([1, 3, 5, 7]),
    norm_alpha=st.floats(min_value=0.01, max_value=1.0),
    norm_half_life=st.floats(min_value=0.1, max_value=100.0),
    norm_floor=st.floats(min_value=0.0, max_value=10.0),
)


def run(
    settings: TrustSettings, trace: Sequence[tuple[float, int]], *, query_each_step: bool
) -> list[TrustStatistics]:
    """Play ``trace`` (time step, call count) from t=0; optionally query after each step."""
    monitor = TrustMonitor(settings, started_at=0.0)
    now = 0.0
    out: list[TrustStatistics] = []
    for dt, n in trace:
        now += dt
        monitor.record_call(now, n)
        if query_each_step:
            out.append(monitor.statistics(now))
    out.append(monitor.statistics(now + 100.0))
    return out


@given(valid_settings, steps)
def test_property_bounds_and_determinism(
    settings: TrustSettings, trace: list[tuple[float, int]]
) -> None:
    """For any traffic and settings: trust in [0, 1], NORM and rates >= 0, trust is 1 whenever
    NORM is below the floor, and the same inputs give the same outputs."""
    first = run(settings, trace, query_each_step=True)
    for stats in first:
        assert 0.0 <= stats.trust <= 1.0
        assert stats.norm >= 0.0
        assert stats.rate >= 0.0
        assert stats.last_tick_rate >= 0.0
        if stats.norm < settings.norm_floor:
            assert stats.trust == 1.0
    assert run(settings, trace, query_each_step=True) == first
    assert first[-1].calls_total == sum(n for _, n in trace)


@given(valid_settings, steps)
def test_property_querying_does_not_change_the_outcome(
    settings: TrustSettings, trace: list[tuple[float, int]]
) -> None:
    """Whether the shell queries after every call or never, the final state is the same (up to
    rounding between the closed-form and tick-by-tick idle decay)."""
    eager = run(settings, trace, query_each_step=True)[-1]
    lazy = run(settings, trace, query_each_step=False)[-1]
    assert lazy.calls_total == eager.calls_total
    for field in ("trust", "norm", "rate", "last_tick_rate"):
        assert getattr(lazy, field) == pytest.approx(getattr(eager, field), rel=1e-9, abs=1e-9)


# -- settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tick", 0.0),
        ("tick", -1.0),
        ("tick", math.nan),
        ("tick", math.inf),
        ("tick", "1"),
        ("load_alpha", 0.0),
        ("load_alpha", 1.5),
        ("load_alpha", math.nan),
        ("spike_window", 0),
        ("spike_window", 4),
        ("spike_window", 5.0),
        ("spike_window", True),
        ("norm_alpha", 0.0),
        ("norm_alpha", -0.1),
        ("norm_half_life", 0.0),
        ("norm_half_life", math.inf),
        ("norm_floor", -1.0),
        ("norm_floor", math.nan),
        ("norm_floor", True),
    ],
)
def test_bad_settings_raise_value_error_naming_the_field(field: str, value: object) -> None:
    """Each constant is validated; the error names the field and the bad value."""
    with pytest.raises(ValueError, match=rf"TrustSettings\.{field} must be"):
        TrustSettings(**{field: value})  # type: ignore[arg-type]


def test_edge_settings_are_accepted() -> None:
    """alpha = 1 (no smoothing), a window of 1 (no spike filter), floor 0 and int tick are valid."""
    settings = TrustSettings(tick=1, load_alpha=1.0, spike_window=1, norm_alpha=1.0, norm_floor=0)
    monitor = TrustMonitor(settings, started_at=0.0)
    assert monitor.trust(5.0) == 1.0
    stats = play(monitor, calls(5.0, 7.0, 10.0) + calls(7.0, 8.0, 5.0), [8.0])[8.0]
    assert stats.rate == 5.0
    assert stats.norm == pytest.approx(10.0 * 2 ** (-0.1))
    assert stats.trust == pytest.approx(5.0 / stats.norm)


def test_defaults_are_the_documented_ones() -> None:
    """The defaults docs/trust.md justifies (a change here must update the docs)."""
    assert TrustSettings() == TrustSettings(
        tick=1.0,
        load_alpha=0.6,
        spike_window=5,
        norm_alpha=0.6,
        norm_half_life=10.0,
        norm_floor=1.0,
        source_cap=1.0,
    )
