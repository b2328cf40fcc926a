"""Helpers of the recipe tests. Their servers are the suite's (tests/support.py, re-exported
here): ``start_server`` in the test's trio run, ``ThreadedServer`` in a thread of its own for
the sync face, optionally under a MockClock that the test jumps from outside."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from support import TEST_CONFIG, ThreadedServer, start_server

from lockserver import RunningServer

#: The servers are re-exported from tests/support.py, so test modules import them from here.
__all__ = [
    "NS",
    "TEST_CONFIG",
    "ThreadedServer",
    "entries",
    "start_server",
    "sync_entries",
    "until",
    "waiters",
]

NS = "recipes-test"


async def entries(session: Any, table: str, var: str, namespace: str = NS) -> list[dict[str, Any]]:
    """Every entry record of ``table``/``var`` (read through ``session``, an AsyncSession)."""
    from client import SelectVarValue

    r = await session.execute(
        namespace,
        [SelectVarValue("all", table, var, ignore_this_session=False, select_many=True)],
    )
    return list(r["all"] or [])


def sync_entries(session: Any, table: str, var: str, namespace: str = NS) -> list[dict[str, Any]]:
    """Every entry record of ``table``/``var`` (read through ``session``, a sync Session)."""
    from client import SelectVarValue

    r = session.execute(
        namespace,
        [SelectVarValue("all", table, var, ignore_this_session=False, select_many=True)],
    )
    return list(r["all"] or [])


async def until(predicate: Callable[[], bool], interval: float = 0.005) -> None:
    """Test-side setup only: wait (bounded by the caller's fail_after) until ``predicate()``,
    e.g. until the server has parked a request."""
    while not predicate():
        await trio.sleep(interval)


def waiters(server: RunningServer) -> int:
    """Parked transactions on the server (call from the server's trio run)."""
    return int(server.statistics()["waiting"]["waiters"])
