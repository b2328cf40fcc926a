"""HTTP clients that misbehave (issue 16 section 3: "the same limits as protocol clients").

Pinned down: keep-alive serves several requests on one connection, pipelined or not; a
method other than GET/HEAD is 405 (the connection goes on when the request had no body, ends
when a body is left unread); garbage after a valid method is 400; a request head at
``http_max_header`` is served and one byte past it is 431, whether it arrives whole or
trickles; a body at ``MAX_BODY`` is read and one byte past it is 413 (announced or chunked);
a request that never finishes is answered 408 at ``http_request_timeout`` however slowly it
trickles; a kept-alive connection is closed after ``http_idle_timeout``; past
``http_max_connections`` a connection gets 503; shutdown closes idle HTTP connections; and a
protocol client on the same server is served throughout all of it.

Time is a MockClock at real speed (conftest ``clock``) moved by ``clock.jump``; jumps happen
outside any ``fail_after`` block (a jump would eat its virtual deadline).
"""

from __future__ import annotations

import trio
import trio.testing
from server._wire import WireClient, wait_for

from lockserver import RunningServer
from lockserver.http._http import MAX_BODY

from ._client import HttpClient, get, request_bytes
from .conftest import start_server


def _http_stats(server: RunningServer) -> dict[str, int]:
    s = server.statistics()["server"]
    return {"open": s["http_connections"], "requests": s["http_requests_total"]}


async def test_keep_alive_serves_two_requests_on_one_connection(nursery: trio.Nursery) -> None:
    """Two requests one after the other, then two pipelined in one write: four answers in
    order on one connection, which stays open."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        assert (await client.request("GET", "/healthz")).status == 200
        assert (await client.request("GET", "/readyz")).json() == {"ready": True}
        await client.send_raw(request_bytes("GET", "/healthz") + request_bytes("GET", "/nope"))
        assert (await client.response()).status == 200
        assert (await client.response()).status == 404
        assert _http_stats(server) == {"open": 1, "requests": 4}
        await client.aclose()
        await wait_for(lambda: _http_stats(server)["open"] == 0)


async def test_other_methods_are_405(nursery: trio.Nursery) -> None:
    """POST, PUT, DELETE, OPTIONS, any other token: 405 with ``Allow: GET, HEAD``. Without
    a body the connection goes on; a POST whose body is left unread ends it (Connection:
    close)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        for method in ("POST", "PUT", "DELETE", "OPTIONS", "GETX"):
            response = await client.request(method, "/metrics", (("Content-Length", "0"),))
            assert response.status == 405, method
            assert response.headers["allow"] == "GET, HEAD"
            assert "read-only" in response.json()["error"]
        assert (await client.request("GET", "/healthz")).status == 200
        await client.send_raw(
            request_bytes("POST", "/metrics", (("Content-Length", "10"),)) + b"0123456789"
        )
        response = await client.response()
        assert response.status == 405
        assert response.headers["connection"] == "close"
        assert await client.closed()
        await client.aclose()


async def test_garbage_after_a_valid_method_is_400(nursery: trio.Nursery) -> None:
    """A first byte that is a method's but a request that is not HTTP: 400 with the
    parser's reason, the connection closed; the server goes on."""
    server = await start_server(nursery)
    garbage = [
        b"GET \x00\x01\x02 nonsense\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n",
        b"Z" * 100 + b"\r\n\r\n",
    ]
    with trio.fail_after(10):
        for data in garbage:
            client = await HttpClient.connect(server.port)
            await client.send_raw(data)
            response = await client.response()
            assert response.status == 400, data
            assert response.json()["error"].startswith("malformed HTTP request"), data
            assert await client.closed(), data
            await client.aclose()
        assert (await get(server.port, "/healthz")).status == 200


async def test_other_http_versions_are_505(nursery: trio.Nursery) -> None:
    """A request of HTTP/2.0 or 9.9 in HTTP/1 syntax: 505 naming the version."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        for version in ("2.0", "9.9"):
            client = await HttpClient.connect(server.port)
            await client.send_raw(f"GET /healthz HTTP/{version}\r\nHost: x\r\n\r\n".encode())
            response = await client.response()
            assert response.status == 505
            assert f"HTTP/{version} is not supported" in response.json()["error"]
            await client.aclose()


def _request_of_head_size(size: int) -> bytes:
    """A GET /healthz whose request line and headers are exactly ``size`` bytes."""
    base = request_bytes("GET", "/healthz", (("X-Pad", ""),))
    pad = "p" * (size - len(base))
    data = request_bytes("GET", "/healthz", (("X-Pad", pad),))
    assert len(data) == size
    return data


async def test_request_heads_at_and_past_http_max_header(nursery: trio.Nursery) -> None:
    """With http_max_header = 2048: a head of exactly 2048 bytes is served, 2049 is 431
    (closed); so is a head that trickles past the bound without ever ending."""
    server = await start_server(nursery, http_max_header=2048)
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        await client.send_raw(_request_of_head_size(2048))
        assert (await client.response()).status == 200
        await client.send_raw(_request_of_head_size(2049))
        response = await client.response()
        assert response.status == 431
        assert "http_max_header" in response.json()["error"]
        assert await client.closed()
        await client.aclose()
        endless = await HttpClient.connect(server.port)
        await endless.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n")
        for _ in range(30):
            await endless.send_raw(b"X-Long: " + b"y" * 100 + b"\r\n")
        assert (await endless.response()).status == 431
        await endless.aclose()


async def test_request_bodies_at_and_past_max_body(nursery: trio.Nursery) -> None:
    """A GET with a body of MAX_BODY bytes is served (the body ignored) and the connection
    goes on; MAX_BODY + 1 announced is 413 before the body is read; a chunked body that
    grows past MAX_BODY is 413."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        head = request_bytes("GET", "/healthz", (("Content-Length", str(MAX_BODY)),))
        await client.send_raw(head + b"b" * MAX_BODY)
        assert (await client.response()).status == 200
        assert (await client.request("GET", "/healthz")).status == 200
        await client.send_raw(
            request_bytes("GET", "/healthz", (("Content-Length", str(MAX_BODY + 1)),))
        )
        response = await client.response()
        assert response.status == 413
        assert str(MAX_BODY) in response.json()["error"]
        assert await client.closed()
        await client.aclose()
        chunked = await HttpClient.connect(server.port)
        await chunked.send_raw(
            request_bytes("GET", "/healthz", (("Transfer-Encoding", "chunked"),))
        )
        for _ in range(MAX_BODY // 1000 + 1):
            await chunked.send_raw(b"3e8\r\n" + b"c" * 1000 + b"\r\n")
        assert (await chunked.response()).status == 413
        await chunked.aclose()


async def test_a_request_that_never_ends_is_408_at_http_request_timeout(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A client that sends half a head and then a header line every 3 s (never idle) is
    answered 408 and closed once its request is http_request_timeout (10 s) old, not
    before."""
    server = await start_server(nursery)
    assert server.config.http_request_timeout == 10.0
    with trio.fail_after(5):
        slow = await HttpClient.connect(server.port)
        await slow.send_raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await wait_for(lambda: _http_stats(server)["open"] == 1)
    for _ in range(3):  # 9 s
        clock.jump(3)
        with trio.fail_after(5):
            await slow.send_raw(b"X-More: 1\r\n")
            await trio.testing.wait_all_tasks_blocked()
            assert _http_stats(server)["requests"] == 0
    clock.jump(1.5)
    with trio.fail_after(5):
        response = await slow.response()
        assert response.status == 408
        assert "http_request_timeout" in response.json()["error"]
        assert await slow.closed()
        await slow.aclose()
        await wait_for(lambda: _http_stats(server)["open"] == 0)


async def test_an_idle_kept_alive_connection_is_closed(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """After a response, a connection that sends nothing for http_idle_timeout (30 s) is
    closed without a response; one byte before then would have been in time."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        client = await HttpClient.connect(server.port)
        assert (await client.request("GET", "/healthz")).status == 200
    clock.jump(29)
    with trio.fail_after(5):
        await trio.testing.wait_all_tasks_blocked()
        assert _http_stats(server)["open"] == 1
    clock.jump(1.5)
    with trio.fail_after(5):
        assert await client.closed()
        await client.aclose()
        await wait_for(lambda: _http_stats(server)["open"] == 0)


async def test_http_max_connections(nursery: trio.Nursery) -> None:
    """With http_max_connections = 2: two HTTP connections are served; a third takes the
    place of the one that has waited longest for its next request (closed without a word,
    counted as evicted), and so does a fourth; never more than two are open."""
    server = await start_server(nursery, http_max_connections=2)
    with trio.fail_after(10):
        first = await HttpClient.connect(server.port)
        second = await HttpClient.connect(server.port)
        for c in (first, second):
            assert (await c.request("GET", "/healthz")).status == 200
        third = await HttpClient.connect(server.port)
        assert (await third.request("GET", "/healthz")).status == 200
        assert await first.closed()
        assert _http_stats(server)["open"] == 2
        fourth = await HttpClient.connect(server.port)
        assert (await fourth.request("GET", "/readyz")).status == 200
        assert await second.closed()
        metrics = (await third.request("GET", "/metrics")).body.decode()
        assert "lockserver_http_connections_evicted_total 2.0" in metrics
        assert "lockserver_http_connections_refused_total 0.0" in metrics
        assert _http_stats(server)["open"] == 2
        for c in (first, second, third, fourth):
            await c.aclose()


async def test_shutdown_closes_idle_http_connections(nursery: trio.Nursery) -> None:
    """aclose() with a kept-alive HTTP connection open returns at once and the connection
    is closed (no 0.6 s grace spent waiting for it)."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        client = await HttpClient.connect(server.port)
        assert (await client.request("GET", "/healthz")).status == 200
        started = trio.current_time()
        await server.aclose()
        assert trio.current_time() - started < 0.5
        assert await client.closed()
        await client.aclose()


async def test_a_protocol_client_is_unaffected_by_misbehaving_http_clients(
    nursery: trio.Nursery,
) -> None:
    """While 20 HTTP connections hold half-sent heads, 10 send garbage and one scrapes
    /metrics in a loop, a protocol client on the same port is served: 200 pings, each
    answered within 0.5 s (a ping waits at most for the render in progress, a few ms; a
    starved client would wait for the stuck heads, until the 20 s bound; 0.5 s leaves room
    for a loaded 2-core machine running the suite on parallel workers)."""
    server = await start_server(nursery)
    worst = 0.0
    with trio.fail_after(20):
        stuck = []
        for _ in range(20):
            c = await HttpClient.connect(server.port)
            await c.send_raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            stuck.append(c)
        done = trio.Event()

        async def scrape() -> None:
            c = await HttpClient.connect(server.port)
            while not done.is_set():
                assert (await c.request("GET", "/metrics")).status == 200
            await c.aclose()

        async def garbage() -> None:
            for _ in range(10):
                c = await HttpClient.connect(server.port)
                await c.send_raw(b"GET \xff\xfe HTTP/1.1\r\n\r\n")
                assert (await c.response()).status == 400
                await c.aclose()

        async with trio.open_nursery() as inner:
            inner.start_soon(scrape)
            inner.start_soon(garbage)
            client = await WireClient.connect(server)
            for _ in range(200):
                start = trio.current_time()
                await client.ping()
                worst = max(worst, trio.current_time() - start)
            done.set()
        await client.aclose()
        for c in stuck:
            await c.aclose()
    assert worst < 0.5, worst
