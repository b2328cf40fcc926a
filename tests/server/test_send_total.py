"""The unsent bytes of all connections together (issue 14, item 7, send side): bounded by
``max_send_total`` as one connection's are by ``max_send_buffer``.

Pinned down: a blocked connection's outbox is counted in the server's ``Totals`` exactly
(the bound itself is allowed, one byte more drops the connection whose outbox grew, not the
others); bytes leave the total as the writer sends them, when a connection is killed and when
its writer ends; the count of blocked connections follows; and end to end, a client that
does not read is dropped by the total while under its own ``max_send_buffer``, with another
client served.
"""

from __future__ import annotations

import logging
import socket

import pytest
import trio

from lockserver._peer import Peer, Totals
from protocol import Connection, Role, SelectConstantValue

from ._wire import BIG, WireClient, flood, wait_for
from .conftest import start_server

LIMIT = 1024 * 1024
CHUNK = b"x" * 65536


async def _host(*, task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
    """A nursery of its own for one Peer (Peer.kill cancels its connection's nursery)."""
    async with trio.open_nursery() as nursery:
        task_status.started(nursery)
        await trio.sleep_forever()


def _client(sock: socket.socket, name: str, totals: Totals, drops: list[str]) -> Peer:
    sock.setblocking(False)
    return Peer(
        sock,
        name,
        Connection(Role.SERVER),
        trio.current_time(),
        max_send_buffer=64 * LIMIT,  # far away: only the total can drop anybody here
        send_timeout=60.0,
        on_slow=lambda c, why: drops.append(f"{c.name}: {why}"),
        totals=totals,
    )


def _block(c: Peer) -> None:
    """Queue bytes until the kernel refuses some (bounded: socket buffers are finite)."""
    for _ in range(1000):
        c.push(CHUNK)
        if c.blocked:
            return
    raise AssertionError("the socket never filled up")


def _drain(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            data = sock.recv(1 << 20)
        except BlockingIOError:
            return got
        got += len(data)


async def test_send_total_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """Two blocked connections fill the total to exactly max_send_total: both are kept. One
    byte more on the first drops it (its outbox grew past the total) and takes its bytes out
    of the total; the second stays, and once its peer reads, its writer empties it: the total
    and the blocked count return to zero."""
    totals = Totals(max_receive=LIMIT, max_send=LIMIT)
    drops: list[str] = []
    a_sock, a_peer = socket.socketpair()
    b_sock, b_peer = socket.socketpair()
    b_peer.setblocking(False)
    with trio.fail_after(10), a_sock, a_peer, b_sock, b_peer:
        a = _client(a_sock, "a", totals, drops)
        b = _client(b_sock, "b", totals, drops)
        a.nursery = await nursery.start(_host)
        b.nursery = await nursery.start(_host)
        _block(a)
        _block(b)
        assert totals.blocked == 2
        assert totals.unsent == len(a.outbox) + len(b.outbox) < LIMIT
        b.push(b"y" * (LIMIT - totals.unsent))  # exactly at the bound
        assert totals.unsent == LIMIT == len(a.outbox) + len(b.outbox)
        assert drops == [] and not a.dead and not b.dead
        a_size = len(a.outbox)
        a.push(b"z")  # one byte past it
        assert a.dead and not b.dead
        assert drops == [
            f"a: {a_size + 1} unsent bytes, {LIMIT + 1} in all connections together "
            f"(max_send_total={LIMIT})"
        ]
        assert totals.unsent == len(b.outbox)
        await wait_for(lambda: totals.blocked == 1)  # a's writer was cancelled
        for _ in range(10_000):
            if not b.blocked:
                break
            _drain(b_peer)
            await trio.sleep(0.001)
        assert not b.blocked and not b.outbox
        assert totals.unsent == 0 and totals.blocked == 0
        assert drops == [drops[0]]


async def test_writer_ending_takes_its_bytes_out_of_the_total(nursery: trio.Nursery) -> None:
    """A blocked connection's bytes leave the total as they are sent; bytes queued while
    blocked are counted at once; a connection cancelled mid-write (its nursery cancelled, as
    at shutdown) takes its unsent bytes out."""
    totals = Totals(max_receive=LIMIT, max_send=64 * LIMIT)
    drops: list[str] = []
    sock, peer = socket.socketpair()
    peer.setblocking(False)
    with trio.fail_after(10), sock, peer:
        c = _client(sock, "c", totals, drops)
        host = await nursery.start(_host)
        c.nursery = host
        _block(c)
        before = totals.unsent
        assert before == len(c.outbox) > 0
        c.push(b"q" * 1000)
        assert totals.unsent == before + 1000 == len(c.outbox)
        _drain(peer)
        await wait_for(lambda: totals.unsent < before)  # the writer sent some
        assert totals.unsent == len(c.outbox)
        host.cancel_scope.cancel()
        await wait_for(lambda: totals.blocked == 0)
        assert totals.unsent == 0
        assert drops == []


async def test_non_reader_dropped_by_the_total_under_its_own_buffer(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """With max_send_total far below max_send_buffer, a client that floods requests without
    reading is dropped as a slow consumer by the total; a reading client is served and
    nothing is left counted."""
    server = await start_server(
        nursery, max_send_buffer=64 * 1024 * 1024, max_send_total=256 * 1024
    )
    caplog.set_level(logging.WARNING, logger="lockserver")
    with trio.fail_after(30):
        flooder = await WireClient.connect(server)
        other = await WireClient.connect(server)
        async with trio.open_nursery() as inner:
            inner.start_soon(flood, flooder, 1000)  # 60 MB, far beyond the kernel's buffers
            while server.statistics()["server"]["slow_consumers_dropped"] == 0:
                await other.ping()
                await trio.sleep(0.001)
        assert "max_send_total=262144" in caplog.text
        await wait_for(lambda: server.statistics()["server"]["connections"] == 1)
        stats = server.statistics()["server"]
        assert stats["slow_consumers_dropped"] == 1
        assert stats["send_buffered"] == 0 and stats["connections_blocked"] == 0
        res = await other.execute("other", SelectConstantValue("v", BIG))
        assert res.ok
        await flooder.aclose()
        await other.aclose()
