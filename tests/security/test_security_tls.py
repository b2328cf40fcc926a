"""TLS: both clients over TLS with a trustme CA, a plain client refused cleanly, and client
certificates required and enforced with tls_client_ca."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trio
import trustme
from security_support import Raw, start_server

from client import Assert, LockClient, ServerUnavailable, SetVar, open_lock_client
from lockserver._auth import TokenSpec

TOKEN = "tls-token-0123456789"


async def test_async_client_over_tls(
    nursery: trio.Nursery, server_files: tuple[str, str], client_ctx: ssl.SSLContext
) -> None:
    """open_lock_client(ssl_context=...) handshakes, authenticates and works over TLS,
    including a batch of pipelined requests."""
    cert, key = server_files
    server = await start_server(
        nursery, tls_cert=cert, tls_key=key, tokens=(TokenSpec("t", TOKEN),)
    )
    with trio.fail_after(10):
        async with open_lock_client(
            server.host, server.port, ssl_context=client_ctx, token=TOKEN
        ) as c:
            s = c.session(session_id="tls")
            assert (await s.execute("ns", [Assert(SetVar("t", "v"))])).ok
            results: list[bool] = []

            async def one(i: int) -> None:
                results.append((await s.execute("ns", [Assert(SetVar("t", f"v{i}"))])).ok)

            async with trio.open_nursery() as n:
                for i in range(50):
                    n.start_soon(one, i)
            assert len(results) == 50
            assert (await c.ping()).uptime >= 0


async def test_sync_client_over_tls(
    nursery: trio.Nursery, server_files: tuple[str, str], client_ctx: ssl.SSLContext
) -> None:
    """LockClient(ssl_context=...) works over TLS (run in a thread)."""
    cert, key = server_files
    server = await start_server(nursery, tls_cert=cert, tls_key=key)

    def use() -> bool:
        with LockClient(server.host, server.port, ssl_context=client_ctx, timeout=5) as c:
            with c.session(session_id="sync-tls") as s:
                ok = s.execute("ns", [Assert(SetVar("t", "v"))]).ok
            c.ping()
            return ok

    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(use)


async def test_untrusted_server_certificate_is_refused(
    nursery: trio.Nursery, server_files: tuple[str, str]
) -> None:
    """A client that does not trust the server's CA fails with ServerUnavailable."""
    cert, key = server_files
    server = await start_server(nursery, tls_cert=cert, tls_key=key)
    ctx = ssl.create_default_context()
    trustme.CA().configure_trust(ctx)  # another CA
    with trio.fail_after(10), pytest.raises(ServerUnavailable, match="TLS"):
        async with open_lock_client(server.host, server.port, ssl_context=ctx):
            pass  # pragma: no cover


async def test_plain_client_against_tls_server_fails_cleanly(
    nursery: trio.Nursery, server_files: tuple[str, str], client_ctx: ssl.SSLContext
) -> None:
    """A plain-TCP client gets no answer but a closed connection (its hello is not TLS);
    the server logs it, keeps serving TLS clients, and counts no internal error."""
    cert, key = server_files
    server = await start_server(nursery, tls_cert=cert, tls_key=key)
    with trio.fail_after(10):
        raw = await Raw.connect(server)
        try:
            await raw.send_hello_quietly()
            answer = await raw.receive_raw()
            # Nothing, or a TLS alert record (type 21): never a protocol frame.
            assert answer == b"" or answer[0] == 21
            assert await raw.receive_raw() == b""  # then the server closes
        finally:
            await raw.aclose()
        with pytest.raises(ServerUnavailable):
            async with open_lock_client(server.host, server.port, connect_timeout=2):
                pass  # pragma: no cover
        async with open_lock_client(server.host, server.port, ssl_context=client_ctx) as c:
            assert (await c.session().execute("ns", [])).ok
    assert server.statistics()["server"]["internal_errors"] == 0


def _client_cert_ctx(ca: trustme.CA, client_ca: trustme.CA, tmp_path: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    client_ca.issue_cert("client@example.org").configure_cert(ctx)
    return ctx


async def test_client_certificates_required_and_enforced(
    nursery: trio.Nursery,
    server_files: tuple[str, str],
    ca: trustme.CA,
    client_ca: trustme.CA,
    client_ctx: ssl.SSLContext,
    tmp_path: Path,
) -> None:
    """With tls_client_ca: a client with a certificate from that CA works; one without a
    certificate, or with one from another CA, is refused; the server keeps serving."""
    cert, key = server_files
    ca_file = tmp_path / "client-ca.pem"
    client_ca.cert_pem.write_to_path(str(ca_file))
    server = await start_server(nursery, tls_cert=cert, tls_key=key, tls_client_ca=str(ca_file))
    good = _client_cert_ctx(ca, client_ca, tmp_path)
    stranger = _client_cert_ctx(ca, trustme.CA(), tmp_path)
    with trio.fail_after(10):
        for ctx in (client_ctx, stranger):
            # TLS 1.3: the client may finish its handshake before the server checks the
            # certificate; the refusal then shows as the connection closing in the hello.
            with pytest.raises(ServerUnavailable):
                async with open_lock_client(
                    server.host, server.port, ssl_context=ctx, connect_timeout=3
                ):
                    pass  # pragma: no cover
        async with open_lock_client(server.host, server.port, ssl_context=good) as c:
            assert (await c.session().execute("ns", [Assert(SetVar("t", "v"))])).ok

    def sync_use() -> bool:
        with LockClient(server.host, server.port, ssl_context=good, timeout=5) as c:
            return c.session().execute("ns", []).ok

    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(sync_use)
