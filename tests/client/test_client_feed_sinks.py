"""Feed sinks (client/_core.py): a subscription made with a sink hands its events to the sink,
never to the application's ``feed_events()`` (which keeps its own); the sink hears when the
connection drops and when the subscription was made again after a reconnect (a gap); ending
the subscription forgets the sink; ``process_events(until=)`` stops reading as soon as the
predicate holds. Sync and async faces."""

from __future__ import annotations

import socket
import threading
import time

import anyio
import trio
from support import ThreadedServer

from client import Assert, LockClient, SetVar, open_lock_client
from lockserver import RunningServer
from protocol import FeedEvent


class Sink:
    """A FeedSink that records what it is told."""

    def __init__(self) -> None:
        self.events: list[FeedEvent] = []
        self.gaps = 0
        self.losses = 0
        self.changed = threading.Event()

    def put(self, event: FeedEvent) -> None:
        self.events.append(event)
        self.changed.set()

    def gap(self) -> None:
        self.gaps += 1
        self.changed.set()

    def connection_lost(self) -> None:
        self.losses += 1
        self.changed.set()


def test_sync_sink_gets_its_events_and_hears_gaps(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """Two subscriptions, one with a sink: each event goes to exactly one place; a dropped
    connection is reported to the sink, and the reconnect's resubscription as a gap; after
    unsubscribe the sink is forgotten."""
    with LockClient(port=threaded_server.port) as c, c.session() as s:
        sink = Sink()
        mine = c.subscribe("ns", "t", sink=sink)
        theirs = c.subscribe("ns", "u")
        assert c._core.feed_sinks == {mine: sink}
        s.execute("ns", [Assert(SetVar("t", "a")), Assert(SetVar("u", "b"))])
        c.process_events(5, until=lambda: bool(sink.events))
        c.process_events(0.1)
        assert [(e.table, e.var) for e in sink.events] == [("t", "a")]
        assert all(e.subscription == mine for e in sink.events)
        assert [(e.table, e.var, e.subscription) for e in c.feed_events()] == [("u", "b", theirs)]
        conn = c._conn
        assert conn is not None
        conn.sock.shutdown(socket.SHUT_RDWR)
        c.process_events(0.5, until=lambda: sink.losses > 0)
        assert sink.losses == 1
        c.ping()  # reconnects: the subscriptions are made again
        assert sink.gaps == 1
        assert c.unsubscribe(mine)
        assert c._core.feed_sinks == {}
        assert c.unsubscribe(theirs)


def test_process_events_until_returns_as_soon_as_it_holds(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """``process_events(30, until=...)`` returns right after the event that makes the
    predicate true, not at its timeout."""
    with LockClient(port=threaded_server.port) as c, LockClient(port=threaded_server.port) as o:
        sink = Sink()
        c.subscribe("ns", "t", sink=sink)
        with o.session() as s:
            threading.Timer(0.2, lambda: s.execute("ns", [Assert(SetVar("t", "x"))])).start()
            t0 = time.monotonic()
            c.process_events(30, until=lambda: bool(sink.events))
            assert time.monotonic() - t0 < 10
            assert sink.events


async def test_async_sink_gets_its_events(server: RunningServer) -> None:
    """The async face: the reader task hands the sink its events; the application's
    feed_events() is left alone; the sink hears the drop and the resubscription."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            sink = Sink()
            mine = await c.subscribe("ns", "t", sink=sink)
            await s.execute("ns", [Assert(SetVar("t", "a"))])
            while not sink.events:
                await anyio.sleep(0.01)
            assert c.feed_events() == []
            assert sink.events[0].subscription == mine
            conn = c._conn
            assert conn is not None
            conn.sock.shutdown(socket.SHUT_RDWR)
            while not sink.losses:
                await anyio.sleep(0.01)
            await c.ping()
            assert sink.gaps == 1
            assert await c.unsubscribe(mine)
            assert c._core.feed_sinks == {}
