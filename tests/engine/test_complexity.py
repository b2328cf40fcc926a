"""Cost structure, shown by counting operations (never by timing): ending a session touches
only its own entries, and a sweep takes only what is due from the deadline queues (O(N log M)
for N expired out of M)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from lockserver._build import build
from lockserver.engine import Engine, EngineLimits
from lockserver.engine._deadlines import Deadlines
from protocol import Assert, DeleteVar, SessionSpec, SetVar

from ._helpers import START, make_engine, run

HELD = 100_000


class NoScanDict(dict[Any, Any]):
    """A dict that fails any whole-container walk (iteration, keys/values/items, copy)."""

    def _refuse(self, *args: Any) -> Any:
        raise AssertionError("a whole-container scan happened")

    __iter__ = keys = values = items = copy = _refuse


def held_engine() -> Engine:
    """An engine where two sessions hold 100,000 entries (50,000 each, one table)."""
    engine = make_engine(limits=EngineLimits(max_entries_per_session=HELD))
    half = HELD // 2
    for sid, base in [("big1", 0), ("big2", half)]:
        statements = [Assert(SetVar("T", f"k{i}", i)) for i in range(base, base + half)]
        assert run(engine, SessionSpec(sid, max_age=1e9), *statements).ok
    assert engine.entry_count == HELD
    return engine


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of Engine._unlink calls and of the deadline queues' work: items queued ("push",
    Deadlines.add), taken ("pop"), moved from a far bucket into the near heap ("moved").
    Pure build only (a compiled engine's calls to its own methods cannot be patched)."""
    if build() != "pure":
        pytest.skip("pure build only: counts calls by patching the engine's methods")
    counts: Counter[str] = Counter()
    real_unlink = Engine._unlink
    real_add = Deadlines.add
    real_pop = Deadlines.pop
    real_advance = Deadlines.advance

    def unlink(self: Engine, *args: Any) -> None:
        counts["unlink"] += 1
        real_unlink(self, *args)

    def add(self: Deadlines, *args: Any) -> None:
        counts["push"] += 1
        real_add(self, *args)

    def pop(self: Deadlines) -> Any:
        counts["pop"] += 1
        return real_pop(self)

    def advance(self: Deadlines, now: float) -> None:
        before = len(self.near)
        real_advance(self, now)
        counts["moved"] += len(self.near) - before

    monkeypatch.setattr(Engine, "_unlink", unlink)
    monkeypatch.setattr(Deadlines, "add", add)
    monkeypatch.setattr(Deadlines, "pop", pop)
    monkeypatch.setattr(Deadlines, "advance", advance)
    return counts


def test_ending_a_session_touches_only_its_own_entries(counted: Counter[str]) -> None:
    """With 100,000 entries held by other sessions in the same table, ending a session that
    holds one entry unlinks exactly one entry and never walks the namespaces or the table."""
    engine = held_engine()
    run(engine, "small", Assert(SetVar("T", "mine", 1)))
    engine.store.namespaces = NoScanDict(engine.store.namespaces)
    engine.namespaces["Clinical"] = NoScanDict(engine.namespaces["Clinical"])
    engine.namespaces["Clinical"]["T"] = NoScanDict(engine.namespaces["Clinical"]["T"])
    counted.clear()
    assert engine.end_session("small", now=START + 1, notify=True)
    assert counted["unlink"] == 1
    assert counted["pop"] == 0
    (event,) = engine.drain_lost()
    assert event.entries == (("Clinical", "T", "mine", 3),)
    assert engine.entry_count == HELD


@pytest.mark.parametrize("k", [1, 10, 100])
def test_ending_a_session_costs_one_unlink_per_entry(counted: Counter[str], k: int) -> None:
    """Ending a session with k entries unlinks exactly k entries, however much else is held."""
    engine = held_engine()
    run(engine, "s", *(Assert(SetVar("U", f"v{i}", i)) for i in range(k)))
    counted.clear()
    engine.end_session("s", now=START + 1)
    assert counted["unlink"] == k
    assert engine.entry_count == HELD


@pytest.mark.parametrize(("due", "total"), [(10, 10_000), (100, 10_000), (0, 10_000)])
def test_sweep_pops_only_the_due_ttl_entries(counted: Counter[str], due: int, total: int) -> None:
    """With M TTL entries queued (one per second), a sweep at a time when N are due moves N
    into the near heap and pops exactly those N (each O(log M)), queues nothing: O(N log M),
    independent of M."""
    engine = make_engine(limits=EngineLimits(max_entries_per_session=total))
    statements = [Assert(SetVar("T", f"k{i}", i, ttl=i + 1)) for i in range(total)]
    assert run(engine, SessionSpec("s", max_age=3000), *statements).ok
    counted.clear()
    assert engine.sweep(START + due) == due
    assert counted["pop"] == due
    assert counted["moved"] == due
    assert counted["push"] == 0
    assert engine.entry_count == total - due


def test_released_ttl_entries_leave_the_queue_at_once() -> None:
    """Issue 14, item 3: entries released long before their TTL leave no item behind in the
    deadline queue (200,000 acquire+release with ttl=1e9 used to keep 66 MB until then)."""
    engine = make_engine()
    for i in range(2_000):
        lock = SetVar("T", f"k{i}", None, ttl=2_000_000)
        assert run(engine, "s", Assert(lock), now=START + i / 1000).ok
        assert run(engine, "s", Assert(DeleteVar("T", f"k{i}")), now=START + i / 1000).ok
    assert len(engine._ttls_due) == 0
    assert engine.entry_count == 0


def test_sweep_pops_only_the_due_sessions(counted: Counter[str]) -> None:
    """With M idle sessions queued, a sweep with N due pops N items; a session touched since it
    was queued costs one pop and one push (its lazy re-queue), untouched ones nothing."""
    engine = make_engine()
    for i in range(1_000):
        run(engine, SessionSpec(f"s{i}", max_age=10 + i))
    run(engine, "s0", now=START + 5)  # s0's queued deadline (10) is now stale
    counted.clear()
    assert engine.sweep(START + 12) == 0
    assert counted["moved"] == 3  # the buckets of 10, 11 and 12 came due
    assert counted["pop"] == 3  # s0 (re-queued at 15), s1 and s2 expired
    assert counted["push"] == 1
    assert len(engine.sessions) == 998


def test_ended_sessions_leave_the_queue_at_once() -> None:
    """Issue 14, item 3: sessions ended long before their max age leave no item behind
    (200,000 sessions created and ended with max_age=3600 used to keep 78 MB until then),
    and their retry memory goes with them."""
    engine = make_engine()
    for i in range(2_000):
        spec = SessionSpec(f"s{i}", max_age=3600)
        assert run(
            engine, spec, Assert(SetVar("T", "x")), transaction_id="t", now=START + i / 1000
        ).ok
        assert engine.end_session(f"s{i}", now=START + i / 1000)
    assert len(engine._sessions_due) == 0
    assert len(engine.sessions) == 0
    assert engine.stored == 0


def test_touch_and_calls_with_nothing_due_cost_no_heap_work(counted: Counter[str]) -> None:
    """Touching an existing session does not push a new deadline, and a transaction with no
    deadline due pops nothing."""
    engine = held_engine()
    run(engine, "a")
    counted.clear()
    for t in range(100):
        run(engine, "a", Assert(SetVar("T", f"a{t}", t)), now=START + t / 10)
    assert counted["pop"] == 0
    assert counted["push"] == 0
    assert counted["moved"] == 0
