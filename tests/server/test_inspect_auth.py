"""Authorization of the operator's requests (issue 16, docs/security.md): with tokens, a
principal lists and watches only the namespaces it may use (its own sessions always);
force-release and ending another principal's session need an admin token (FORBIDDEN
otherwise); every admin action is logged with the principal."""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import pytest
import trio

from lockserver import RunningServer
from lockserver._auth import SecurityConfigError, TokenSpec, tokens_from_toml
from protocol import (
    Assert,
    EndSession,
    ErrorCode,
    ForceRelease,
    Hello,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    Released,
    SessionEnded,
    SessionsPage,
    SetVar,
    Subscribe,
    Subscribed,
    WaitersPage,
)

from ._wire import WireClient
from .conftest import start_server

TOKENS = (
    TokenSpec("alice", "alice-secret", ["a-*"]),
    TokenSpec("bob", "bob-secret"),
    TokenSpec("ops", "ops-secret", admin=True),
)


async def connect(stack: AsyncExitStack, server: RunningServer, token: str) -> WireClient:
    """A connection with ``token``, closed when ``stack`` closes."""
    c = await stack.enter_async_context(await WireClient.connect(server, hello=False))
    await c.call(Hello(c.rid(), client_name="t", token=token))
    return c


def lock(name: str) -> Assert:
    return Assert(SetVar("L", name))


async def test_a_principal_sees_only_what_it_may_use(nursery: trio.Nursery) -> None:
    """alice (namespaces a-*) lists only holders and waiters in a-* namespaces, and sessions
    that are hers or hold entries there; naming another namespace in a listing or a
    subscription is FORBIDDEN; bob (every namespace) sees everything."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            alice = await connect(stack, server, "alice-secret")
            bob = await connect(stack, server, "bob-secret")
            await alice.execute("alice-1", lock("x"), namespace="a-jobs")
            await bob.execute("bob-1", lock("y"), namespace="b-jobs")
            await bob.execute("bob-2", lock("z"), namespace="a-shared")
            await bob.send(bob.execute_message("bob-3", [lock("y")], namespace="b-jobs", wait=30))

            page = await alice.call(ListHolders(alice.rid()))
            assert isinstance(page, HoldersPage)
            assert sorted(h.session for h in page.holders) == ["alice-1", "bob-2"]
            sessions = await alice.call(ListSessions(alice.rid()))
            assert isinstance(sessions, SessionsPage)
            assert sorted(s.session for s in sessions.sessions) == ["alice-1", "bob-2"]
            waiters = await alice.call(ListWaiters(alice.rid()))
            assert isinstance(waiters, WaitersPage) and waiters.waiters == ()
            for request in (
                ListHolders(alice.rid(), ListQuery(namespace="b-jobs")),
                ListWaiters(alice.rid(), ListQuery(namespace="b-jobs")),
                Subscribe(alice.rid(), "b-jobs"),
            ):
                err = await alice.error(request)
                assert err.code is ErrorCode.FORBIDDEN
                assert "token 'alice' may not use namespace 'b-jobs'" in err.message
            assert await alice.call(Subscribe(77, "a-jobs")) == Subscribed(77)

            everything = await bob.call(ListHolders(bob.rid()))
            assert isinstance(everything, HoldersPage) and len(everything.holders) == 3
            bob_waiters = await bob.call(ListWaiters(bob.rid()))
            assert isinstance(bob_waiters, WaitersPage) and len(bob_waiters.waiters) == 1
            bob_sessions = await bob.call(ListSessions(bob.rid(), ListQuery(session="bob-1")))
            assert isinstance(bob_sessions, SessionsPage)
            [mine] = bob_sessions.sessions
            assert mine.principal == "bob"


async def test_admin_actions_need_an_admin_token_and_are_logged(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """Force-release and ending another principal's session are FORBIDDEN for alice and bob
    (and change nothing); the ops token (admin = true) does both, and each is logged on one
    line naming the principal."""
    server = await start_server(nursery, tokens=TOKENS)
    caplog.set_level(logging.INFO, logger="lockserver.admin")
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            alice = await connect(stack, server, "alice-secret")
            bob = await connect(stack, server, "bob-secret")
            ops = await connect(stack, server, "ops-secret")
            await alice.execute("alice-1", lock("x"), namespace="a-jobs")
            for c in (alice, bob):
                err = await c.error(ForceRelease(c.rid(), "a-jobs", "L", "x"))
                assert err.code is ErrorCode.FORBIDDEN and "not an admin token" in err.message
            err = await bob.error(EndSession(bob.rid(), "alice-1"))
            assert err.code is ErrorCode.FORBIDDEN and "needs an admin token" in err.message
            assert server.engine.entry_count == 1 and "alice-1" in server.engine.sessions
            assert not [r for r in caplog.records if r.name == "lockserver.admin"]

            released = await ops.call(ForceRelease(ops.rid(), "a-jobs", "L", "x"))
            assert isinstance(released, Released) and released.entries == 1
            await alice.execute("alice-1", lock("x"), namespace="a-jobs")
            assert await ops.call(EndSession(ops.rid(), "alice-1")) == SessionEnded(True)
            lines = [r.getMessage() for r in caplog.records if r.name == "lockserver.admin"]
            assert len(lines) == 2
            assert lines[0].startswith("admin 'ops'") and "release a-jobs/L/x" in lines[0]
            assert "1 entries removed" in lines[0]
            assert lines[1].startswith("admin 'ops'") and "end session 'alice-1'" in lines[1]
            assert "of principal 'alice'" in lines[1]
            assert all("\n" not in line for line in lines)


def test_the_admin_flag_comes_from_the_toml_tokens() -> None:
    """``admin = true`` in a [[tokens]] table marks an admin token; the default is not;
    anything but a bool is a one-line configuration error."""
    tokens = tokens_from_toml(
        [{"name": "ops", "token": "s1", "admin": True}, {"name": "app", "token": "s2"}]
    )
    assert [t.admin for t in tokens] == [True, False]
    with pytest.raises(SecurityConfigError, match="tokens: entry 1: admin must be true or false"):
        tokens_from_toml([{"name": "ops", "token": "s1", "admin": "yes"}])
