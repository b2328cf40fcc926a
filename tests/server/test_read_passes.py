"""Read passes by duration (statistics ``server``: ``read_passes``, ``read_pass_histogram``,
``read_pass_longest``): counted once per pass whatever it served, the longest kept."""

from __future__ import annotations

import trio

from lockserver import RunningServer
from lockserver.http._metrics import DURATION_BOUNDS, Durations
from protocol import Assert, SetVar

from ._wire import WireClient


def test_a_pass_counts_once_and_its_requests_each() -> None:
    d = Durations()
    d.observe(0.003, 64)  # one pass of 3 ms served 64 requests
    d.observe(0.00004, 1)
    d.observe(0.0004, 2)
    wire = d.passes_to_wire()
    assert wire["read_passes"] == 3
    assert wire["read_pass_longest"] == 0.003
    hist = wire["read_pass_histogram"]
    assert list(hist) == [*map(repr, DURATION_BOUNDS), "+inf"]
    assert hist["0.005"] == 1 and hist["5e-05"] == 1 and hist["0.0005"] == 1
    assert sum(hist.values()) == 3
    # The request buckets count the 64 requests of the long pass.
    assert sum(d.counts) == 67 and d.counts[DURATION_BOUNDS.index(0.005)] == 64
    assert d.cumulative_passes()[-1] == ("+Inf", 3.0)


def test_a_pass_at_a_bound_counts_in_that_bucket_and_past_every_bound_in_inf() -> None:
    d = Durations()
    d.observe(0.005, 1)  # at the bound: in its bucket (upper bounds are inclusive)
    d.observe(2.0, 1)  # past the last bound
    hist = d.passes_to_wire()["read_pass_histogram"]
    assert hist["0.005"] == 1 and hist["+inf"] == 1
    assert d.passes_to_wire()["read_pass_longest"] == 2.0


async def test_statistics_count_the_passes(server: RunningServer) -> None:
    """Over the wire: requests sent one at a time are a pass each."""
    with trio.fail_after(10):
        client = await WireClient.connect(server)
        before = server.statistics()["server"]
        for i in range(3):
            await client.execute("s", Assert(SetVar("t", str(i))))
        after = server.statistics()["server"]
        await client.aclose()
    assert after["read_passes"] - before["read_passes"] == 3
    assert sum(after["read_pass_histogram"].values()) == after["read_passes"]
    assert 0 < after["read_pass_longest"] < 10
