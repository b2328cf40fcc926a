"""The async face's per-request hot path, bound once per client to the running event loop.

Why: the async face is written on anyio (tasks, cancel scopes, timeouts, socket readiness),
so the same code runs under trio and asyncio. But every anyio call first looks up the running
backend (``sniffio``, then a dict), and an ``anyio.Event`` wraps the loop's own event. On the
path every request takes (read the clock, check for a cancellation, park the caller, wake it
with its reply) and in the reader's wait for more bytes, that indirection cost the trio face
~28 Python calls and 11-15 % more client CPU per request (benchmarks/client_rtt.py, 64 tasks
on one connection). So :func:`hooks_for_running_loop` picks, once, when a client opens, the
running loop's own primitives for exactly those steps:

- trio: ``trio.current_time``, ``trio.lowlevel.checkpoint_if_cancelled``,
  ``trio.lowlevel.wait_readable``, and a
  :class:`TrioSlot` that parks the caller with ``wait_task_rescheduled`` (its abort callback
  abandons the request synchronously, so a cancelled caller never sees its reply) and wakes it
  with ``reschedule`` — the face's trio path as it was before anyio.
- asyncio (any other loop anyio runs): anyio's clock, checkpoint and readiness wait, and a
  :class:`FutureSlot` that parks the caller on an ``asyncio.Future`` of the running loop. A
  cancellation can land after the reply was set; the caller then sees the cancellation, and
  the face counts the reply as dropped.

Rules kept: a slot is resolved at most once, by the reader task or by a broken connection,
never from another thread; ``wait(abandon)`` calls ``abandon()`` exactly when the caller stops
waiting before its slot was resolved.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import trio

__all__ = ["CLOSED", "FutureSlot", "LoopHooks", "Slot", "TrioSlot", "hooks_for_running_loop"]


class Slot:
    """Where a reply meets its caller: the resolution (``done`` once set) and the way the
    caller waits for it (the subclasses)."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def unwrap(self) -> Any:
        """The value, or raise the error."""
        if self.error is not None:
            raise self.error
        return self.value

    def resolve(self, value: Any, error: BaseException | None) -> None:
        """Set the resolution and wake the waiting caller (from the loop's thread)."""
        raise NotImplementedError

    def wait(self, abandon: Callable[[], object]) -> Awaitable[None]:
        """An awaitable that waits until resolved; when the caller is cancelled first,
        ``abandon()`` is called and the cancellation raised."""
        raise NotImplementedError


class TrioSlot(Slot):
    """A slot under trio: the caller parks with ``wait_task_rescheduled``."""

    __slots__ = ("task",)

    def __init__(self) -> None:  # Slot.__init__ inlined: one per request
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.task: trio.lowlevel.Task | None = None

    def resolve(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error
        self.done = True
        task = self.task
        if task is not None:
            self.task = None
            trio.lowlevel.reschedule(task)

    def wait(self, abandon: Callable[[], object]) -> Awaitable[None]:
        # Not a coroutine of its own: the caller awaits trio's trap directly (one frame
        # less per request).
        self.task = trio.lowlevel.current_task()

        def abort(raise_cancel: Any) -> trio.lowlevel.Abort:
            self.task = None
            abandon()
            return trio.lowlevel.Abort.SUCCEEDED

        return trio.lowlevel.wait_task_rescheduled(abort)


class FutureSlot(Slot):
    """A slot under asyncio: the caller waits for a future of the running loop."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        super().__init__()
        self.future: asyncio.Future[None] | None = None

    def resolve(self, value: Any, error: BaseException | None) -> None:
        self.value = value
        self.error = error
        self.done = True
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)

    def wait(self, abandon: Callable[[], object]) -> Awaitable[None]:
        return self._wait(abandon)

    async def _wait(self, abandon: Callable[[], object]) -> None:
        future = self.future = asyncio.get_running_loop().create_future()
        try:
            await future
        except BaseException:
            if not self.done:
                abandon()
            raise


class LoopHooks:
    """The running loop's primitives for the per-request path (see the module docstring).
    ``wait_readable`` (the reader's wait for more replies) raises one of :data:`CLOSED` when
    the socket is closed under it."""

    __slots__ = ("checkpoint_if_cancelled", "now", "slot", "wait_readable")

    def __init__(
        self,
        slot: type[Slot],
        now: Callable[[], float],
        checkpoint_if_cancelled: Callable[[], Awaitable[None]],
        wait_readable: Callable[[socket.socket], Awaitable[None]],
    ) -> None:
        self.slot = slot
        self.now = now
        self.checkpoint_if_cancelled = checkpoint_if_cancelled
        self.wait_readable = wait_readable


#: What ``LoopHooks.wait_readable`` raises for a socket closed under it (trio's own error
#: under trio, anyio's otherwise).
CLOSED = (trio.ClosedResourceError, anyio.ClosedResourceError)

_TRIO = LoopHooks(
    TrioSlot,
    trio.current_time,
    trio.lowlevel.checkpoint_if_cancelled,
    trio.lowlevel.wait_readable,
)
_ANYIO = LoopHooks(
    FutureSlot,
    anyio.current_time,
    anyio.lowlevel.checkpoint_if_cancelled,
    anyio.wait_readable,
)


def hooks_for_running_loop() -> LoopHooks:
    """The hooks of the event loop running the caller (trio's own under trio, else anyio's
    and asyncio futures)."""
    return _TRIO if trio.lowlevel.in_trio_run() else _ANYIO
