"""Which server a connection goes to: the members of one entry of the server list (a single
server, or a replicated group) and the order a (re)connect tries them. Socket-free, shared by
both faces; each face's connection code asks :meth:`Members.round` for the order, tries each
member with its own I/O, and reports the one that answered (:meth:`Members.connected`) or
what every one of them raised (:meth:`Members.failure`).

Why: the replicas of a group share one lock state (their welcomes name the same
``instance``), so a client whose replica dies may continue **the same sessions** on another
replica; the core's reconnect rules (``ClientCore.reconnected``, the keepalives and
subscriptions made again on the new connection) then apply unchanged. Only the choice of
the server is new, and it is the same decision on both faces.

Rules kept:
- Order: the first connection tries the members in the configured order; after a lost
  connection a reconnect starts at the member **after** the one that was lost, then the
  others round robin (configured members first, then learned ones), the lost one last. A
  later reconnect that is not after a loss starts at the last member that worked.
- One round per (re)connect: every member is tried once (each within ``connect_timeout``);
  when none answers, the face raises :meth:`failure`; the next call (or keepalive) starts
  another round. There is no sleep between rounds.
- Learning: a replicated group's welcome may list the group's current ``replicas``; those the
  client was not given are added after the configured members (at most :data:`MAX_SERVERS`
  members in all), replacing what an earlier welcome taught. Configured members are never
  dropped. A plain server (not given as a group) learns nothing: it is exactly the
  single-server client it always was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from protocol import Welcome

from ._errors import LockClientError, ServerError, ServerUnavailable
from ._placement import MAX_SERVERS, ServerAddress, ServerGroup, parse_servers

__all__ = ["Members"]

log = logging.getLogger("client")


class Members:
    """The servers one client's connection may go to (one entry of its server list), the
    member it is (or was last) connected to, and the order to try them in."""

    __slots__ = ("_current", "_learned", "connected_once", "failovers", "group")

    def __init__(self, group: ServerGroup) -> None:
        self.group = group
        self._learned: tuple[ServerAddress, ...] = ()
        # The last member that worked (the first configured one before any connection).
        self._current = group.members[0]
        self.connected_once = False
        # Connections made to another member than the previous connection's.
        self.failovers = 0

    @property
    def members(self) -> tuple[ServerAddress, ...]:
        """Every member a connection may go to: the configured ones, then the learned."""
        return self.group.members + self._learned

    @property
    def learned(self) -> tuple[ServerAddress, ...]:
        """The members learned from the last welcome that listed replicas."""
        return self._learned

    @property
    def current(self) -> ServerAddress:
        """The member of the current (or last) connection; the first configured member
        before any connection."""
        return self._current

    def round(self, after_loss: bool) -> list[ServerAddress]:
        """The members in the order a (re)connect tries them, each once: from the last
        member that worked, or with ``after_loss`` (the connection to it was lost) from the
        member after it; then round robin."""
        members = self.members
        try:
            start = members.index(self._current)
        except ValueError:  # a learned member that a later welcome no longer lists
            start = -1 if after_loss else 0
        if after_loss:
            start += 1
        n = len(members)
        return [members[(start + k) % n] for k in range(n)]

    def connected(self, address: ServerAddress, welcome: Welcome) -> None:
        """A connection to ``address`` was welcomed with ``welcome``: it is the current
        member now; a replicated group learns the replicas the welcome lists."""
        if self.connected_once and address != self._current:
            self.failovers += 1
        self._current = address
        self.connected_once = True
        if self.group.replicated and welcome.replicas:
            self._learn(welcome.replicas)

    def _learn(self, replicas: Iterable[str]) -> None:
        known = {m.id for m in self.group.members}
        room = MAX_SERVERS - len(self.group.members)
        learned: list[ServerAddress] = []
        for text in replicas:
            try:
                named = parse_servers(text)
            except (TypeError, ValueError) as exc:
                log.warning(
                    "group %s: ignoring replica %r of the welcome: %s", self.group, text, exc
                )
                continue
            if len(named) != 1:
                log.warning(
                    "group %s: ignoring replica %r of the welcome: not one server", self.group, text
                )
                continue
            address = named[0]
            if address.id in known:
                continue
            if len(learned) >= room:
                log.warning(
                    "group %s: the welcome lists more than %d replicas; the rest are ignored",
                    self.group,
                    MAX_SERVERS,
                )
                break
            known.add(address.id)
            learned.append(address)
        self._learned = tuple(learned)

    def failure(self, errors: Sequence[tuple[ServerAddress, LockClientError]]) -> LockClientError:
        """What a round in which every member failed raises, given each member's error in
        the order tried: the one error of a single member as it is (the single-server
        client's error, unchanged); else the first ServerError (a refusal, e.g. a bad token,
        says more than an unreachable member); else a ServerUnavailable naming every member
        and its error, the last one as the cause."""
        if len(errors) == 1:
            return errors[0][1]
        for _, exc in errors:
            if isinstance(exc, ServerError):
                return exc
        tried = "; ".join(f"{address.id}: {exc}" for address, exc in errors)
        err = ServerUnavailable(f"no member of group {self.group.id} could be reached ({tried})")
        err.__cause__ = errors[-1][1]
        return err
