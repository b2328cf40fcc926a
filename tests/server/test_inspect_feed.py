"""The change feed over a real socket (issue 16): events pushed to subscribers, filtered by
namespace and table, and a subscriber that never reads: the server drops and counts its
events, keeps serving everyone else, never drops the subscriber, and tells it how many it
lost."""

from __future__ import annotations

import socket
import time

import trio

from lockserver import RunningServer
from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    FeedEvent,
    FeedKind,
    Reply,
    SetVar,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
)

from ._wire import WireClient, wait_for


async def next_feed(c: WireClient) -> FeedEvent:
    while True:
        for i, msg in enumerate(c.inbox):
            if isinstance(msg, FeedEvent):
                del c.inbox[i]
                return msg
        await c._fill()


async def test_subscribers_hear_the_changes_of_their_namespace_and_table(
    server: RunningServer,
) -> None:
    """A namespace subscriber hears a grant and a release with session, fence and a
    wall-clock time; a table subscriber hears only its table; another namespace is silent;
    after unsubscribe nothing more comes."""
    with trio.fail_after(10):
        async with (
            await WireClient.connect(server) as ns_sub,
            await WireClient.connect(server) as table_sub,
            await WireClient.connect(server) as worker,
        ):
            assert await ns_sub.call(Subscribe(41, "ns")) == Subscribed(41)
            assert await table_sub.call(Subscribe(42, "ns", "jobs")) == Subscribed(42)
            granted = await worker.execute("w", Assert(SetVar("locks", "a")))
            await worker.execute("w", Assert(SetVar("other", "x")), namespace="elsewhere")
            await worker.execute("w", Assert(SetVar("jobs", "j")))
            await worker.execute("w", AnywayContinueAfter(DeleteVar("locks", "a")))
            events = [await next_feed(ns_sub) for _ in range(3)]
            assert [(e.subscription, e.kind, e.table, e.var) for e in events] == [
                (41, FeedKind.GRANTED, "locks", "a"),
                (41, FeedKind.GRANTED, "jobs", "j"),
                (41, FeedKind.RELEASED, "locks", "a"),
            ]
            assert events[0].session == "w" and events[0].fence == granted.fence
            assert abs(events[0].at - time.time()) < 60 and events[0].dropped == 0
            jobs = await next_feed(table_sub)
            assert (jobs.subscription, jobs.table, jobs.var) == (42, "jobs", "j")
            assert await ns_sub.call(Unsubscribe(43, 41)) == Unsubscribed(True)
            await worker.execute("w", Assert(SetVar("locks", "b")))
            await ns_sub.ping()
            assert not [m for m in ns_sub.inbox if isinstance(m, FeedEvent)]


ROUNDS = 80
BATCH = 500  # two ops each: max_ops


async def test_a_subscriber_that_never_reads_loses_events_not_the_server(
    server: RunningServer,
) -> None:
    """A subscriber stops reading while 80,000 feed events are produced. The server drops
    and counts the events it cannot buffer (past the feed's bound), keeps answering another
    client's pings promptly the whole time, never drops the subscriber as a slow consumer;
    once the subscriber reads again, the next event says how many were dropped, and the
    events received plus those reported dropped are exactly the events produced."""
    with trio.fail_after(60):
        async with (
            await WireClient.connect(server, hello=False) as sub,
            await WireClient.connect(server) as worker,
            await WireClient.connect(server) as bystander,
        ):
            sub.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            await sub.hello()
            assert await sub.call(Subscribe(7, "ns")) == Subscribed(7)
            # Small kernel buffers on both ends of the subscriber's socket (64 KiB), so the
            # feed's own bound is what fills (not tens of megabytes of autotuned buffers).
            port = sub.stream.socket.getsockname()[1]
            [peer] = [
                p
                for p in server._shell.clients  # type: ignore[attr-defined]
                if p.address.endswith(f":{port}")
            ]
            peer.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
            worst = 0.0
            produced = 0
            for r in range(ROUNDS):
                take = [Assert(SetVar("L", f"v{i}")) for i in range(BATCH)]
                drop = [AnywayContinueAfter(DeleteVar("L", f"v{i}")) for i in range(BATCH)]
                assert (await worker.execute("w", *take)).ok
                assert (await worker.execute("w", *drop)).ok
                produced += 2 * BATCH
                if r % 4 == 0:
                    started = time.perf_counter()
                    await bystander.ping()
                    worst = max(worst, time.perf_counter() - started)
            stats = server.statistics()["server"]
            dropped = stats["feed_events_dropped"]
            assert dropped > 0
            assert stats["slow_consumers_dropped"] == 0
            assert worst < 1.0, f"a ping took {worst:.3f} s while the feed overflowed"
            # The subscriber reads again; once its backlog is out, one more change carries
            # the count of the events dropped since the last one it was sent.
            counts = [0, 0]  # received, reported dropped

            async def read_feed() -> None:
                while True:
                    await sub._fill()
                    events = [m for m in sub.inbox if isinstance(m, FeedEvent)]
                    sub.inbox.clear()  # (only feed events can be there: nothing else asked)
                    for event in events:
                        counts[0] += 1
                        counts[1] += event.dropped
                        if event.var == "marker":
                            return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_feed)
                await wait_for(lambda: not peer.blocked and not peer.outbox)
                await worker.execute("w", Assert(SetVar("L", "marker")))
                produced += 1
            received, reported = counts
            assert reported == dropped
            assert received + reported == produced
            # The subscriber's connection is still in order.
            assert isinstance(await sub.request(Unsubscribe(sub.rid(), 7)), Reply)
