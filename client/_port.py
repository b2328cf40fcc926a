"""The ports: what a session may ask of its client, one ``typing.Protocol`` per face.

Why: a session (``_sync_session`` / ``_async_session``) sends its frames through the client
that owns the connection, and the recipes reach the client through ``session.client``. If the
session named the client class, the client module (which creates sessions) and the session
module would import each other. Instead the session names only the port below; the client
classes (``LockClient``, ``AsyncLockClient``) implement it with documented methods, checked
structurally by mypy where a client is handed to a session. This module is socket-free like
the rest of the core: it imports the core and ``protocol``, never a face.

The contract of every method is the client's docstring; in short:
- ``core``: the client's :class:`~client._core.ClientCore` (request ids, the session
  registry, counters), which a session registers with and builds its frames from.
- ``check_open()``: raise ClientClosed once the client is closed.
- ``request(kind, rid, data, ...)``: send one framed request registered under ``rid`` (a
  ``client._wire`` request kind) and return its decoded reply; reconnects first when needed,
  re-sends idempotent kinds once after a drop, raises the client's errors.
- ``request_batch(rids, data, ...)``: the frames of several Executes in one write; every
  call's outcome (a Result or its exception) in call order.
- sync only: ``send_unanswered(data)`` writes a request whose reply nobody waits for (the
  Cancel of a timed-out waiting Execute); async only: ``start_soon(fn, *args)`` runs a
  background task (a session's keepalive) in the client's own task group, and ``clock`` is
  the event loop's clock (a function), which the session's deadlines use.
- The rest is the client's public API that recipes use through ``session.client``, and
  ``place(namespace)``: the server a namespace lives on.
- A client of several servers is also a *router port*: ``split(calls)`` (a batch grouped
  by server) and ``shard_client(server)`` (that server's single-server client, opened on
  first use), which a session over several servers uses to run each call on its server
  (``client._sharding``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from protocol import Pong, Welcome

from ._core import ClientCore, ClientStatistics
from ._placement import ServerGroup

__all__ = ["AsyncRouterPort", "AsyncSessionPort", "RouterPort", "SessionPort"]


class SessionPort(Protocol):
    """What a sync :class:`~client.Session` needs of its client (``LockClient``)."""

    @property
    def core(self) -> ClientCore: ...

    @property
    def timeout(self) -> float: ...

    @property
    def welcome(self) -> Welcome: ...

    @property
    def closed(self) -> bool: ...

    def check_open(self) -> None: ...

    def request(self, kind: int, rid: int, data: bytes, timeout: float) -> Any: ...

    def request_batch(self, rids: list[int], data: bytes, timeout: float) -> list[Any]: ...

    def send_unanswered(self, data: bytes) -> None: ...

    def process_events(
        self, timeout: float = 0.0, *, until: Callable[[], bool] | None = None
    ) -> None: ...

    def ping(self) -> Pong: ...

    def end_session(self, session_id: str) -> bool: ...

    def local_statistics(self) -> ClientStatistics: ...

    def place(self, namespace: str) -> ServerGroup: ...


class AsyncSessionPort(Protocol):
    """What an :class:`~client.AsyncSession` needs of its client (``AsyncLockClient``)."""

    @property
    def core(self) -> ClientCore: ...

    @property
    def welcome(self) -> Welcome: ...

    @property
    def closed(self) -> bool: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def check_open(self) -> None: ...

    async def request(
        self, kind: int, rid: int, data: bytes, cancel_on_abort: bool = False
    ) -> Any: ...

    async def request_batch(self, rids: list[int], data: bytes) -> list[Any]: ...

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None: ...

    async def ping(self) -> Pong: ...

    async def end_session(self, session_id: str) -> bool: ...

    def local_statistics(self) -> ClientStatistics: ...

    def place(self, namespace: str) -> ServerGroup: ...


class RouterPort(SessionPort, Protocol):
    """What a sync session over several servers (``ShardedSession``) needs of its client: a
    ``LockClient`` given several servers."""

    def split(self, calls: Iterable[Any]) -> list[tuple[ServerGroup, list[int], list[Any]]]: ...

    def shard_client(self, server: ServerGroup) -> SessionPort: ...


class AsyncRouterPort(AsyncSessionPort, Protocol):
    """What an async session over several servers (``AsyncShardedSession``) needs of its
    client: an ``AsyncLockClient`` given several servers."""

    def split(self, calls: Iterable[Any]) -> list[tuple[ServerGroup, list[int], list[Any]]]: ...

    async def shard_client(self, server: ServerGroup) -> AsyncSessionPort: ...
