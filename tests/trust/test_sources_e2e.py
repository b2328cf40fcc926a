"""One flooding connection cannot switch min_trust off, end to end (issue 14, item 8): a real
server on 127.0.0.1, real clients, trio's MockClock.

The clock runs at real speed (so ``fail_after`` bounds a real hang too) and the test jumps it
forward to each call's slot: 20 calls in every second of virtual time for the legitimate
client, whatever the machine's speed. The flood is pipelined (``execute_many``) so thousands of
calls land in one tick in a fraction of a real second.
"""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from client import Cause, Status, open_lock_client
from lockserver import ServerConfig, TrustSettings, serve
from protocol import Statement

CLIENT_RATE = 20  # calls per second of virtual time
MIN_TRUST = 0.3
WARM_UP_TICKS = 8  # the client alone: NORM settles near 20
FLOOD_TICKS = 8  # the peer floods, beside the client
AFTER_TICKS = 20  # the peer is silent: the client was refused for 30+ s from here
FLOOD_PER_TICK = 2_000  # 100 x the client's rate


@pytest.mark.parametrize(
    ("source_cap", "refused"),
    [
        pytest.param(1.0, False, id="default-cap"),
        pytest.param(math.inf, True, id="no-cap-reproduces-the-issue"),
    ],
)
async def test_flooding_connection_cannot_refuse_a_steady_client(
    mock_clock: trio.testing.MockClock, source_cap: float, refused: bool
) -> None:
    """A connection sends 2,000 empty executes in each of 8 ticks, then stops; another
    connection calls 20 times a second with min_trust=0.3 throughout. With the default cap the
    flood counts no more than the client (NORM stays near 40) and the client is never refused,
    neither during the flood nor in the 20 s after it. Counting every call (cap inf) the same
    run refuses it after the flood (MinimumRequirements), as the issue reported."""
    mock_clock.rate = 1.0
    config = ServerConfig(host="127.0.0.1", port=0, trust=TrustSettings(source_cap=source_cap))
    results = []
    norms = []  # NORM seen at the end of every tick
    async with trio.open_nursery() as nursery:
        running = await nursery.start(serve, config)
        base = running.started_at
        total_ticks = WARM_UP_TICKS + FLOOD_TICKS + AFTER_TICKS
        with trio.fail_after(total_ticks + 60):  # virtual time: the jumps plus real time
            async with (
                open_lock_client("127.0.0.1", running.port) as good,
                open_lock_client("127.0.0.1", running.port) as bad,
            ):
                client = good.session(max_age=600.0, keepalive=False)
                peer = bad.session(max_age=600.0, keepalive=False)
                flood: list[tuple[str, list[Statement]]] = [("flood", [])] * FLOOD_PER_TICK
                for tick in range(total_ticks):  # bounded: 36 ticks of 20 calls and <= 1 batch
                    for i in range(CLIENT_RATE):
                        slot = base + tick + (i + 0.5) / CLIENT_RATE
                        behind = slot - trio.current_time()
                        if behind > 0:
                            mock_clock.jump(behind)
                        results.append(await client.execute("ns", [], min_trust=MIN_TRUST))
                        if i == 0 and WARM_UP_TICKS <= tick < WARM_UP_TICKS + FLOOD_TICKS:
                            answered = await peer.execute_many(flood)
                            assert all(r.ok for r in answered)
                    norms.append(running.trust.statistics(trio.current_time()).norm)
                stats = running.trust.statistics(trio.current_time())
        nursery.cancel_scope.cancel()

    assert len(results) == total_ticks * CLIENT_RATE
    assert stats.calls_total >= FLOOD_TICKS * FLOOD_PER_TICK + len(results)
    denied = [r for r in results if r.status is Status.TRANSACTION_ERROR]
    assert all(r.cause is Cause.MINIMUM_REQUIREMENTS for r in denied)
    if refused:
        assert max(norms) > 1_000
        assert len(denied) > CLIENT_RATE  # refused for more than a second's worth of calls
        assert min(r.server_trust for r in results) < 0.05
    else:
        # The flood counted no more than the client (up to a call or two of slack at tick
        # edges), so NORM stayed near 40 and the client's trust near 0.5 or above.
        assert max(norms) <= 2.2 * CLIENT_RATE
        assert denied == []
        assert all(r.ok for r in results)
        assert min(r.server_trust for r in results) >= 0.4
