"""The async face (trio and asyncio) of the coordination recipes: election, reentrant mutex,
barriers, latch, group.

Why: their transactions and operations are written once (``_election``, ``_reentrant``,
``_barrier``, ``_latch``, ``_group``, over ``_ops`` and ``_feed``); this module only **drives**
them with awaited calls (cleanup steps shielded and bounded, as ``AsyncLock._drive`` does)
and gives them signatures. :func:`_adrive` runs an operation of an object that is not a
single grant; :class:`AsyncWatch` runs a watching operation (``observe``, ``watch``) as an
async iterator and async context manager: its ``Emit`` steps are what ``__anext__`` returns,
and leaving the ``async with`` (or ``aclose()``) tells the operation to stop and runs its
cleanup (ending its subscriptions), shielded.

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

from . import _ops
from ._async import AsyncLock, AsyncMutex
from ._barrier import DoubleBarrierKind, abandon, abandon_block, barrier_wait, enter, leave
from ._base import CLEANUP_TIMEOUT, NotAcquired
from ._election import (
    ElectionKind,
    LeaderChange,
    LeaderInfo,
    campaign,
    leader,
    observe,
    proclaim,
)
from ._feed import Emit, FeedBatch, FeedSinkBase, StopWatching
from ._group import GroupChange, GroupKind, Member, join, members, update, watch
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


async def _run_step(step: Any, session: Any, namespace: str) -> Any:
    if not step.cleanup:
        return await step.run(session, namespace)
    with anyio.move_on_after(CLEANUP_TIMEOUT, shield=True):
        return await step.run(session, namespace)
    return None


async def _adrive(session: Any, namespace: str, op: _ops.Op[_ops.T]) -> _ops.T:
    """Run an operation of ``_ops`` to its end with awaited calls (cleanup steps shielded and
    bounded); an operation that made no call still checkpoints."""
    run = _ops.Run(op, session.client.clock)
    called = False
    while (step := run.next()) is not None:
        called = True
        try:
            run.value = await _run_step(step, session, namespace)
        except BaseException as exc:
            run.error = exc
    if not called:
        await anyio.lowlevel.checkpoint()
    return run.result


class AsyncFeedSink(FeedSinkBase):
    """A watcher's sink on the async face: the client's reader task sets an event."""

    def __init__(self) -> None:
        super().__init__()
        self._event: anyio.Event | None = None

    def _wake(self) -> None:
        event = self._event
        if event is not None:
            event.set()

    def _pending(self) -> bool:
        with self._mu:
            return bool(self._events) or self._gap or self._lost

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
                    run.value = await _run_step(step, self._session, self._namespace)
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
                    run.value = await _run_step(step, self._session, self._namespace)
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

    async def campaign(self, value: Any = None, *, timeout: float | None = None) -> int | None:
        """Wait until this candidate leads; its term, or None when ``timeout`` ran out.
        Cancelling the caller withdraws the candidacy (whatever was granted is released)."""
        return await self._drive(campaign(self, value, timeout))

    async def proclaim(self, value: Any) -> None:
        """Publish ``value`` under the same term (RuntimeError when not leading,
        LockLostError when the leadership was lost)."""
        await self._drive(proclaim(self, value))

    async def resign(self) -> bool:
        """Step down; True when this candidate led until now."""
        return await self.release()

    async def leader(self) -> LeaderInfo | None:
        """The leader now, None when nobody leads (one read)."""
        return await self._drive(leader(self))

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

    def _new_lock(self) -> AsyncMutex:
        return AsyncMutex(self._session, self.namespace, self.name, **self._options)

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire for the calling task (no call when it holds the lock already)."""
        return await _adrive(
            self._session,
            self.namespace,
            reentrant_acquire(self, self._owner(), blocking, timeout),
        )

    async def release(self) -> bool:
        """Release once for the calling task; the last release ends the grant."""
        return await _adrive(self._session, self.namespace, reentrant_release(self, self._owner()))

    async def locked(self) -> bool:
        """As :meth:`~client.recipes.ReentrantMutex.locked` (one read)."""
        return await _adrive(self._session, self.namespace, reentrant_locked(self))

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
    async def enter(self, timeout: float | None = None) -> bool:
        """Wait until all the parties have entered; False when ``timeout`` ran out first."""
        return await self._drive(enter(self, timeout))

    async def release(self) -> bool:
        """Drop out at once, without waiting for the others; True when it was in."""
        return await self._drive(abandon(self))


class AsyncDoubleBarrier(_AsyncBarrierBase):
    """The async face of :class:`~client.recipes.DoubleBarrier`. ``async with barrier:``
    enters, runs the block (cancelled when this party's grant is lost), and leaves (drops
    out at once when the block raised)."""

    async def leave(self, timeout: float | None = None) -> bool:
        """Wait until all the parties have left; False when ``timeout`` ran out first (still
        leaving: call it again)."""
        return await self._drive(leave(self, timeout))

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

    async def wait(self, timeout: float | None = None) -> bool:
        """As :meth:`~client.recipes.Barrier.wait` (False: ``timeout`` ran out first)."""
        return await self._drive(barrier_wait(self, timeout))


class AsyncCountDownLatch(LatchCore[AsyncSession]):
    """The async face of :class:`~client.recipes.CountDownLatch`."""

    def _latch_session(self, max_age: float) -> AsyncSession:
        client: Any = self._session.client
        session: AsyncSession = client.session(
            max_age=max_age, description=self._what, session_id=self.session_id, keepalive=False
        )
        return session

    async def count_down(self) -> int:
        """Count down once; the count left (0: open)."""
        return await _adrive(self._session, self.namespace, count_down(self))

    async def wait(self, timeout: float | None = None) -> bool:
        """As :meth:`~client.recipes.CountDownLatch.wait` (False: ``timeout`` ran out)."""
        return await _adrive(self._session, self.namespace, latch_wait(self, timeout))

    async def count(self) -> int:
        """As :meth:`~client.recipes.CountDownLatch.count` (one read)."""
        return await _adrive(self._session, self.namespace, latch_count(self))


class AsyncGroup(GroupKind[AsyncSession], AsyncLock):
    """The async face of :class:`~client.recipes.Group`. ``async with
    group.membership(metadata):`` runs its block as a member (cancelled when the membership is
    lost) and leaves at its end."""

    async def join(self, metadata: Any = None) -> bool:
        """Join with ``metadata``; False when the member id is taken, or this session is a
        member already."""
        return await self._drive(join(self, metadata))

    async def leave(self) -> bool:
        """Leave; True when this member was in the group until now."""
        return await self.release()

    async def update(self, metadata: Any) -> None:
        """Replace this member's metadata."""
        await self._drive(update(self, metadata))

    async def members(self) -> tuple[Member, ...]:
        """As :meth:`~client.recipes.Group.members` (one read)."""
        return await self._drive(members(self))

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
