"""Incomplete request frames (issue 14, item 7: slowloris with partial frames).

Pinned down: a frame must arrive whole within ``frame_timeout`` of its first byte, however
steadily its bytes trickle in (the attack: hello, all but a few bytes of a 1 MiB frame, then a
byte a second below ``idle_timeout``); a slow frame inside the bound, and a stream whose
writes split its frames, are served; the bytes of incomplete frames of all connections
together are bounded by ``max_receive_total`` (the receive that passes it gets OVERLOADED and
its connection is closed, the others carry on); nothing is allocated for the size a header
announces.

Time is a MockClock at real speed (conftest ``clock``) moved by ``clock.jump``; jumps happen
outside any ``fail_after`` block (a jump would eat its virtual deadline).
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import trio
import trio.testing

from lockserver import RunningServer
from protocol import (
    ErrorCode,
    ErrorReply,
    Ping,
    Reply,
    TransactionResult,
    frame,
)

from ._wire import WireClient, frame_of_size, wait_for
from .conftest import start_server

MIB = 1024 * 1024


def _server_stats(server: RunningServer) -> dict[str, Any]:
    stats: dict[str, Any] = server.statistics()["server"]
    return stats


def _buffering(server: RunningServer, size: int) -> Callable[[], bool]:
    """The condition "the server holds ``size`` bytes of incomplete frames" (for wait_for)."""
    return lambda: _server_stats(server)["receive_buffered"] == size


async def _served(c: WireClient, rid: int) -> None:
    reply = await c.reply(rid)
    assert isinstance(reply, Reply), reply
    assert isinstance(reply.body, TransactionResult) and reply.body.ok


# --- frame_timeout ----------------------------------------------------------------------------

ATTACKERS = 4
HELD_BACK = 20  # bytes of the 1 MiB frame each attacker has not sent yet


async def test_trickled_frames_are_dropped_at_frame_timeout(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """The attack of issue 14: connections say hello, send all but 20 bytes of a 1 MiB frame,
    then one byte a second (below idle_timeout = 3 s, so they are never idle). They are
    closed once the frame is frame_timeout (15 s, the default) old, not before, without an
    idle timeout; their buffered megabytes are released; a well-behaved client (which pings
    every second) is served throughout."""
    server = await start_server(nursery, idle_timeout=3.0)
    assert server.config.frame_timeout == 15.0
    data = frame(b"\x00" * MIB)  # max_frame exactly: accepted by the header check
    with trio.fail_after(10):
        good = await WireClient.connect(server)
        attackers = [await WireClient.connect(server) for _ in range(ATTACKERS)]
        first_byte_sent = trio.current_time()
        for a in attackers:
            await a.send_raw(data[:-HELD_BACK])
        buffered = ATTACKERS * (len(data) - HELD_BACK)
        await wait_for(_buffering(server, buffered))
    sent = 0
    for _ in range(HELD_BACK - 2):  # never the whole frame
        clock.jump(1)
        with trio.fail_after(5):
            await trio.testing.wait_all_tasks_blocked()  # the reaper saw the new time
            stats = _server_stats(server)
            assert stats["idle_timeouts"] == 0
            if stats["frame_timeouts"]:
                break
            assert trio.current_time() - first_byte_sent < 15 + 1  # the reaper is late by < 1 s
            position = len(data) - HELD_BACK + sent
            for a in attackers:
                await a.send_raw(data[position : position + 1])
            sent += 1
            buffered += ATTACKERS
            await wait_for(_buffering(server, buffered))
            await good.ping()
    # Dropped by frame_timeout: no earlier than 15 s after the frame's first byte.
    assert trio.current_time() - first_byte_sent >= 15
    assert 14 <= sent < HELD_BACK - 2
    # An attacker whose first byte came a few ms after the first one's may be left for the
    # next pass of the reaper: one more second (below idle_timeout) and all are past.
    clock.jump(1)
    with trio.fail_after(5):
        await wait_for(lambda: _server_stats(server)["frame_timeouts"] == ATTACKERS)
        stats = _server_stats(server)
        assert stats["frame_timeouts"] == ATTACKERS
        assert stats["idle_timeouts"] == 0
        for a in attackers:
            assert await a.read_until_closed() == []  # closed without a reply, as on idle
            await a.aclose()
        await wait_for(lambda: _server_stats(server)["connections"] == 1)
        assert _server_stats(server)["receive_buffered"] == 0
        await good.ping()
        await good.aclose()


async def test_a_slow_frame_inside_the_bound_is_served(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A frame whose pieces arrive over 9.5 s with frame_timeout = 10 s is served; another
    connection whose frame would take 10.5 s is closed at the bound."""
    server = await start_server(nursery, frame_timeout=10.0)
    with trio.fail_after(5):
        slow = await WireClient.connect(server)
        late = await WireClient.connect(server)
        data, rid = frame_of_size(slow, 40_000)
        late_data, _ = frame_of_size(late, 40_000)
        await slow.send_raw(data[:10_000])
        await late.send_raw(late_data[:10_000])
        await wait_for(_buffering(server, 20_000))
    clock.jump(5)
    with trio.fail_after(5):
        await slow.send_raw(data[10_000:30_000])
        await late.send_raw(late_data[10_000:30_000])
        await wait_for(_buffering(server, 60_000))
    clock.jump(4.5)
    with trio.fail_after(5):
        await slow.send_raw(data[30_000:])
        await _served(slow, rid)
        assert _server_stats(server)["frame_timeouts"] == 0
    clock.jump(1)
    with trio.fail_after(5):
        assert await late.read_until_closed() == []
        assert _server_stats(server)["frame_timeouts"] == 1
        await wait_for(_buffering(server, 0))
        await slow.ping()
        await slow.aclose()
        await late.aclose()


async def test_a_stream_whose_writes_split_frames_is_not_one_slow_frame(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A client whose every write ends inside a frame always has an incomplete frame
    buffered, for far longer than frame_timeout; each frame completes within 6 s of its
    first byte, so each is served and the connection stays (the deadline restarts with the
    frame that begins in the receive completing the previous one)."""
    server = await start_server(nursery, frame_timeout=10.0)
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        frames = [frame_of_size(c, 3_000) for _ in range(8)]
        half = 1_500
        await c.send_raw(frames[0][0][:half])
    for i in range(len(frames) - 1):
        clock.jump(6)
        with trio.fail_after(5):
            await c.send_raw(frames[i][0][half:] + frames[i + 1][0][:half])
            await _served(c, frames[i][1])
    with trio.fail_after(5):
        await c.send_raw(frames[-1][0][half:])
        await _served(c, frames[-1][1])
        stats = _server_stats(server)
        assert stats["frame_timeouts"] == 0
        assert stats["receive_buffered"] == 0
        await c.aclose()


async def test_frame_timeout_zero_means_no_limit(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """frame_timeout = 0 (and no idle timeout): an incomplete frame may wait for ever."""
    server = await start_server(nursery, frame_timeout=0.0, idle_timeout=0.0)
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        data, rid = frame_of_size(c, 5_000)
        await c.send_raw(data[:100])
        await wait_for(_buffering(server, 100))
    clock.jump(100_000)
    with trio.fail_after(5):
        await c.send_raw(data[100:])
        await _served(c, rid)
        assert _server_stats(server)["frame_timeouts"] == 0
        await c.aclose()


# --- max_receive_total ------------------------------------------------------------------------

FRAME = 30_000  # payload bytes of the frames of the receive-total test
CAP = 65_536


async def test_max_receive_total_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """Incomplete frames of several connections fill the total exactly to max_receive_total:
    all are kept. One more byte on a fourth connection passes it: that connection gets
    OVERLOADED (no request id) and is closed; the others complete their frames and are
    served, a client sending whole frames is served throughout, and once room is back a new
    incomplete frame is accepted."""
    server = await start_server(nursery, max_frame=32_768, max_receive_total=CAP)
    with trio.fail_after(10):
        a, b, c, d, bystander = [await WireClient.connect(server) for _ in range(5)]
        pieces = {}
        for who in (a, b):
            pieces[who] = frame_of_size(who, FRAME)
            await who.send_raw(pieces[who][0][:30_000])
        pieces[c] = frame_of_size(c, FRAME)
        await c.send_raw(pieces[c][0][: CAP - 60_000])
        await wait_for(_buffering(server, CAP))
        await bystander.ping()  # whole frames never count
        await d.send_raw(b"\x00")  # half a header: one byte past the bound
        messages = await d.read_until_closed()
        assert len(messages) == 1
        error = messages[0]
        assert isinstance(error, ErrorReply)
        assert error.code is ErrorCode.OVERLOADED and error.request_id is None
        assert "max_receive_total" in error.message
        stats = _server_stats(server)
        assert stats["overloaded_drops"] == 1
        await wait_for(_buffering(server, CAP))
        for who in (a, b, c):
            data, rid = pieces[who]
            sent = 30_000 if who is not c else CAP - 60_000
            await who.send_raw(data[sent:])
            await _served(who, rid)
        assert _server_stats(server)["receive_buffered"] == 0
        e = await WireClient.connect(server)
        data, rid = frame_of_size(e, FRAME)
        await e.send_raw(data[:20_000])
        await wait_for(_buffering(server, 20_000))
        await e.send_raw(data[20_000:])
        await _served(e, rid)
        await bystander.ping()
        assert _server_stats(server)["overloaded_drops"] == 1
        for w in (a, b, c, d, e, bystander):
            await w.aclose()


# --- no preallocation -------------------------------------------------------------------------

HEADERS = 16


async def test_a_header_alone_allocates_nothing_for_its_frame(nursery: trio.Nursery) -> None:
    """A header announcing 1 MiB followed by 10 bytes makes the server buffer those 14
    bytes, not the announced size: 16 such connections grow the process's traced memory by
    far less than one announced frame (16 MiB if the size were preallocated)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        clients = [await WireClient.connect(server) for _ in range(HEADERS)]
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for c in clients:
                await c.send_raw(MIB.to_bytes(4, "big") + b"\x00" * 10)
            await wait_for(_buffering(server, HEADERS * 14))
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert after - before < MIB, after - before
        for c in clients:
            await c.aclose()
        await wait_for(_buffering(server, 0))


PINGS = 2_900  # ~60 KiB of frames


async def test_whole_frames_before_an_incomplete_one_are_not_held(
    nursery: trio.Nursery,
) -> None:
    """A receive of ~60 KiB of whole frames (pings) and one byte of the next frame: the pings
    are answered and only that byte stays held and counted. 16 such connections grow the
    traced memory by far less than the 1 MiB of pings they sent (the frame buffer used to keep
    them until the next frame completed, uncounted)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        clients = [await WireClient.connect(server) for _ in range(HEADERS)]
        writes = [b"".join(c.proto.send(Ping(c.rid())) for _ in range(PINGS)) for c in clients]
        assert all(55_000 < len(w) < 65_536 for w in writes)
        tracemalloc.start()
        try:
            before, _ = tracemalloc.get_traced_memory()
            for c, w in zip(clients, writes, strict=True):
                await c.send_raw(w + b"\x00")
            total = HEADERS * (1 + PINGS)  # with the hellos
            await wait_for(lambda: _server_stats(server)["requests_total"] == total)
            await wait_for(_buffering(server, HEADERS))
            after, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert after - before < MIB // 4, after - before
        for c in clients:
            await c.aclose()
        await wait_for(_buffering(server, 0))
