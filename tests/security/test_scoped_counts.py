"""Counts are scoped (issue 30, item 7): a token restricted to some namespaces reads, in
``stats`` and ``/v1/status``, only the counts of what it may see -- the namespaces it may use
(their tables, entries and parked transactions) and the sessions it owns; an admin token and
one without a namespace restriction read the server's; ``/metrics`` (the whole server) is
refused to a restricted token."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing
from security_support import Raw, start_server

from lockserver import RunningServer
from lockserver._auth import TokenSpec
from protocol import (
    Assert,
    Execute,
    GetStatistics,
    SessionSpec,
    SetVar,
    Statistics,
    Transaction,
)

ALICE = "alice-secret-0123"
BOB = "bob-secret-0123"
OPS = "ops-secret-0123"
ROOT = "root-secret-0123"
TOKENS = (
    TokenSpec("alice", ALICE, ("orders", "jobs-*")),
    TokenSpec("bob", BOB, ("billing",)),
    TokenSpec("ops", OPS),  # every namespace, not an admin
    TokenSpec("root", ROOT, ("billing",), admin=True),
)


async def execute(c: Raw, session: str, namespace: str, *variables: str, wait: Any = None) -> Any:
    tx = Transaction(namespace, tuple(Assert(SetVar("t", v)) for v in variables))
    await c.send(Execute(c.rid(), SessionSpec(session, 60.0), tx, wait))
    return await c.receive()


async def counts(server: RunningServer, secret: str) -> dict[str, int]:
    c = await Raw.connect(server)
    await c.hello(secret)
    await c.send(GetStatistics(c.rid()))
    body = await c.receive()
    await c.aclose()
    assert isinstance(body, Statistics)
    engine = body.values["engine"]
    return {
        "namespaces": engine["namespaces"],
        "tables": engine["tables"],
        "entries": engine["entries"],
        "sessions": engine["sessions"],
        "waiters": body.values["waiting"]["waiters"],
    }


async def http_get(server: RunningServer, path: str, secret: str) -> tuple[int, Any]:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {secret}\r\n"
        "Connection: close\r\n\r\n"
    )
    await stream.send_all(request.encode())
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, (json.loads(body) if head.lower().count(b"application/json") else body)


async def test_a_restricted_tokens_counts_are_its_own(nursery: trio.Nursery) -> None:
    """Alice holds 3 entries in two of her namespaces (2 tables) and parks a waiter there;
    bob holds 4 in billing and ops 1 in a namespace nobody restricted may use. Alice's
    stats and /v1/status count her 2 namespaces, 2 tables, 3 entries, 2 sessions (the
    waiter's is hers too), 1 waiter; bob's his own; ops (every namespace) and root (an
    admin) read the server's: 4 namespaces, 8 entries, 4 sessions."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(20):
        alice = await Raw.connect(server)
        bob = await Raw.connect(server)
        ops = await Raw.connect(server)
        await alice.hello(ALICE)
        await bob.hello(BOB)
        await ops.hello(OPS)
        assert (await execute(alice, "a1", "orders", "x", "y")).ok
        assert (await execute(alice, "a1", "jobs-1", "x")).ok
        assert (await execute(bob, "b1", "billing", "p", "q", "r", "s")).ok
        assert (await execute(ops, "o1", "internal", "z")).ok
        # A waiter of alice (the entry is hers already: another session waits on it).
        tx = Transaction("orders", (Assert(SetVar("t", "x")),))
        await alice.send(Execute(alice.rid(), SessionSpec("a2", 60.0), tx, 30.0))
        await trio.testing.wait_all_tasks_blocked()
        mine = await counts(server, ALICE)
        assert mine == {"namespaces": 2, "tables": 2, "entries": 3, "sessions": 2, "waiters": 1}
        assert await counts(server, BOB) == {
            "namespaces": 1,
            "tables": 1,
            "entries": 4,
            "sessions": 1,
            "waiters": 0,
        }
        whole = {"namespaces": 4, "tables": 4, "entries": 8, "sessions": 4, "waiters": 1}
        assert await counts(server, OPS) == whole
        assert await counts(server, ROOT) == whole
        status, page = await http_get(server, "/v1/status", ALICE)
        assert status == 200
        seen = {k: page[k] for k in ("namespaces", "tables", "entries", "sessions", "waiters")}
        assert seen == mine
        status, page = await http_get(server, "/v1/status", OPS)
        assert (status, page["entries"], page["sessions"]) == (200, 8, 4)
        for c in (alice, bob, ops):
            await c.aclose()


async def test_metrics_are_for_tokens_that_see_the_whole_server(nursery: trio.Nursery) -> None:
    """/metrics shows the server's counts: an admin token and one without a namespace
    restriction read it (200), a restricted token is refused (403, saying why)."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(20):
        for secret in (OPS, ROOT):
            status, _ = await http_get(server, "/metrics", secret)
            assert status == 200
        status, body = await http_get(server, "/metrics", ALICE)
        assert status == 403
        assert "'alice'" in body["error"] and "/metrics" in body["error"]


async def test_a_restricted_tokens_stats_show_no_other_session_count(
    nursery: trio.Nursery,
) -> None:
    """The server section's ``sessions_tracked`` (sessions of every principal) is left out
    of a restricted token's statistics, and its engine section names the scope."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(20):
        c = await Raw.connect(server)
        await c.hello(BOB)
        await c.send(GetStatistics(c.rid()))
        body = await c.receive()
        await c.aclose()
    assert isinstance(body, Statistics)
    assert "sessions_tracked" not in body.values["server"]
    assert body.values["engine"]["scope"] == "bob"
    assert "scope" not in server.statistics()["engine"]
