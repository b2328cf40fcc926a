"""Slow consumers: a client that does not read its replies is dropped (outbox bound or send
timeout) and the others are served while it is stuck; a client that reads while it pipelines
is served fully. No assertion here depends on how fast the machine is: states and counts."""

from __future__ import annotations

import trio
import trio.testing

from protocol import GetStatistics, Reply, SelectConstantValue, TransactionResult

from ._wire import BIG, WireClient, flood, wait_for
from .conftest import start_server


async def test_client_that_does_not_read_is_dropped(nursery: trio.Nursery) -> None:
    """A client flooding requests without reading passes max_send_buffer of unsent replies
    and is disconnected; meanwhile another client keeps getting answers: while the flooder is
    blocked (its replies stuck in the server, not yet dropped), the other client gets every
    one of 20 pings and a transaction answered, and it is served after the drop as well."""
    server = await start_server(nursery, max_send_buffer=256 * 1024, send_timeout=3600.0)

    def stats() -> dict[str, int]:
        figures: dict[str, int] = server.statistics()["server"]
        return figures

    with trio.fail_after(30):
        flooder = await WireClient.connect(server)
        other = await WireClient.connect(server)
        # One big request at a time until the kernel refuses the flooder's replies: its
        # connection is blocked with at most a couple of 60 KB replies queued (< 256 KiB).
        while stats()["connections_blocked"] == 0:
            done = stats()["requests_total"] + 1
            await flooder.send(flooder.execute_message("flood", [SelectConstantValue("v", BIG)]))
            await wait_for(lambda done=done: stats()["requests_total"] >= done)
        assert stats()["slow_consumers_dropped"] == 0
        for _ in range(20):
            await other.ping()  # fails the test unless its Pong arrives
        res = await other.execute("other", SelectConstantValue("v", 1))
        assert res.ok
        assert stats()["connections_blocked"] == 1  # the flooder was stuck all along
        assert stats()["slow_consumers_dropped"] == 0
        async with trio.open_nursery() as inner:
            inner.start_soon(flood, flooder, 1000)  # 60 MB, far beyond the kernel's buffers
            await wait_for(lambda: stats()["slow_consumers_dropped"] == 1)
        await wait_for(lambda: stats()["connections"] == 1)
        assert stats()["slow_consumers_dropped"] == 1
        assert stats()["connections_blocked"] == 0
        await other.ping()
        res = await other.execute("other", SelectConstantValue("v", 1))
        assert res.ok
        await flooder.aclose()
        await other.aclose()


async def test_blocked_send_times_out(nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    """A client whose unsent replies stay under max_send_buffer but which stops reading is
    dropped once a send makes no progress for send_timeout."""
    server = await start_server(nursery, max_send_buffer=64 * 1024 * 1024, send_timeout=5.0)
    with trio.fail_after(30):
        stuck = await WireClient.connect(server)
        await flood(stuck, 300)  # 18 MB: the kernel buffers cannot hold the replies
        await wait_for(lambda: server.statistics()["server"]["connections_blocked"] == 1)
        assert server.statistics()["server"]["slow_consumers_dropped"] == 0
    clock.jump(6)
    with trio.fail_after(5):
        await wait_for(lambda: server.statistics()["server"]["slow_consumers_dropped"] == 1)
        await wait_for(lambda: server.statistics()["server"]["connections"] == 0)
        await stuck.aclose()


async def test_pipelining_client_that_reads_is_served_fully(nursery: trio.Nursery) -> None:
    """Replies bigger than the kernel's buffers go through the blocked-writer path in order:
    a client that sends 400 big requests while reading gets every reply, matched by id."""
    server = await start_server(nursery, max_send_buffer=8 * 1024 * 1024)
    with trio.fail_after(30):
        c = await WireClient.connect(server)
        messages = [c.execute_message("s", [SelectConstantValue("v", BIG)]) for _ in range(400)]

        async def send_all() -> None:
            for m in messages:
                await c.send(m)

        async with trio.open_nursery() as inner:
            inner.start_soon(send_all)
            for m in messages:
                answer = await c.reply(m.request_id)
                assert isinstance(answer, Reply)
                assert isinstance(answer.body, TransactionResult)
                assert answer.body.data == (("v", BIG),)
        body = await c.call(GetStatistics(c.rid()))
        assert body.values["server"]["slow_consumers_dropped"] == 0  # type: ignore[union-attr]
        await c.aclose()
