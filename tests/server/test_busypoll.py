"""The poller's adaptive busy-poll policy (lockserver._busypoll), fed with made-up times,
and the server wiring: statistics, the off switch, shutdown while spinning."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import trio
import trio.testing
from hypothesis import given

from lockserver import RunningServer
from lockserver._busypoll import BusyPoll
from protocol import Assert, LockLost, LostReason, SetVar

from ._wire import WireClient, wait_for
from .conftest import start_server

W = 0.0001  # the default window, 100 us
LOCK = Assert(SetVar("locks", "printer", "job"))


def _stream(bp: BusyPoll, start: float, gaps: list[float], work: float = 0.00001) -> float:
    """Serve one batch after each gap (gaps measured from the previous batch's end)."""
    t = start
    for gap in gaps:
        t += gap
        bp.served(t, t + work)
        t += work
    return t


def test_off_never_spins() -> None:
    """window 0: no gap, however short, makes the poller spin; nothing is counted."""
    bp = BusyPoll(0.0)
    _stream(bp, 0.0, [0.0, 1e-9, 0.0] * 20)
    assert not bp.spinning
    assert (bp.hits, bp.misses, bp.seconds) == (0, 0, 0.0)


def test_a_steady_stream_starts_spinning_and_counts_hits() -> None:
    """Close gaps raise the density past 0.7 on the fifth close batch; later batches are
    hits. (The very first batch has no batch before it: a far gap.)"""
    bp = BusyPoll(W)
    t = _stream(bp, 0.0, [0.00003] * 5)
    assert not bp.spinning  # density 0.68 after the first batch and four close ones
    t = _stream(bp, t, [0.00003])
    assert bp.spinning
    _stream(bp, t, [0.00003] * 10)
    assert bp.hits == 10
    assert bp.seconds == pytest.approx(10 * 0.00003)
    assert bp.misses == 0


def test_idle_spins_out_the_window_then_counts_a_miss() -> None:
    """idle() keeps spinning inside the window; at its end it stops and the miss is billed."""
    bp = BusyPoll(W)
    t = _stream(bp, 0.0, [0.00001] * 8)
    assert bp.spinning
    assert bp.idle(t + 0.00005) is True
    assert bp.spinning
    assert bp.idle(t + W) is False
    assert not bp.spinning
    assert bp.misses == 1
    assert bp.seconds == pytest.approx(2 * 0.00001 + W)  # batches 7 and 8 were hits


def test_one_late_request_keeps_spinning_two_stop_it() -> None:
    """A steady stream survives one lull (density 1 -> 0.75); a second lull stops spinning."""
    bp = BusyPoll(W)
    t = _stream(bp, 0.0, [0.00001] * 30)  # density ~1
    assert bp.spinning
    assert not bp.idle(t + W)
    t = _stream(bp, t, [0.001])  # the late request, served after a sleep
    assert bp.spinning
    assert not bp.idle(t + W)
    _stream(bp, t, [0.001])
    assert not bp.spinning
    assert bp.misses == 2


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
    steps=st.lists(st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=0.02)), max_size=60),
)
def test_invariants_under_any_timing(window: float, steps: list[tuple[bool, float]]) -> None:
    """Driven as the poll loop drives it (idle() only while spinning), the policy never spins
    with window 0, never keeps spinning past an empty window, and its counts add up."""
    bp = BusyPoll(window)
    t = 0.0
    batches = 0
    for is_batch, dt in steps:
        t += dt
        if is_batch:
            bp.served(t, t + 0.000001)
            t += 0.000001
            batches += 1
        elif bp.spinning:
            before = bp.misses
            if not bp.idle(t):
                assert not bp.spinning
                assert bp.misses == before + 1
        assert not (window == 0 and bp.spinning)
        assert bp.hits + bp.misses <= batches + 1
        assert bp.seconds >= 0.0
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
