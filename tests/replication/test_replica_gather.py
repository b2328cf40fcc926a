"""A replica that nothing waits on lets the watch's entries gather (issue 29: a lone client's
acquire shares the machine with every replica's per-entry work): while a client works on
one replica, another with no client pauses between drained batches (``watch_gathers``
counts the pauses) and still applies every entry, reaching the same full state; the serving
replica never pauses, nor does an idle one after a batch heavier than the bound; and once a
client works on the idle replica too, it stops pausing, its waiter is granted by a release
made on the other replica, and both hold the same state.

On a real etcd (one member), replicas in this process, every test bounded by
``trio.fail_after``; nothing asserts on elapsed time."""

from __future__ import annotations

import itertools

import pytest
import trio

from lockbench.etcd import EtcdCluster
from lockserver.replication import _replica

from .test_replicas import acquire, caught_up, release, session_on, start

_groups = itertools.count()


def _gathers(handle: object) -> int:
    return int(handle.replica.statistics()["watch_gathers"])  # type: ignore[attr-defined]


async def test_an_idle_replica_gathers_and_applies_every_entry(etcd1: EtcdCluster) -> None:
    """40 acquires through replica A: B, with no client, pauses between batches and applies
    them all (the same fingerprint as A's state); A, serving them, does not pause."""
    group = f"gather{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = [await start(nursery, etcd1, group) for _ in range(2)]
            await caught_up(a, b)
            async with session_on(a.port, "S") as s:
                assert (await s.execute("ns", acquire("first", "S"))).ok  # A has a client now
                await caught_up(a, b)
                before_a, before_b = _gathers(a), _gathers(b)
                for i in range(40):
                    assert (await s.execute("ns", acquire(f"v{i}", "S"))).ok
                await caught_up(a, b)
                assert _gathers(b) > before_b
                assert _gathers(a) == before_a
                assert b.replica.state.fingerprint() == a.replica.state.fingerprint()
                assert b.replica.state.entries == a.replica.state.entries
            nursery.cancel_scope.cancel()


async def test_a_replica_with_a_client_stops_gathering(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a client made a call on B, B does not pause (a pause as long as the test would
    show in every wait otherwise), and a waiter parked on B is granted when A's client
    releases the lock."""
    monkeypatch.setattr(_replica, "IDLE_GATHER", 3600.0)  # a pause would never end by itself
    group = f"gather{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(a.port, "A") as sa, session_on(b.port, "B") as sb:
                # B's first call ends any pause (a proposal wakes it) and keeps it awake.
                assert (await sb.execute("ns", acquire("mine", "B"))).ok
                paused = _gathers(b)
                assert (await sa.execute("ns", acquire("x", "A"))).ok
                granted: list[bool] = []

                async def wait_on_b() -> None:
                    granted.append((await sb.execute("ns", acquire("x", "B"), wait=20.0)).ok)

                nursery.start_soon(wait_on_b)
                for i in range(10):
                    assert (await sa.execute("ns", acquire(f"y{i}", "A"))).ok
                assert not granted
                await sa.execute("ns", release("x"))
                while not granted:
                    await trio.sleep(0.01)
                assert granted == [True]
                assert _gathers(b) == paused
                await caught_up(a, b)
                assert b.replica.state.fingerprint() == a.replica.state.fingerprint()
            nursery.cancel_scope.cancel()


async def test_no_pause_after_a_heavy_batch(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the bound on a light batch at zero, every batch is heavy: the idle replica never
    pauses, and still applies every entry."""
    monkeypatch.setattr(_replica, "GATHER_APPLY_BELOW", 0.0)
    group = f"gather{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(a.port, "S") as s:
                for i in range(20):
                    assert (await s.execute("ns", acquire(f"v{i}", "S"))).ok
                await caught_up(a, b)
                assert _gathers(b) == 0
                assert b.replica.state.fingerprint() == a.replica.state.fingerprint()
            nursery.cancel_scope.cancel()
