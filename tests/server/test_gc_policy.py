"""The server's collector policy (``lockserver._gcstats``, issue 19): a table that grows big
(``BigTable``) is frozen out of the cyclic collector's sight after the read pass that made it,
once, when the ``lockserver`` command turned the policy on; a program embedding ``serve``
keeps its own collector policy."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest
import trio
from support import start_server

from client import Assert, SetVar, open_lock_client
from lockserver._gcstats import POLICY
from lockserver.engine import BigTable, _eval, _store


@pytest.fixture
def small_big_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tables become big at 8 variables (the evaluator inlines the bound, add_var reads it);
    whatever a test freezes is handed back to the collector afterwards."""
    monkeypatch.setattr(_eval, "SHARD_AT", 8)
    monkeypatch.setattr(_store, "SHARD_AT", 8)
    try:
        yield
    finally:
        gc.unfreeze()


async def grow(port: int, table: str, count: int) -> None:
    async with open_lock_client(port=port) as client, client.session() as session:
        for k in range(count):
            await session.execute("ns", [Assert(SetVar(table, f"v{k}"))])


async def test_a_table_grown_big_is_frozen_once_when_the_policy_is_on(
    nursery: trio.Nursery, small_big_tables: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(POLICY, "freeze_big_tables", True)
    server = await start_server(nursery)
    made = BigTable.made
    before = gc.get_freeze_count()
    await grow(server.port, "t", 7)
    assert server.statistics()["gc"]["freezes"] == 0  # not big yet
    await grow(server.port, "t", 12)  # the 8th variable makes it big; more stay in it
    assert BigTable.made == made + 1
    assert server.statistics()["gc"]["freezes"] == 1
    assert gc.get_freeze_count() > before  # the heap of that moment is out of sight
    await grow(server.port, "u", 8)  # another table grown big: frozen as well
    assert server.statistics()["gc"]["freezes"] == 2


async def test_an_embedded_server_leaves_the_collector_alone(
    nursery: trio.Nursery, small_big_tables: None
) -> None:
    assert POLICY.freeze_big_tables is False  # nobody turned it on in this process
    server = await start_server(nursery)
    before = gc.get_freeze_count()
    await grow(server.port, "t", 10)
    assert server.statistics()["gc"]["freezes"] == 0
    assert gc.get_freeze_count() == before


def test_the_command_turns_the_policy_on_with_its_thresholds() -> None:
    code = (
        "import gc\n"
        "from lockserver.__main__ import _tune_gc\n"
        "from lockserver._gcstats import POLICY\n"
        "_tune_gc()\n"
        "print(POLICY.freeze_big_tables, gc.get_threshold())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "True (20000, 20, 100)"
