"""The async face's sessions: :class:`AsyncSession`, the awaitable half of a
:class:`~client._core.SessionState` (execute, execute_many, end, ``wait_lost``, ``async
with``) and its keepalive task.

Split from ``_async.py`` (the client, its connection, its reader and writer tasks): a session
changes with the session API, the client with the connection machinery. A session holds its
client and sends through ``AsyncLockClient._request`` / ``_request_batch``, the same calls as
when both were one module (the execute path gains no layer). ``_async.py`` imports this
module; this one names ``AsyncLockClient`` only for type checking, so there is no import
cycle.

Theory of operation:
- Keepalive: one task per used session in the client's nursery, pinging every max_age/3 of
  idleness. Failures are logged through a :class:`~client._core.FailureLog` (the first, then
  at most one line a minute), not once per retry.
- Every reply that carries ``valid_until`` (execute, execute_many, keepalive) moves the
  session's local deadline (``SessionState``), on trio's clock, which the client's
  ``reconnected`` check uses.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING

import trio

from protocol import LockLost, Statement

from ._core import BatchCall, FailureLog, SessionState
from ._errors import ClientClosed, LockClientError
from ._result import Result
from ._wire import END, EXECUTE, KEEPALIVE, batch_results

if TYPE_CHECKING:
    from ._async import AsyncLockClient

__all__ = ["AsyncSession"]

log = logging.getLogger("client")

_CLEANUP_TIMEOUT = 10.0  # bound on ending a session from a cancelled or failing block


class AsyncSession(SessionState):
    """A session of an :class:`AsyncLockClient` (see :meth:`AsyncLockClient.session`)."""

    def __init__(
        self,
        client: AsyncLockClient,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        super().__init__(client._core, session_id, max_age, description, keepalive)
        self._client = client
        self._last_activity = trio.current_time()
        self._keepalive_scope: trio.CancelScope | None = None
        self._lost_event = trio.Event()
        self._failures = FailureLog(f"keepalive of session {self.id}")
        self.keepalive_error: LockClientError | None = None  # the last keepalive failure

    @property
    def client(self) -> AsyncLockClient:
        """The client this session runs on (its ``welcome`` limits, its events)."""
        return self._client

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
        rid, data = self._build_execute(
            namespace, statements, min_uptime, min_trust, description, transaction_id, wait
        )
        sent_at = self._last_activity = trio.current_time()
        result: Result = await self._client._request(EXECUTE, rid, data, bool(wait))
        raw = result.raw  # SessionState._note_reply, inlined (the hot path)
        if raw.valid_until is not None:
            self._valid_deadline = sent_at + (raw.valid_until - raw.uptime)
        if self._keepalive_scope is None and self._keepalive and not self._ended:
            self._keepalive_scope = trio.CancelScope()
            self._client._nursery.start_soon(self._keepalive_loop, self._keepalive_scope)
        return result

    async def execute_many(
        self, calls: Iterable[BatchCall], *, min_uptime: float = 0.0, min_trust: float = 0.0
    ) -> list[Result]:
        """Run several transactions pipelined: one write for all, one wait for all replies.

        ``calls``: ``(namespace, statements)`` or ``(namespace, statements, transaction_id)``
        tuples. Returns their Results in call order (``[]`` for no calls). **Each call is its
        own transaction**: the batch is not atomic (put the statements in one transaction for
        all or nothing); the server runs them in order. ``min_uptime`` / ``min_trust`` apply to
        every call. No ``wait``: a batch is answered at once.

        When some calls fail, :class:`BatchError` is raised once all are settled, with every
        call's Result or exception in ``results`` (a ServerError: that call was refused; a
        ConnectionLost: its outcome is unknown; repeat with the same transaction ids in the
        same session to learn it). ClientClosed and ServerUnavailable are raised as such.
        Cancelling the caller abandons the whole batch (late replies are dropped); the calls
        already sent may or may not run.
        """
        rids, data = self._build_batch(calls, min_uptime, min_trust)
        if not rids:
            self._client._check_open()
            await trio.lowlevel.checkpoint()
            return []
        sent_at = self._last_activity = trio.current_time()
        outcomes = await self._client._request_batch(rids, data)
        for outcome in reversed(outcomes):  # the last call answered carries the latest bound
            if type(outcome) is Result and outcome.valid_until is not None:
                self._note_reply(sent_at, outcome)
                break
        if (
            self._keepalive_scope is None
            and self._keepalive
            and not self._ended
            and any(type(o) is Result for o in outcomes)
        ):
            self._keepalive_scope = trio.CancelScope()
            self._client._nursery.start_soon(self._keepalive_loop, self._keepalive_scope)
        return batch_results(outcomes)

    async def end(self) -> bool:
        """End the session now: the server removes all its entries at once. True when the
        server still had it. Ending twice returns False without a call. If the connection
        drops with the request in flight it is re-sent once, and may then answer False."""
        if self._ended:
            await trio.lowlevel.checkpoint()
            return False
        self._stop_keepalive()
        rid, data = self._build_end()
        try:
            existed: bool = await self._client._request(END, rid, data)
        finally:
            self._mark_ended()
        return existed

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
        with trio.move_on_after(_CLEANUP_TIMEOUT, shield=True):
            try:
                await self.end()
            except LockClientError:
                log.warning("ending session %s failed", self.id, exc_info=True)

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"<AsyncSession {self.id} max_age={self.max_age} {state}>"

    def _deliver(self, event: LockLost) -> None:
        super()._deliver(event)
        self._lost_event.set()

    # --- keepalive --------------------------------------------------------------------------------

    def _stop_keepalive(self) -> None:
        if self._keepalive_scope is not None:
            self._keepalive_scope.cancel()
        else:
            self._keepalive_scope = trio.CancelScope()
            self._keepalive_scope.cancel()

    async def _keepalive_loop(self, scope: trio.CancelScope) -> None:
        interval = self.max_age / 3
        client = self._client
        with scope:
            while True:
                due = self._last_activity + interval
                if due > trio.current_time():
                    await trio.sleep_until(due)
                    continue
                built = self._build_keepalive()
                if built is None:
                    return
                sent_at = self._last_activity = trio.current_time()
                try:
                    with trio.move_on_after(interval):
                        result = await client._request(KEEPALIVE, built[0], built[1])
                        self._note_reply(sent_at, result)
                        self._failures.succeeded()
                except ClientClosed:
                    return
                except LockClientError as exc:
                    self.keepalive_error = exc
                    self._failures.failed(exc, trio.current_time())
                    # Try again soon rather than after a whole interval.
                    self._last_activity = trio.current_time() - interval + min(interval, 1.0)
