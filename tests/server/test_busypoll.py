"""The poller's busy-poll policy (lockserver.shell._busypoll), fed with made-up times and CPU costs,
and the server wiring: statistics, the off switch, shutdown while spinning."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given

from lockserver import RunningServer
from lockserver.shell._busypoll import SPIN_SHARE, BusyPoll
from protocol import Assert, LockLost, LostReason, SetVar

from ._wire import WireClient, wait_for
from .conftest import start_server

W = 0.0001  # the default window, 100 us
LOCK = Assert(SetVar("locks", "printer", "job"))
WORK = 0.00004  # one batch's serving time in the paced streams, 40 us
STEP = 0.000002  # one poll of a spinning poller (a trio pass and an epoll_wait(0)), 2 us


def _stream(bp: BusyPoll, start: float, gaps: list[float], work: float = WORK) -> float:
    """Serve one batch of ``work`` seconds after each gap (gaps measured from the previous
    batch's end), whatever the policy says (no polls, no sleeps)."""
    t = start
    for gap in gaps:
        t += gap
        bp.served(t, t + work)
        t += work
    return t


def _paced(
    bp: BusyPoll,
    period: float,
    work: float,
    n: int,
    t: float = 0.0,
    after: float | None = None,
    wake: float = 0.0,
) -> float:
    """Drive ``bp`` as the poll loop does under open-loop traffic: a request becomes readable
    every ``period`` seconds after ``after`` (default: ``t``, the time now) and takes ``work``
    to serve; after a batch, while the policy says spin, the poller polls every STEP (``idle``
    when it finds nothing), else it sleeps until the next request, and that sleep costs
    ``wake`` seconds of CPU (``slept``). Returns the time the last batch ended."""
    arrival = t if after is None else after
    for _ in range(n):
        arrival += period
        while bp.spinning:
            t += STEP
            if t >= arrival:
                break  # this poll finds the request
            bp.idle(t)
        if not bp.spinning and t < arrival:
            bp.slept(wake)
        start = max(t, arrival)
        bp.served(start, start + work)
        t = start + work
    return t


def test_off_never_spins() -> None:
    """window 0: no gap, however short, makes the poller spin; nothing is counted."""
    bp = BusyPoll(0.0)
    _stream(bp, 0.0, [0.0, 1e-9, 0.0] * 20)
    assert not bp.spinning
    assert (bp.hits, bp.misses, bp.seconds) == (0, 0, 0.0)
    _paced(bp, 0.00005, WORK, 200, wake=0.00005)
    assert (bp.hits, bp.misses, bp.seconds) == (0, 0, 0.0)
    assert bp.budget <= 0.0


def test_sparse_traffic_never_spins() -> None:
    """A request every millisecond (10 times the window): no gap is close, nothing is ever
    spun, however much a sleep costs."""
    bp = BusyPoll(W)
    _paced(bp, 0.001, 0.00005, 500, wake=0.00008)
    assert bp.density == 0.0
    assert (bp.hits, bp.misses, bp.seconds) == (0, 0, 0.0)
    assert not bp.spinning


def test_dense_traffic_spins_and_every_spin_finds_a_request() -> None:
    """Requests every 55 us taking 50 us each (a server ~90% busy), sleeping costing nothing:
    gaps of 5 us, less than the SPIN_SHARE of a batch, so after the density warms up the
    poller spins through every gap and each spin is a hit."""
    bp = BusyPoll(W)
    _paced(bp, 0.000055, 0.00005, 1000)
    assert bp.spinning
    assert bp.misses == 0
    assert bp.hits >= 990  # all but the first few batches (density warming up)
    assert bp.seconds == pytest.approx(bp.hits * 0.000006, rel=0.2)  # a 5 us gap, polled at 6
    assert bp.seconds <= SPIN_SHARE * 1000 * 0.00005


def test_medium_traffic_with_cheap_sleeps_spins_within_its_share() -> None:
    """Requests every 90 us taking 40 us (a server ~45% busy) where a sleep costs nothing:
    every gap (50 us) is close, so spinning through all of them would cost 55% of wall time
    and save nothing. The budget allows SPIN_SHARE of the 40 us served per batch: the poller
    spins only when it has saved a whole expected gap, so its spins are hits and their total
    stays within the share."""
    bp = BusyPoll(W)
    n, gap = 5000, 0.00005
    _paced(bp, 0.00009, WORK, n)
    busy = n * WORK
    assert bp.density > 0.99
    assert bp.seconds <= SPIN_SHARE * busy
    assert bp.seconds >= 0.8 * SPIN_SHARE * busy  # and it does spend it
    assert bp.hits == pytest.approx(SPIN_SHARE * busy / (gap + STEP), rel=0.1)
    assert bp.misses <= bp.hits // 20  # a spin is started only when it can wait out a gap


def test_medium_traffic_with_costly_sleeps_spins_through_every_gap() -> None:
    """The same traffic where a sleep and wake-up cost the poller 60 us of CPU (a virtual
    machine's): a hit's 52 us spin costs less than the sleep it saves, so spinning pays for
    itself; the poller spins through every gap, and what it spun beyond what it saved is
    still within the share."""
    bp = BusyPoll(W)
    n, wake = 5000, 0.00006
    _paced(bp, 0.00009, WORK, n, wake=wake)
    assert 0 < bp.wake <= wake  # learnt from the sleeps before the spinning took over
    assert bp.hits >= n - 50
    assert bp.misses <= 5  # while the cost of a sleep was still being learnt
    assert bp.seconds - bp.hits * wake <= SPIN_SHARE * n * WORK


@given(
    period=st.floats(min_value=0.000001, max_value=0.0003),
    load=st.floats(min_value=0.05, max_value=1.0),
    wake=st.floats(min_value=0.0, max_value=0.0002),
)
def test_spin_beyond_the_sleeps_it_saves_stays_within_its_share(
    period: float, load: float, wake: float
) -> None:
    """Any steady rate (busy 5% to 100%) and any cost of a sleep: the time spun, less the
    sleeps the hits saved (at most ``window`` each), is at most SPIN_SHARE of the time
    served, plus one sleep and one poll (the debt a miss may leave)."""
    bp = BusyPoll(W)
    work = period * load
    n = 2000
    _paced(bp, period, work, n, wake=wake)
    debt = min(wake, W) + STEP
    assert bp.seconds - bp.hits * bp.wake <= SPIN_SHARE * n * work + debt + 1e-12


def test_a_sleep_cost_is_averaged_and_capped_at_the_window() -> None:
    """``slept`` keeps a moving average (1/8 for the newest) of what a sleep cost, each sample
    at most ``window``: a timer that ran 5 ms during one wait counts as one window."""
    bp = BusyPoll(W)
    assert bp.wake == 0.0  # nothing is credited before anything is measured
    bp.slept(0.00008)
    assert bp.wake == pytest.approx(0.00001)
    for _ in range(200):
        bp.slept(0.00008)
    assert bp.wake == pytest.approx(0.00008)
    bp.slept(0.005)
    assert bp.wake == pytest.approx(0.00008 + (W - 0.00008) / 8)
    bp.slept(W)
    assert bp.wake <= W
    off = BusyPoll(0.0)
    off.slept(0.00008)
    assert off.wake == 0.0


def test_a_hit_is_credited_with_the_sleep_it_saved() -> None:
    """A hit spends its gap and earns back one sleep; a miss earns nothing."""
    bp = BusyPoll(W)
    for _ in range(200):
        bp.slept(0.00003)
    t = _stream(bp, 0.0, [0.00001] * 10, work=0.0001)  # budget full, density ~0.94
    assert bp.spinning
    assert bp.budget == W
    budget, wake, hits = bp.budget, bp.wake, bp.hits
    t += 0.00005
    bp.served(t, t)  # a hit after 50 us, serving nothing
    assert bp.budget == pytest.approx(budget - 0.00005 + wake)
    assert bp.hits == hits + 1
    assert not bp.idle(t + W * 1.001)  # a miss of a whole window: spends it, earns nothing
    assert bp.budget == pytest.approx(budget - 0.00005 + wake - W)


def test_a_spin_may_reach_one_sleep_into_debt() -> None:
    """At the bound (exact binary times): with a sleep costing ~15 us, a spin goes on until it
    has spent its budget plus that sleep (which the hit it hopes for would give back), never
    past ``window``; the miss leaves the debt."""
    bp = BusyPoll(W)
    bp.served(0.0, 2.0**-10)
    bp.spinning, bp.budget, bp.wake = True, 2.0**-15, 2.0**-16  # ~30 us paid, ~15 us a sleep
    limit = 2.0**-10 + 2.0**-15 + 2.0**-16
    assert bp.idle(limit - 2.0**-30) is True
    assert bp.idle(limit) is False
    assert (bp.misses, bp.seconds, bp.budget) == (1, 2.0**-15 + 2.0**-16, -(2.0**-16))
    bp.served(1.0, 1.0)  # far: sleeps now
    bp.spinning, bp.budget, bp.wake = True, W, W  # however much is paid and saved
    assert bp.idle(1.0 + W * 0.999) is True
    assert bp.idle(1.0 + W * 1.001) is False  # a spin never runs past the window


def test_a_stall_while_spinning_is_billed_one_window_at_most() -> None:
    """The process stopped (SIGSTOP, a long collector pause) for 10 s while spinning: the
    spin is billed one window, not 10 s of debt that would keep the poller from spinning for
    a minute of serving; a dense stream spins again within a few batches."""
    for late_batch in (False, True):
        bp = BusyPoll(W)
        t = _paced(bp, 0.000045, WORK, 200)
        assert bp.spinning
        budget, seconds = bp.budget, bp.seconds
        if late_batch:  # the poll after the stall finds a request: a hit
            bp.served(t + 10.0, t + 10.0 + WORK)
            t += 10.0 + WORK
        else:  # it finds nothing: a miss
            assert not bp.idle(t + 10.0)
            t += 10.0
        assert bp.seconds == pytest.approx(seconds + W)
        assert bp.budget >= budget - W - 1e-12
        hits = bp.hits
        _paced(bp, 0.000045, WORK, 20, t, t - WORK)
        assert bp.hits > hits + 5


def test_after_a_miss_costly_sleeps_bring_the_spinning_straight_back() -> None:
    """Requests every 70 us taking 40 us (gaps of 30 us). Where a sleep costs 60 us, the
    poller that missed once (a lull) spins again at the very next batch, though the miss
    emptied its budget: the hit it expects pays for itself. Where sleeping is free it has to
    save up a gap's worth first (6 us a batch)."""
    for wake, spins_again in [(0.00006, True), (0.0, False)]:
        bp = BusyPoll(W)
        t = _paced(bp, 0.00007, WORK, 300, wake=wake)
        while not bp.spinning:
            t = _paced(bp, 0.00007, WORK, 1, t, t - WORK, wake=wake)
        assert not bp.idle(t + W * 1.001)  # the lull: a miss of the whole window
        assert bp.budget <= 0.0
        t = _paced(bp, 0.00007, WORK, 1, t, t - WORK + W, wake=wake)  # the next request
        assert bp.spinning is spins_again


def test_a_lull_costs_at_most_the_budget_then_sleeps() -> None:
    """A dense stream, then silence: the poller spins out what is left of its budget (at most
    ``window``), counts one miss and sleeps."""
    bp = BusyPoll(W)
    t = _paced(bp, 0.000045, WORK, 200)
    assert bp.spinning
    budget = bp.budget
    assert 0 < budget <= W
    assert bp.idle(t + budget / 2) is True
    assert bp.idle(t + budget * 1.000001) is False
    assert not bp.spinning
    assert bp.misses == 1
    assert bp.budget == pytest.approx(0.0, abs=1e-9)


def test_idle_stops_exactly_at_the_budget() -> None:
    """At the bound (exact binary times), sleeps costing nothing: a poll before the budget is
    spent keeps spinning, the poll at it stops, bills the miss and leaves the budget at 0."""
    bp = BusyPoll(W)
    bp.served(0.0, 2.0**-10)
    bp.spinning, bp.budget = True, 2.0**-15  # ~30 us left to spin
    assert bp.idle(2.0**-10 + 2.0**-15 - 2.0**-30) is True
    assert bp.spinning
    assert bp.idle(2.0**-10 + 2.0**-15) is False
    assert not bp.spinning
    assert (bp.misses, bp.seconds, bp.budget) == (1, 2.0**-15, 0.0)


def test_the_budget_is_capped_at_one_window() -> None:
    """However long the server was busy, what it saved buys at most one window of spinning."""
    bp = BusyPoll(W)
    _stream(bp, 0.0, [0.000001] * 10, work=0.01)
    assert bp.budget == W
    bp = BusyPoll(W)
    _stream(bp, 0.0, [0.000001] * 10, work=W / SPIN_SHARE)  # earns a window at each batch
    assert bp.budget == W


def test_spins_only_when_the_budget_covers_the_expected_gap() -> None:
    """At the bound (exact binary times): a budget equal to the average close gap spins; a
    hair less does not (such a spin would most likely run out before the request came)."""
    gap = 2.0**-16  # ~15 us
    for short, spins in [(0.0, True), (2.0**-40, False)]:
        bp = BusyPoll(W)
        t = _stream(bp, 0.0, [gap] * 60, work=0.0)  # density ~1, no budget: nothing served
        assert not bp.spinning
        bp.gap, bp.budget = gap, gap - short
        bp.served(t + gap, t + gap)  # one more close gap, exactly the average
        assert (bp.gap, bp.budget) == (gap, gap - short)
        assert bp.spinning is spins


def test_an_overdrawn_budget_is_paid_back_before_the_next_spin() -> None:
    """A spin that ran past its budget (the poll came late: a timer ran meanwhile) leaves a
    debt: the next batches' earnings pay it before the poller spins again."""
    bp = BusyPoll(W)
    t = _paced(bp, 0.000045, WORK, 200)
    assert bp.spinning
    bp.budget = W / 4
    late = t + W / 4 + W / 2  # the poll after the budget ran out, half a window late
    assert bp.idle(late) is False
    assert bp.budget == pytest.approx(-W / 2)
    earned = 0.0
    t = late
    while not bp.spinning:  # batches of 40 us earn 40 us * SPIN_SHARE each
        t = _stream(bp, t, [0.000005])
        earned += WORK * SPIN_SHARE
    assert earned >= W / 2


def test_one_late_request_keeps_spinning_two_stop_it() -> None:
    """A steady stream survives one lull (density 1 -> 0.75) and goes on spinning; a second
    lull in a row (0.56) stops spinning until the stream is dense again. (Each call goes on
    at the pace of the previous request, which came at ``t - WORK``: none waits here.)"""
    bp = BusyPoll(W)
    t = _paced(bp, 0.000045, WORK, 100)  # density ~1
    assert bp.spinning
    t = _paced(bp, 0.001, WORK, 1, t, t - WORK)  # the late request: one miss, then a sleep
    assert bp.misses == 1
    assert bp.density == pytest.approx(0.75, abs=0.01)
    t = _paced(bp, 0.000045, WORK, 1, t, t - WORK)
    assert bp.spinning
    t = _paced(bp, 0.001, WORK, 2, t, t - WORK)
    assert bp.density < 0.7
    assert not bp.spinning
    hits = bp.hits
    t = _paced(bp, 0.000045, WORK, 1, t, t - WORK)  # dense again: one close gap is not enough
    assert not bp.spinning
    _paced(bp, 0.000045, WORK, 10, t, t - WORK)
    assert bp.spinning
    assert bp.hits > hits


def test_alternating_close_and_far_gaps_settle_to_sleeping() -> None:
    """Bursts of two on a millisecond timer: spinning after each close gap would miss every
    other time, so the policy settles to not spinning, even from a dense start."""
    bp = BusyPoll(W)
    t = _stream(bp, 0.0, [0.00001] * 30)
    t = _stream(bp, t, [0.001, 0.00001] * 10)
    for _ in range(20):
        t = _stream(bp, t, [0.001])
        assert not bp.spinning
        t = _stream(bp, t, [0.00001])
        assert not bp.spinning


@given(
    window=st.sampled_from([0.0, 0.00001, W, 0.01]),
    steps=st.lists(
        st.tuples(
            st.sampled_from(["batch", "poll", "sleep"]),
            st.floats(min_value=0.0, max_value=0.02),
        ),
        max_size=60,
    ),
)
def test_invariants_under_any_timing(window: float, steps: list[tuple[str, float]]) -> None:
    """Driven as the poll loop drives it (``idle`` only while spinning, ``slept`` only while
    not), with any timing and any cost of a sleep: the policy never spins with window 0,
    never holds more than one window of budget nor owes more than one window and one late
    poll, never spins more than the sleeps it saved plus SPIN_SHARE of the time served plus
    that debt, and its counts add up."""
    bp = BusyPoll(window)
    t = 0.0
    batches = 0
    served = 0.0
    saved = 0.0  # the sleeps credited to hits
    late = 0.0  # the longest step: how far one poll may overdraw
    for kind, dt in steps:
        t += dt
        late = max(late, dt)
        if kind == "batch":
            if bp.spinning:
                saved += bp.wake
            bp.served(t, t + 0.000001)
            t += 0.000001
            served += 0.000001
            batches += 1
        elif kind == "poll" and bp.spinning:
            before = bp.misses
            if not bp.idle(t):
                assert not bp.spinning
                assert bp.misses == before + 1
        elif kind == "sleep" and not bp.spinning:
            bp.slept(dt)
        assert not (window == 0 and bp.spinning)
        assert -window - late - 1e-12 <= bp.budget <= window
        assert 0.0 <= bp.wake <= window
        assert not (bp.spinning and bp.budget + bp.wake <= 0)
        assert bp.hits + bp.misses <= batches + 1
        assert 0.0 <= bp.seconds <= saved + SPIN_SHARE * served + window + late + 1e-12
    if window == 0:
        assert (bp.hits, bp.misses, bp.seconds) == (0, 0, 0.0)


async def _ping_burst(server: RunningServer, n: int) -> None:
    async with await WireClient.connect(server) as client:
        for _ in range(n):
            await client.ping()


async def test_statistics_count_spins_of_a_dense_stream(nursery: trio.Nursery) -> None:
    """With a 10 ms window, back-to-back pings on one connection are dense traffic: the
    poller spins and its spins find the next ping (statistics ``server``)."""
    with trio.fail_after(10):
        server = await start_server(nursery, busy_poll=0.01)
        await _ping_burst(server, 50)
        stats = server.statistics()["server"]
        assert stats["busy_poll_hits"] > 0
        assert stats["busy_poll_seconds"] > 0.0
        server.shutdown()  # while it may still be spinning: must not hang
        await server.aclose()


async def test_busy_poll_zero_never_spins(nursery: trio.Nursery) -> None:
    """busy_poll=0: the same traffic is served and no spin is ever counted."""
    with trio.fail_after(10):
        server = await start_server(nursery, busy_poll=0)
        await _ping_burst(server, 50)
        stats = server.statistics()["server"]
        assert stats["requests_total"] >= 50
        assert (stats["busy_poll_hits"], stats["busy_poll_misses"]) == (0, 0)
        assert stats["busy_poll_seconds"] == 0.0


async def test_timers_run_while_the_poller_spins(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A connection streaming pings keeps the poller spinning; timers still fire meanwhile:
    the holder of a session that expires during the stream gets its LockLost, and the
    poller is still spinning afterwards."""
    server = await start_server(nursery, busy_poll=0.01)
    with trio.fail_after(5):
        holder = await WireClient.connect(server)
        streamer = await WireClient.connect(server)
        granted = await holder.execute("holder", LOCK, max_age=60)
        assert granted.ok

    async def stream() -> None:
        while True:
            await streamer.ping()

    async with trio.open_nursery() as streaming:
        streaming.start_soon(stream)
        with trio.fail_after(5):
            await wait_for(lambda: server.statistics()["server"]["busy_poll_hits"] > 20)
        hits = server.statistics()["server"]["busy_poll_hits"]
        clock.jump(61)
        with trio.fail_after(5):
            event = await holder.event()
        assert event == LockLost(
            "holder", LostReason.EXPIRED, (("ns", "locks", "printer", granted.fence),)
        )
        with trio.fail_after(5):  # and the poller goes on spinning for the stream
            await wait_for(lambda: server.statistics()["server"]["busy_poll_hits"] > hits)
        streaming.cancel_scope.cancel()
    with trio.fail_after(5):
        await holder.aclose()
        await streamer.aclose()
