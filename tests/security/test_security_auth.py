"""Authentication and authorization over real connections: tokens in the handshake,
namespace restrictions, session ownership, and secrets kept out of the logs."""

from __future__ import annotations

import contextlib
import hmac
import logging

import pytest
import trio
from security_support import Raw, start_server

from client import AccessDenied, Assert, SetVar, open_lock_client
from lockserver import RunningServer
from lockserver._auth import TokenSpec
from protocol import EndSession, ErrorCode, ErrorReply, Ping, Pong, Welcome

ALICE = "alice-secret-0123456789abcdef"
BOB = "bob-secret-fedcba9876543210"
TOKENS = (
    TokenSpec("alice", ALICE, ("orders", "jobs-*")),
    TokenSpec("bob", BOB, ("billing",)),
)


async def _secured(nursery: trio.Nursery) -> RunningServer:
    return await start_server(nursery, tokens=TOKENS)


@pytest.mark.parametrize("token", ["wrong-token", "", ALICE[:-1], ALICE + "x", None])
async def test_bad_or_missing_token_is_unauthorized_and_closes(
    nursery: trio.Nursery, token: str | None
) -> None:
    """A hello with a wrong, truncated, extended or missing token gets ONE UNAUTHORIZED error,
    then the server closes the connection (EOF); nothing else is answered."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        raw = await Raw.connect(server)
        reply = await raw.hello(token)
        assert isinstance(reply, ErrorReply)
        assert reply.code is ErrorCode.UNAUTHORIZED
        assert "token" in reply.message
        if token:
            assert token not in reply.message
        with contextlib.suppress(trio.BrokenResourceError):
            await raw.send(Ping(raw.rid()))
        assert await raw.receive() is None
        await raw.aclose()


async def test_good_token_works_and_server_keeps_serving(nursery: trio.Nursery) -> None:
    """After a refused client, a client with a good token gets Welcome and can work."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        raw = await Raw.connect(server)
        assert (await raw.hello("nope")).code is ErrorCode.UNAUTHORIZED
        await raw.aclose()
        raw = await Raw.connect(server)
        assert isinstance(await raw.hello(ALICE), Welcome)
        await raw.send(Ping(raw.rid()))
        assert isinstance(await raw.receive(), Pong)
        await raw.aclose()


async def test_request_before_hello_still_needs_the_handshake(nursery: trio.Nursery) -> None:
    """Nothing but hello is accepted before authentication."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        raw = await Raw.connect(server)
        await raw.send(EndSession(raw.rid(), "s"))
        reply = await raw.receive()
        assert reply.code is ErrorCode.HANDSHAKE_REQUIRED
        await raw.aclose()


async def test_client_library_raises_access_denied(nursery: trio.Nursery) -> None:
    """The async client surfaces UNAUTHORIZED as AccessDenied when connecting."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        with pytest.raises(AccessDenied) as info:
            async with open_lock_client(server.host, server.port, token="bad"):
                pass  # pragma: no cover
        assert info.value.code is ErrorCode.UNAUTHORIZED
        with pytest.raises(AccessDenied):
            async with open_lock_client(server.host, server.port):
                pass  # pragma: no cover


async def test_namespaces_forbidden_and_connection_stays_usable(nursery: trio.Nursery) -> None:
    """Each token may use only its namespaces: an exact name and a prefix work, another
    namespace is FORBIDDEN, nothing changes (no session created), and the same connection
    keeps working."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        async with open_lock_client(server.host, server.port, token=ALICE) as c:
            s = c.session(session_id="alice-1")
            assert (await s.execute("orders", [Assert(SetVar("t", "a"))])).ok
            assert (await s.execute("jobs-nightly", [Assert(SetVar("t", "a"))])).ok
            assert (await s.execute("jobs-", [Assert(SetVar("t", "b"))])).ok
            with pytest.raises(AccessDenied) as info:
                await c.session(session_id="alice-2").execute("billing", [Assert(SetVar("t", "a"))])
            assert info.value.code is ErrorCode.FORBIDDEN
            assert "alice-2" not in server.engine.sessions
            with pytest.raises(AccessDenied):
                await s.execute("jobs", [Assert(SetVar("t", "a"))])  # "jobs-*" is not "jobs"
            with pytest.raises(AccessDenied):
                await s.execute("order", [Assert(SetVar("t", "a"))])  # exact, not a prefix
            assert (await s.execute("orders", [Assert(SetVar("t", "c"))])).ok
        async with open_lock_client(server.host, server.port, token=BOB) as c:
            s = c.session(session_id="bob-1")
            assert (await s.execute("billing", [Assert(SetVar("t", "a"))])).ok
            with pytest.raises(AccessDenied):
                await s.execute("orders", [Assert(SetVar("t", "z"))])


async def test_session_hijack_refused_owner_keeps_working(nursery: trio.Nursery) -> None:
    """Another principal presenting the owner's session id is refused: SESSION_CONFLICT for
    execute, FORBIDDEN for end (it is not an admin token); the session and its lock survive
    and the owner carries on."""
    server = await start_server(
        nursery, tokens=(TokenSpec("alice", ALICE), TokenSpec("mallory", BOB))
    )
    with trio.fail_after(5):
        async with (
            open_lock_client(server.host, server.port, token=ALICE) as owner,
            open_lock_client(server.host, server.port, token=BOB) as thief,
        ):
            mine = owner.session(session_id="shared-id")
            assert (await mine.execute("orders", [Assert(SetVar("locks", "x"))])).ok
            theirs = thief.session(session_id="shared-id")
            with pytest.raises(AccessDenied) as info:
                await theirs.execute("orders", [Assert(SetVar("locks", "y"))])
            assert info.value.code is ErrorCode.SESSION_CONFLICT
            with pytest.raises(AccessDenied) as info:
                await thief.end_session("shared-id")
            assert info.value.code is ErrorCode.FORBIDDEN  # ending it needs an admin token
            assert "shared-id" in server.engine.sessions
            # The thief's connection is still usable for its own sessions.
            other = thief.session(session_id="mallory-own")
            assert (await other.execute("orders", [Assert(SetVar("locks", "y"))])).ok
            # The owner's lock is still held (a third principal cannot take it)...
            assert server.engine.statistics(trio.current_time()).entries == 2
            # ...and the owner carries on and may end its session.
            assert (await mine.execute("orders", [])).ok
            assert await owner.end_session("shared-id") is True
            # Once ended, the id is free: whoever uses it next owns it.
            assert (await theirs.execute("orders", [Assert(SetVar("locks", "z"))])).ok
            with pytest.raises(AccessDenied):
                await mine.execute("orders", [Assert(SetVar("locks", "x"))])


async def test_same_principal_may_share_a_session(nursery: trio.Nursery) -> None:
    """Two connections with the same token are one principal: the session is theirs (a
    reconnecting client keeps its sessions)."""
    server = await _secured(nursery)
    with trio.fail_after(5):
        async with (
            open_lock_client(server.host, server.port, token=ALICE) as a,
            open_lock_client(server.host, server.port, token=ALICE) as b,
        ):
            assert (await a.session(session_id="s").execute("orders", [])).ok
            assert (await b.session(session_id="s").execute("orders", [])).ok
            assert await b.end_session("s") is True


async def test_no_tokens_means_open(nursery: trio.Nursery) -> None:
    """Without tokens configured the server is open: any token, or none, works everywhere,
    and session ids are shared freely (there is one principal)."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        async with (
            open_lock_client(server.host, server.port) as a,
            open_lock_client(server.host, server.port, token="whatever") as b,
        ):
            assert (await a.session(session_id="s").execute("any", [Assert(SetVar("t", "v"))])).ok
            assert (await b.session(session_id="s").execute("other", [])).ok
            assert await b.end_session("s") is True


async def test_tokens_never_logged(nursery: trio.Nursery, caplog: pytest.LogCaptureFixture) -> None:
    """At DEBUG, through successful and failed handshakes, refusals and hijack attempts, no
    log record contains a token's secret (nor a presented wrong token)."""
    caplog.set_level(logging.DEBUG)
    wrong = "wrong-token-value-42"
    server = await _secured(nursery)
    with trio.fail_after(5):
        for token in (wrong, None):
            raw = await Raw.connect(server)
            await raw.hello(token)
            await raw.aclose()
        async with open_lock_client(server.host, server.port, token=ALICE) as c:
            s = c.session(session_id="x")
            await s.execute("orders", [])
            with pytest.raises(AccessDenied):
                await s.execute("billing", [])
        async with open_lock_client(server.host, server.port, token=BOB) as c:
            with pytest.raises(AccessDenied):
                await c.end_session("x")
        await server.aclose()
    text = caplog.text + "".join(repr(r.args) for r in caplog.records)
    assert "authentication failed" in text  # the logs did see the events
    for secret in (ALICE, BOB, wrong):
        assert secret not in text
    assert ALICE not in repr(server.config)


async def test_tokens_compared_with_compare_digest(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server checks tokens with hmac.compare_digest, against every configured token
    (no early exit that would tell which one matched)."""
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    server = await _secured(nursery)
    with trio.fail_after(5):
        async with open_lock_client(server.host, server.port, token=ALICE):
            pass
    assert len(calls) == len(TOKENS)  # every token compared, though the first matched
    assert (ALICE.encode(), ALICE.encode()) in calls
    assert {b for _, b in calls} == {ALICE.encode(), BOB.encode()}
