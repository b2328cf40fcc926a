"""A snapshot is written in small chunks at a bounded rate, its encoder yields the CPU, and a
loaded state is kept out of the collector's walks (issue 29: no 10 s window's worst over
30 ms in a group): the plan of the writes (pure, Hypothesis), the settings at and past their
bounds, the writes against a real etcd (chunk sizes, the previous snapshot's chunks deleted,
a replica joining later loads what was written, no write before the plan allows it), the
child's priority, and the collector policy on load."""

from __future__ import annotations

import gc
import hashlib
import itertools
import os
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from lockbench.etcd import EtcdCluster
from lockserver import ServerConfig
from lockserver._gcstats import POLICY
from lockserver.replication import _replica
from lockserver.replication._etcd import Etcd
from lockserver.replication._group import SnapshotError
from lockserver.replication._replica import (
    VALUE_LIMIT,
    EncodedSnapshot,
    encode_snapshot,
    group_prefix,
    load_state,
    snapshot_plan,
    store_snapshot,
)

from .test_replicas import acquire, caught_up, session_on, start
from .test_snapshot_stall import GENESIS, _state

_groups = itertools.count()


# --- the plan ------------------------------------------------------------------------------


@given(
    size=st.integers(0, 200_000),
    old=st.integers(0, 300),
    chunk=st.integers(1, 70_000),
    rate=st.integers(1, 10**9),
)
def test_the_plan_writes_every_byte_once_then_deletes_every_old_chunk_once(
    size: int, old: int, chunk: int, rate: int
) -> None:
    """The puts are chunks 0..n-1 with n = ceil(size / chunk) (one empty chunk for an empty
    state), in order; then the deletions cover the old chunks 0..old-1 in adjacent runs of
    at most a megabyte's worth; each step's time is the bytes before it over the rate."""
    steps = snapshot_plan(size, old, chunk, rate)
    puts = [s for s in steps if s.put]
    deletes = [s for s in steps if not s.put]
    assert steps == puts + deletes
    assert [s.first for s in puts] == list(range(max(1, -(-size // chunk))))
    assert all(s.end == s.first + 1 for s in puts)
    covered = [i for s in deletes for i in range(s.first, s.end)]
    assert covered == list(range(old))
    assert all(s.end - s.first <= max(1, VALUE_LIMIT // chunk) for s in deletes)
    done = 0
    for s in steps:
        assert s.at == done / rate
        done += min(chunk, size - s.first * chunk) if s.put else (s.end - s.first) * chunk


def test_the_plan_spreads_a_snapshot_over_its_size_divided_by_the_rate() -> None:
    """16 MB in 16,000-byte chunks at 4 MB/s: 1,000 puts, the last one 3.996 s after the
    first; 1,000 old chunks deleted in runs of 62, the last one starting 7.992 s in."""
    steps = snapshot_plan(16_000_000, 1000, 16_000, 4_000_000)
    puts = [s for s in steps if s.put]
    deletes = [s for s in steps if not s.put]
    assert len(puts) == 1000 and puts[-1].at == pytest.approx(3.996)
    assert deletes[0].at == pytest.approx(4.0) and deletes[0].end == 62
    assert deletes[-1].at == pytest.approx(4.0 + 992 * 16_000 / 4_000_000)


@pytest.mark.parametrize(
    ("size", "old", "chunk", "rate"), [(1, 0, 0, 1), (1, 0, 1, 0), (-1, 0, 1, 1), (1, -1, 1, 1)]
)
def test_the_plan_refuses_nonsense(size: int, old: int, chunk: int, rate: int) -> None:
    """A chunk or rate below 1, a negative size or chunk count: ValueError."""
    with pytest.raises(ValueError, match="chunk and rate"):
        snapshot_plan(size, old, chunk, rate)


# --- the settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "good", "bad", "message"),
    [
        ("replica_snapshot_chunk", 1024, 1023, "must be >= 1024, got 1023"),
        ("replica_snapshot_chunk", 1_000_000, 1_000_001, "must be <= 1000000, got 1000001"),
        ("replica_snapshot_rate", 65_536, 65_535, "must be >= 65536, got 65535"),
        ("replica_snapshot_rate", 10**9, 10**9 + 1, "must be <= 1000000000, got 1000000001"),
    ],
)
def test_the_snapshot_settings_at_and_past_their_bounds(
    name: str, good: int, bad: int, message: str
) -> None:
    """Each bound is accepted; one past it is refused, naming the setting and the bound."""
    accepted: dict[str, Any] = {name: good}
    refused: dict[str, Any] = {name: bad}
    assert getattr(ServerConfig(**accepted), name) == good
    with pytest.raises(ValueError, match=f"{name} {message}"):
        ServerConfig(**refused)


def test_the_snapshot_settings_defaults() -> None:
    """16,000-byte chunks (one HTTP/2 frame on gRPC) at 4 MB/s, on the server and the
    replica's settings alike."""
    config = ServerConfig()
    assert (config.replica_snapshot_chunk, config.replica_snapshot_rate) == (16_000, 4_000_000)
    settings = _replica.ReplicationSettings(endpoints=("127.0.0.1:1",), group="g")
    assert (settings.snapshot_chunk, settings.snapshot_rate) == (16_000, 4_000_000)


# --- the writes, on a real etcd ---------------------------------------------------------------


async def test_chunks_are_at_most_the_chunk_size_and_the_old_ones_go(
    etcd1: EtcdCluster,
) -> None:
    """A snapshot stored in 1,024-byte chunks has only such chunks in etcd and loads back to
    the same state; the next one, in 4,096-byte chunks, replaces it: the first one's chunks
    are deleted, a state loads from the second."""
    prefix = group_prefix(f"pace{next(_groups)}")
    state, _ = _state(1000)
    later, _ = _state(1500)
    async with Etcd(etcd1.endpoints) as etcd:
        size, count = await store_snapshot(etcd, prefix, state, None, chunk=1024, rate=10**9)
        kvs, _ = await etcd.get_prefix(prefix + b"snapshot/")
        assert count == len(kvs) == -(-size // 1024) > 10
        assert all(len(kv.value) <= 1024 for kv in kvs)
        loaded, from_snapshot = await load_state(etcd, prefix, GENESIS, 0)
        assert from_snapshot and loaded.fingerprint() == state.fingerprint()

        later.revision = state.revision + 10
        await store_snapshot(etcd, prefix, later, None, chunk=4096, rate=10**9)
        kvs, _ = await etcd.get_prefix(prefix + b"snapshot/")
        assert kvs and all(b"/%020d/" % later.revision in kv.key for kv in kvs)
        assert all(len(kv.value) <= 4096 for kv in kvs)
        loaded, _ = await load_state(etcd, prefix, GENESIS, 0)
        assert loaded.fingerprint() == later.fingerprint()


@pytest.mark.parametrize(
    "forged",
    [b"\xc1", b"\x92\x01\x02", b"\x81\xa8revision\xa3abc", b"\x80", b"\x07"],
    ids=["not-msgpack", "a-list", "not-a-number", "no-fields", "an-int"],
)
async def test_a_forged_description_does_not_stop_the_writer(
    etcd1: EtcdCluster, forged: bytes
) -> None:
    """In a group without a secret anyone who can write to etcd can put anything at the
    snapshot's description: the writer stores its snapshot anyway (nothing of the forged
    one's to delete), and the new snapshot loads."""
    prefix = group_prefix(f"pace{next(_groups)}")
    state, _ = _state(200)
    async with Etcd(etcd1.endpoints) as etcd:
        await etcd.put(prefix + b"snapshot", forged)
        size, count = await store_snapshot(etcd, prefix, state, None, chunk=1024, rate=10**9)
        assert size > 0 and count == -(-size // 1024)
        loaded, from_snapshot = await load_state(etcd, prefix, GENESIS, 0)
        assert from_snapshot and loaded.fingerprint() == state.fingerprint()


@pytest.mark.parametrize(
    "forged", [b"\xc1", b"\x92\x01\x02", b"\x80"], ids=["raw", "list", "empty"]
)
async def test_a_forged_description_is_refused_clearly_when_loading(
    etcd1: EtcdCluster, forged: bytes
) -> None:
    """A joining replica that finds something else than a description at the snapshot's
    key gets SnapshotError saying so (the command then refuses to join, naming it), not a
    decoding error from deep inside."""
    prefix = group_prefix(f"pace{next(_groups)}")
    async with Etcd(etcd1.endpoints) as etcd:
        await etcd.put(prefix + b"snapshot", forged)
        with pytest.raises(SnapshotError, match="is not a snapshot's description"):
            await load_state(etcd, prefix, GENESIS, 0)


async def test_no_write_goes_before_the_plan_allows_it(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each put and deletion of a paced snapshot starts no earlier than its step's time
    after the first (a lower bound only: a slow machine is later, never earlier), and they
    come in the plan's order."""
    prefix = group_prefix(f"pace{next(_groups)}")
    data = os.urandom(20 * 1024)
    first = EncodedSnapshot(data, hashlib.sha256(data).hexdigest())
    calls: list[tuple[float, str]] = []
    put, delete_range = Etcd.put, Etcd.delete_range

    async def timed_put(self: Etcd, key: bytes, value: bytes, **kw: Any) -> Any:
        calls.append((trio.current_time(), "put"))
        return await put(self, key, value, **kw)

    async def timed_delete(self: Etcd, start: bytes, end: bytes) -> int:
        calls.append((trio.current_time(), "delete"))
        return await delete_range(self, start, end)

    async with Etcd(etcd1.endpoints) as etcd:
        await store_snapshot(etcd, prefix, first, None, revision=1, chunk=1024, rate=10**9)
        monkeypatch.setattr(Etcd, "put", timed_put)
        monkeypatch.setattr(Etcd, "delete_range", timed_delete)
        rate = 100 * 1024  # 20 chunks in 0.2 s, 20 old ones deleted in the next 0.2 s
        with trio.fail_after(30):
            await store_snapshot(etcd, prefix, first, None, revision=2, chunk=1024, rate=rate)
    steps = snapshot_plan(len(data), 20, 1024, rate)
    deletions = len(steps) - 20
    # the puts of the chunks, the description's after the last one, the paced deletions,
    # and the last sweep of the old snapshot's prefix
    kinds = [kind for _, kind in calls]
    assert kinds == ["put"] * 21 + ["delete"] * (deletions + 1)
    began = calls[0][0]
    chunk_and_delete_times = [at for at, _ in calls[:20] + calls[21 : 21 + deletions]]
    for step, at in zip(steps, chunk_and_delete_times, strict=True):
        assert at - began >= step.at - 1e-6


async def test_a_replica_writes_its_snapshots_in_its_chunk_size(etcd1: EtcdCluster) -> None:
    """``replica_snapshot_chunk`` reaches the replica: its snapshots' chunks in etcd are at
    most that size, and a replica joining later loads the snapshot and holds the same state."""
    group = f"pace{next(_groups)}"
    settings = {"replica_snapshot_every": 10, "replica_snapshot_chunk": 1024}
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group, **settings)
            async with session_on(r1.port, "a") as a:
                for i in range(30):
                    assert (await a.execute("ns", acquire(f"variable-{i:04d}", "a"))).ok
                while r1.replica.snapshots_written < 2:
                    await a.execute("ns", acquire("more", "a"))
                    await trio.sleep(0.1)
                async with Etcd(etcd1.endpoints) as etcd:
                    kvs, _ = await etcd.get_prefix(group_prefix(group) + b"snapshot/")
                assert kvs and all(len(kv.value) <= 1024 for kv in kvs)
                late = await start(nursery, etcd1, group, **settings)
                assert late.replica.snapshots_loaded == 1
                await caught_up(r1, late)
                assert late.replica.state.fingerprint() == r1.replica.state.fingerprint()
            nursery.cancel_scope.cancel()


# --- the encoder's priority and the collector ---------------------------------------------


async def test_the_encoding_child_runs_at_the_lowest_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forked encoder lowers its own priority to nice 19 (the parent's stays as it was):
    it takes only the CPU the serving processes leave."""
    parent = os.nice(0)

    def report_niceness(state: Any) -> EncodedSnapshot:
        niceness = b"%d" % os.nice(0)  # in the child
        return EncodedSnapshot(niceness, hashlib.sha256(niceness).hexdigest())

    monkeypatch.setattr(_replica, "_encode", report_niceness)
    with trio.fail_after(30):
        encoded = await encode_snapshot(_state(10)[0])
    assert int(encoded.data) == min(19, parent + 19)
    assert os.nice(0) == parent


@pytest.mark.parametrize("policy", [True, False])
async def test_a_loaded_state_is_frozen_out_of_the_collector_under_the_servers_policy(
    etcd1: EtcdCluster, policy: bool
) -> None:
    """With the lockserver command's collector policy on, the state a snapshot loads is
    frozen (the collector never walks it again); with it off (a program embedding the
    server owns its collector), nothing is frozen."""
    prefix = group_prefix(f"pace{next(_groups)}")
    state, _ = _state(2000)
    saved = POLICY.freeze_big_tables
    frozen_before = gc.get_freeze_count()
    try:
        async with Etcd(etcd1.endpoints) as etcd:
            await store_snapshot(etcd, prefix, state, None)
            POLICY.freeze_big_tables = policy
            loaded, _ = await load_state(etcd, prefix, GENESIS, 0)
        grown = gc.get_freeze_count() - frozen_before
        # gc.get_objects() lists what the collector walks: a frozen object is not among them
        in_sight = any(o is loaded for o in gc.get_objects())
        if policy:
            assert grown > 0 and not in_sight
        else:
            assert grown == 0 and in_sight
        assert loaded.fingerprint() == state.fingerprint()
    finally:
        POLICY.freeze_big_tables = saved
        if frozen_before == 0:
            gc.unfreeze()
