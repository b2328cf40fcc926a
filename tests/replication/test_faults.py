"""Faults of a replicated group, each with clients contending on a few locks throughout and
every critical section checked by the safety checker (no overlapping exclusive holders,
fences strictly increasing) -- issue 18's acceptance list:

- kill -9 of the replica a holder is connected to: the holder keeps its lock through another
  replica; the waiters are served in order;
- kill -9 of one of three etcd members;
- SIGSTOP of a replica for longer than the session max age, then SIGCONT: it does not answer
  from its old state;
- a replica started late catches up from a snapshot;
- the whole group restarted: nothing lost; the uptime gate holds as for one server.

Replicas are real ``lockserver --replicate`` processes (``lockbench.replicas``), etcd is real
(``lockbench.etcd``); loopback only; every test bounded in time and in count."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import (
    AnywayContinueAfter,
    Assert,
    ConnectionLost,
    DeleteVar,
    LockClient,
    LockClientError,
    Mutex,
    SetVar,
)
from lockbench.etcd import EtcdCluster
from lockbench.replicas import Contention, ReplicaGroup
from lockbench.safety import Recorder, check
from protocol import Cause

#: How long the contention runs around each fault (seconds).
SETTLE = 2.0


@pytest.fixture
def group1(etcd1: EtcdCluster, tmp_path: Path) -> Iterator[ReplicaGroup]:
    """Three replicas on the one-member etcd, leases of 2 s, sessions up to 4 s."""
    with ReplicaGroup(
        etcd1.endpoints, tmp_path / "replicas", n=3, group=f"f{time.monotonic_ns()}"
    ) as g:
        yield g.start()


def contend(group: ReplicaGroup, recorder: Recorder, **kw: object) -> Contention:
    return Contention(group.addresses, recorder, **kw).start()  # type: ignore[arg-type]


def grants_grow(c: Contention, seconds: float) -> int:
    """Wait ``seconds``; return how many grants were recorded meanwhile."""
    before = c.grants
    time.sleep(seconds)
    return c.grants - before


def parked(client: LockClient, n: int, timeout: float = 20.0) -> None:
    """Return once ``n`` transactions wait on the namespace ``held`` (the listing goes
    through the group's log, so any replica answers the same), failing after ``timeout``
    seconds. Waiting for the state, not a fixed sleep: under load a waiter's request can take
    longer than any sleep to be queued."""
    deadline = time.monotonic() + timeout
    while len(client.waiters("held").waiters) < n:
        assert time.monotonic() < deadline, f"{n} waiters were not parked in {timeout} s"
        time.sleep(0.02)


def finish(c: Contention, recorder: Recorder) -> None:
    c.stop()
    assert c.alive == 0, "a contending thread did not stop"
    report = check(recorder.intervals)
    assert report.ok, report.summary()
    assert c.grants > 0


def test_kill_9_of_the_holders_replica(group1: ReplicaGroup) -> None:
    """The holder's replica is killed: the holder's session and lock live on (it releases
    through another replica, no LockLost); the waiters queued on other replicas are served in
    the order they queued; contending clients see no violation."""
    recorder = Recorder()
    c = contend(group1, recorder, threads=3, locks=2)
    try:
        # The holder talks to replica 0 first; the two waiters to replicas 1 and 2.
        order = group1.addresses
        holder = LockClient(servers=[order], timeout=3.0)
        hs = holder.session(max_age=10.0)
        lock = Mutex(hs, "held", "L")
        assert lock.acquire(timeout=5.0)
        fence = lock.fence
        served: list[str] = []
        mu = threading.Lock()

        def waiter(name: str, members: list[str]) -> None:
            with LockClient(servers=[members], timeout=10.0) as w, w.session(max_age=10.0) as s:
                m = Mutex(s, "held", "L")
                if m.acquire(timeout=20.0):
                    with mu:
                        served.append(name)
                    assert m.fence is not None and fence is not None and m.fence > fence
                    m.release()

        w1 = threading.Thread(target=waiter, args=("first", order[1:] + order[:1]))
        w1.start()
        parked(holder, 1)  # the first is queued before the second asks: their order is known
        w2 = threading.Thread(target=waiter, args=("second", order[2:] + order[:2]))
        w2.start()
        parked(holder, 2)
        group1.kill(0)
        assert grants_grow(c, SETTLE) > 0  # the others keep being served
        lock.release()  # through replica 1 or 2: the session lived on, the lock was held
        assert not lock.lost
        w1.join(25)
        w2.join(25)
        assert served == ["first", "second"]
        holder.close()
    finally:
        finish(c, recorder)


def test_kill_9_of_one_of_three_etcd_members(etcd3: EtcdCluster, tmp_path: Path) -> None:
    """One of three etcd members is killed (the leader: the hardest case): the group goes on
    granting, without a violation."""
    with ReplicaGroup(etcd3.endpoints, tmp_path / "replicas", n=3, group="e3") as group:
        group.start()
        recorder = Recorder()
        c = contend(group, recorder, threads=3, locks=2)
        try:
            assert grants_grow(c, SETTLE) > 0
            etcd3.kill(etcd3.leader())
            time.sleep(2.0)  # re-election (~1 s) and retries
            assert grants_grow(c, SETTLE) > 0
        finally:
            finish(c, recorder)


def test_sigstop_past_the_session_max_age_then_sigcont(group1: ReplicaGroup) -> None:
    """A replica paused longer than the session max age does not answer from its old state:
    its sessions expired in the group meanwhile, another client took the lock, and after
    SIGCONT the paused replica's client is refused or cut off, never told it still holds."""
    recorder = Recorder()
    c = contend(group1, recorder, threads=2, locks=2, max_age=4.0)
    try:
        only0 = [group1.addresses[0]]  # this client cannot fail over: it sees what 0 says
        stuck = LockClient(servers=[only0], timeout=15.0)
        ss = stuck.session(max_age=3.0, keepalive=False)
        assert ss.execute("paused", [Assert(SetVar("L", "x", "stuck"))]).ok
        group1.stop(0)
        time.sleep(5.0)  # > max age 3 s and > lease 2 s
        with LockClient(servers=[group1.addresses[1:]], timeout=5.0) as other:
            taken = other.session(max_age=10.0).execute(
                "paused", [Assert(SetVar("L", "x", "other"))]
            )
            assert taken.ok  # the paused replica's session expired in the group
        group1.cont(0)
        try:
            again = ss.execute("paused", [Assert(SetVar("L", "x", "stuck"))])
        except (ConnectionLost, LockClientError):
            pass  # cut off (UNAVAILABLE) as it rejoins: the right answer too
        else:
            assert not again.ok  # answered from the group's state: the other holds it
        stuck.close()
        assert grants_grow(c, SETTLE) > 0
    finally:
        finish(c, recorder)


def test_replica_started_late_catches_up_from_a_snapshot(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """Two replicas serve long enough for snapshots (every 20 entries) and compaction; a
    third started afterwards loads the snapshot and refuses what the group holds."""
    with ReplicaGroup(
        etcd1.endpoints, tmp_path / "replicas", n=3, group="late", snapshot_every=20
    ) as group:
        group.start([0, 1])
        with LockClient(servers=[group.addresses[:2]], timeout=5.0) as cl:
            s = cl.session(max_age=30.0)
            for i in range(60):
                assert s.execute("late", [Assert(SetVar("L", f"v{i}", "a"))]).ok
            time.sleep(1.5)  # the snapshot loop looks once a second
            group.start([2])
            with LockClient(servers=[[group.addresses[2]]], timeout=5.0) as late:
                replication = late.statistics()["replication"]
                assert replication["snapshots_loaded"] == 1
                assert replication["snapshots_written"] == 0  # it is not the writer
                denied = late.session().execute("late", [Assert(SetVar("L", "v7", "b"))])
                assert not denied.ok
                assert [h.session for h in denied.holders] == [s.id]


def test_whole_group_restarted_loses_nothing_uptime_gate_holds(group1: ReplicaGroup) -> None:
    """Every replica killed, then started again: the lock is still held (the state is in
    etcd); a contract with a minimum uptime is refused until the replicas have been up that
    long, as for one restarted server."""
    with LockClient(servers=[group1.addresses], timeout=5.0) as cl:
        s = cl.session(max_age=60.0, keepalive=False)
        held = s.execute("restart", [Assert(SetVar("L", "x", "a"))])
        assert held.ok
    for i in range(3):
        group1.kill(i)
    group1.start()
    with LockClient(servers=[group1.addresses], timeout=5.0) as cl:
        other = cl.session(max_age=60.0)
        denied = other.execute("restart", [Assert(SetVar("L", "x", "b"))])
        assert not denied.ok and [h.fence for h in denied.holders] == [held.fence]
        gated = other.execute("restart", [Assert(SetVar("L", "y", "b"))], min_uptime=30.0)
        assert not gated.ok and gated.cause is Cause.MINIMUM_REQUIREMENTS
        s2 = cl.session(max_age=60.0, session_id=s.id)
        assert s2.execute("restart", [AnywayContinueAfter(DeleteVar("L", "x"))]).ok
        assert other.execute("restart", [Assert(SetVar("L", "x", "b"))]).ok
