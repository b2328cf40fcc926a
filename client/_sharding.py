"""One client over several servers, the socket-free half both faces share: which server a
namespace lives on (cached), how a batch splits by server and how its outcomes merge back,
and what a server that cannot be reached raises.

Why here: the sync and the async face route the same way; only their I/O differs. Placement
itself (the hash, the server list) is ``_placement`` (PROTOCOL.md §12). The router's entries
are :class:`~client._placement.ServerGroup` values: a single server, or a replicated group
whose per-entry client fails over among its members (``_failover``); "server" below means
such an entry.

Theory of operation (docs/client.md#several-servers):
- A client given several servers is a *router*: it holds one ordinary single-server client
  per server, opened lazily by the first call that needs that server, and sessions that are
  *composite*: one session id, and on each server it touches an ordinary session with that
  id, created there lazily (its own keepalive, its own ``valid_until``, its own lost
  events, which reach the composite's listeners).
- A call for a namespace goes to its server's client unchanged; the only cost on the call
  path is one dict lookup (:meth:`Router.place`).
- A server that cannot be reached makes the calls for *its* namespaces raise
  :class:`ServerUnavailable` naming it (:func:`unavailable`); other servers' clients and
  sessions are separate objects, so they are not touched.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from protocol import FeedEvent

from ._errors import BatchError, LockClientError, ServerUnavailable
from ._placement import ServerAddress, ServerGroup, Servers, parse_groups, parse_servers, place
from ._result import Result
from ._session_state import BatchCall

__all__ = [
    "Router",
    "Subscriptions",
    "client_groups",
    "describe",
    "shard_servers",
    "join_cursor",
    "merge_outcomes",
    "split_cursor",
    "unavailable",
]

#: Namespaces whose placement a router remembers; past this the memo starts again (placing
#: is a few microseconds, the memo only saves them on the hot path).
PLACEMENT_MEMO = 65_536


class Router:
    """The placement of one client over its servers (and groups), with a memo of
    namespace -> entry."""

    __slots__ = ("_memo", "servers")

    def __init__(self, servers: Servers | tuple[ServerGroup, ...]) -> None:
        if type(servers) is tuple and all(type(s) is ServerGroup for s in servers):
            self.servers: tuple[ServerGroup, ...] = servers  # a client's own host and port
        else:
            self.servers = parse_groups(servers)  # type: ignore[arg-type]
        self._memo: dict[str, ServerGroup] = {}

    def member(self, server: str) -> ServerGroup:
        """The entry of this list that ``server`` names: one ``host:port`` (a server, or
        any configured member of a group), or a group's members in any order (its id, as
        :attr:`servers` lists them). ValueError when it names no entry, or several."""
        named = parse_servers(server)
        ids = {address.id for address in named}
        for listed in self.servers:
            members = {m.id for m in listed.members}
            if ids == members or (len(ids) == 1 and ids <= members):
                return listed
        if len(named) != 1:
            raise ValueError(f"name one server or group, got {len(named)}: {server!r}")
        listed_ids = " ".join(s.id for s in self.servers)
        raise ValueError(f"{named[0].id} is not one of this client's servers ({listed_ids})")

    def place(self, namespace: str) -> ServerGroup:
        """The server ``namespace`` lives on (TypeError when it is not a str)."""
        server = self._memo.get(namespace)
        if server is None:
            if type(namespace) is not str:
                raise TypeError(f"namespace must be a str, got {type(namespace).__name__}")
            if len(self._memo) >= PLACEMENT_MEMO:
                self._memo.clear()
            server = self._memo[namespace] = place(namespace, self.servers)
        return server

    def split(self, calls: Iterable[BatchCall]) -> list[tuple[ServerGroup, list[int], list[Any]]]:
        """The calls of a batch grouped by server, in the order each server first appears:
        ``(server, indexes of its calls in the batch, its calls)``. A call that is not a
        ``(namespace, statements[, transaction_id])`` tuple raises TypeError naming it."""
        groups: dict[ServerGroup, tuple[list[int], list[Any]]] = {}
        for i, call in enumerate(calls):
            if type(call) is not tuple or not 2 <= len(call) <= 3:
                raise TypeError(
                    f"calls[{i}]: a call must be a tuple (namespace, statements) or "
                    f"(namespace, statements, transaction_id), got {call!r:.80}"
                )
            try:
                server = self.place(call[0])
            except TypeError as exc:
                raise TypeError(f"calls[{i}]: {exc}") from exc
            indexes, items = groups.setdefault(server, ([], []))
            indexes.append(i)
            items.append(call)
        return [(server, indexes, items) for server, (indexes, items) in groups.items()]


def client_groups(host: str, port: int, servers: Servers | None) -> tuple[ServerGroup, ...]:
    """The entries of a client made with ``host`` and ``port`` (one plain server, its host
    text kept as given) or with ``servers`` (:func:`~client._placement.parse_groups`);
    TypeError when both are given (``host`` and ``port`` not at their defaults)."""
    if servers is None:
        return (ServerGroup((ServerAddress(host, port),)),)
    if (host, port) != ("127.0.0.1", 7400):
        raise TypeError("give either host and port or servers, not both")
    return parse_groups(servers)


def shard_servers(group: ServerGroup) -> str | list[list[str]]:
    """The ``servers`` argument that makes the single-entry client of ``group`` (a router's
    per-server client): its one server, or the group with its members in their order."""
    ids = [member.id for member in group.members]
    return [ids] if group.replicated else ids[0]


def describe(groups: Iterable[ServerGroup]) -> str:
    """The entries as ``repr`` shows them: ids joined by ``,``, a group in brackets."""
    return ",".join(f"[{g.id}]" if g.replicated else g.id for g in groups)


def unavailable(server: ServerGroup, exc: ServerUnavailable) -> ServerUnavailable:
    """``exc`` (raised by the client of ``server``) as it reaches the caller of a router:
    the same class, its text prefixed with the server, ``server`` set, the original as cause."""
    if exc.server == server.id:
        return exc
    err = ServerUnavailable(f"server {server.id}: {exc}")
    err.server = server.id
    err.__cause__ = exc
    return err


def merge_outcomes(
    size: int, parts: list[tuple[list[int], list[Result] | BaseException]]
) -> list[Result]:
    """The results of a batch that went to several servers, in the caller's order.

    ``parts``: for each server, the batch indexes of its calls and either their results or
    what its ``execute_many`` raised: a :class:`BatchError` (its per-call outcomes are used)
    or any other client error (every call of that server gets it). Raises BatchError when
    some call failed, as a one-server batch does."""
    out: list[Result | LockClientError | None] = [None] * size
    failed = False
    for indexes, outcome in parts:
        if isinstance(outcome, BatchError):
            values: list[Any] = outcome.results
        elif isinstance(outcome, LockClientError):
            values = [outcome] * len(indexes)
        elif isinstance(outcome, BaseException):
            raise outcome
        else:
            values = outcome
        for i, value in zip(indexes, values, strict=True):
            out[i] = value
            failed = failed or isinstance(value, LockClientError)
    if failed:
        raise BatchError(out)  # type: ignore[arg-type]  # every slot is set above
    return out  # type: ignore[return-value]


# --- the operator's calls over several servers ------------------------------------------------


def split_cursor(cursor: str | None, count: int) -> tuple[int, str | None]:
    """A router's listing cursor as (index of the server to ask, that server's cursor): the
    router pages through its servers in list order, each to its end. ValueError for a cursor
    this router did not make."""
    if cursor is None:
        return 0, None
    if type(cursor) is not str:
        raise TypeError(f"cursor must be a str or None, got {type(cursor).__name__}")
    index, sep, inner = cursor.partition("~")
    if not sep or not index.isascii() or not index.isdigit() or int(index) >= count:
        raise ValueError(f"not a cursor of this client's listings: {cursor[:40]!r}")
    return int(index), inner or None


def join_cursor(index: int, inner: str | None, count: int) -> str | None:
    """The router's cursor after a page of server ``index`` whose own cursor is ``inner``:
    more of that server, else the next server from its start, else None (the end)."""
    if inner is not None:
        return f"{index}~{inner}"
    if index + 1 < count:
        return f"{index + 1}~"
    return None


class Subscriptions:
    """A router's change-feed subscriptions: its own ids (unique across servers) for each
    server's subscription id, both ways."""

    __slots__ = ("_by_server", "_ours")

    def __init__(self) -> None:
        self._ours: dict[int, tuple[ServerGroup, int]] = {}
        self._by_server: dict[tuple[ServerGroup, int], int] = {}

    def add(self, ours: int, server: ServerGroup, theirs: int) -> int:
        self._ours[ours] = (server, theirs)
        self._by_server[server, theirs] = ours
        return ours

    def pop(self, ours: int) -> tuple[ServerGroup, int] | None:
        """Forget subscription ``ours``; where it lives, None when unknown."""
        where = self._ours.pop(ours, None)
        if where is not None:
            del self._by_server[where]
        return where

    def relabel(self, received: list[tuple[ServerGroup, list[FeedEvent]]]) -> list[FeedEvent]:
        """The feed events each server's client received, under the router's subscription
        ids (events of subscriptions the router no longer knows are left out)."""
        out: list[FeedEvent] = []
        for server, events in received:
            for event in events:
                ours = self._by_server.get((server, event.subscription))
                if ours is not None:
                    out.append(attrs.evolve(event, subscription=ours))
        return out
