"""Cheap requests that cost a lot (issue 14, item 5): ``stats`` is answered from counters.

Pinned down: 3,000 pipelined ``stats`` in one write are all answered, in order, and none of
them walks the frozen generation (``gc.get_freeze_count()`` is called once, when the server
starts: it walks every frozen object, ~26,000 after ``gc.freeze()`` at start-up, which made
3,000 stats cost ~1 s of server CPU); another client is served meanwhile; the blocked
connections are a running count that returns to zero. (The CPU and latency figures are
measured outside the tests; nothing here times anything.)
"""

from __future__ import annotations

import gc

import pytest
import trio

from protocol import GetStatistics, Reply, Statistics

from ._wire import WireClient, wait_for
from .conftest import start_server

COUNT = 3_000


async def test_pipelined_stats_never_walk_the_frozen_generation(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 stats requests in one write (64 KiB): every one answered, frozen_objects the
    count taken at start, gc.get_freeze_count() not called again; a second client's ping is
    answered while they are served; no connection is left counted as blocked."""
    calls = []
    real = gc.get_freeze_count

    def counting() -> int:
        calls.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counting)
    server = await start_server(nursery)
    assert len(calls) == 1  # at start
    frozen = server.statistics()["gc"]["frozen_objects"]
    assert frozen == real()
    with trio.fail_after(30):
        async with (
            await WireClient.connect(server) as c,
            await WireClient.connect(server) as other,
        ):
            requests = [GetStatistics(c.rid()) for _ in range(COUNT)]
            await c.send(*requests)
            await other.ping()
            for request in requests:
                reply = await c.reply(request.request_id)
                assert isinstance(reply, Reply) and isinstance(reply.body, Statistics)
                assert reply.body.values["gc"]["frozen_objects"] == frozen
            await other.ping()
            assert len(calls) == 1
            await wait_for(lambda: server.statistics()["server"]["connections_blocked"] == 0)
