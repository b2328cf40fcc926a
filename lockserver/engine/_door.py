"""The door as the shell sees it: ``Door``, the calls the trio shell makes into the lock state.

Two objects stand there: a single server's :class:`~lockserver.engine.LockCore`, and a
replica's ``ReplicatedDoor`` (``lockserver/replication/_replica.py``), whose deciding calls become
ops of the group's log and whose answers come back when the log is applied. This protocol is their
contract, held by mypy (STYLE.md 17, "Declare the seams"): the request handler, the timers
and the HTTP face type the door as ``Door[Peer]`` and never need to know which one they call.

Rules every door keeps (docs/architecture.md "The door"):

- Each call that may decide something takes ``now`` (and ``trust``) and returns the ordered
  list of what to send, addressed to the owners it was called with (``Output[OwnerT]``); the
  shell delivers them in that order and decides nothing.
- The reads (``next_deadline``, ``uptime``, ``busiest_tables``, ``session_principal``) change
  nothing. ``statistics`` and ``page_at`` (the HTTP face's listing) may expire what is due
  (a single server) and return what that caused; a replica's read its applied state and
  return nothing to send.
- ``engine`` is the engine behind the door, for reading (tests, embedding, statistics).

This module is not compiled (a Protocol is a typing construct): it costs nothing at run time.
"""

from __future__ import annotations

from typing import Protocol

from protocol import ListQuery, SessionSpec, Transaction

from ._core import Listed, Output, OwnerT
from ._engine import Engine
from ._inspect import BusyTable, Visibility
from ._records import CoreStatistics, VisibleCounts

__all__ = ["Door"]


class Door(Protocol[OwnerT]):
    """The calls the shell makes through the door, with owners of type ``OwnerT``."""

    @property
    def engine(self) -> Engine: ...

    def execute(
        self,
        owner: OwnerT,
        request_id: int,
        session: SessionSpec,
        tx: Transaction,
        wait: float | None,
        now: float,
        trust: float,
        principal: str,
    ) -> list[Output[OwnerT]]: ...

    def end_session(
        self,
        owner: OwnerT,
        request_id: int,
        session_id: str,
        *,
        now: float,
        trust: float,
        principal: str,
        admin: bool = False,
    ) -> list[Output[OwnerT]]: ...

    def release(
        self,
        owner: OwnerT,
        request_id: int,
        namespace: str,
        table: str,
        var: str,
        session_id: str | None,
        *,
        now: float,
        trust: float,
    ) -> list[Output[OwnerT]]: ...

    def listing(
        self,
        owner: OwnerT,
        request_id: int,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> list[Output[OwnerT]]: ...

    def page_at(
        self,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> tuple[Listed, list[Output[OwnerT]]]: ...

    def busiest_tables(
        self, n: int, *, visible: Visibility | None = None
    ) -> tuple[list[BusyTable], int]: ...

    def subscribe(
        self,
        owner: OwnerT,
        request_id: int,
        namespace: str,
        table: str | None,
        principal: str = "",
    ) -> list[Output[OwnerT]]: ...

    def unsubscribe(self, owner: OwnerT, request_id: int, target: int) -> list[Output[OwnerT]]: ...

    def cancel(
        self, owner: OwnerT, request_id: int, target: int, *, now: float, trust: float
    ) -> list[Output[OwnerT]]: ...

    def owner_gone(self, owner: OwnerT, *, now: float, trust: float) -> list[Output[OwnerT]]: ...

    def advance(self, now: float, *, trust: float) -> list[Output[OwnerT]]: ...

    def next_deadline(self) -> float | None: ...

    def uptime(self, now: float) -> float: ...

    def session_principal(self, session_id: str) -> str | None: ...

    def visible_counts(self, visible: Visibility) -> VisibleCounts: ...

    def statistics(
        self, now: float, *, trust: float
    ) -> tuple[CoreStatistics, list[Output[OwnerT]]]: ...
