"""The transactions each recipe sends, pinned exactly (docs/recipes.md shows them): one
atomic transaction per acquire and per release, the same for both faces.

Tests marked ``@on_both_loops`` run under trio and under asyncio
(tests/asyncio_support.py); those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import anyio
from asyncio_support import on_both_loops
from recipes_support import NS

from client import (
    Abort,
    AnywayContinueAfter,
    Assert,
    AsyncLockSet,
    AsyncMutex,
    AsyncReadWriteLock,
    AsyncSemaphore,
    AsyncStateLock,
    AsyncTimeWindowLock,
    CountBelow,
    DeleteVar,
    Exists,
    If,
    Not,
    SelectOperatorValue,
    SelectVarValue,
    SetVar,
    Waiting,
    open_lock_client,
)
from client.recipes import _kinds
from client.recipes._kinds import UNLIMITED
from lockserver import RunningServer

R, W = "recipes.rw.read", "recipes.rw.write"
PR, PW = "recipes.permits.read", "recipes.permits.write"


def read_part(name: str, stamp: str, *, give_way: bool = True) -> list[object]:
    return [
        If(DeleteVar(R, name), Abort()),
        Assert(Not(Exists(W, name, ignore_this_session=False))),
        *([Assert(Not(Waiting(W, name)))] if give_way else []),
        Assert(CountBelow(R, name, UNLIMITED, limit_table=PR, limit_var=name)),
        Assert(SetVar(R, name, stamp, allow_duplicates=True)),
    ]


def write_part(name: str, stamp: str) -> list[object]:
    return [
        If(DeleteVar(W, name), Abort()),
        Assert(Not(Exists(R, name, ignore_this_session=False))),
        Assert(CountBelow(W, name, 1, limit_table=PW, limit_var=name)),
        Assert(SetVar(W, name, stamp, allow_duplicates=True)),
    ]


@on_both_loops
async def test_the_transactions(server: RunningServer) -> None:
    """Mutex, read/write, lock sets (writer preference only for read-only sets), semaphore,
    time window and task claim: acquire, release and cleanup statements."""
    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            m = AsyncMutex(s, NS, "m", ttl=5, description="why")
            assert m._acquire_statements("T") == [
                Assert(SetVar("recipes.mutex", "m", "T", description="why", ttl=5.0)),
                SelectVarValue("grant", "recipes.mutex", "m", ignore_this_session=False),
            ]
            assert m._release_statements("T") == [
                SelectOperatorValue("released", DeleteVar("recipes.mutex", "m", "T"))
            ]
            assert m._cleanup_statements("T") == m._release_statements("T")

            rw = AsyncReadWriteLock(s, NS, "doc")
            assert rw.read._acquire_statements("T") == read_part("doc", "T")
            assert rw.write._acquire_statements("T") == write_part("doc", "T")

            mixed = AsyncLockSet(s, NS, {"b": "w", "a": "r"})
            assert mixed.name == "a:r,b:w"
            assert mixed._acquire_statements("S") == [
                *read_part("a", "S", give_way=False),
                *write_part("b", "S"),
            ]
            reads = AsyncLockSet(s, NS, [("b", "r"), ("a", "r")])
            assert reads._acquire_statements("S") == [*read_part("a", "S"), *read_part("b", "S")]
            assert mixed._release_statements("S") == [
                SelectOperatorValue("released", DeleteVar(R, "a", "S")),
                SelectOperatorValue("released", DeleteVar(W, "b", "S")),
            ]

            sem = AsyncSemaphore(s, NS, "pool", permits=4)
            assert sem._acquire_statements("T") == [
                If(DeleteVar("recipes.semaphore", "pool"), Abort()),
                Assert(CountBelow("recipes.semaphore", "pool", 4)),
                Assert(SetVar("recipes.semaphore", "pool", "T", allow_duplicates=True)),
            ]

            win = AsyncTimeWindowLock(s, NS, "daily", period=86400)
            assert win._acquire_statements("T") == [
                Assert(SetVar("recipes.window", "daily", "T", period=86400.0)),
                SelectVarValue("grant", "recipes.window", "daily", ignore_this_session=False),
            ]

            task = AsyncStateLock(s, NS, "job")
            claim, state = "recipes.task.claim", "recipes.task.state"
            assert task._acquire_statements("T") == [
                Assert(SetVar(claim, "job", "T")),
                SelectVarValue("states", state, "job", ignore_this_session=False, select_many=True),
            ]
            task._set_final_state("failed")
            assert task._release_statements("T") == [
                Assert(DeleteVar(claim, "job", "T")),
                Assert(SetVar(state, "job", "failed", allow_duplicates=True)),
            ]
            assert task._cleanup_statements("T") == [
                AnywayContinueAfter(DeleteVar(claim, "job", "T"))
            ]
            probe = m._probe_statements()
            assert probe[-1] == Abort() and len(probe) == 3


def test_permits_transactions() -> None:
    """set/clear/get permits: one transaction each, refused over another session's setting."""
    assert _kinds.set_permits_statements("doc", "r", 5) == [
        Assert(Not(Exists(PR, "doc"))),
        Assert(SetVar(PR, "doc", 5, allow_duplicates=True)),
    ]
    assert _kinds.clear_permits_statements("doc", "w") == [Assert(DeleteVar(PW, "doc"))]
    assert _kinds.get_permits_statements("doc", "w") == [
        SelectVarValue("permits", PW, "doc", ignore_this_session=False)
    ]
