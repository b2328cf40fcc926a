"""The async face of the recipes: the same locks over an :class:`~client.AsyncSession`.

Why: as for the sync face (``_sync``), what a recipe decides is written once (its
transactions, grant bookkeeping and operations); this module only **drives** the operations with
awaited calls (:meth:`AsyncLock._drive`: cleanup steps shielded and bounded) and signals a
loss — an event (``trio.Event`` under trio, ``asyncio.Event`` under asyncio) and, inside
``async with lock:``, the cancellation of the protected block. Written on anyio like the
client, so the same code runs under trio and asyncio.

``async with lock:`` runs its body in a cancel scope. The client's reader task dispatches a
``LockLost`` event the moment it arrives; when it is about this grant, the scope is
cancelled, the body stops at its next checkpoint, and the ``async with`` raises
:class:`LockLostError` (the body's own exceptions, and cancellations from outside, propagate
unchanged). Releases at the end of a block, and the cleanup after a cancelled acquire, are
shielded and bounded (10 s), so cancelling a caller never leaves a grant behind that the
client does not know about.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.lowlevel
import trio

from client._async import AsyncLockClient
from client._async_session import AsyncSession
from client._errors import LockClientError
from client._methods import awaitable
from protocol import LockLost

from . import _kinds, _ops, _task_kinds
from ._base import CLEANUP_TIMEOUT, NotAcquired, RecipeCore
from ._multi import MultiLockBase, ReadWriteBase, try_locks

__all__ = [
    "AsyncLock",
    "AsyncLockSet",
    "AsyncMultiLock",
    "AsyncMutex",
    "AsyncReadLock",
    "AsyncReadWriteLock",
    "AsyncSemaphore",
    "AsyncStateLock",
    "AsyncTimeWindowLock",
    "AsyncWriteLock",
]


async def run_step(step: Any, session: Any, namespace: str) -> Any:
    """Run one step of an operation in ``session`` and ``namespace``; a cleanup step shielded
    and bounded by CLEANUP_TIMEOUT (None when that ran out)."""
    if not step.cleanup:
        return await step.run(session, namespace)
    with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
        return await step.run(session, namespace)
    return None


async def drive(session: Any, namespace: str, op: _ops.Op[_ops.T]) -> _ops.T:
    """Run an operation of ``_ops`` to its end with awaited calls, in ``session`` and
    ``namespace`` (a lock's, or those of an object that is not a single grant), cleanup steps
    shielded and bounded; an operation that made no call still checkpoints."""
    run = _ops.Run(op, session.client.clock)
    called = False
    while (step := run.next()) is not None:
        called = True
        try:
            run.value = await run_step(step, session, namespace)
        except BaseException as exc:
            run.error = exc
    if not called:
        await anyio.lowlevel.checkpoint()
    return run.result


class AsyncLock(RecipeCore[AsyncSession]):
    """The lock interface every async recipe has."""

    _scope: anyio.CancelScope | None = None
    _cm: AbstractAsyncContextManager[None] | None = None
    _clock = staticmethod(anyio.current_time)

    async def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        """Run an operation of ``_ops`` to its end with awaited calls (:func:`drive`)."""
        return await drive(self._session, self.namespace, op)

    def _new_grant(self) -> None:
        # The running loop's own kind of event (trio.Event under trio, as this face has
        # always given; asyncio.Event under asyncio).
        self._lost_signal: trio.Event | asyncio.Event = (
            trio.Event() if trio.lowlevel.in_trio_run() else asyncio.Event()
        )

    def _signal_lost(self) -> None:
        self._lost_signal.set()
        scope = self._scope
        if scope is not None:
            scope.cancel()

    @property
    def lost_event(self) -> trio.Event | asyncio.Event:
        """Set when the current grant is lost (a new Event per grant): a ``trio.Event``
        under trio, an ``asyncio.Event`` under asyncio."""
        return self._lost_signal

    async def wait_lost(self) -> LockLost | None:
        """Wait until the current grant is lost; the server's notice (None when the loss was
        found by a call)."""
        await self._lost_signal.wait()
        return self.lost_event_info

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire in one transaction; True when granted: ``blocking``, ``timeout``, the wait
        on the server, the results and the errors are :meth:`~client.recipes.Mutex.acquire`'s
        (the sync face). Cancelling the caller cancels the wait on the server and releases
        whatever may have been granted meanwhile (shielded, bounded)."""
        return await self._drive(_ops.acquire(self, blocking, timeout))

    release = awaitable(_ops.release)

    locked = awaitable(_ops.locked)

    def check(self) -> None:
        """Raise LockLostError if the current grant has been lost (events are dispatched by
        the client's reader task as they arrive)."""
        self._check()

    refresh = awaitable(_ops.refresh)

    async def __aenter__(self) -> Self:
        if self._cm is not None:
            raise RuntimeError(f"{self!r} is already used by an `async with` block")
        cm = self._hold()
        await cm.__aenter__()
        self._cm = cm
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        cm = self._cm
        self._cm = None
        assert cm is not None
        return await cm.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _hold(
        self, blocking: bool = True, timeout: float | None = None
    ) -> AsyncIterator[None]:
        if not await self.acquire(blocking, timeout):
            raise NotAcquired(self, self.last_result)
        try:
            with anyio.CancelScope() as scope:
                with self._mu:
                    self._scope = scope
                    lost = self._lost
                if lost:
                    scope.cancel()
                try:
                    yield
                finally:
                    self._scope = None
        except BaseException:
            await self._drive(_ops.exit_block(self, True))
            raise
        await self._drive(_ops.exit_block(self, False))


class AsyncMutex(_kinds.MutexKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.Mutex`."""


class AsyncReadLock(_kinds.ReadKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.ReadLock`."""


class AsyncWriteLock(_kinds.WriteKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.WriteLock`."""


class AsyncLockSet(_kinds.LockSetKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.LockSet`."""


class AsyncSemaphore(_kinds.SemaphoreKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.Semaphore`."""


class AsyncTimeWindowLock(_task_kinds.TimeWindowKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.TimeWindowLock`."""


class AsyncStateLock(_task_kinds.TaskClaimKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.StateLock`."""

    async def release(self, state: str | None = None) -> bool:
        """As :meth:`~client.recipes.StateLock.release`."""
        if state is not None:
            self._set_final_state(state)
        return await super().release()

    state = awaitable(_ops.state)


class AsyncReadWriteLock(ReadWriteBase[AsyncSession, AsyncReadLock, AsyncWriteLock]):
    """The async face of :class:`~client.recipes.ReadWriteLock`: ``rw.read``, ``rw.write``."""

    _read_lock = AsyncReadLock
    _write_lock = AsyncWriteLock


class AsyncMultiLock(MultiLockBase[AsyncLockClient, AsyncSession, AsyncLockSet]):
    """The async face of :class:`~client.recipes.MultiLock` (``aclose()`` and ``async with``
    end its session)."""

    _lock_set = AsyncLockSet

    try_locks = awaitable(try_locks)

    async def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        return await drive(self.session, self.namespace, op)

    async def release_locks(self, stamp: str) -> None:
        """Release the set ``stamp`` names (UnknownStamp, LockLostError as the sync face)."""
        await self._stamps.pop(stamp).release()

    async def release_all(self) -> bool:
        """End the application's session: every lock it holds is removed at once."""
        self._forget_all()
        return await self.client.end_session(self.session.id)

    async def aclose(self) -> None:
        """As :meth:`~client.recipes.MultiLock.close`."""
        self._forget_all()
        with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self.session.end()

    async def __aenter__(self) -> AsyncMultiLock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.aclose()
        except LockClientError as error:
            self._end_failed(error, exc)
