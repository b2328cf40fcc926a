"""What each HTTP path answers (issue 16 section 3), on the protocol's own port.

Pinned down: ``/healthz`` is 200 while the process serves; ``/readyz`` is 200 when the server
would accept work and 503 naming every reason when not (``ready_min_uptime``,
``ready_min_trust``, ``max_connections``, ``max_sessions``); ``/v1/status`` carries the
figures of the status page, live (the sessions, entries and tables a protocol client just
made) and its history grows on the trust ticks; HEAD answers GET's head without a body; an
unknown path is 404 (JSON); with tokens configured the data paths
need a bearer token and the probes do not; HTTPS works on a TLS server's port.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme
from server._wire import WireClient, wait_for

from lockserver._auth import TokenSpec
from lockserver._build import build
from lockserver.http._http import HttpResponse
from protocol import Assert, SetVar

from ._client import HttpClient, get
from .conftest import start_server


async def test_healthz(nursery: trio.Nursery) -> None:
    """GET /healthz: 200, ``{"status": "ok"}``, JSON, not cacheable."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        response = await get(server.port, "/healthz")
    assert response.status == 200
    assert response.json() == {"status": "ok"}
    assert response.headers["cache-control"] == "no-store"


async def test_readyz_waits_for_ready_min_uptime(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """With ready_min_uptime = 30 s, /readyz is 503 with the reason until the server has
    been up 30 s, then 200."""
    server = await start_server(nursery, ready_min_uptime=30.0)
    with trio.fail_after(10):
        response = await get(server.port, "/readyz")
    assert response.status == 503
    [reason] = response.json()["reasons"]
    assert "below ready_min_uptime=30 s" in reason, reason
    clock.jump(30)
    with trio.fail_after(10):
        response = await get(server.port, "/readyz")
    assert response.status == 200
    assert response.json() == {"ready": True}


async def test_readyz_names_every_reason(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A server at max_connections and max_sessions, its trust below ready_min_trust (a
    drop from 50 calls/s to none), is not ready for all three reasons at once. (The probe's
    connection is kept alive from before the limit was reached; a new one would be served
    too: tests/server/test_fairness.py.)"""
    server = await start_server(nursery, max_connections=1, max_sessions=1, ready_min_trust=0.9)
    with trio.fail_after(20):
        probe = await HttpClient.connect(server.port)
        assert (await probe.request("GET", "/readyz")).status == 200
        client = await WireClient.connect(server)
        for _ in range(8):  # NORM learns 50 calls/s
            for _ in range(50):
                await client.execute("s1")
            clock.jump(1)
        clock.jump(2)  # then nothing: the load falls, NORM remembers
        await trio.testing.wait_all_tasks_blocked()
        response = await probe.request("GET", "/readyz")
        await client.aclose()
        await probe.aclose()
    assert response.status == 503
    reasons = response.json()["reasons"]
    assert len(reasons) == 3, reasons
    assert "(max_connections=1)" in reasons[0]
    assert "(max_sessions=1)" in reasons[1]
    assert "below ready_min_trust=0.9" in reasons[2]


@pytest.mark.both_builds("reports which build runs")
async def test_status_shows_live_figures(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """/v1/status counts the sessions, entries and tables a protocol client made, the
    protocol and HTTP connections, and its history gains a sample per trust tick with the
    transactions per second of that tick."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await WireClient.connect(server)
        for i in range(3):
            await client.execute(f"s{i}", Assert(SetVar("t", f"v{i}")))
        await client.execute("s0", Assert(SetVar("u", "v")))
        clock.jump(1)
        await trio.testing.wait_all_tasks_blocked()
        status = (await get(server.port, "/v1/status")).json()
    assert status["sessions"] == 3
    assert status["entries"] == 4
    assert status["tables"] == 2
    assert status["namespaces"] == 1
    assert status["connections"] == 1
    assert status["http_connections"] == 1  # the asking one
    assert status["transactions_total"] == 4
    assert status["ready"] is True and status["not_ready"] == []
    assert status["version"] and status["host"] and status["instance"]
    assert status["build"] == build()  # pure or compiled, as this run loaded it
    assert status["started_at"].endswith("Z")
    assert status["time"].endswith("Z") and status["time"][:19] >= status["started_at"][:19]
    history = status["history"]
    assert len(history["uptime"]) == 1
    assert history["transactions_per_second"] == [0.0]  # the first sample has no rate yet
    with trio.fail_after(10):
        for _ in range(10):
            await client.execute("s0")
        clock.jump(1)
        await trio.testing.wait_all_tasks_blocked()
        status = (await get(server.port, "/v1/status")).json()
        await client.aclose()
    assert len(status["history"]["uptime"]) == 2
    rate = status["transactions_per_second"]
    assert rate == pytest.approx(status["history"]["transactions_per_second"][-1], abs=1e-3)
    assert rate == pytest.approx(10.0, rel=0.05)  # 10 calls in one tick (the clock runs too)


async def test_head_is_get_without_the_body(nursery: trio.Nursery) -> None:
    """HEAD / and HEAD /healthz: the status and headers GET gives (Content-Length included),
    no body; the connection stays usable for the next request."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        for path in ("/", "/healthz"):
            full = await client.request("GET", path)
            head = await client.request("HEAD", path)
            assert head.status == full.status == 200
            assert head.body == b""
            assert head.headers == full.headers
            assert int(head.headers["content-length"]) == len(full.body) > 0
        assert (await client.request("GET", "/healthz")).json() == {"status": "ok"}
        await client.aclose()


async def test_the_page_is_html_with_a_strict_policy(nursery: trio.Nursery) -> None:
    """GET / is the status page: HTML that loads nothing from elsewhere (its policy allows
    inline script and style and requests to this server only)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        response = await get(server.port, "/")
    assert response.status == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert b"/v1/status" in response.body
    assert b"http://" not in response.body.replace(b"http://www.w3.org/2000/svg", b"")
    assert b"https://" not in response.body
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy


async def test_unknown_paths_are_404(nursery: trio.Nursery) -> None:
    """Any unknown path (a listing's with a trailing slash too): 404 with a JSON error
    naming the path."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        for path in ("/v1/holders/", "/v1/holder", "/nope", "/metrics/"):
            response = await get(server.port, path + "?namespace=x")
            assert response.status == 404, path
            assert response.json() == {"error": f"no such endpoint: {path}"}


async def test_query_strings_and_absolute_targets(nursery: trio.Nursery) -> None:
    """The query does not change the route; an absolute target (a proxy's) routes by its
    path."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        assert (await get(server.port, "/healthz?verbose=1")).status == 200
        response = await get(server.port, f"http://127.0.0.1:{server.port}/healthz")
        assert response.status == 200
        # An absolute target without a path means "/": the page.
        response = await get(server.port, "http://127.0.0.1")
        assert response.headers["content-type"] == "text/html; charset=utf-8"


TOKENS = (TokenSpec("ops", "s3cret-ops"), TokenSpec("billing", "s3cret-billing", ("billing",)))


async def test_tokens_guard_the_data_paths(nursery: trio.Nursery) -> None:
    """With tokens configured: /metrics and /v1/status answer 401 (with WWW-Authenticate)
    without a token or with a wrong one; /v1/status 200 with any configured token, /metrics
    (the whole server) 200 with one without a namespace restriction and 403 with a
    restricted one; /healthz, /readyz and the page need none."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(10):
        for path in ("/metrics", "/v1/status"):
            for headers in ((), (("Authorization", "Bearer nope"),), (("Authorization", "x"),)):
                response = await get(server.port, path, headers)
                assert response.status == 401, (path, headers)
                assert response.headers["www-authenticate"].startswith("Bearer")
                assert "token" in response.json()["error"]
            for secret in ("s3cret-ops", "s3cret-billing"):
                response = await get(server.port, path, (("Authorization", f"Bearer {secret}"),))
                restricted = secret == "s3cret-billing" and path == "/metrics"
                assert response.status == (403 if restricted else 200), path
        for path in ("/healthz", "/readyz", "/"):
            assert (await get(server.port, path)).status == 200, path


async def test_https_on_a_tls_server(nursery: trio.Nursery, tmp_path: Path) -> None:
    """A TLS server answers HTTPS on its port: the request is sniffed after decryption."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    pem = tmp_path / "server.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(pem))
    server = await start_server(nursery, tls_cert=str(pem))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with trio.fail_after(10):
        tcp = await trio.open_tcp_stream("127.0.0.1", server.port)
        stream = trio.SSLStream(tcp, context, server_hostname="127.0.0.1", https_compatible=True)
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
        await stream.aclose()
    assert data.startswith(b"HTTP/1.1 200 OK\r\n"), data
    assert data.endswith(b'{"status":"ok"}')


async def test_a_protocol_client_is_still_served(nursery: trio.Nursery) -> None:
    """The first bytes of a protocol connection (a hello) are served as before, and a first
    byte that is neither 0x00 nor a letter is still a protocol frame (FRAME_TOO_LARGE)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        client = await WireClient.connect(server)
        await client.ping()
        await client.aclose()
        raw = await WireClient.connect(server, hello=False)
        await raw.send_raw(b"\x01\x00\x00\x05hello")
        [error] = await raw.read_until_closed()
        assert "exceeds the limit" in error.message  # type: ignore[union-attr]
        await raw.aclose()
        await wait_for(lambda: server.statistics()["server"]["connections"] == 0)


async def test_a_failing_endpoint_is_a_500_for_that_request_only(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """An endpoint that raises (a bug) answers 500 with a JSON error and is logged with its
    traceback; the connection and the server go on."""
    server = await start_server(nursery)

    def broken(*args: object) -> HttpResponse:
        raise RuntimeError("boom")

    server._shell.endpoints.add_route("/broken", broken)  # type: ignore[arg-type]
    with trio.fail_after(10):
        client = await HttpClient.connect(server.port)
        response = await client.request("GET", "/broken")
        assert response.status == 500
        assert response.json() == {"error": "internal server error (logged)"}
        assert (await client.request("GET", "/healthz")).status == 200
        await client.aclose()
    assert "RuntimeError: boom" in caplog.text
    with pytest.raises(ValueError, match="routed already"):
        server._shell.endpoints.add_route("/broken", broken)  # type: ignore[arg-type]
