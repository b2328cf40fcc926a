"""Group membership: join with metadata, members, update, leave, watch; written once.

Why: services find each other and partition work through a group (kazoo's ``Party``, tooz's
groups, Consul's catalog): who is in, with what capabilities, since when, and who came and
went. A member is a **session** that holds an entry, so a member whose process dies leaves
by itself when its session expires (no cleanup job), and the watchers hear it from the change
feed, with the reason (it left, its session expired or was ended, an operator removed it).

Tables (in the group's namespace; the variable is the group's name):

| table | entries |
|---|---|
| ``recipes.group`` | one per member session: value = the member id, description = who |
| ``recipes.group.meta`` | one per member session: value = ``{"ticket": t, "metadata": m}`` |

The member id is the entry's value, so ``join`` can refuse an id another session holds in
the same transaction (``Exists`` with the id); the metadata lives apart so that ``update``
never rewrites the membership entry (``since`` is that entry's grant time, its fence the
membership's). ``members()`` reads both tables in one transaction and pairs them by session.

Membership is a grant (``RecipeCore``): ``join`` is a one-shot acquire, ``leave`` the release;
losing it (the session expired, was ended, or an operator released the entry) is a loss like
a mutex's (``lost``, ``on_lost``, the protected block of ``async with group.membership():``
cancelled).

``watch()`` subscribes to both tables, reads the members, and again after each batch of events
about the group: it yields a :class:`GroupChange` with who joined, who left (and why, from
the events' kinds) and whose metadata changed since the last one, and the members now. The
first change has every member as joined. After a reconnect (or a buffer overflow) the
change is marked ``gap`` and the reasons of those who left meanwhile are ``"unknown"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from client._result import Result
from protocol import (
    Abort,
    AnywayContinueAfter,
    Assert,
    Block,
    DeleteVar,
    Exists,
    FeedKind,
    If,
    Not,
    SelectConstantValue,
    SelectVarValue,
    SetVar,
    Statement,
    check_value,
)

from ._base import LockLostError, OnLost, S, check_name, same_value
from ._feed import Emit, FeedSinkBase, NextFeed, StopWatching, SubscribeFeed, unsubscribe_all
from ._kinds import _KindInit
from ._ops import Op, RunTx, acquire, release

__all__ = [
    "GROUP_META_TABLE",
    "GROUP_TABLE",
    "GroupChange",
    "GroupKind",
    "Member",
    "join",
    "leave_group",
    "members",
    "members_from",
    "members_statements",
    "update",
    "watch",
]

GROUP_TABLE = "recipes.group"
GROUP_META_TABLE = "recipes.group.meta"

#: Why a member left, from the feed event that removed its entry.
_REASONS = {
    FeedKind.RELEASED: "left",
    FeedKind.EXPIRED: "expired",
    FeedKind.KILLED: "ended",
    FeedKind.LOST: "released",
}


@attrs.frozen
class Member:
    """One member of a group as a read saw it: its ``member_id``, ``session``,
    ``metadata``, ``since`` (wall-clock Unix seconds of its join, the server's clock; None when
    the server does not send its start time), ``description`` (its session's, unless the
    member gave one) and ``fence`` (of its join)."""

    member_id: str
    session: str
    metadata: Any
    since: float | None
    description: str | None
    fence: int


@attrs.frozen
class GroupChange:
    """One observation of ``watch()``: who ``joined``, who ``left`` (with why: ``"left"``,
    ``"expired"``, ``"ended"``, ``"released"`` by an operator, or ``"unknown"`` after a gap),
    whose metadata was ``updated``, and the ``members`` now (by member id). ``gap``: events
    may have been missed before this change (the client reconnected): members may have come
    and gone unseen in between."""

    joined: tuple[Member, ...] = ()
    left: tuple[tuple[Member, str], ...] = ()
    updated: tuple[Member, ...] = ()
    members: tuple[Member, ...] = ()
    gap: bool = False


def members_statements(name: str) -> list[Statement]:
    """Read a group's members and their metadata."""
    return [
        SelectVarValue("members", GROUP_TABLE, name, ignore_this_session=False, select_many=True),
        SelectVarValue("meta", GROUP_META_TABLE, name, ignore_this_session=False, select_many=True),
    ]


def members_from(
    result: Result, wall_clock: Callable[[float | None], float | None]
) -> tuple[Member, ...]:
    """The members a ``members_statements`` reply names, in join order (by fence)."""
    metadata: dict[str, Any] = {}
    for record in result.get("meta") or ():
        value = record.get("value") if isinstance(record, dict) else None
        if isinstance(value, dict):
            metadata[record["session"]] = value.get("metadata")
    out = []
    for record in result.get("members") or ():
        if not isinstance(record, dict) or type(record.get("value")) is not str:
            continue  # not a member entry (someone wrote to the reserved table)
        session = record["session"]
        out.append(
            Member(
                member_id=record["value"],
                session=session,
                metadata=metadata.get(session),
                since=wall_clock(record.get("set_at")),
                description=record.get("description"),
                fence=record["fence"],
            )
        )
    out.sort(key=lambda m: m.fence)
    return tuple(out)


class GroupKind(_KindInit[S]):
    """One member of a group: ``join`` (the grant), ``update``, ``leave`` (the release),
    ``members``, ``watch``. ``member_id`` defaults to the session's id."""

    KIND = "group member"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        member_id: str | None = None,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self.member_id = session.id if member_id is None else check_name("member_id", member_id)
        self._metadata: Any = None
        self._meta_entry: dict[str, Any] | None = None  # our metadata entry's value

    @property
    def joined(self) -> bool:
        """True while this object is a member and has not heard it was lost (local)."""
        return self.held and not self.lost

    @property
    def metadata(self) -> Any:
        """The metadata this member joined with or last set."""
        return self._metadata

    @property
    def _desc(self) -> str | None:
        return self.description or self.session.description or None

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((GROUP_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        name = self.name
        return [
            Assert(Not(Exists(GROUP_TABLE, name, self.member_id, ignore_this_session=False))),
            If(DeleteVar(GROUP_TABLE, name), Abort()),  # this session is a member already
            Assert(
                SetVar(
                    GROUP_TABLE, name, self.member_id, description=self._desc, allow_duplicates=True
                )
            ),
            Assert(
                SetVar(
                    GROUP_META_TABLE,
                    name,
                    {"ticket": ticket, "metadata": self._metadata},
                    allow_duplicates=True,
                )
            ),
        ]

    def _on_grant(self, result: Result) -> float | None:
        with self._mu:
            self._meta_entry = {"ticket": self._ticket, "metadata": self._metadata}
        return None

    def _release_statements(self, ticket: str) -> list[Statement]:
        # The metadata goes only with this membership (never another member object's of the
        # same session, cleaning up after a refused join).
        return [
            If(
                DeleteVar(GROUP_TABLE, self.name, self.member_id),
                Block(
                    AnywayContinueAfter(DeleteVar(GROUP_META_TABLE, self.name)),
                    SelectConstantValue("released", True),
                ),
                SelectConstantValue("released", False),
            )
        ]

    def _refresh_statements(self) -> list[Statement] | None:
        with self._mu:
            entry = self._meta_entry if self._fence is not None else None
        if entry is None:
            return None
        return [
            Assert(Exists(GROUP_TABLE, self.name, self.member_id, ignore_this_session=False)),
            Assert(Exists(GROUP_META_TABLE, self.name, entry, ignore_this_session=False)),
        ]

    def _on_release(self) -> None:
        self._meta_entry = None

    def _check_join(self, metadata: Any) -> None:
        check_value(metadata, "metadata")
        with self._mu:
            busy = self._acquiring or (self._fence is not None and not self._lost)
        if busy:
            raise RuntimeError(f"{self!r} has joined already: leave first")

    def _update_statements(self, metadata: Any) -> tuple[list[Statement], dict[str, Any]]:
        with self._mu:
            entry = self._meta_entry if self._fence is not None else None
            lost = self._lost
            info = self._lost_info
        if entry is None:
            raise RuntimeError(f"{self!r} is not a member: join first")
        if lost:
            raise LockLostError(self, info)
        new = {"ticket": entry["ticket"], "metadata": metadata}
        return [
            Assert(Exists(GROUP_TABLE, self.name, self.member_id, ignore_this_session=False)),
            Assert(DeleteVar(GROUP_META_TABLE, self.name, entry)),
            Assert(SetVar(GROUP_META_TABLE, self.name, new, allow_duplicates=True)),
        ], new

    def _gone(self) -> None:
        with self._mu:
            newly = self._fence is not None and not self._lost
            if newly:
                self._lost = True
        if newly:
            self._signal_lost()
        self._check()


def join(g: GroupKind[Any], metadata: Any = None) -> Op[bool]:
    """Join with ``metadata``: True when this member joined; False when its member id is taken
    by another session, or this session is a member of the group already (``last_result``
    says which: ``failed_statement`` ``"0:/AssertOp/"`` or ``"1:/IfOp/AbortOp/"``).
    RuntimeError when this object has joined already."""
    g._check_join(metadata)
    g._metadata = metadata
    return (yield from acquire(g, False, None))


def update(g: GroupKind[Any], metadata: Any) -> Op[None]:
    """Replace this member's metadata, in one call (its membership, ``since`` and fence
    stay). RuntimeError when not a member; LockLostError when the membership was lost."""
    check_value(metadata, "metadata")
    statements, new = g._update_statements(metadata)
    result: Result = yield RunTx(statements)
    if result.ok:
        with g._mu:
            g._meta_entry = new
        g._metadata = metadata
        return
    g._gone()


def members(g: GroupKind[Any]) -> Op[tuple[Member, ...]]:
    """The members now, in join order (one read)."""
    result: Result = yield RunTx(members_statements(g.name))
    return members_from(result, g._wall_clock)


def watch(g: GroupKind[Any], sink: FeedSinkBase) -> Op[None]:
    """``watch()``: hand out (``Emit``) a :class:`GroupChange` now (everyone as joined) and
    after each batch of events about the group that changed something, until the driver
    throws :class:`~._feed.StopWatching` in. Ends its subscriptions on the way out."""
    subscriptions: list[int] = []
    name = g.name
    tables = (GROUP_TABLE, GROUP_META_TABLE)
    try:
        for table in tables:
            subscriptions.append((yield SubscribeFeed(table, sink)))
        known: dict[str, Member] = {}
        reasons: dict[str, str] = {}  # session -> why its membership entry went
        first = True
        gap = expect_gap = False
        while True:
            result: Result = yield RunTx(members_statements(name))
            now = {m.session: m for m in members_from(result, g._wall_clock)}
            for ev in sink.peek():  # not taken yet, but they may explain what the read saw
                if ev.var == name and ev.table == GROUP_TABLE and ev.kind in _REASONS:
                    reasons.setdefault(ev.session, _REASONS[ev.kind])
            joined = tuple(m for s, m in now.items() if s not in known or _rejoined(known[s], m))
            left = tuple(
                (m, "unknown" if gap else reasons.get(s, "unknown"))
                for s, m in known.items()
                if s not in now or _rejoined(m, now[s])
            )
            updated = tuple(
                m
                for s, m in now.items()
                if s in known
                and not _rejoined(known[s], m)
                and not same_value(known[s].metadata, m.metadata)
            )
            if first or gap or joined or left or updated:
                yield Emit(GroupChange(joined, left, updated, tuple(now.values()), gap))
            first = gap = False
            known = now
            reasons = {}
            while True:
                batch = yield NextFeed(sink)
                if batch.lost:
                    gap = expect_gap = True
                    break
                if batch.gap and not (expect_gap and not batch.events):
                    gap = True
                    break
                expect_gap = False
                relevant = False
                for ev in batch.events:
                    if ev.var != name or ev.table not in tables:
                        continue
                    relevant = True
                    if ev.table == GROUP_TABLE and ev.kind in _REASONS:
                        reasons[ev.session] = _REASONS[ev.kind]
                if relevant or batch.gap:
                    break
    except StopWatching:
        pass
    except GeneratorExit:  # pragma: no cover - a driver never drops an operation midway
        raise
    except BaseException:
        yield from unsubscribe_all(subscriptions)
        raise
    yield from unsubscribe_all(subscriptions)


def _rejoined(before: Member, after: Member) -> bool:
    """The same session left and joined again between two reads (a new membership)."""
    return before.fence != after.fence


def leave_group(g: GroupKind[Any]) -> Op[bool]:
    """Leave; True when this member was in the group until now (False without a call when it
    had not joined; LockLostError when its membership had been lost)."""
    return (yield from release(g))
