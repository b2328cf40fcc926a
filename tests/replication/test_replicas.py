"""Replicas of a group on a real etcd (one member), in this process: what one replica grants
another refuses and queues behind; a session continues through another replica when its own
is gone; a departed replica's waiters are dropped and the queue moves on; two replicas hold
the same full state; a replica started late catches up from a snapshot after etcd was
compacted; a replica cut off from etcd answers UNAVAILABLE instead of answering from its
state (issue 18).

Time is real here (etcd's leases run on its clock): the leases are the shortest allowed
(2 s) and every test is bounded by ``trio.fail_after``."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from client import (
    AnywayContinueAfter,
    Assert,
    ConnectionLost,
    DeleteVar,
    ServerError,
    SetVar,
    open_lock_client,
)
from lockbench.etcd import EtcdCluster
from lockserver import RunningServer, ServerConfig, serve
from lockserver.replication._replica import Replica
from protocol import Cause, ErrorCode

_groups = itertools.count()


class Handle:
    """A replica served in the test's nursery; ``kill()`` cancels it at once (no goodbye to
    etcd: its lease lapses as a dead machine's would)."""

    running: RunningServer
    scope: trio.CancelScope

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def replica(self) -> Replica:
        assert self.running.replica is not None
        return self.running.replica

    def kill(self) -> None:
        self.scope.cancel()


async def _serve(config: ServerConfig, handle: Handle, *, task_status: Any) -> None:
    with trio.CancelScope() as scope:
        handle.scope = scope
        await serve(config, task_status=task_status)


async def start(nursery: trio.Nursery, etcd: EtcdCluster, group: str, **settings: Any) -> Handle:
    config = ServerConfig(
        port=0,
        replicate="etcd://" + ",".join(etcd.endpoints),
        group=group,
        replica_lease_ttl=2,
        **settings,
    )
    handle = Handle()
    handle.running = await nursery.start(_serve, config, handle)
    return handle


def acquire(var: str, value: str) -> list[Any]:
    return [Assert(SetVar("L", var, value))]


def release(var: str) -> list[Any]:
    return [AnywayContinueAfter(DeleteVar("L", var))]


@asynccontextmanager
async def session_on(port: int, session_id: str, max_age: float = 30.0) -> AsyncIterator[Any]:
    async with open_lock_client("127.0.0.1", port) as c:
        yield c.session(max_age=max_age, session_id=session_id)


async def caught_up(*handles: Handle, timeout: float = 5.0) -> None:
    """Wait until every replica has applied the same revision (nothing in flight)."""
    with trio.fail_after(timeout):
        while True:
            revisions = {h.replica.state.revision for h in handles}
            if len(revisions) == 1:
                await trio.sleep(0.2)
                if {h.replica.state.revision for h in handles} == revisions:
                    return
            await trio.sleep(0.02)


async def test_grant_denial_and_queue_across_replicas(etcd1: EtcdCluster) -> None:
    """A grant on one replica is refused on another (naming its holder) and queued behind
    on a third; the release there lets the waiter run; fences increase."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2, r3 = [await start(nursery, etcd1, group) for _ in range(3)]
            async with (
                session_on(r1.port, "A") as a,
                session_on(r2.port, "B") as b,
                session_on(r3.port, "C") as c,
            ):
                first = await a.execute("ns", acquire("x", "A"))
                assert first.ok
                denied = await b.execute("ns", acquire("x", "B"))
                assert not denied.ok
                assert [h.session for h in denied.holders] == ["A"]
                result: list[Any] = []

                async def wait_for_it() -> None:
                    result.append(await c.execute("ns", acquire("x", "C"), wait=20.0))

                nursery.start_soon(wait_for_it)
                await trio.sleep(0.3)
                assert not result  # parked
                await a.execute("ns", release("x"))
                while not result:
                    await trio.sleep(0.02)
                assert result[0].ok and result[0].fence > first.fence
            nursery.cancel_scope.cancel()


async def test_session_continues_through_another_replica(etcd1: EtcdCluster) -> None:
    """The replica a holder talked to dies: the holder's session and lock are intact on the
    others -- another session is refused, the holder continues on another replica."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(r1.port, "H") as h:
                granted = await h.execute("ns", acquire("x", "H"))
                assert granted.ok
                r1.kill()
            async with session_on(r2.port, "other") as other:
                denied = await other.execute("ns", acquire("x", "other"))
                assert not denied.ok and [x.session for x in denied.holders] == ["H"]
            async with open_lock_client("127.0.0.1", r2.port) as c:
                page = await c.holders("ns")
                assert [(h.session, h.var, h.fence) for h in page.holders] == [
                    ("H", "x", granted.fence)
                ]
                h2 = c.session(max_age=30.0, session_id="H")
                assert (await h2.execute("ns", release("x"))).ok  # the holder goes on
                taken = await c.session(session_id="other").execute("ns", acquire("x", "o"))
                assert taken.ok and taken.fence > granted.fence
            nursery.cancel_scope.cancel()


async def test_departed_replica_waiter_dropped_queue_moves(etcd1: EtcdCluster) -> None:
    """A waiter parked through a replica that dies is dropped once its lease lapses (a log
    event, the same on every replica); the next waiter in line gets the lock."""
    group = f"g{next(_groups)}"
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1, r2, r3 = [await start(nursery, etcd1, group) for _ in range(3)]
            got: list[Any] = []
            async with session_on(r2.port, "holder") as holder:
                assert (await holder.execute("ns", acquire("x", "holder"))).ok

                lost: list[str] = []

                async def wait_on(port: int, sid: str) -> None:
                    async with session_on(port, sid) as s:
                        try:
                            result = await s.execute("ns", acquire("x", sid), wait=30.0)
                        except ConnectionLost:  # its replica died under it
                            lost.append(sid)
                            return
                        got.append((sid, result))

                nursery.start_soon(wait_on, r1.port, "first")
                await trio.sleep(0.5)
                nursery.start_soon(wait_on, r3.port, "second")
                await trio.sleep(0.5)
                r1.kill()
                # the lease (2 s) lapses and the group drops r1's connections
                while any(r1.replica.rid in r.replica.state.replicas for r in (r2, r3)):
                    await trio.sleep(0.1)
                await holder.execute("ns", release("x"))
                while not got:
                    await trio.sleep(0.02)
                assert [(sid, r.ok) for sid, r in got] == [("second", True)]
                assert lost == ["first"]
            nursery.cancel_scope.cancel()


async def test_two_replicas_hold_the_same_full_state(etcd1: EtcdCluster) -> None:
    """After traffic through both, two replicas that applied the same revisions hold the
    same full state (the determinism of the log, on real etcd)."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(r1.port, "a", 3.0) as a, session_on(r2.port, "b") as b:
                for i in range(30):
                    await a.execute("ns", acquire(f"v{i % 7}", "a"))
                    await b.execute("ns", acquire(f"v{i % 5}", "b"))
                    if i % 4 == 0:
                        await b.execute("ns", release(f"v{i % 5}"))
            await caught_up(r1, r2)
            assert r1.replica.state.entries > 0
            assert r1.replica.state.fingerprint() == r2.replica.state.fingerprint()
            nursery.cancel_scope.cancel()


async def test_late_replica_catches_up_from_a_snapshot(etcd1: EtcdCluster) -> None:
    """Snapshots are written and etcd compacted to them; a replica started afterwards loads
    the snapshot, replays the rest, and holds the same state as the others."""
    group = f"g{next(_groups)}"
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group, replica_snapshot_every=10)
            async with session_on(r1.port, "a") as a:
                for i in range(40):
                    assert (await a.execute("ns", acquire(f"v{i}", "a"))).ok
                while r1.replica.snapshots_written == 0:
                    await trio.sleep(0.1)
                await a.execute("ns", acquire("after", "a"))
                late = await start(nursery, etcd1, group, replica_snapshot_every=10)
                assert late.replica.snapshots_loaded == 1
                assert late.replica.joined_at > 0
                await caught_up(r1, late)
                assert late.replica.state.fingerprint() == r1.replica.state.fingerprint()
            async with session_on(late.port, "b") as b:
                denied = await b.execute("ns", acquire("v3", "b"))
                assert not denied.ok and [h.session for h in denied.holders] == ["a"]
            nursery.cancel_scope.cancel()


async def test_replica_cut_off_from_etcd_answers_unavailable(etcd1: EtcdCluster) -> None:
    """With etcd stopped, a replica cannot commit: the request is not answered from its
    state; the connection gets UNAVAILABLE after the commit timeout, and the client's last
    result tells how long its locks were guaranteed."""
    group = f"g{next(_groups)}"
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group)
            async with open_lock_client("127.0.0.1", r1.port) as c:
                s = c.session(max_age=30.0, session_id="cut")
                held = await s.execute("ns", acquire("x", "cut"))
                assert held.ok and held.valid_until is not None
                etcd1.stop(0)
                try:
                    with pytest.raises(ConnectionLost) as info:
                        await s.execute("ns", acquire("y", "cut"))
                    cause = info.value.__cause__
                    assert isinstance(cause, ServerError)
                    assert cause.code is ErrorCode.UNAVAILABLE
                    assert "cannot reach the group's log" in cause.message
                finally:
                    etcd1.cont(0)
            nursery.cancel_scope.cancel()


async def test_uptime_gate_is_the_replicas_own(etcd1: EtcdCluster) -> None:
    """A contract's minimum uptime is checked against the replica's own process uptime (a
    replica that just started refuses, as a restarted server would), then the group's."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group)
            async with open_lock_client("127.0.0.1", r1.port) as c:
                s = c.session(session_id="u")
                refused = await s.execute("ns", acquire("x", "u"), min_uptime=60.0)
                assert not refused.ok and refused.cause is Cause.MINIMUM_REQUIREMENTS
                r1.replica.started -= 120.0  # as if this replica had run for two minutes
                # the group itself is younger than 60 s: the door refuses it as well
                again = await s.execute("ns", acquire("x", "u"), min_uptime=60.0)
                assert not again.ok and again.cause is Cause.MINIMUM_REQUIREMENTS
                young = await s.execute("ns", acquire("x", "u"), min_uptime=0.001)
                assert young.ok
            nursery.cancel_scope.cancel()


async def test_http_listings_of_a_replica_name_its_own_connections(etcd1: EtcdCluster) -> None:
    """/v1/sessions and /v1/holders on a replica answer from the group's state; a session's
    ``clients`` are the connections open on this replica (200, not a server error)."""
    import http.client
    import json

    def get(port: int, path: str) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            assert response.status == 200
            return json.loads(response.read())
        finally:
            connection.close()

    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(r1.port, "here") as s1, session_on(r2.port, "there") as s2:
                assert (await s1.execute("ns", acquire("a", "here"))).ok
                assert (await s2.execute("ns", acquire("b", "there"))).ok
                await caught_up(r1, r2)
                listing = await trio.to_thread.run_sync(get, r1.port, "/v1/sessions")
                sessions = listing["sessions"]
                listing = await trio.to_thread.run_sync(get, r1.port, "/v1/holders?namespace=ns")
                holders = listing["holders"]
                by_id = {x["session"]: x for x in sessions}
                assert len(by_id["here"]["clients"]) == 1  # its connection is on r1
                assert by_id["there"]["clients"] == []  # on r2: r2's to name
                assert sorted(h["var"] for h in holders) == ["a", "b"]
            nursery.cancel_scope.cancel()


async def test_a_deferred_cleanup_goes_before_the_sessions_next_call(etcd1: EtcdCluster) -> None:
    """A cleanup a recipe could not deliver (``defer_cleanup``) is sent before the session's
    next call, whatever that call is: the lock it held is free afterwards."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1 = await start(nursery, etcd1, group)
            async with session_on(r1.port, "a") as a, session_on(r1.port, "b") as b:
                assert (await a.execute("ns", acquire("x", "a"))).ok
                a.defer_cleanup("ns", release("x"))
                assert not (await b.execute("ns", acquire("x", "b"))).ok  # not sent yet
                assert (await a.execute("ns", acquire("y", "a"))).ok  # sends it first
                assert (await b.execute("ns", acquire("x", "b"))).ok
                assert a._deferred == []
            nursery.cancel_scope.cancel()


async def test_a_replica_whose_lease_may_have_lapsed_delivers_no_grant(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica none of whose keepalives succeeded within the lease TTL (paused, or cut
    off) does not deliver what it applies: a waiter's grant, applied from the log, could be
    one the group has undone since (its session expired while the replica was paused). The
    waiter's connection is closed with UNAVAILABLE instead; the client carries on elsewhere."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(r2.port, "A") as a, session_on(r1.port, "C") as c:
                assert (await a.execute("ns", acquire("x", "A"))).ok
                outcome: list[Any] = []

                async def wait_for_it() -> None:
                    try:
                        outcome.append(await c.execute("ns", acquire("x", "C"), wait=20.0))
                    except ConnectionLost as exc:
                        outcome.append(exc)

                nursery.start_soon(wait_for_it)
                await trio.sleep(0.3)
                assert not outcome  # parked through r1

                async def no_answer(lease: int) -> int:
                    await trio.sleep_forever()
                    raise AssertionError("unreachable")

                # As if r1 had been paused: its last keepalive was asked 10 s ago, and the
                # next one hangs (the lease itself is still alive in etcd for ~2 s).
                monkeypatch.setattr(r1.replica.etcd, "lease_keepalive", no_answer)
                r1.replica._lease_from = trio.current_time() - 10.0
                refused = r1.replica.late_deliveries_refused
                await a.execute("ns", release("x"))  # through r2: C's wait is granted
                while not outcome:
                    await trio.sleep(0.02)
                lost = outcome[0]
                assert isinstance(lost, ConnectionLost), f"delivered: {lost!r}"
                cause = lost.__cause__
                assert isinstance(cause, ServerError) and cause.code is ErrorCode.UNAVAILABLE
                assert r1.replica.late_deliveries_refused > refused
            nursery.cancel_scope.cancel()


async def test_a_replica_shutting_down_never_says_not_executed(etcd1: EtcdCluster) -> None:
    """A replica shut down with a request of its own in flight (here: parked in the group)
    cannot promise that request was not executed, as a single server's SHUTTING_DOWN does:
    its client gets an outcome-unknown error (the fault lab's clock-skew run found a
    compare-and-set told "not executed" that had taken effect)."""
    group = f"g{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group) for _ in range(2)]
            async with session_on(r1.port, "A") as a:
                assert (await a.execute("ns", acquire("x", "A"))).ok
                outcome: list[BaseException] = []

                async def park_on_r2() -> None:
                    async with session_on(r2.port, "C") as c:
                        try:
                            await c.execute("ns", acquire("x", "C"), wait=20.0)
                        except (ConnectionLost, ServerError) as exc:
                            outcome.append(exc)

                nursery.start_soon(park_on_r2)
                while not r2.replica.state.core.waits.by_namespace.get("ns"):
                    await trio.sleep(0.02)
                r2.running.shutdown()
                while not outcome:
                    await trio.sleep(0.02)
            [exc] = outcome
            assert not (isinstance(exc, ServerError) and exc.code is ErrorCode.SHUTTING_DOWN), exc
            assert "not executed" not in str(exc)
            nursery.cancel_scope.cancel()
