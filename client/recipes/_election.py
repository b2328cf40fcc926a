"""Leader election: campaign, who leads, proclaim, resign, observe; written once for both faces.

Why: an election is an exclusive lock whose holder also publishes a value, plus a way for
everyone to see who holds it. The grant is a mutex grant (``RecipeCore``: ticket, fence, lost
notices, the protected block cancelled on a loss), so the **term** is the grant's fence:
strictly increasing across leaders (every commit has a larger fence than the one before it,
across restarts too), usable to fence the leader's writes as etcd's revision is and Curator's
latch is not. Campaigning parks the transaction on the server: candidates are served in
arrival order (FIFO, no barging: docs/waiting.md), nobody polls.

Tables (in the election's namespace; the variable is the election's name):

| table | entries |
|---|---|
| ``recipes.election`` | one, exclusive: the leader's, value = its ticket, description = who |
| ``recipes.election.value`` | one per session that led: the value it proclaimed |

The value lives apart from the grant so that ``proclaim`` never rewrites the grant's entry: the
term stays the grant's fence and the grant's lost notices keep naming it. A leader's value
entry is written in the campaign's own transaction (so only a leader has one) and removed
with its resignation, its session's end or its next campaign; ``leader()`` takes the value
entry of the leader's session, so an old leader's value (one whose grant an operator released)
is never shown as the new leader's.

``observe()`` subscribes to both tables (PROTOCOL.md "subscribe": a sink, ``_feed``), reads
the leader once, and again after each event about the election: it yields a
:class:`LeaderChange` whenever the leader, its term or its value differs from the last one
yielded. After a reconnect (or a buffer overflow) events may have been missed: the state is
read again and the next change is yielded with ``gap=True`` even when nothing differs, so a
gap is never hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from client._result import Result
from protocol import (
    AnywayContinueAfter,
    Assert,
    Block,
    DeleteVar,
    Exists,
    If,
    SelectConstantValue,
    SelectVarValue,
    SetVar,
    Statement,
    check_value,
)

from ._base import LockLostError, OnLost, S, same_value
from ._feed import Emit, FeedSinkBase, NextFeed, StopWatching, SubscribeFeed, unsubscribe_all
from ._kinds import _KindInit
from ._ops import Op, RunTx, acquire, release

__all__ = [
    "ELECTION_TABLE",
    "ELECTION_VALUE_TABLE",
    "ElectionKind",
    "LeaderChange",
    "LeaderInfo",
    "campaign",
    "leader",
    "leader_from",
    "leader_statements",
    "observe",
    "proclaim",
    "resign",
]

ELECTION_TABLE = "recipes.election"
ELECTION_VALUE_TABLE = "recipes.election.value"


@attrs.frozen
class LeaderInfo:
    """The leader of an election as one read saw it: its proclaimed ``value``, its ``term``
    (the fence of its grant), its ``session`` id, ``description`` (its session's, unless the
    candidate gave one) and ``since`` (wall-clock Unix seconds of the grant, the server's
    clock; None when the server does not send its start time)."""

    value: Any
    term: int
    session: str
    description: str | None
    since: float | None


@attrs.frozen
class LeaderChange:
    """One observation of ``observe()``: the leader now (None: nobody leads). ``gap``: events
    may have been missed before this observation (the client reconnected, or the observer
    fell behind): leaders may have come and gone unseen in between (their terms lie between
    the last one seen and this one)."""

    leader: LeaderInfo | None
    gap: bool = False


def leader_statements(name: str) -> list[Statement]:
    """Read an election's leader: its grant and the value entries (one per session)."""
    return [
        SelectVarValue("leader", ELECTION_TABLE, name, ignore_this_session=False),
        SelectVarValue(
            "values", ELECTION_VALUE_TABLE, name, ignore_this_session=False, select_many=True
        ),
    ]


def leader_from(
    result: Result, wall_clock: Callable[[float | None], float | None]
) -> LeaderInfo | None:
    """The leader a ``leader_statements`` reply names (None: nobody leads); ``wall_clock``
    turns the grant's server uptime into wall-clock time (``since``)."""
    record = result.get("leader")
    if not isinstance(record, dict):
        return None
    session = record["session"]
    value = None
    for entry in result.get("values") or ():
        if isinstance(entry, dict) and entry.get("session") == session:
            value = entry.get("value")
            break
    return LeaderInfo(
        value=value,
        term=record["fence"],
        session=session,
        description=record.get("description"),
        since=wall_clock(record.get("set_at")),
    )


class ElectionKind(_KindInit[S]):
    """An election's candidate: ``campaign`` (a blocking acquire that also publishes a value),
    ``proclaim``, ``resign`` (the release), ``leader``, ``observe``; ``term`` is the grant's
    fence."""

    KIND = "election"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self._value: Any = None  # the value this candidate campaigns with / proclaimed

    @property
    def term(self) -> int | None:
        """This candidate's term while it leads (the fence of its grant), else None."""
        return self.fence

    @property
    def value(self) -> Any:
        """The value this candidate campaigned with or last proclaimed."""
        return self._value

    @property
    def leading(self) -> bool:
        """True while this object holds the leadership and has not heard it was lost (local
        knowledge, no call)."""
        return self.held and not self.lost

    @property
    def _desc(self) -> str | None:
        return self.description or self.session.description or None

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((ELECTION_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return [
            Assert(SetVar(ELECTION_TABLE, self.name, ticket, description=self._desc)),
            Assert(SetVar(ELECTION_VALUE_TABLE, self.name, self._value, allow_duplicates=True)),
        ]

    def _release_statements(self, ticket: str) -> list[Statement]:
        # The value entry goes only with this grant: another candidate object of the same
        # session (waiting, or cleaning up after a cancelled campaign) must not take the
        # leader's value away.
        return [
            If(
                DeleteVar(ELECTION_TABLE, self.name, ticket),
                Block(
                    AnywayContinueAfter(DeleteVar(ELECTION_VALUE_TABLE, self.name)),
                    SelectConstantValue("released", True),
                ),
                SelectConstantValue("released", False),
            )
        ]

    def _check_campaign(self, value: Any) -> None:
        check_value(value, "value")
        with self._mu:
            busy = self._acquiring or (self._fence is not None and not self._lost)
        if busy:
            raise RuntimeError(
                f"{self!r} is already leading (or campaigning): resign first, or make one "
                "object per candidate"
            )

    def _proclaim_statements(self, value: Any) -> list[Statement]:
        with self._mu:
            ticket = self._ticket if self._fence is not None else None
            lost = self._lost
            info = self._lost_info
        if ticket is None:
            raise RuntimeError(f"{self!r} does not lead: campaign first")
        if lost:
            raise LockLostError(self, info)
        return [
            Assert(Exists(ELECTION_TABLE, self.name, ticket, ignore_this_session=False)),
            Assert(SetVar(ELECTION_VALUE_TABLE, self.name, value, allow_duplicates=True)),
        ]

    def _proclaim_failed(self) -> None:
        """The grant was gone when a proclaim arrived: a loss nobody announced (yet)."""
        with self._mu:
            newly = self._fence is not None and not self._lost
            if newly:
                self._lost = True
        if newly:
            self._signal_lost()
        self._check()


def campaign(
    el: ElectionKind[Any], value: Any = None, *, timeout: float | None = None
) -> Op[int | None]:
    """Wait (on the server, in arrival order) until this candidate leads, at most
    ``timeout`` seconds; its term, or None when the time ran out. RuntimeError when it leads
    (or campaigns) already; LockLostError when it led and lost it without resigning (it is
    then free). Cancelling the caller (async face) withdraws the candidacy: whatever was
    granted is released."""
    el._check_campaign(value)
    el._value = value
    granted = yield from acquire(el, True, timeout)
    return el.term if granted else None


def proclaim(el: ElectionKind[Any], value: Any) -> Op[None]:
    """Publish ``value`` as the leader's value, under the same term. RuntimeError when
    this candidate does not lead; LockLostError when its leadership was lost."""
    check_value(value, "value")
    statements = el._proclaim_statements(value)
    result: Result = yield RunTx(statements)
    if result.ok:
        el._value = value
        return
    el._proclaim_failed()


def leader(el: ElectionKind[Any]) -> Op[LeaderInfo | None]:
    """The leader now (value, term, session, description, since), None when nobody leads.
    One read."""
    result: Result = yield RunTx(leader_statements(el.name))
    return leader_from(result, el._wall_clock)


def observe(el: ElectionKind[Any], sink: FeedSinkBase) -> Op[None]:
    """``observe()``: hand out (``Emit``) a :class:`LeaderChange` now and at each change,
    until the driver throws :class:`~._feed.StopWatching` into it (the caller stopped
    iterating). Ends its subscriptions on the way out, also when the caller is cancelled or
    a call fails."""
    subscriptions: list[int] = []
    try:
        for table in (ELECTION_TABLE, ELECTION_VALUE_TABLE):
            subscriptions.append((yield SubscribeFeed(table, sink)))
        last: LeaderInfo | None = None
        first = True
        gap = False
        expect_gap = False  # a reconnect we caused by reading after a lost connection
        while True:
            result: Result = yield RunTx(leader_statements(el.name))
            now = leader_from(result, el._wall_clock)
            if first or gap or _differs(now, last):
                yield Emit(LeaderChange(now, gap))
            first = gap = False
            last = now
            while True:
                batch = yield NextFeed(sink)
                if batch.lost:
                    gap = expect_gap = True  # the read below reconnects (and resubscribes)
                    break
                if batch.gap and not (expect_gap and not batch.events):
                    gap = True
                    break
                expect_gap = False
                if batch.gap or any(
                    ev.var == el.name and ev.table in (ELECTION_TABLE, ELECTION_VALUE_TABLE)
                    for ev in batch.events
                ):
                    break
    except StopWatching:
        pass
    except GeneratorExit:  # pragma: no cover - a driver never drops an operation midway
        raise
    except BaseException:
        yield from unsubscribe_all(subscriptions)
        raise
    yield from unsubscribe_all(subscriptions)


def _differs(a: LeaderInfo | None, b: LeaderInfo | None) -> bool:
    if a is None or b is None:
        return a is not b
    return (a.session, a.term) != (b.session, b.term) or not same_value(a.value, b.value)


def resign(el: ElectionKind[Any]) -> Op[bool]:
    """Step down; True when this candidate led until now. False (without a call) when it did
    not lead; LockLostError when its leadership had been lost meanwhile."""
    return (yield from release(el))
