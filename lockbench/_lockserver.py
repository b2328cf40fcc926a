"""The lockserver side: each workload op as a transaction, sent with our own client.

Why: the comparison is "Python client end to end", so lockserver is driven the way a user drives
it: ``client.LockClient`` (sync) or ``client.open_lock_client`` (trio), one session per task,
transactions built from the protocol's tree vocabulary at every call (as an application would).
Each op kind maps to the transactions below (SEMANTICS.md gives the rules they rely on):

- mutex: acquire ``[Assert(SetVar("Mutex", key, ticket))]`` — exclusive SetVar fails on any
  existing entry, so no separate ``Not(Exists(...))`` is needed; release
  ``[AnywayContinueAfter(DeleteVar("Mutex", key, ticket))]``.
- rwlock: readers ``Assert(Not(Exists("RW-Writer", key)))`` then
  ``Assert(SetVar("RW-Reader", key, ticket, allow_duplicates=True))``; writers
  ``Assert(Not(Exists("RW-Reader", key)))`` then ``Assert(SetVar("RW-Writer", key, ticket))``.
- multilock: one ``Assert(SetVar("Multi", k, ticket))`` per key; the first failure aborts and
  rolls back the others (all or nothing). Release: one DeleteVar per key, in one transaction.
- session-churn: a fresh session (uuid id) per cycle: acquire = its first transaction (which
  creates it on the server), release = ``end()`` (the server drops all its entries).
- mds: namespace "Clinical", exactly SEMANTICS.md's entry / review / unlock transactions; the
  month-end close is ``Assert(Not(Exists("MDS-Entry", F)))``, ``Assert(Not(Exists("MDS-Review",
  F)))``, ``Assert(SetVar("Month-End", F, ticket))``.
- ping: ``client.ping()`` (the protocol's Ping; touches no session).

Pipelining (``--pipeline D``): a batch of D ops goes out as ``session.execute_many`` — D
transactions encoded into one write, one wait for all the replies — as redis-py's pipeline
does for Redis. Session-churn keeps one call per op (each op has a session of its own) and
pings stay D concurrent calls (trio: D tasks; sync: one after the other).

Sessions are made with ``keepalive=False``: a run never leaves a session idle for max_age / 3
(20 s), so the keepalive would never fire; turning it off only spares starting a keepalive task
(trio) or thread (sync) per session, which matters for session-churn — a user doing churn with
short-lived sessions would do the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from client import AsyncSession, Session
from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Exists,
    Not,
    SetVar,
    Statement,
)

from ._workloads import Op, OpKind

__all__ = [
    "CLINICAL",
    "NAMESPACE",
    "LockserverAsyncOps",
    "LockserverSyncOps",
    "acquire_statements",
    "release_statements",
]

NAMESPACE = "lockbench"
CLINICAL = "Clinical"


def acquire_statements(op: Op) -> tuple[str, list[Statement]]:
    """(namespace, statements) that acquire ``op``'s lock(s)."""
    kind, keys, t = op.kind, op.keys, op.ticket
    if kind is OpKind.MUTEX:
        return NAMESPACE, [Assert(SetVar("Mutex", keys[0], t))]
    if kind is OpKind.SESSION:
        return NAMESPACE, [Assert(SetVar("Churn", keys[0], t))]
    if kind is OpKind.READ:
        return NAMESPACE, [
            Assert(Not(Exists("RW-Writer", keys[0]))),
            Assert(SetVar("RW-Reader", keys[0], t, allow_duplicates=True)),
        ]
    if kind is OpKind.WRITE:
        return NAMESPACE, [
            Assert(Not(Exists("RW-Reader", keys[0]))),
            Assert(SetVar("RW-Writer", keys[0], t)),
        ]
    if kind is OpKind.MULTI:
        return NAMESPACE, [Assert(SetVar("Multi", k, t)) for k in keys]
    if kind is OpKind.MDS_ENTRY:
        f, p = keys
        return CLINICAL, [
            Assert(Not(Exists("Month-End", f))),
            Assert(Not(Exists("MDS-Review", f, p))),
            Assert(SetVar("MDS-Entry", f, p, allow_duplicates=True)),
        ]
    if kind is OpKind.MDS_REVIEW:
        f, p = keys
        return CLINICAL, [
            Assert(Not(Exists("Month-End", f))),
            Assert(Not(Exists("MDS-Entry", f, p))),
            Assert(SetVar("MDS-Review", f, p)),
        ]
    if kind is OpKind.MDS_MONTH_END:
        f = keys[0]
        return CLINICAL, [
            Assert(Not(Exists("MDS-Entry", f))),
            Assert(Not(Exists("MDS-Review", f))),
            Assert(SetVar("Month-End", f, t)),
        ]
    raise ValueError(f"{kind} takes no lock")


def release_statements(op: Op) -> tuple[str, list[Statement]]:
    """(namespace, statements) that release ``op``'s lock(s)."""
    kind, keys, t = op.kind, op.keys, op.ticket
    if kind is OpKind.MUTEX:
        return NAMESPACE, [AnywayContinueAfter(DeleteVar("Mutex", keys[0], t))]
    if kind is OpKind.READ:
        return NAMESPACE, [AnywayContinueAfter(DeleteVar("RW-Reader", keys[0], t))]
    if kind is OpKind.WRITE:
        return NAMESPACE, [AnywayContinueAfter(DeleteVar("RW-Writer", keys[0], t))]
    if kind is OpKind.MULTI:
        return NAMESPACE, [AnywayContinueAfter(DeleteVar("Multi", k, t)) for k in keys]
    if kind is OpKind.MDS_ENTRY:
        f, p = keys
        return CLINICAL, [AnywayContinueAfter(DeleteVar("MDS-Entry", f, p))]
    if kind is OpKind.MDS_REVIEW:
        f, p = keys
        return CLINICAL, [AnywayContinueAfter(DeleteVar("MDS-Review", f, p))]
    if kind is OpKind.MDS_MONTH_END:
        return CLINICAL, [AnywayContinueAfter(DeleteVar("Month-End", keys[0], t))]
    raise ValueError(f"{kind} takes no lock (session-churn releases by ending its session)")


def _batchable(ops: Sequence[Op]) -> bool:
    """Whether ``ops`` go out as one ``execute_many`` (more than one op, all in the task's
    own session)."""
    return len(ops) > 1 and all(op.kind is not OpKind.SESSION for op in ops)


class LockserverSyncOps:
    """Workload ops of one task over a sync ``LockClient``: a batch of ops is one
    ``execute_many`` (one write, one wait), session-churn one request at a time."""

    def __init__(self, client: Any, session: Session) -> None:
        self._client = client
        self._session = session
        self._churn: dict[str, Session] = {}

    def ping(self, n: int) -> None:
        """``n`` pings, one after the other."""
        for _ in range(n):
            self._client.ping()

    def acquire(self, ops: Sequence[Op]) -> list[bool]:
        """Try to acquire every op's lock (never waiting); which ones succeeded."""
        if _batchable(ops):
            results = self._session.execute_many([acquire_statements(op) for op in ops])
            return [r.ok for r in results]
        out = []
        for op in ops:
            session = self._session
            if op.kind is OpKind.SESSION:
                session = self._client.session(keepalive=False)
            ns, statements = acquire_statements(op)
            ok = session.execute(ns, statements).ok
            if op.kind is OpKind.SESSION:
                self._churn[op.ticket] = session
            out.append(ok)
        return out

    def release(self, ops: Sequence[Op]) -> None:
        """Release every op's lock (session-churn: end its session)."""
        if _batchable(ops):
            self._session.execute_many([release_statements(op) for op in ops])
            return
        for op in ops:
            if op.kind is OpKind.SESSION:
                self._churn.pop(op.ticket).end()
                continue
            ns, statements = release_statements(op)
            self._session.execute(ns, statements)

    def discard(self, ops: Sequence[Op]) -> None:
        """End the churn sessions of ops whose acquire failed."""
        for op in ops:
            session = self._churn.pop(op.ticket, None)
            if session is not None:
                session.end()


class LockserverAsyncOps:
    """Workload ops of one task over a trio client: a batch of D ops is one ``execute_many``
    (D requests in one write, one wake-up when the last reply is in); session-churn batches
    run as D concurrent calls, i.e. D requests pipelined on the task's connection."""

    def __init__(self, client: Any, session: AsyncSession) -> None:
        self._client = client
        self._session = session
        self._churn: dict[str, AsyncSession] = {}

    async def ping(self, n: int) -> None:
        """``n`` pings in flight at once."""
        if n == 1:
            await self._client.ping()
            return
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(self._client.ping)

    async def acquire(self, ops: Sequence[Op]) -> list[bool]:
        """Try to acquire every op's lock (never waiting); which ones succeeded."""
        if len(ops) == 1:
            return [await self._acquire_one(ops[0])]
        if _batchable(ops):
            results = await self._session.execute_many([acquire_statements(op) for op in ops])
            return [r.ok for r in results]
        out = [False] * len(ops)

        async def one(i: int, op: Op) -> None:
            out[i] = await self._acquire_one(op)

        async with trio.open_nursery() as nursery:
            for i, op in enumerate(ops):
                nursery.start_soon(one, i, op)
        return out

    async def _acquire_one(self, op: Op) -> bool:
        session = self._session
        if op.kind is OpKind.SESSION:
            session = self._client.session(keepalive=False)
            self._churn[op.ticket] = session
        ns, statements = acquire_statements(op)
        result = await session.execute(ns, statements)
        return bool(result.ok)

    async def release(self, ops: Sequence[Op]) -> None:
        """Release every op's lock (session-churn: end its session)."""
        if len(ops) == 1:
            await self._release_one(ops[0])
            return
        if _batchable(ops):
            await self._session.execute_many([release_statements(op) for op in ops])
            return
        async with trio.open_nursery() as nursery:
            for op in ops:
                nursery.start_soon(self._release_one, op)

    async def _release_one(self, op: Op) -> None:
        if op.kind is OpKind.SESSION:
            await self._churn.pop(op.ticket).end()
            return
        ns, statements = release_statements(op)
        await self._session.execute(ns, statements)

    async def discard(self, ops: Sequence[Op]) -> None:
        """End the churn sessions of ops whose acquire failed."""
        for op in ops:
            session = self._churn.pop(op.ticket, None)
            if session is not None:
                await session.end()
