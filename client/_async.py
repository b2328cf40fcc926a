"""The async face: one connection shared by any number of tasks, pipelined, on anyio (so it
runs under trio and under asyncio alike).

Why: many tasks of one program should share one connection with many requests in flight
(64 tasks -> 64 requests on the wire, answered in any order), and a cancelled caller must never
desynchronise the connection or receive someone else's reply. Written on anyio, the face runs
in a trio program exactly as before and in an asyncio one (FastAPI, aiohttp...) the same way:
tasks, cancel scopes, timeouts, the clock and socket readiness all come from anyio, which
uses the running loop's own.

Sessions (:class:`AsyncSession`, its execute/end, ``wait_lost`` and its keepalive task) are in
``_async_session.py``: they change with the session API, this module with the public
calls. The client creates them and stops their keepalive on shutdown. A session sees its
client only as a :class:`~client._port.AsyncSessionPort`, which :class:`AsyncLockClient`
implements (``core``, ``check_open``, ``request``, ``request_batch``, ``start_soon``, and the
public calls); this module imports the session module, never the other way round.

The calls are written once as steps (``_calls``) and the state and what reads it once
(``_face.ClientFace``); this module only **drives** them with awaited calls and adds what is
the async face's own (``open_lock_client``, ``next_feed_events``, the session port's task
group and clock). The connection machinery (the reader and writer tasks, register-and-write,
cancellation, TLS, connect, break, reconnect) is ``_async_conn.AsyncConnector``,
AsyncLockClient's base, and its theory of operation is written there.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.abc
import anyio.lowlevel

from protocol import FeedEvent

from . import _calls
from ._async_conn import AsyncConnector
from ._async_session import AsyncSession, AsyncShardedSession, run_async
from ._methods import awaitable
from ._placement import ServerGroup, Servers

__all__ = ["AsyncLockClient", "open_lock_client"]

T = TypeVar("T")


@asynccontextmanager
async def open_lock_client(
    host: str = "127.0.0.1",
    port: int = 7400,
    *,
    servers: Servers | None = None,
    client_name: str = "python-trio",
    connect_timeout: float = 10.0,
    token: str | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[AsyncLockClient]:
    """Connect to a lock server; the client is closed when the block exits.

    ``token``: the shared secret the server asks for (docs/security.md). ``ssl_context``:
    speak TLS, verifying the server with it (e.g. ``ssl.create_default_context(cafile=...)``;
    the server name checked is ``host``).

    Raises :class:`ServerUnavailable` when no connection can be made. Calls have no timeout
    of their own (a waiting Execute may be answered much later): bound them with the event
    loop's cancel scopes or timeouts (``trio.move_on_after``, ``anyio.fail_after``,
    ``asyncio.timeout``), which is always safe (see the module docstring).

    ``servers`` (instead of ``host`` and ``port``): several servers, as for the sync face's
    :class:`~client.LockClient` (docs/client.md#several-servers): each namespace lives on one
    of them, connections are opened lazily by the first call that needs each server (so
    entering the block connects to none), sessions span servers, and a server that cannot be
    reached makes the calls for its namespaces raise ServerUnavailable naming it. A
    replicated group is a list of its servers (``servers=[["h1:7400", "h2:7400"]]``): the
    connection fails over among its members and the sessions carry on
    (docs/client.md#replicated-groups).
    """
    failure: BaseException | None = None
    async with anyio.create_task_group() as task_group:
        client = AsyncLockClient(
            task_group,
            host,
            port,
            servers=servers,
            client_name=client_name,
            connect_timeout=connect_timeout,
            token=token,
            ssl_context=ssl_context,
        )
        try:
            if client._router is None:
                await client._reconnect()
            yield client
        except BaseException as exc:
            # Raised again below, outside the task group, so it is not wrapped in an
            # ExceptionGroup (the client's own tasks never raise).
            failure = exc
        finally:
            client._shutdown()
    if failure is not None:
        raise failure


class AsyncLockClient(AsyncConnector[AsyncSession, "AsyncLockClient"]):
    """An async client (trio or asyncio); create it with :func:`open_lock_client`. Safe to
    share between the tasks of its event loop. What is not written here (``welcome``,
    ``session``, ``servers``, ``members``...) is :class:`~client._face.ClientFace`'s, as the
    sync face's."""

    _SHARD_HINT = "(await client.shard(server))"
    _session_class = AsyncSession
    _sharded_session_class = AsyncShardedSession

    def __init__(
        self,
        nursery: anyio.abc.TaskGroup,
        host: str = "127.0.0.1",
        port: int = 7400,
        *,
        servers: Servers | None = None,
        client_name: str,
        connect_timeout: float,
        token: str | None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._setup(host, port, servers, client_name, token, ssl_context)
        if (
            type(connect_timeout) not in (int, float)
            or not math.isfinite(connect_timeout)
            or connect_timeout <= 0
        ):
            raise ValueError(
                f"connect_timeout must be a finite number > 0, got {connect_timeout!r}"
            )
        self.connect_timeout = float(connect_timeout)
        self._setup_connection(nursery)
        # A router's per-server clients live in this client's task group.
        router = self._router
        self._shard_locks = {} if router is None else {s: anyio.Lock() for s in router.servers}

    async def _drive(self, op: Generator[_calls.Step, Any, T]) -> T:
        """Run a call of ``_calls`` to its end with awaited calls."""
        return await run_async(op, self._answer)

    async def _answer(self, step: _calls.Step) -> Any:
        if type(step) is _calls.Call:
            return await self.request(step.kind, step.rid, step.data)
        assert type(step) is _calls.OnShard  # OpenTo is the connector's, OnPart a session's
        shard = await self.shard_client(step.server)
        return await shard._drive(step.make(shard))

    # --- public API (the docstrings are the sync face's: client.LockClient) ----------------------

    ping = awaitable(_calls.ping)
    statistics = awaitable(_calls.statistics)
    end_session = awaitable(_calls.end_session)

    async def shard(self, server: str) -> AsyncLockClient:
        """The single-server client of ``server`` (one of :attr:`servers`), connected now if
        it was not yet (as the sync face's :meth:`~client.LockClient.shard`)."""
        address = self._shard_address(server)
        if address is None:
            await anyio.lowlevel.checkpoint()
            return self
        return await self.shard_client(address)

    # --- the operator's calls (as the sync face's: docs/operations.md) --------------------------

    holders = awaitable(_calls.holders)
    sessions = awaitable(_calls.sessions)
    waiters = awaitable(_calls.waiters)
    release = awaitable(_calls.release)
    subscribe = awaitable(_calls.subscribe)
    unsubscribe = awaitable(_calls.unsubscribe)

    def _take_feed(self) -> list[FeedEvent]:
        conn = self._conn
        return [] if conn is None else conn.wire.take_feed()

    async def next_feed_events(self) -> list[FeedEvent]:
        """Wait until change-feed events have arrived (at once if some have) and take them."""
        while True:
            events = self.feed_events()
            if events:
                await anyio.lowlevel.checkpoint()
                return events
            self.check_open()
            await self._feed_ready.wait()
            self._feed_ready = anyio.Event()

    def _in_flight(self) -> int:
        conn = self._conn
        return 0 if conn is None else len(conn.wire.pending)

    # --- several servers: how an AsyncShardedSession finds its server's client; not for
    # applications

    async def shard_client(self, server: ServerGroup) -> AsyncLockClient:
        """Router port: the single-entry client of ``server`` (a server or group), opened on
        first use (in this client's task group); ServerUnavailable naming it when it cannot
        be."""
        shard = self._shards.get(server)
        if shard is not None:
            return shard
        async with self._shard_locks[server]:
            shard = self._shards.get(server)
            if shard is None:
                self.check_open()
                shard = AsyncLockClient(self._task_group, **self._shard_options(server))
                shard._feed_owner = self
                with self._opening(server):
                    await shard._reconnect()
                self._shards[server] = shard
        return shard

    # --- the session port (client._port.AsyncSessionPort): how an AsyncSession sends and runs
    # its keepalive; not for applications

    @property
    def clock(self) -> Callable[[], float]:
        """Session port: the event loop's clock (``trio.current_time`` under trio), the one
        the session's deadlines and the reconnect checks use."""
        return self._hooks.now

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, object]], *args: object) -> None:
        """Session port: run ``fn(*args)`` as a task of the client's own task group
        (cancelled when the client closes); it must not raise."""
        self._task_group.start_soon(fn, *args)

    def _shutdown(self) -> None:
        """Close for good: stop keepalives, fail calls in flight, stop the reader."""
        if self._closed:
            return
        self._closed = True
        self._stop_keepalives()
        if self._conn is not None:
            self._break(self._conn, "the client was closed")
        for shard in self._shards.values():
            shard._shutdown()
        self._task_group.cancel_scope.cancel()
