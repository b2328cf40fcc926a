"""A snapshot costs the serving loop (nearly) nothing (issue 29, "the stall"): the state is
encoded by a forked child while the event loop goes on, and the encoding is exactly the state
when it was asked for, whatever the loop applies meanwhile; a failing child is an error, not
a hung or crashed replica; the snapshot's chunks never come down a replica's watch (the watch
covers only the keys a replica applies), on real etcd."""

from __future__ import annotations

import hashlib
import itertools
import os
from typing import Any

import pytest
import trio
import trio.testing

from lockbench.etcd import EtcdCluster
from lockserver.replication import _replica
from lockserver.replication._etcd import Etcd
from lockserver.replication._group import Genesis, GroupState, SnapshotError, encode_entry, wire
from lockserver.replication._replica import encode_snapshot, group_prefix
from protocol import Assert, Execute, SessionSpec, SetVar, Transaction

from .test_replicas import acquire, caught_up, session_on, start

LIMITS = {
    "max_sessions": 100_000,
    "max_entries": 100_000,
    "max_entries_per_session": 100_000,
    "max_store_bytes": 100_000_000,
}
WAIT_LIMITS = {
    "max_waiters": 1000,
    "max_waiters_per_session": 100,
    "max_waiters_per_owner": 100,
    "max_waiting_ops_per_variable": 100_000,
    "max_waiting_ops_per_session": 100_000,
    "max_waiting_ops_per_principal": 1_000_000,
}
GENESIS = Genesis(1_700_000_000.0, "stall-instance", False, LIMITS, WAIT_LIMITS)
_groups = itertools.count()


def _acquires(first: int, count: int) -> list[list[Any]]:
    def tx(var: str) -> Transaction:
        return Transaction("ns", (Assert(SetVar("L", var, "s")),))

    return [
        ["x", 1, "", wire(Execute(i, SessionSpec(f"s{i % 50}", 60.0), tx(f"v{i}"), None))]
        for i in range(first, first + count)
    ]


def _state(locks: int) -> tuple[GroupState, int]:
    """A state holding ``locks`` locks of 50 sessions; and the next revision."""
    state = GroupState(GENESIS)
    state.apply_registered("r1", "r1:7400", 2)
    revision = 3
    for batch, first in enumerate(range(0, locks, 500), 1):
        entry = encode_entry("r1", batch, GENESIS.started_at + 1, 1.0, _acquires(first, 500))
        state.apply_entry(entry, revision)
        revision += 1
    return state, revision


async def test_a_snapshot_is_the_state_when_asked_while_the_loop_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The snapshot encoded while the loop applies more entries (and other tasks run) is the
    state as it stood when it was asked for, byte for byte: restored, it has that state's
    fingerprint, not the later one's. (The child is held at a gate until the loop has
    applied the entries, so the encoding certainly overlaps them.)"""
    state, revision = _state(20_000)
    before = state.snapshot()
    fingerprint = state.fingerprint()
    gate_read, gate_write = os.pipe()
    encode = _replica._encode

    def gated(s: GroupState) -> Any:
        os.read(gate_read, 1)  # in the child: wait until the parent has moved on
        return encode(s)

    monkeypatch.setattr(_replica, "_encode", gated)
    ran = 0
    encoded: list[Any] = []

    async def ticker() -> None:
        nonlocal ran
        while True:
            ran += 1
            await trio.sleep(0)

    async def snapshot() -> None:
        encoded.append(await encode_snapshot(state))

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(snapshot)
                await trio.testing.wait_all_tasks_blocked()  # forked; waits on its child
                nursery.start_soon(ticker)
                for i in range(5):  # the loop goes on applying the log meanwhile
                    entry = encode_entry(
                        "r1", 1000 + i, GENESIS.started_at + 2, 1.0, _acquires(10**6 + i, 3)
                    )
                    state.apply_entry(entry, revision + i)
                    await trio.sleep(0)
                assert not encoded and ran > 0
                os.write(gate_write, b"x")
                while not encoded:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
    finally:
        os.close(gate_read)
        os.close(gate_write)
    data, digest = encoded[0].data, encoded[0].sha256
    assert data == before
    assert digest == hashlib.sha256(before).hexdigest()
    assert GroupState.restore(data).fingerprint() == fingerprint
    assert state.fingerprint() != fingerprint  # the loop did apply more meanwhile


class _Broken(GroupState):
    def snapshot(self) -> bytes:
        raise RuntimeError("cannot pickle this")


async def test_a_failing_encoding_is_an_error_not_a_hang() -> None:
    """A child that fails to encode exits non-zero: the caller gets a SnapshotError naming
    the child process (the snapshot loop logs it and tries again later)."""
    broken = _Broken(GENESIS)
    with trio.fail_after(30), pytest.raises(SnapshotError, match="child process"):
        await encode_snapshot(broken)


async def test_a_ranged_watch_sees_no_key_past_its_end(etcd1: EtcdCluster) -> None:
    """``Etcd.watch`` with ``range_end`` delivers the keys before it and none from it on;
    a range_end not after the first key is refused."""
    prefix = b"/w/"
    async with Etcd(etcd1.endpoints) as etcd:
        start = await etcd.current_revision() + 1
        with pytest.raises(ValueError, match="range_end"):
            etcd.watch(prefix, start_revision=start, range_end=prefix)
        for key in (b"log", b"replicas/a", b"snapshot", b"snapshot/1/0", b"zzz", b"log"):
            await etcd.put(prefix + key, b"x")
        seen: list[bytes] = []
        with trio.fail_after(10):
            async with etcd.watch(
                prefix, start_revision=start, range_end=prefix + b"snapshot"
            ) as batches:
                async for events in batches:
                    seen += [ev.key for ev in events]
                    if len(seen) >= 3:
                        break
        assert seen == [prefix + b"log", prefix + b"replicas/a", prefix + b"log"]


async def test_snapshot_chunks_never_come_down_a_replicas_watch(etcd1: EtcdCluster) -> None:
    """While snapshots are written (by the writer, into etcd), no replica's watch delivers a
    key of them: each applies only the genesis, the log and the registrations; and a replica
    that joins later still loads the snapshot and holds the same state."""
    group = f"stall{next(_groups)}"
    snapshot_keys = group_prefix(group) + b"snapshot"
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group, replica_snapshot_every=10)
            r2 = await start(nursery, etcd1, group, replica_snapshot_every=10)
            seen: list[bytes] = []
            for handle in (r1, r2):
                replica = handle.replica
                original = replica._apply_event

                def spy(ev: Any, *args: Any, _original: Any = original) -> Any:
                    seen.append(ev.key)
                    return _original(ev, *args)

                replica._apply_event = spy  # type: ignore[method-assign,assignment]
            async with session_on(r1.port, "a") as a:
                for i in range(40):
                    assert (await a.execute("ns", acquire(f"v{i}", "a"))).ok
                written = r1.replica.snapshots_written + r2.replica.snapshots_written
                while r1.replica.snapshots_written + r2.replica.snapshots_written == written:
                    await a.execute("ns", acquire("more", "a"))
                    await trio.sleep(0.1)
                await a.execute("ns", acquire("after", "a"))
                await caught_up(r1, r2)
                async with Etcd(etcd1.endpoints) as etcd:
                    chunks, _ = await etcd.get_prefix(snapshot_keys + b"/")
                assert chunks  # the snapshot is in etcd ...
                assert seen and not [k for k in seen if k.startswith(snapshot_keys)]  # ... not here
                late = await start(nursery, etcd1, group, replica_snapshot_every=10)
                assert late.replica.snapshots_loaded == 1
                await caught_up(r1, late)
                assert late.replica.state.fingerprint() == r1.replica.state.fingerprint()
            nursery.cancel_scope.cancel()
