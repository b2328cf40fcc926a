"""The async face (trio and asyncio) of the coordination recipes: election, reentrant mutex,
barriers, latch, group.

Why: as for the sync face (``_sync_coord``), the recipes' transactions and operations are
written once; this module drives them with awaited calls (cleanup steps shielded and bounded, as
``AsyncLock._drive`` does) and gives them signatures. :func:`~._async.drive` runs an operation
of an object that is not a single grant; :class:`AsyncWatch` runs a watching operation
(``observe``, ``watch``) as an async iterator and async context manager: its ``Emit`` steps are
what ``__anext__`` returns, and leaving the ``async with`` (or ``aclose()``) tells the operation
to stop and runs its cleanup (ending its subscriptions), shielded.

The protected blocks (``async with election.leadership():``, ``async with reentrant:``,
``async with barrier:``, ``async with group.membership():``) run in a cancel scope that a
loss of the grant cancels, as ``async with mutex:`` does (``_async``).
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import anyio
import anyio.lowlevel

from client._async_session import AsyncSession
from client._methods import awaitable

from . import _ops
from ._async import AsyncLock, AsyncMutex, drive, run_step
from ._barrier import DoubleBarrierKind, abandon, abandon_block, barrier_wait, enter, leave
from ._base import NotAcquired
from ._election import (
    ElectionKind,
    LeaderChange,
    campaign,
    leader,
    observe,
    proclaim,
    resign,
)
from ._feed import Emit, FeedBatch, FeedSinkBase, StopWatching
from ._group import GroupChange, GroupKind, join, leave_group, members, update, watch
from ._latch import LatchCore, count_down, latch_count, latch_wait
from ._reentrant import ReentrantCore, reentrant_acquire, reentrant_locked, reentrant_release

__all__ = [
    "AsyncBarrier",
    "AsyncCountDownLatch",
    "AsyncDoubleBarrier",
    "AsyncElection",
    "AsyncFeedSink",
    "AsyncGroup",
    "AsyncReentrantMutex",
    "AsyncWatch",
]

T = TypeVar("T")


class AsyncFeedSink(FeedSinkBase):
    """A watcher's sink on the async face: the client's reader task sets an event."""

    def __init__(self) -> None:
        super().__init__()
        self._event: anyio.Event | None = None

    def _wake(self) -> None:
        event = self._event
        if event is not None:
            event.set()

    async def next(self, client: Any, timeout: float | None) -> FeedBatch:
        """Wait until something arrived (or ``timeout`` passed)."""
        with anyio.move_on_after(math.inf if timeout is None else timeout):
            while True:
                batch = self.take()
                if batch:
                    return batch
                self._event = anyio.Event()
                if not self._pending():
                    await self._event.wait()
        return self.take()


class AsyncWatch(Generic[T]):
    """A watching operation as an async iterator; use it with ``async with`` (leaving the
    block ends its subscriptions) or call :meth:`aclose`."""

    def __init__(self, session: Any, namespace: str, op: _ops.Op[None]) -> None:
        self._session = session
        self._namespace = namespace
        self._run = _ops.Run(op, session.client.clock)
        self._done = False

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> T:
        if self._done:
            raise StopAsyncIteration
        run = self._run
        try:
            while (step := run.next()) is not None:
                if type(step) is Emit:
                    value: T = step.value
                    return value
                try:
                    run.value = await run_step(step, self._session, self._namespace)
                except BaseException as exc:
                    run.error = exc
        except BaseException:
            self._done = True
            raise
        self._done = True
        raise StopAsyncIteration

    async def aclose(self) -> None:
        """Stop watching: the operation ends its subscriptions (shielded, bounded)."""
        if self._done:
            return
        self._done = True
        run = self._run
        run.error = StopWatching()
        with anyio.CancelScope(shield=True):
            while (step := run.next()) is not None:
                if type(step) is Emit:
                    continue
                try:
                    run.value = await run_step(step, self._session, self._namespace)
                except BaseException as exc:
                    run.error = exc

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class AsyncElection(ElectionKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.Election`. ``async with
    election.leadership(value):`` runs its block as the leader and cancels it the moment the
    leadership is lost."""

    campaign = awaitable(campaign)

    proclaim = awaitable(proclaim)

    resign = awaitable(resign)

    leader = awaitable(leader)

    def observe(self) -> AsyncWatch[LeaderChange]:
        """The leader now, then each change: ``async with election.observe() as changes:
        async for change in changes: ...`` (:class:`LeaderChange`; ``gap=True`` after a
        reconnect)."""
        return AsyncWatch(self._session, self.namespace, observe(self, AsyncFeedSink()))

    @asynccontextmanager
    async def leadership(
        self, value: Any = None, *, timeout: float | None = None
    ) -> AsyncIterator[Self]:
        """Campaign, run the block as the leader (cancelled when the leadership is lost:
        the ``async with`` then raises LockLostError), resign at its end. NotAcquired when
        ``timeout`` ran out."""
        self._check_campaign(value)
        self._value = value
        async with self._hold(True, timeout):
            yield self


class AsyncReentrantMutex(ReentrantCore[AsyncSession, AsyncMutex]):
    """The async face of :class:`~client.recipes.ReentrantMutex`: the owner is the **task**
    (trio or asyncio). ``async with`` blocks nest; the outermost one's body is cancelled when
    the grant is lost. Share one object between the tasks."""

    def _owner(self) -> Hashable:
        return anyio.get_current_task().id

    _lock_class = AsyncMutex

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire for the calling task (no call when it holds the lock already)."""
        return await drive(
            self._session,
            self.namespace,
            reentrant_acquire(self, self._owner(), blocking, timeout),
        )

    async def release(self) -> bool:
        """Release once for the calling task; the last release ends the grant."""
        return await drive(self._session, self.namespace, reentrant_release(self, self._owner()))

    async def locked(self) -> bool:
        """As :meth:`~client.recipes.ReentrantMutex.locked` (one read)."""
        return await drive(self._session, self.namespace, reentrant_locked(self))

    def check(self) -> None:
        """Raise LockLostError if the calling task's grant has been lost."""
        self._check_lost()

    async def wait_lost(self) -> Any:
        """Wait until the calling task's grant is lost (RuntimeError when it holds none)."""
        hold = self._hold()
        if hold is None:
            raise RuntimeError(f"{self!r}: the calling task does not hold it")
        return await hold.lock.wait_lost()

    async def __aenter__(self) -> Self:
        owner = self._owner()
        if self._enter_nested(owner) is not None:
            await anyio.lowlevel.checkpoint()
            return self
        lock = self._fresh(owner).lock
        try:
            await lock.__aenter__()
        except BaseException:
            self._forget(owner)
            raise
        self._acquired(owner, True)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        hold = self._leave_nested(self._owner())
        if hold is None:
            return None
        try:
            return await hold.lock.__aexit__(exc_type, exc, tb)
        finally:
            self._forget(self._owner())


class _AsyncBarrierBase(DoubleBarrierKind[AsyncSession], AsyncLock):
    enter = awaitable(enter)

    release = awaitable(abandon)


class AsyncDoubleBarrier(_AsyncBarrierBase):
    """The async face of :class:`~client.recipes.DoubleBarrier`. ``async with barrier:``
    enters, runs the block (cancelled when this party's grant is lost), and leaves (drops
    out at once when the block raised)."""

    leave = awaitable(leave)

    async def __aenter__(self) -> Self:
        if self._cm is not None:
            raise RuntimeError(f"{self!r} is already used by an `async with` block")
        cm = self._inside()
        await cm.__aenter__()
        self._cm = cm
        return self

    @asynccontextmanager
    async def _inside(self) -> AsyncIterator[None]:
        if not await self.enter():
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
            await self._drive(abandon_block(self, True))
            raise
        await self.leave()


class AsyncBarrier(_AsyncBarrierBase):
    """The async face of :class:`~client.recipes.Barrier` (a cyclic barrier)."""

    wait = awaitable(barrier_wait)


class AsyncCountDownLatch(LatchCore[AsyncSession]):
    """The async face of :class:`~client.recipes.CountDownLatch`."""

    async def _drive(self, op: _ops.Op[_ops.T]) -> _ops.T:
        return await drive(self._session, self.namespace, op)

    count_down = awaitable(count_down)

    wait = awaitable(latch_wait)

    count = awaitable(latch_count)


class AsyncGroup(GroupKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.Group`. ``async with
    group.membership(metadata):`` runs its block as a member (cancelled when the membership is
    lost) and leaves at its end."""

    join = awaitable(join)

    leave = awaitable(leave_group)

    update = awaitable(update)

    members = awaitable(members)

    def watch(self) -> AsyncWatch[GroupChange]:
        """The members now, then each change: ``async with group.watch() as changes: async
        for change in changes: ...`` (:class:`GroupChange`)."""
        return AsyncWatch(self._session, self.namespace, watch(self, AsyncFeedSink()))

    @asynccontextmanager
    async def membership(self, metadata: Any = None) -> AsyncIterator[Self]:
        """Join, run the block as a member, leave at its end (NotAcquired when the join was
        refused)."""
        self._check_join(metadata)
        self._metadata = metadata
        async with self._hold(False):
            yield self
