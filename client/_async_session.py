"""The async face's sessions: :class:`AsyncSession`, the awaitable half of a
:class:`~client._session_state.SessionState` (execute, execute_many, end, ``wait_lost``, ``async
with``) and its keepalive task.

A session talks to its client only through the :class:`~client._port.AsyncSessionPort` (the
client's ``request`` / ``request_batch``, and ``start_soon`` for the keepalive task in the
client's own task group); it never imports the client module, which creates sessions. The
bookkeeping both faces share (reply deadlines, what a batch's outcomes mean, keepalive
failures, ending) is ``SessionState``'s; this module adds the awaitable calls and the task.

Theory of operation:
- Keepalive: one task per used session in the client's task group, pinging every max_age/3 of
  idleness. Failures are logged through a :class:`~client._core.FailureLog` (the first, then
  at most one line a minute), not once per retry.
- Every reply that carries ``valid_until`` (execute, execute_many, keepalive) moves the
  session's local deadline (``SessionState``), on the event loop's clock (the client's
  ``clock``), which the client's ``reconnected`` check uses.
- Written on anyio like the client: the same code under trio and asyncio.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Iterable
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.lowlevel

from protocol import LockLost, Statement, Welcome

from ._calls import Call, OnPart, Op, Step
from ._errors import ClientClosed, LockClientError, ServerUnavailable
from ._methods import awaitable
from ._placement import ServerGroup
from ._port import AsyncSessionPort
from ._result import Result
from ._session_calls import (
    keepalive_frame,
    resend_deferred,
    session_end,
    sharded_end,
    sharded_execute,
    sharded_execute_many,
)
from ._session_state import BatchCall, SessionState, ShardedParts
from ._sharding import unavailable
from ._wire import EXECUTE, KEEPALIVE, batch_results

__all__ = ["AsyncSession", "AsyncShardedSession", "run_async"]

T = TypeVar("T")
S = TypeVar("S")  # a step

log = logging.getLogger("client")

_CLEANUP_TIMEOUT = 10.0  # bound on ending a session from a cancelled or failing block


async def run_async(op: Generator[S, Any, T], answer: Callable[[S], Awaitable[Any]]) -> T:
    """Run a call of ``_calls`` to its end, answering each step with ``await answer(step)``
    (``_calls.run_sync`` with ``await``); one checkpoint when it took no step."""
    value: Any = None
    error: BaseException | None = None
    stepped = False
    while True:
        try:
            step = op.send(value) if error is None else op.throw(error)
        except StopIteration as stop:
            if not stepped:
                await anyio.lowlevel.checkpoint()
            return stop.value  # type: ignore[no-any-return]
        stepped = True
        value = error = None
        try:
            value = await answer(step)
        except BaseException as exc:
            error = exc


class AsyncSession(SessionState):
    """A session of an :class:`AsyncLockClient` (see :meth:`AsyncLockClient.session`)."""

    def __init__(
        self,
        client: AsyncSessionPort,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        super().__init__(client.core, session_id, max_age, description, keepalive)
        self._client: AsyncSessionPort = client
        self._now = client.clock  # the event loop's clock, as the client reads it
        self._last_activity = self._now()
        self._keepalive_scope: anyio.CancelScope | None = None
        self._lost_event = anyio.Event()

    @property
    def client(self) -> AsyncSessionPort:
        """The :class:`~client.AsyncLockClient` this session runs on (its ``welcome``
        limits, its events), typed as the session's port."""
        return self._client

    async def welcome_for(self, namespace: str) -> Welcome:
        """The Welcome (limits included) of the server ``namespace`` lives on. (Returns
        without a checkpoint here: the recipes ask it on every acquire; a session of several
        servers may connect.)"""
        return self._client.welcome

    async def execute(
        self,
        namespace: str,
        statements: Iterable[Statement],
        *,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
        transaction_id: str | None = None,
        wait: float | None = None,
    ) -> Result:
        """Run a transaction in this session: all statements or none.

        A refused or aborted transaction is a Result with ``ok == False``; ServerError,
        ConnectionLost (outcome unknown) and ClientClosed are raised. ``wait``: let the server
        park the transaction until it can succeed, at most that many seconds (cancelling the
        caller also cancels the wait on the server). ``min_uptime`` / ``min_trust``: the
        reliability contract (refused with cause MINIMUM_REQUIREMENTS when not met).
        """
        if self._deferred:
            await self._send_deferred()
        rid, data = self._build_execute(
            namespace, statements, min_uptime, min_trust, description, transaction_id, wait
        )
        if wait and self._keepalive_scope is None and self._keepalive and not self._ended:
            # A parked transaction does not keep its session alive, pings do: a first call
            # that waits longer than the max age must not find its session expired.
            self._start_keepalive()
        sent_at = self._last_activity = self._now()
        result: Result = await self._client.request(EXECUTE, rid, data, bool(wait))
        raw = result.raw  # SessionState._note_reply, inlined (the hot path)
        if raw.valid_until is not None:
            deadline = sent_at + (raw.valid_until - raw.uptime)
            if self._valid_deadline is None or deadline > self._valid_deadline:
                self._valid_deadline = deadline
        if self._keepalive_scope is None and self._keepalive and not self._ended:
            self._start_keepalive()
        return result

    async def _send_deferred(self) -> None:
        await run_async(resend_deferred(self), lambda call: self.execute(*call))

    async def execute_many(
        self, calls: Iterable[BatchCall], *, min_uptime: float = 0.0, min_trust: float = 0.0
    ) -> list[Result]:
        """Run several transactions pipelined, one write for all and one wait for all
        replies: the calls, results, errors and :class:`BatchError` are those of the sync
        face's :meth:`~client.Session.execute_many` (each call its own transaction; no
        ``wait``), except that there is no client timeout and no chunking: bound the call
        with a cancel scope. Cancelling the caller abandons the whole batch (late replies are
        dropped); the calls already sent may or may not run.
        """
        rids, data = self._build_batch(calls, min_uptime, min_trust)
        if not rids:
            self._client.check_open()
            await anyio.lowlevel.checkpoint()
            return []
        sent_at = self._last_activity = self._now()
        outcomes = await self._client.request_batch(rids, data)
        if self._batch_done(sent_at, outcomes) and self._keepalive_scope is None:
            self._start_keepalive()
        return batch_results(outcomes)

    end = awaitable(session_end)

    async def _drive(self, op: Generator[Call, Any, T]) -> T:
        """Run a session step of ``_calls`` (its requests) with awaited calls."""
        return await run_async(op, self._request)

    async def _request(self, call: Call) -> Any:
        return await self._client.request(call.kind, call.rid, call.data)

    async def wait_lost(self) -> LockLost:
        """Wait until a LockLost event has arrived for this session (returns at once if one
        has); return the latest one."""
        await self._lost_event.wait()
        return self._lost[-1]

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.end()
            return
        # Leaving on an exception or a cancellation: end the session anyway (shielded, bounded)
        # without masking the exception.
        with anyio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            try:
                await self.end()
            except LockClientError:
                log.warning("ending session %s failed", self.id, exc_info=True)

    def _deliver(self, event: LockLost) -> None:
        super()._deliver(event)
        self._lost_event.set()

    # --- keepalive --------------------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        self._keepalive_scope = anyio.CancelScope()
        self._client.start_soon(self._keepalive_loop, self._keepalive_scope)

    def _stop_keepalive(self) -> None:
        if self._keepalive_scope is not None:
            self._keepalive_scope.cancel()
        else:
            self._keepalive_scope = anyio.CancelScope()
            self._keepalive_scope.cancel()

    async def _keepalive_loop(self, scope: anyio.CancelScope) -> None:
        interval = self.max_age / 3
        client = self._client
        with scope:
            while True:
                due = self._last_activity + interval
                if due > self._now():
                    await anyio.sleep_until(due)
                    continue
                built = await run_async(keepalive_frame(self), lambda c: self.execute(*c))
                if built is None:
                    return
                sent_at = self._last_activity = self._now()
                try:
                    with anyio.move_on_after(interval):
                        result = await client.request(KEEPALIVE, *built)
                        self._keepalive_done(sent_at, result)
                except ClientClosed:
                    return
                except LockClientError as exc:
                    self._keepalive_failed(exc, self._now(), interval)


class AsyncShardedSession(ShardedParts[AsyncSession], AsyncSession):
    """A session of an :class:`AsyncLockClient` of several servers: one id, and on each
    server it touches an ordinary :class:`AsyncSession` with that id (its *part*), as the
    sync face's :class:`~client._sync_session.ShardedSession`."""

    _part_class = AsyncSession

    async def welcome_for(self, namespace: str) -> Welcome:
        return (await self._part(self._router.place(namespace)))._client.welcome

    async def _part(self, server: ServerGroup) -> AsyncSession:
        """The part on ``server``, made (and that server's client opened) on first use."""
        part = self._parts.get(server)
        if part is not None:
            return part
        self._check_open()
        try:
            shard = await self._router.shard_client(server)
        except ServerUnavailable as exc:
            raise unavailable(server, exc) from exc
        return self._adopt(server, shard)

    execute = awaitable(sharded_execute)
    execute_many = awaitable(sharded_execute_many)
    end = awaitable(sharded_end)

    async def _drive(self, op: Op[T]) -> T:
        return await run_async(op, self._on_part)

    async def _on_part(self, step: Step) -> Any:
        """The driver of ``_calls``' session steps (``OnPart``)."""
        assert type(step) is OnPart
        return await step.call(await self._part(step.server))
