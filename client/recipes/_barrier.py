"""Barriers: N parties enter together and leave together; written once for both faces.

Why: a double barrier (ZooKeeper's recipe, Curator's ``DistributedDoubleBarrier``) lets N
parties start a phase together (``enter`` blocks until all N have entered) and end it together
(``leave`` blocks until all have left); a cyclic barrier (``threading.Barrier``) is the same
thing used once per round. Peers build ``enter`` from a write, a count and a watch, and must
then fight the *late observer*: a party whose watch fires after the others have already left
the barrier waits forever. Here each party enters with **one transaction** that waits on the
server, and no party can ever observe the barrier late:

- ``enter``: ``Assert(Not(Exists(out, name)))`` (the previous round has left),
  ``Assert(SetVar(in, name, ticket, allow_duplicates=True))`` (arrive),
  ``Assert(Not(ArrivedBelow(in, name, N)))`` (N have arrived). ``ArrivedBelow`` counts the
  parties that hold an entry **and those whose transaction is parked** waiting to set one
  (PROTOCOL.md). So the first N-1 park; the N-th counts them, passes, and its commit lets the
  parked ones run in the same step of the server, before it reads anything else: all N pass
  together, nobody passes before N have arrived, and nobody is left waiting for a
  notification it missed.
- ``leave``: move the entry from ``in`` to ``out`` (one transaction; the last one to move sees
  no ``in`` left and is done), then wait on the server until no ``in`` entry is left and remove
  the ``out`` entry. A party that passes ``enter`` of the next round needs every ``out`` entry
  gone, so the next round cannot start while a slow party of this one is still leaving: a
  late leaver never sees the next round's entries.

A party is a **session** (one entry per session and variable, SEMANTICS.md): give each party
its own session. Tables (in the barrier's namespace, variable = the barrier's name):
``recipes.barrier`` (the parties in, value = each party's ticket) and ``recipes.barrier.out``
(the parties leaving).

Dead parties are **counted out**: a party whose session ends or expires loses its entries, so
the others stop counting it (``leave`` does not wait for it; before the barrier is full, a
party that dies while waiting to enter was counted only while its transaction was parked, and
is not any more). Its own grant is lost like a mutex's (``lost``, ``on_lost``, the protected
block cancelled). The others are **told** when they ask for it: with ``on_party_lost``, the
barrier object watches the change feed while it is in the barrier and calls
``on_party_lost(event)`` (from the thread or task reading the connection) for every entry of
the barrier that went because its session expired, was ended or an operator released it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from client._errors import ClientTimeout, ConnectionLost, LockClientError
from client._result import Result
from protocol import (
    ArrivedBelow,
    Assert,
    Block,
    Cause,
    DeleteVar,
    Exists,
    FeedEvent,
    If,
    Not,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SetVar,
    Statement,
)

from ._base import LockLostError, OnLost, S, max_wait_of
from ._feed import DEATHS, FeedSinkBase, SubscribeFeed, unsubscribe_all
from ._kinds import UNLIMITED, _KindInit
from ._ops import NOW, WELCOME, Op, RunTx, acquire, exit_block, release

__all__ = [
    "BARRIER_OUT_TABLE",
    "BARRIER_TABLE",
    "DoubleBarrierKind",
    "PartyWatch",
    "abandon",
    "abandon_block",
    "barrier_wait",
    "enter",
    "leave",
]

BARRIER_TABLE = "recipes.barrier"
BARRIER_OUT_TABLE = "recipes.barrier.out"

OnPartyLost = Callable[[FeedEvent], object]

log = logging.getLogger("client.recipes")


class PartyWatch(FeedSinkBase):
    """A sink that calls ``callback`` for every feed event saying that another party's entry
    of the barrier went without that party asking (its session expired or was ended, or an
    operator released it). Called by the thread or task reading the connection."""

    def __init__(self, name: str, own_session: str, callback: OnPartyLost) -> None:
        super().__init__()
        self._name = name
        self._own = own_session
        self._callback = callback

    def put(self, event: FeedEvent) -> None:
        if event.var != self._name or event.kind not in DEATHS or event.session == self._own:
            return
        try:
            self._callback(event)
        except Exception:
            log.exception("on_party_lost callback %r raised", self._callback)

    def _wake(self) -> None:
        """Nobody waits on this sink: its events are handed on at once."""


class DoubleBarrierKind(_KindInit[S]):
    """One party of a double barrier of ``parties`` parties: ``enter`` (the grant), ``leave``,
    and ``wait`` (enter then leave: a cyclic barrier)."""

    KIND = "barrier"
    MATCH_LATER: ClassVar[bool] = True  # leaving moves the entry on (a later fence)

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        parties: int,
        on_party_lost: OnPartyLost | None = None,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        if type(parties) is not int or not 1 <= parties < UNLIMITED:
            raise ValueError(f"parties must be an integer >= 1, got {parties!r}")
        if on_party_lost is not None and not callable(on_party_lost):
            raise TypeError(f"on_party_lost must be callable, got {type(on_party_lost).__name__}")
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self.parties = parties
        self.on_party_lost = on_party_lost
        self._leaving = False
        self._uncertain = False  # a leave whose outcome is unknown (its connection dropped)
        self._subscriptions: list[int] = []

    @property
    def inside(self) -> bool:
        """True from a successful ``enter`` until ``leave`` starts (local knowledge)."""
        return self.held and not self._leaving

    @property
    def leaving(self) -> bool:
        """True once ``leave`` has started until it completes (a timed-out ``leave`` keeps
        the party leaving: call ``leave`` again to finish)."""
        return self.held and self._leaving

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((BARRIER_TABLE, self.name), (BARRIER_OUT_TABLE, self.name))

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        name = self.name
        return [
            Assert(Not(Exists(BARRIER_OUT_TABLE, name, ignore_this_session=False))),
            Assert(
                SetVar(BARRIER_TABLE, name, ticket, description=self._desc, allow_duplicates=True)
            ),
            Assert(Not(ArrivedBelow(BARRIER_TABLE, name, self.parties))),
        ]

    def _release_statements(self, ticket: str) -> list[Statement]:
        return [
            SelectOperatorValue("released", DeleteVar(BARRIER_TABLE, self.name, ticket)),
            SelectOperatorValue("released_out", DeleteVar(BARRIER_OUT_TABLE, self.name, ticket)),
        ]

    def _was_released(self, result: Result) -> bool:
        return result.ok and (result.get("released") is True or result.get("released_out") is True)

    def _refresh_statements(self) -> list[Statement] | None:
        with self._mu:
            ticket = self._ticket if self._fence is not None else None
        if ticket is None:
            return None
        return [
            Assert(
                Or(
                    Exists(BARRIER_TABLE, self.name, ticket, ignore_this_session=False),
                    Exists(BARRIER_OUT_TABLE, self.name, ticket, ignore_this_session=False),
                )
            )
        ]

    def _on_release(self) -> None:
        self._leaving = False
        self._uncertain = False

    def _start_leave(self) -> str:
        """The ticket of the grant that leaves. RuntimeError when not in the barrier,
        LockLostError when the grant was lost (it is then forgotten)."""
        with self._mu:
            ticket = self._ticket if self._fence is not None else None
            lost = self._lost
            info = self._lost_info
        if ticket is None:
            raise RuntimeError(f"{self!r} is not in the barrier: enter first")
        if lost:
            self._forget()
            raise LockLostError(self, info)
        return ticket

    def _mark_out_statements(self, ticket: str) -> list[Statement]:
        name = self.name
        return [
            # In: move out. Not in: it must be out already (a mark-out whose reply was lost),
            # else the party was counted out ("0:/IfOp/AssertOp/").
            If(
                DeleteVar(BARRIER_TABLE, name, ticket),
                Assert(SetVar(BARRIER_OUT_TABLE, name, ticket, allow_duplicates=True)),
                Assert(Exists(BARRIER_OUT_TABLE, name, ticket, ignore_this_session=False)),
            ),
            If(
                Not(Exists(BARRIER_TABLE, name, ignore_this_session=False)),
                Block(
                    Assert(DeleteVar(BARRIER_OUT_TABLE, name, ticket)),
                    SelectConstantValue("left", True),
                ),
            ),
        ]

    def _wait_out_statements(self, ticket: str) -> list[Statement]:
        name = self.name
        return [
            Assert(Not(Exists(BARRIER_TABLE, name, ignore_this_session=False))),
            SelectOperatorValue("mine", DeleteVar(BARRIER_OUT_TABLE, name, ticket)),
        ]

    def _gone(self) -> None:
        """The grant was found gone by a call: a loss nobody announced (yet)."""
        with self._mu:
            newly = self._fence is not None and not self._lost
            if newly:
                self._lost = True
            info = self._lost_info
        if newly:
            self._signal_lost()
        self._forget()
        raise LockLostError(self, info)


def _watch(b: DoubleBarrierKind[Any]) -> Op[None]:
    """Start watching the other parties (with ``on_party_lost``): subscribe to both tables."""
    callback = b.on_party_lost
    if callback is None or b._subscriptions:
        return
    sink = PartyWatch(b.name, b.session.id, callback)
    for table in (BARRIER_TABLE, BARRIER_OUT_TABLE):
        b._subscriptions.append((yield SubscribeFeed(table, sink)))


def enter(b: DoubleBarrierKind[Any], timeout: float | None = None) -> Op[bool]:
    """Wait until all the parties have entered: True; False when ``timeout`` ran out first (nothing
    is left behind: the party did not enter). RuntimeError when this object is in the barrier (or
    leaving) already."""
    if b.held and b._leaving:
        raise RuntimeError(f"{b!r} is still leaving the last round: leave() first")
    yield from _watch(b)
    try:
        entered = yield from acquire(b, True, timeout)
    except BaseException:
        yield from unsubscribe_all(b._subscriptions)
        raise
    if not entered:
        yield from unsubscribe_all(b._subscriptions)
    return entered


def leave(b: DoubleBarrierKind[Any], timeout: float | None = None) -> Op[bool]:
    """Wait until every party has left: True; False when ``timeout`` ran out
    first (the party is still leaving: call ``leave`` again). RuntimeError when not in the
    barrier; LockLostError when this party's grant was lost (it is counted out)."""
    ticket = b._start_leave()
    if not b._leaving:
        result: Result = yield RunTx(b._mark_out_statements(ticket))
        if not result.ok:
            if result.cause is Cause.STATEMENT:
                yield from unsubscribe_all(b._subscriptions)
                b._gone()
            return False  # refused (e.g. the reliability contract): still inside
        b._leaving = True
        if result.get("left") is True:
            yield from _left(b)
            return True
    max_wait = max_wait_of((yield WELCOME).limits)
    start = yield NOW
    deadline = None if timeout is None else start + timeout
    statements = b._wait_out_statements(ticket)
    while True:
        now = yield NOW
        wait = max_wait if deadline is None else min(max_wait, max(0.0, deadline - now))
        try:
            result = yield RunTx(statements, wait=wait)
        except (ConnectionLost, ClientTimeout):
            b._uncertain = True  # it may have passed: the next leave tells
            raise
        if result.ok:
            if result.get("mine") is not True and not b._uncertain:
                yield from unsubscribe_all(b._subscriptions)
                b._gone()  # our entry was gone: the party was counted out
            yield from _left(b)
            return True
        now = yield NOW
        if result.cause is not Cause.STATEMENT or (deadline is not None and now >= deadline):
            return False


def abandon(b: DoubleBarrierKind[Any]) -> Op[bool]:
    """Drop out of the barrier at once, without waiting for the others (they stop
    counting this party); True when it was in (or leaving; a cyclic barrier between rounds:
    nothing to do, False). LockLostError when it had
    been counted out already."""
    try:
        return (yield from release(b))
    finally:
        yield from unsubscribe_all(b._subscriptions)


def abandon_block(b: DoubleBarrierKind[Any], failed: bool) -> Op[None]:
    """Leaving a ``with`` block that raised: drop out (a cleanup: shielded on the async
    face); a failing release is logged, never raised over the block's exception."""
    try:
        yield from exit_block(b, failed)
    finally:
        yield from unsubscribe_all(b._subscriptions)


def _left(b: DoubleBarrierKind[Any]) -> Op[None]:
    with contextlib.suppress(LockClientError):
        yield from unsubscribe_all(b._subscriptions)
    b._forget()


def barrier_wait(b: DoubleBarrierKind[Any], timeout: float | None = None) -> Op[bool]:
    """Wait until all the parties have arrived (a cyclic barrier: enter, then leave at once); True
    once all passed, False when ``timeout`` ran out first. ``timeout`` bounds the wait to enter; the
    leave that follows waits only for the parties that entered with this one to start leaving too. A
    party still in (or leaving) a previous round, whose leave failed, finishes that first."""
    if b.held:
        yield from leave(b, None)
    if not (yield from enter(b, timeout)):
        return False
    return (yield from leave(b, None))
