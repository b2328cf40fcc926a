"""Shared helpers for the door tests: a ``LockCore`` at a known start behind a thin wrapper
that fills in ``trust`` and ``principal`` and checks, on every call, that no request is ever
answered twice (within a call or across calls). Owners are plain strings; time is an
explicit ``now``."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from lockserver.engine import EngineError, LockCore, Output
from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Exists,
    FeedEvent,
    ListQuery,
    LockLost,
    LostReason,
    Not,
    SessionSpec,
    SetVar,
    Statement,
    Transaction,
    TransactionResult,
    Waiting,
)

START = 0.0  # the core's started_at: an answer's uptime is its ``now``
NS = "ns"
KEY = (NS, "L", "k")  # the variable ``acquire()`` and ``release()`` use


def tx(*statements: Statement, **fields: Any) -> Transaction:
    """A transaction in NS."""
    return Transaction(NS, statements, **fields)


def acquire(var: str = "k", *, ticket: str = "t", ttl: float | None = None) -> Transaction:
    """A mutex acquire of L/``var``."""
    return tx(Assert(SetVar("L", var, ticket, ttl=ttl)))


def release(var: str = "k") -> Transaction:
    """A mutex release of L/``var`` (never fails)."""
    return tx(AnywayContinueAfter(DeleteVar("L", var)))


# A writer that needs no reader, and a reader that gives way to parked writers (``Waiting``).
WRITE = tx(Assert(Not(Exists("r", "doc"))), Assert(SetVar("w", "doc", 1)))
READ = tx(Assert(Not(Waiting("w", "doc"))), Assert(SetVar("r", "doc", 1, allow_duplicates=True)))


def spec(session_id: str, max_age: float = 60.0) -> SessionSpec:
    """A session of ``max_age`` seconds idle time."""
    return SessionSpec(session_id, max_age)


def lost(session_id: str, reason: LostReason, *entries: tuple[str, str, str, int]) -> LockLost:
    """The LockLost event of ``session_id``."""
    return LockLost(session_id, reason, tuple(entries))


def granted(payload: object) -> bool:
    """Whether an output's payload is a successful transaction result."""
    return isinstance(payload, TransactionResult) and payload.ok


def addresses(outs: list[Output]) -> list[tuple[Hashable, int | None]]:
    """The addresses of a call's outputs, in order."""
    return [address for address, _ in outs]


class Door:
    """A LockCore with defaults for ``trust`` (1.0) and ``principal`` ("") that asserts
    every answer's address is new: a request is answered at most once, ever (a feed event,
    addressed (owner, subscription id), is no answer)."""

    def __init__(self, **kwargs: Any) -> None:
        self.core = LockCore(started_at=START, host="test-host", **kwargs)
        self.answered: set[tuple[Hashable, int]] = set()

    def _check(self, outs: list[Output]) -> list[Output]:
        for (owner, rid), payload in outs:
            if rid is not None and type(payload) is not FeedEvent:
                assert (owner, rid) not in self.answered, f"{(owner, rid)} answered twice"
                self.answered.add((owner, rid))
        return outs

    def execute(
        self,
        owner: Hashable,
        rid: int,
        session: SessionSpec | str,
        transaction: Transaction,
        *,
        now: float,
        wait: float | None = None,
        principal: str = "",
        trust: float = 1.0,
    ) -> list[Output]:
        session = spec(session) if isinstance(session, str) else session
        return self._check(
            self.core.execute(
                owner,
                rid,
                session,
                transaction,
                wait=wait,
                now=now,
                trust=trust,
                principal=principal,
            )
        )

    def end_session(
        self,
        owner: Hashable,
        rid: int,
        session_id: str,
        *,
        now: float,
        principal: str = "",
        admin: bool = False,
    ) -> list[Output]:
        return self._check(
            self.core.end_session(
                owner, rid, session_id, now=now, trust=1.0, principal=principal, admin=admin
            )
        )

    def release(
        self,
        owner: Hashable,
        rid: int,
        table: str,
        var: str,
        session_id: str | None = None,
        *,
        now: float,
        namespace: str = NS,
    ) -> list[Output]:
        return self._check(
            self.core.release(owner, rid, namespace, table, var, session_id, now=now, trust=1.0)
        )

    def holders(
        self, owner: Hashable, rid: int, query: ListQuery, *, now: float, visible: Any = None
    ) -> list[Output]:
        return self._check(
            self.core.listing(owner, rid, "holders", query, now=now, trust=1.0, visible=visible)
        )

    def sessions(
        self, owner: Hashable, rid: int, query: ListQuery, *, now: float, visible: Any = None
    ) -> list[Output]:
        return self._check(
            self.core.listing(owner, rid, "sessions", query, now=now, trust=1.0, visible=visible)
        )

    def waiters(
        self, owner: Hashable, rid: int, query: ListQuery, *, now: float, visible: Any = None
    ) -> list[Output]:
        return self._check(
            self.core.listing(owner, rid, "waiters", query, now=now, trust=1.0, visible=visible)
        )

    def subscribe(
        self, owner: Hashable, rid: int, namespace: str = NS, table: str | None = None
    ) -> list[Output]:
        return self._check(self.core.subscribe(owner, rid, namespace, table))

    def unsubscribe(self, owner: Hashable, rid: int, target: int) -> list[Output]:
        return self._check(self.core.unsubscribe(owner, rid, target))

    def cancel(self, owner: Hashable, rid: int, target: int, *, now: float) -> list[Output]:
        return self._check(self.core.cancel(owner, rid, target, now=now, trust=1.0))

    def owner_gone(self, owner: Hashable, *, now: float) -> list[Output]:
        return self._check(self.core.owner_gone(owner, now=now, trust=1.0))

    def advance(self, now: float) -> list[Output]:
        return self._check(self.core.advance(now, trust=1.0))

    def statistics(self, now: float) -> tuple[Any, list[Output]]:
        stats, outs = self.core.statistics(now, trust=1.0)
        return stats, self._check(outs)

    def waiting(self, key: tuple[str, str, str] = KEY) -> list[Hashable]:
        """Addresses of the requests parked on a variable, oldest first."""
        return list(self.core.waits.waiting_on(key))


def only(outs: list[Output]) -> tuple[tuple[Hashable, int | None], object]:
    """The one output of a call (fails when there are none or several)."""
    assert len(outs) == 1, outs
    return outs[0]


def refusal(payload: object) -> EngineError:
    """``payload`` as the EngineError it must be."""
    assert isinstance(payload, EngineError), payload
    return payload
