"""Running the async face's tests on both event loops the face supports: trio and asyncio.

``@on_both_loops`` turns an ``async def`` test (its body written with anyio's calls:
``anyio.fail_after``, ``anyio.create_task_group``...) into two tests, ``[trio]`` and
``[asyncio]``. Under trio the body runs in the test's own trio run, as every test here does.
Under asyncio the body runs in ``anyio.run(..., backend="asyncio")`` on a worker thread,
while the test's trio run keeps serving the fixtures started in it (the real ``server``): the
client under test then speaks to that server over a real socket from an asyncio loop. Tests
that need trio's MockClock stay trio-only (they say so in their docstring).

``on_server(fn, *args)`` runs a synchronous function (e.g. reading the server's statistics) in
the trio run that owns the server, from either loop; ``until(predicate)`` waits on either loop.
This is the equivalent of anyio's pytest plugin (``anyio_backend`` params), which cannot run
beside pytest-trio's trio mode: trio mode claims every ``async def`` test.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import pytest
import trio

__all__ = ["LOOPS", "on_both_loops", "on_server", "until"]

T = TypeVar("T")

#: The event loops the async face runs on.
LOOPS = ("trio", "asyncio")


def on_both_loops(test: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """Parametrize ``test`` over ``loop`` in LOOPS (see the module docstring)."""

    @functools.wraps(test)
    async def run(*args: Any, loop: str, **kwargs: Any) -> None:
        body = functools.partial(test, *args, **kwargs)
        if loop == "trio":
            await body()
        else:
            await trio.to_thread.run_sync(functools.partial(anyio.run, body, backend=loop))

    signature = inspect.signature(test)
    loop = inspect.Parameter("loop", inspect.Parameter.KEYWORD_ONLY, annotation=str)
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[*signature.parameters.values(), loop]
    )
    return pytest.mark.parametrize("loop", LOOPS)(run)


def on_server(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in the trio run of the test (which owns the server), from the test's
    body on either loop."""
    if trio.lowlevel.in_trio_run():
        return fn(*args)
    return trio.from_thread.run_sync(fn, *args)


async def until(predicate: Callable[[], bool], interval: float = 0.005) -> None:
    """Test-side setup only: wait (bounded by the caller's fail_after) until ``predicate()``
    is true, e.g. until the server has parked a request."""
    while not predicate():
        await anyio.sleep(interval)
