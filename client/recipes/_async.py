"""The trio face of the recipes: the same locks over an :class:`~client.AsyncSession`.

Why: the transactions and the grant bookkeeping are shared (``_kinds``, ``_base``); this
module only awaits them and signals a loss — a ``trio.Event`` and, inside ``async with
lock:``, the cancellation of the protected block.

``async with lock:`` runs its body in a cancel scope. The client's reader task dispatches a
``LockLost`` event the moment it arrives; when it is about this grant, the scope is
cancelled, the body stops at its next checkpoint, and the ``async with`` raises
:class:`LockLostError` (the body's own exceptions, and cancellations from outside, propagate
unchanged). Releases at the end of a block, and the cleanup after a cancelled acquire, are
shielded and bounded (10 s), so cancelling a caller never leaves a grant behind that the
client does not know about.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import TracebackType
from typing import Self

import trio

from client._async import AsyncLockClient
from client._async_session import AsyncSession
from client._errors import ClientClosed, LockClientError, ServerError
from protocol import LockLost

from ._base import (
    CLEANUP_TIMEOUT,
    LockCore,
    LockLostError,
    NotAcquired,
    OnLost,
    max_wait_of,
)
from ._kinds import (
    LockSetKind,
    MutexKind,
    ReadKind,
    SemaphoreKind,
    TaskClaimKind,
    TimeWindowKind,
    WriteKind,
    task_state,
)
from ._multi import StampRegistry, app_session_id

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

log = logging.getLogger("client.recipes")


class AsyncLock(LockCore[AsyncSession]):
    """The lock interface every trio recipe has."""

    _scope: trio.CancelScope | None = None
    _cm: AbstractAsyncContextManager[None] | None = None

    def _new_grant(self) -> None:
        self._lost_signal = trio.Event()

    def _signal_lost(self) -> None:
        self._lost_signal.set()
        scope = self._scope
        if scope is not None:
            scope.cancel()

    @property
    def lost_event(self) -> trio.Event:
        """Set when the current grant is lost (a new Event per grant)."""
        return self._lost_signal

    async def wait_lost(self) -> LockLost | None:
        """Wait until the current grant is lost; the server's notice (None when the loss was
        found by a call)."""
        await self._lost_signal.wait()
        return self.lost_event_info

    async def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire in one transaction; True when granted.

        ``blocking=False``: try once. ``blocking=True`` with ``timeout=None`` (or -1): wait
        until granted — the server parks the transaction (``wait`` up to its ``max_wait``,
        re-sent when that runs out); with ``timeout=t``: wait at most ``t`` seconds, on the
        server. False when not granted: busy, or refused (``last_result.cause``). Cancelling
        the caller cancels the wait on the server and releases whatever may have been
        granted meanwhile (shielded, bounded). Raises RuntimeError when this object already
        holds the lock, LockLostError when it held a lost grant nobody released.
        """
        plan = self._start_acquire(blocking, timeout, trio.current_time())
        session = self._session
        try:
            while True:
                sent_at = trio.current_time()
                result = await session.execute(
                    self.namespace,
                    plan.statements,
                    min_uptime=self.min_uptime,
                    min_trust=self.min_trust,
                    wait=plan.wait(sent_at, max_wait_of(session.client.welcome.limits)),
                )
                done = self._attempt_done(plan, result, sent_at, trio.current_time())
                if done is not None:
                    return done
        except BaseException as exc:
            self._abandon_acquire()
            if not isinstance(exc, (ServerError, ClientClosed)):
                with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
                    try:
                        await session.execute(self.namespace, self._cleanup_statements(plan.ticket))
                    except LockClientError:
                        log.warning(
                            "cleanup after a failed acquire of %r failed", self, exc_info=True
                        )
            raise

    async def release(self) -> bool:
        """Release in one transaction; True when this grant's entries were removed. False
        (without a call) when not held. Raises LockLostError when the grant was lost (the
        local state is cleared either way)."""
        statements = self._start_release()
        if statements is None:
            await trio.lowlevel.checkpoint()
            return False
        return self._release_done(await self._session.execute(self.namespace, statements))

    async def locked(self) -> bool:
        """True when an acquire by this session would not succeed right now (held by someone,
        this object included). One transaction that changes nothing."""
        statements = self._probe_statements()
        result = await self._session.execute(self.namespace, statements)
        return self._probe_locked(result, statements)

    def check(self) -> None:
        """Raise LockLostError if the current grant has been lost (events are dispatched by
        the client's reader task as they arrive)."""
        self._check()

    async def refresh(self) -> None:
        """Confirm with the server that the grant is still there, and move ``valid_for()``
        forward. Raises LockLostError when it is gone. No-op when not held."""
        statements = self._refresh_statements()
        if statements is None:
            await trio.lowlevel.checkpoint()
            return
        sent_at = trio.current_time()
        self._refresh_done(await self._session.execute(self.namespace, statements), sent_at)

    def valid_for(self) -> float:
        """Seconds the grant is certainly still valid, from the server's replies and trio's
        clock, without comparing clocks (0.0 when not held or lost). Call ``refresh()`` to
        account for keepalive pings."""
        return self._valid_for(trio.current_time())

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
    async def _hold(self) -> AsyncIterator[None]:
        if not await self.acquire():
            raise NotAcquired(self, self.last_result)
        try:
            with trio.CancelScope() as scope:
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
            self._prepare_exit(True)
            await self._exit_release(quiet=True)
            raise
        self._prepare_exit(False)
        await self._exit_release(quiet=False)

    async def _exit_release(self, *, quiet: bool) -> None:
        if not self.RELEASE_ON_EXIT:
            lost = self.held and self.lost
            info = self.lost_event_info
            self._forget()
            if lost and not quiet:
                raise LockLostError(self, info)
            return
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            try:
                await self.release()
            except LockClientError:
                if not quiet:
                    raise
                # Do not mask the body's exception; the session's expiry frees the lock.
                log.warning("releasing %r after an error failed", self, exc_info=True)


class AsyncMutex(MutexKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.Mutex`."""


class AsyncReadLock(ReadKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.ReadLock`."""


class AsyncWriteLock(WriteKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.WriteLock`."""


class AsyncLockSet(LockSetKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.LockSet`."""


class AsyncSemaphore(SemaphoreKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.Semaphore`."""


class AsyncTimeWindowLock(TimeWindowKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.TimeWindowLock`."""


class AsyncStateLock(TaskClaimKind[AsyncSession], AsyncLock):
    """The trio face of :class:`~client.recipes.StateLock`."""

    async def release(self, state: str | None = None) -> bool:
        """Release the claim recording ``state`` (``"done"`` when not given, or
        ``"failed"``)."""
        if state is not None:
            self._set_final_state(state)
        return await super().release()

    async def state(self) -> str:
        """The task's state now (``in_progress``, ``done`` or ``failed``)."""
        r = await self._session.execute(self.namespace, self._state_statements())
        return task_state(r.get("claim"), r.get("states"))


class AsyncReadWriteLock:
    """The trio face of :class:`~client.recipes.ReadWriteLock`: ``rw.read``, ``rw.write``."""

    def __init__(
        self,
        session: AsyncSession,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self.read = AsyncReadLock(
            session,
            namespace,
            name,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
            description=description,
        )
        self.write = AsyncWriteLock(
            session,
            namespace,
            name,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
            description=description,
        )

    def __repr__(self) -> str:
        return f"<AsyncReadWriteLock {self.read.namespace}/{self.read.name}>"


class AsyncMultiLock:
    """The trio face of :class:`~client.recipes.MultiLock`."""

    def __init__(
        self,
        client: AsyncLockClient,
        namespace: str,
        app_id: str,
        *,
        max_age: float = 60.0,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
    ) -> None:
        self.client = client
        self.app_id = app_id
        self.namespace = namespace
        self.session = client.session(
            max_age=max_age, description=f"MultiLock {app_id}", session_id=app_session_id(app_id)
        )
        self._options = (on_lost, min_uptime, min_trust)
        self._stamps: StampRegistry[AsyncLockSet] = StampRegistry()

    def lock_set(self, locks: Mapping[str, str] | Iterable[tuple[str, str]]) -> AsyncLockSet:
        """A lock object for the set ``locks`` in this application's session."""
        on_lost, min_uptime, min_trust = self._options
        return AsyncLockSet(
            self.session,
            self.namespace,
            locks,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
        )

    async def try_locks(
        self,
        locks: Mapping[str, str] | Iterable[tuple[str, str]],
        *,
        blocking: bool = False,
        timeout: float | None = None,
    ) -> str | None:
        """Take every lock of ``locks`` or none, in one transaction; the stamp, or None."""
        lock_set = self.lock_set(locks)
        if not await lock_set.acquire(blocking, timeout):
            return None
        stamp = lock_set.stamp
        assert stamp is not None
        self._stamps.add(stamp, lock_set)
        return stamp

    async def release_locks(self, stamp: str) -> None:
        """Release the set ``stamp`` names (UnknownStamp, LockLostError as the sync face)."""
        await self._stamps.pop(stamp).release()

    def stamps(self) -> list[str]:
        """The stamps handed out and not released."""
        return self._stamps.stamps()

    async def release_all(self) -> bool:
        """End the application's session: every lock it holds is removed at once."""
        for lock_set in self._stamps.take_all():
            lock_set._forget()
        return await self.client.end_session(self.session.id)

    async def aclose(self) -> None:
        """End the session (releasing everything); stamps are forgotten."""
        for lock_set in self._stamps.take_all():
            lock_set._forget()
        with trio.move_on_after(CLEANUP_TIMEOUT, shield=True):
            await self.session.end()

    async def __aenter__(self) -> AsyncMultiLock:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            await self.aclose()
            return
        try:
            await self.aclose()
        except LockClientError:
            log.warning("ending MultiLock session %s failed", self.session.id, exc_info=True)

    def __repr__(self) -> str:
        return f"<AsyncMultiLock {self.namespace} app={self.app_id} stamps={len(self._stamps)}>"
