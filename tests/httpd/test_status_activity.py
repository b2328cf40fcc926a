"""``/v1/status``'s busiest tables and longest waits (issue 16 section 3).

Pinned down: the busiest tables are the 10 holding the most variables, most first (ties by
name), counted over at most ``BUSIEST_SCAN`` tables (``busiest_tables_scanned`` says how
many were looked at: all of them below the bound, exactly the bound past it); the longest
waits are the 10 oldest parked transactions, the waiters listing's records; with tokens both
show a principal only its namespaces.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

import trio
from server._wire import WireClient

from lockserver._auth import TokenSpec
from lockserver.engine import Engine
from lockserver.engine._inspect import BUSIEST_SCAN, busiest_tables
from protocol import Assert, Hello, SessionSpec, SetVar, Transaction

from ._client import get
from .conftest import start_server


def lock(table: str, var: str) -> Assert:
    return Assert(SetVar(table, var))


async def test_busiest_tables_and_longest_waits(nursery: trio.Nursery) -> None:
    """12 tables holding 1..12 variables: the 10 busiest, most first; 12 waiters parked in
    turn: the 10 oldest, oldest first, as the waiters listing shows them."""
    server = await start_server(nursery)
    with trio.fail_after(20):
        async with await WireClient.connect(server) as c:
            empty = (await get(server.port, "/v1/status")).json()
            assert empty["busiest_tables"] == [] and empty["longest_waits"] == []
            assert empty["busiest_tables_scanned"] == 0
            for n in range(1, 13):
                await c.execute(f"s{n}", *[lock(f"t{n:02}", f"v{i}") for i in range(n)])
            for i in range(12):
                await c.send(c.execute_message(f"w{i:02}", [lock("t01", "v0")], wait=60.0))
                while server.statistics()["waiting"]["waiters"] < i + 1:
                    await trio.sleep(0.01)
                await trio.sleep(0.01)  # each parks at a later time
            status = (await get(server.port, "/v1/status")).json()
            waiters = (await get(server.port, "/v1/waiters?limit=10")).json()["waiters"]
    assert status["busiest_tables"] == [
        {"namespace": "ns", "table": f"t{n:02}", "held": n} for n in range(12, 2, -1)
    ]
    assert status["busiest_tables_scanned"] == status["tables"] == 12
    waits = status["longest_waits"]
    assert [w["session"] for w in waits] == [f"w{i:02}" for i in range(10)]
    assert waits == waiters
    assert waits[0]["since"] < waits[-1]["since"]


def test_busiest_tables_look_at_a_bounded_number_of_tables() -> None:
    """Ties rank by namespace and table name; below the scan bound every table is looked
    at, at it exactly the bound (a table past it is not seen), whatever the store holds."""
    engine = Engine(started_at=0.0)
    for n in range(6):
        statements = tuple(lock(f"t{n}", f"v{i}") for i in range(1 + n % 3))
        engine.execute(SessionSpec(f"s{n}"), Transaction("ns", statements), now=0.0)
    found, looked = busiest_tables(engine, 3, None)
    assert looked == 6
    assert [(t.table, t.held) for t in found] == [("t2", 3), ("t5", 3), ("t1", 2)]
    found, looked = busiest_tables(engine, 10, None, scan=4)
    assert looked == 4 and {t.table for t in found} == {"t0", "t1", "t2", "t3"}
    found, looked = busiest_tables(engine, 10, None, scan=6)
    assert looked == 6 and len(found) == 6
    assert BUSIEST_SCAN == 10_000


async def test_a_principal_sees_its_own_tables_and_waits(nursery: trio.Nursery) -> None:
    """With tokens, alice (a-*) sees the busiest tables and waits of a-* namespaces only;
    bob (every namespace) sees all."""
    tokens = (TokenSpec("alice", "alice-secret", ["a-*"]), TokenSpec("bob", "bob-secret"))
    server = await start_server(nursery, tokens=tokens)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server, hello=False))
            await c.call(Hello(c.rid(), client_name="t", token="bob-secret"))
            await c.execute("x", lock("big", "1"), lock("big", "2"), namespace="b-jobs")
            await c.execute("y", lock("small", "1"), namespace="a-jobs")
            await c.send(c.execute_message("w", [lock("big", "1")], namespace="b-jobs", wait=30))
            while server.statistics()["waiting"]["waiters"] < 1:
                await trio.sleep(0.01)
            seen = {}
            for who in ("alice", "bob"):
                headers = (("Authorization", f"Bearer {who}-secret"),)
                seen[who] = (await get(server.port, "/v1/status", headers)).json()
    assert [t["table"] for t in seen["alice"]["busiest_tables"]] == ["small"]
    assert seen["alice"]["longest_waits"] == []
    assert [t["table"] for t in seen["bob"]["busiest_tables"]] == ["big", "small"]
    assert [w["session"] for w in seen["bob"]["longest_waits"]] == ["w"]
