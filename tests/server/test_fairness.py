"""No client can stall the others (issue 30, items 1 and 2): a connection is served a bounded
turn before every other ready connection gets its own, on both protocols; costly reads cost
once per turn, not once per pipelined copy; the health probes answer at the HTTP connection
limit.

The attacks are the issue's, on a real server on loopback, with another client pinging every
10 ms. Its worst round trip is a regression bound the issue asks for (measured before the fix:
2.2-2.4 s during 20,000 pipelined ``GET /healthz``, 145-149 ms during 3,000 pipelined
``stats``), less the time the machine kept the test's process off its CPU meanwhile (Linux
schedstat), so that a loaded 2-core machine does not decide it; everything else here is
counted, not timed.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from lockserver import RunningServer
from lockserver.http._endpoints import Route
from protocol import (
    Assert,
    ErrorCode,
    GetStatistics,
    Ping,
    Reply,
    SetVar,
    Statistics,
    unpack,
)

from ._wire import WireClient
from .conftest import start_server

#: The issue's bound on another client's worst ping during an attack.
PING_BOUND = 0.050
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


def waited() -> float:
    """Seconds this thread has spent runnable but off the CPU (Linux schedstat: the machine
    gave the CPU to another process)."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return int(f.read().split()[1]) / 1e9


@asynccontextmanager
async def pinging(server: RunningServer) -> AsyncIterator[list[float]]:
    """Another client pinging every 10 ms meanwhile; yields its round trips (seconds), each
    less the time the machine kept this process off its CPU during it (the server, the
    pinger and the attacker share this thread: what remains is what their own work cost
    the ping, which is what a noisy 2-core machine must not decide).

    The cyclic collector is off meanwhile: the server shares this test process, whose heap
    (the whole suite's) makes a full collection a pause of its own that is no turn of any
    connection (the server's collector pauses are its ``gc`` statistics' business)."""
    rtts: list[float] = []
    gc.collect()
    gc.disable()
    try:
        async with await WireClient.connect(server) as pinger, trio.open_nursery() as nursery:

            async def ping_loop() -> None:
                while True:
                    started, off = time.perf_counter(), waited()
                    await pinger.ping()
                    rtts.append(time.perf_counter() - started - (waited() - off))
                    await trio.sleep(0.010)

            nursery.start_soon(ping_loop)
            await trio.sleep(0.05)  # a few quiet pings first
            try:
                yield rtts
            finally:
                nursery.cancel_scope.cancel()
    finally:
        gc.enable()


async def read_http_statuses(stream: trio.SocketStream, count: int) -> list[int]:
    """The statuses of ``count`` responses, in order (a response's head is found by its
    status line, which no body here contains; cheap, so the reading costs the loop little)."""
    statuses: list[int] = []
    tail = b""
    while len(statuses) < count:
        chunk = await stream.receive_some(1 << 16)
        assert chunk, f"closed after {len(statuses)} of {count} responses"
        data = tail + chunk
        at = data.find(b"HTTP/1.1 ")
        while at >= 0 and at + 12 <= len(data):
            statuses.append(int(data[at + 9 : at + 12]))
            at = data.find(b"HTTP/1.1 ", at + 12)
        tail = data[at:] if at >= 0 else data[-11:]
    return statuses


async def read_frames(stream: trio.SocketStream, count: int) -> list[bytes]:
    """``count`` whole frames' payloads, in order."""
    frames: list[bytes] = []
    buf = bytearray()
    while len(frames) < count:
        chunk = await stream.receive_some(1 << 16)
        assert chunk, f"closed after {len(frames)} of {count} frames"
        buf += chunk
        while len(buf) >= 4 and len(buf) >= 4 + (size := int.from_bytes(buf[:4], "big")):
            frames.append(bytes(buf[4 : 4 + size]))
            del buf[: 4 + size]
    return frames


def during(rtts: list[float], before: int) -> list[float]:
    return rtts[before:]


# --- HTTP -----------------------------------------------------------------------------------


async def test_20000_pipelined_healthz_leave_another_client_served(
    nursery: trio.Nursery,
) -> None:
    """One connection writes 20,000 ``GET /healthz`` at once: every one is answered 200, in
    order, and another client's pings keep coming back within PING_BOUND (the connection
    yields after each turn: TURN_SECONDS of work)."""
    server = await start_server(nursery)
    burst = HEALTHZ * 20_000
    with trio.fail_after(120):
        async with pinging(server) as rtts:
            before = len(rtts)
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            async with trio.open_nursery() as attack:
                attack.start_soon(stream.send_all, burst)
                statuses = await read_http_statuses(stream, 20_000)
            await stream.aclose()
            seen = during(rtts, before)
    assert statuses == [200] * 20_000
    assert len(seen) >= 10, "the pinger was not served during the attack"
    assert max(seen) < PING_BOUND, f"worst ping {max(seen) * 1000:.1f} ms"


async def test_pipelined_scrapes_are_rendered_once_per_turn(nursery: trio.Nursery) -> None:
    """3,000 pipelined ``GET /metrics``: all answered 200, but rendered once per turn of the
    connection (a turn's identical requests share the first one's answer), so far fewer
    than 3,000 times; a request with another query is answered on its own."""
    server = await start_server(nursery)
    endpoints = server._shell.endpoints  # type: ignore[attr-defined]
    real = endpoints.routes["/metrics"]
    renders = [0]

    def counting(*args: Any) -> Any:
        renders[0] += 1
        return real.handler(*args)

    endpoints.routes["/metrics"] = Route(counting, real.private)
    answered = server.statistics()["server"]["http_requests_total"]
    with trio.fail_after(120):
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        burst = b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n" * 3_000
        burst += b"GET /metrics?x HTTP/1.1\r\nHost: t\r\n\r\n"
        async with trio.open_nursery() as attack:
            attack.start_soon(stream.send_all, burst)
            statuses = await read_http_statuses(stream, 3_001)
        await stream.aclose()
    assert statuses == [200] * 3_001
    assert server.statistics()["server"]["http_requests_total"] == answered + 3_001
    assert 2 <= renders[0] < 3_000 // 4, renders[0]


async def test_a_probe_answers_at_the_http_connection_limit(nursery: trio.Nursery) -> None:
    """64 kept-alive HTTP connections, each after one request, fill http_max_connections:
    ``/healthz`` and ``/readyz`` from new connections still answer 200 (each takes the slot
    of the connection that has waited longest for its next request: the first ones,
    closed without a word); never more than 64 are open."""
    server = await start_server(nursery)
    limit = server.config.http_max_connections
    idle = []
    with trio.fail_after(30):
        for _ in range(limit):
            s = await trio.open_tcp_stream("127.0.0.1", server.port)
            await s.send_all(HEALTHZ)
            assert await read_http_statuses(s, 1) == [200]
            idle.append(s)
        assert server.statistics()["server"]["http_connections"] == limit
        probes = []
        for path in (b"/healthz", b"/readyz"):  # each kept alive, as a kubelet's may be
            probe = await trio.open_tcp_stream("127.0.0.1", server.port)
            await probe.send_all(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
            assert await read_http_statuses(probe, 1) == [200], path
            probes.append(probe)
        for first in idle[:2]:  # evicted: the server closed them
            assert await first.receive_some(100) == b""
        stats = server.statistics()["server"]
        assert stats["http_connections_evicted"] == 2
        assert stats["http_connections"] == limit
        for s in idle[2:] + probes:  # the others are still served
            await s.send_all(HEALTHZ)
            assert await read_http_statuses(s, 1) == [200]
        for s in idle + probes:
            await s.aclose()


async def test_a_probe_answers_at_max_connections(nursery: trio.Nursery) -> None:
    """A server holding max_connections protocol connections refuses another protocol
    client (TOO_MANY_CONNECTIONS) but answers a new connection's ``GET /healthz`` and
    ``/readyz`` (503 there: the server is full), so a liveness probe never restarts it for
    being full."""
    server = await start_server(nursery, max_connections=2)
    with trio.fail_after(20):
        async with (
            await WireClient.connect(server) as a,
            await WireClient.connect(server) as b,
        ):
            for path, status in ((b"/healthz", 200), (b"/readyz", 503)):
                probe = await trio.open_tcp_stream("127.0.0.1", server.port)
                request = b"GET " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
                await probe.send_all(request)
                assert await read_http_statuses(probe, 1) == [status], path
                await probe.aclose()
            extra = await WireClient.connect(server, hello=False)
            await extra.send(Ping(1))
            [refusal] = await extra.read_until_closed()
            assert getattr(refusal, "code", None) is ErrorCode.TOO_MANY_CONNECTIONS
            await extra.aclose()
            await a.ping()
            await b.ping()
        stats = server.statistics()["server"]
        assert stats["connections_refused"] == 1


# --- the protocol ---------------------------------------------------------------------------


async def test_3000_pipelined_stats_leave_another_client_served(nursery: trio.Nursery) -> None:
    """One connection writes 3,000 ``stats`` at once: every one is answered, in order, with
    the statistics; another client's pings keep coming back within PING_BOUND."""
    server = await start_server(nursery)
    with trio.fail_after(120):
        async with await WireClient.connect(server) as attacker:
            rids = [attacker.rid() for _ in range(3_000)]
            burst = b"".join(attacker.proto.send(GetStatistics(rid)) for rid in rids)
            async with pinging(server) as rtts:
                before = len(rtts)
                await attacker.send_raw(burst)
                frames = await read_frames(attacker.stream, 3_000)
                seen = during(rtts, before)
    answered = [unpack(f) for f in frames]
    assert [w["id"] for w in answered] == rids
    assert all(w["type"] == "stats" and "engine" in w["stats"] for w in answered)
    assert len(seen) >= 3, "the pinger was not served during the attack"
    assert max(seen) < PING_BOUND, f"worst ping {max(seen) * 1000:.1f} ms"


async def test_pipelined_stats_share_one_snapshot_per_turn(nursery: trio.Nursery) -> None:
    """3,000 pipelined ``stats`` take the statistics once per turn of their connection (the
    turns counted by the handler), not 3,000 times; a ``stats`` alone still takes them."""
    server = await start_server(nursery)
    handler = server._shell.requests  # type: ignore[attr-defined]
    real: Callable[..., Any] = handler.statistics
    taken = [0]

    def counting(*args: Any) -> Any:
        taken[0] += 1
        return real(*args)

    handler.statistics = counting
    with trio.fail_after(60):
        async with await WireClient.connect(server) as c:
            turns = handler.turn
            rids = [c.rid() for _ in range(3_000)]
            await c.send(*(GetStatistics(rid) for rid in rids))
            frames = await read_frames(c.stream, 3_000)
            turns = handler.turn - turns
            assert len(frames) == 3_000
            assert 1 <= taken[0] <= turns and taken[0] < 3_000 // 4, (taken[0], turns)
            taken[0] = 0
            assert isinstance(await c.call(GetStatistics(c.rid())), Statistics)
            assert taken[0] == 1


async def test_replies_leave_in_order_across_turns(nursery: trio.Nursery) -> None:
    """4,000 pipelined requests of three kinds in one write, served over many turns (with
    other connections served in between): every reply comes back in request order, and the
    transactions' effects are all there."""
    server = await start_server(nursery)
    with trio.fail_after(60):
        async with (
            await WireClient.connect(server) as c,
            await WireClient.connect(server) as other,
        ):
            messages: list[Any] = []
            for i in range(4_000):
                kind = i % 3
                if kind == 0:
                    messages.append(c.execute_message("s", [Assert(SetVar("t", f"v{i}"))]))
                elif kind == 1:
                    messages.append(Ping(c.rid()))
                else:
                    messages.append(GetStatistics(c.rid()))
            turns = server._shell.requests.turn  # type: ignore[attr-defined]
            await c.send(*messages)
            await other.ping()
            frames = await read_frames(c.stream, 4_000)
            assert server._shell.requests.turn - turns > 2  # type: ignore[attr-defined]
    ids = [unpack(f)["id"] for f in frames]
    assert ids == [m.request_id for m in messages]
    assert server.engine.entry_count == len(range(0, 4_000, 3))


async def test_a_turn_ends_with_whole_frames_and_an_incomplete_one_buffered(
    nursery: trio.Nursery,
) -> None:
    """A write of 3,000 ``stats`` and half of one more frame: the turns serve the 3,000,
    the half frame stays buffered (counted in receive_buffered), its rest completes it."""
    server = await start_server(nursery)
    with trio.fail_after(60):
        async with await WireClient.connect(server) as c:
            rids = [c.rid() for _ in range(3_000)]
            last = c.proto.send(Ping(c.rid()))
            await c.send_raw(b"".join(c.proto.send(GetStatistics(r)) for r in rids) + last[:3])
            frames = await read_frames(c.stream, 3_000)
            assert [unpack(f)["id"] for f in frames] == rids
            assert server.statistics()["server"]["receive_buffered"] == 3
            await c.send_raw(last[3:])
            reply = await c.reply(unpack(last[4:])["id"])
            assert isinstance(reply, Reply)
            assert server.statistics()["server"]["receive_buffered"] == 0
