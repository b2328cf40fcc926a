"""Time in a replicated group can neither leap nor freeze (issue 29, docs/replication.md
"Time"), against a real etcd: one replica whose clock is stepped an hour forward or back while
the group runs (its monotonic clock, through the replica's one clock seam; and the real thing,
a replica process under libfaketime, its wall and monotonic clocks off by an hour and stepped
by another mid-run) expires no session early, and entry TTLs and wait deadlines still fire on
time; the group's uptime follows real time; the step is noticed (a stamp clamped, or the
replica following the group's time again).
A group restarted whole sees the time that passed while it was down (etcd's clock, the
witness), so sessions that were not kept alive expire, and those that were are kept.

Time is real here (etcd's leases and clock): every test is bounded by ``trio.fail_after`` (or
a deadline) and the bounds are generous for a loaded 2-core machine: "on time" is checked as
never early, and late by at most a few seconds."""

from __future__ import annotations

import contextlib
import itertools
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from client import Assert, LockClient, LockClientError, SetVar, open_lock_client
from lockbench.etcd import EtcdCluster
from lockbench.replicas import FAKETIME_LIBRARY, ReplicaGroup
from lockserver.replication._group import CLOCK_WINDOW

from .test_group_attacks import NEW, repl, secret_file, start
from .test_replicas import acquire, release, session_on

_groups = itertools.count()
TOUCH = release("untouched")  # succeeds, and uses the session (a keepalive)


async def expiry_of_a_ttl(port: int, ttl: float) -> float:
    """Real seconds from setting an entry of ``ttl`` through ``port`` until it is gone."""
    async with session_on(port, f"ttl{time.monotonic_ns()}", 60.0) as s:
        begun = time.monotonic()
        result = await s.execute("ns", [Assert(SetVar("T", "e", "v", ttl=ttl))])
        assert result.ok
        async with open_lock_client("127.0.0.1", port) as c:
            while True:
                page = await c.holders("ns", "T")
                if not page.holders:
                    return time.monotonic() - begun
                await trio.sleep(0.05)


async def end_of_a_wait(port: int, wait: float) -> float:
    """Real seconds a wait of ``wait`` seconds on a held lock takes to be answered."""
    async with session_on(port, "waiter", 60.0) as s:
        begun = time.monotonic()
        result = await s.execute("ns", acquire("x", "waiter"), wait=wait)
        assert not result.ok  # the holder keeps x
        return time.monotonic() - begun


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["ahead", "behind"])
async def test_a_replicas_clock_stepped_an_hour_expires_nothing_early(
    etcd1: EtcdCluster, tmp_path: Path, step: float
) -> None:
    """Three replicas; one's clock is stepped an hour mid-run while its clients keep it
    proposing: the holder's session (max age 3 s, kept alive through another replica) is
    never lost, the group's uptime follows real time (a leap of one window at most), a TTL
    and a wait deadline set afterwards fire on time, and a clock ahead is clamped and
    counted (a clock behind just counts for nothing until the replica follows the group)."""
    group = f"c{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, secret) for _ in range(3)]
            stepped = rs[2].replica
            skew = [0.0]
            stepped.clock = lambda: trio.current_time() + skew[0]
            stop = trio.Event()

            async def traffic() -> None:  # keeps the stepped replica proposing
                async with session_on(rs[2].port, "busy", 30.0) as busy:
                    while not stop.is_set():
                        assert (await busy.execute("ns", acquire("z", "busy"))).ok
                        assert (await busy.execute("ns", release("z"))).ok

            nursery.start_soon(traffic)
            async with session_on(rs[0].port, "holder", 3.0) as holder:
                assert (await holder.execute("ns", acquire("x", "holder"))).ok
                async with open_lock_client("127.0.0.1", rs[1].port) as c:
                    up0, t0 = (await c.ping()).uptime, time.monotonic()
                    for i in range(16):
                        if i == 3:
                            skew[0] = step
                        await trio.sleep(0.4)
                        assert (await holder.execute("ns", TOUCH)).ok
                    up1, t1 = (await c.ping()).uptime, time.monotonic()
                assert up1 - up0 <= (t1 - t0) + CLOCK_WINDOW + 0.5
                assert up1 - up0 >= (t1 - t0) - 2.0  # and it did not freeze
                assert holder.lost_events == ()
                if step > 0:  # it noticed: its stamp was clamped, or it applied an entry first
                    assert stepped.clock_resets + repl(rs[0])["clamped_stamps"] >= 1
                assert stepped.group_now() - stepped.state.now < CLOCK_WINDOW
                ttl = await expiry_of_a_ttl(rs[1].port, 2.0)
                assert 2.0 - 0.05 <= ttl <= 2.0 + 3.0
                waited = await end_of_a_wait(rs[2].port, 2.0)
                assert 2.0 - 0.05 <= waited <= 2.0 + 3.0
                assert holder.lost_events == ()
                async with open_lock_client("127.0.0.1", rs[0].port) as c:
                    page = await c.holders("ns", "L", "x")
                    assert [h.session for h in page.holders] == ["holder"]
            stop.set()
            nursery.cancel_scope.cancel()


async def test_a_group_restarted_whole_sees_the_time_that_passed(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """Both replicas killed, the group down for 6 s, one started again: the time etcd counted
    on the witness lease passes at once (a jump, counted), so the session that was not kept
    alive (max age 3 s) has expired and its lock is free, while the one with a max age of
    60 s still holds; the group's uptime counts the time it was down."""
    group = f"c{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, secret) for _ in range(2)]
            async with session_on(rs[0].port, "short", 3.0) as short:
                assert (await short.execute("ns", acquire("a", "short"))).ok
            async with session_on(rs[0].port, "long", 60.0) as long:
                assert (await long.execute("ns", acquire("b", "long"))).ok
            with trio.fail_after(10):
                while any(h.replica.state.witness is None for h in rs):
                    await trio.sleep(0.1)
            async with open_lock_client("127.0.0.1", rs[0].port) as c:
                up0 = (await c.ping()).uptime
            for h in rs:
                h.kill()
            down = time.monotonic()
            await trio.sleep(6.0)
            back = await start(nursery, etcd1, group, secret)
            with trio.fail_after(10):
                while back.replica.state.jumps == 0:
                    await trio.sleep(0.05)
            assert repl(back)["time_jumps"] == 1
            assert back.replica.state.jumped >= 6.0 - 3.0
            async with session_on(back.port, "other") as other:
                assert (await other.execute("ns", acquire("a", "other"))).ok  # short expired
                denied = await other.execute("ns", acquire("b", "other"))
                assert not denied.ok and [h.session for h in denied.holders] == ["long"]
            async with open_lock_client("127.0.0.1", back.port) as c:
                up1 = (await c.ping()).uptime
            assert up1 - up0 >= (time.monotonic() - down) - 4.0
            assert up1 - up0 <= (time.monotonic() - down) + 2.0
            nursery.cancel_scope.cancel()


@pytest.mark.skipif(FAKETIME_LIBRARY is None, reason="libfaketime is not installed (faketime)")
def test_a_replica_process_an_hour_ahead_then_stepped_expires_nothing_early(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """The issue's case, for real: a third replica joins a healthy group with its clocks
    (wall and monotonic, libfaketime) an hour ahead; then they are stepped another hour
    mid-run; then back by two (a monotonic clock going back stalls that process's timers: it
    loses its place as a paused replica would, and comes back). Through it all, with traffic
    through that replica, the holder's session (max age 4 s, kept alive through another
    replica) is never lost and the group's uptime follows real time."""
    with ReplicaGroup(
        etcd1.endpoints,
        tmp_path / "replicas",
        n=3,
        group=f"f{next(_groups)}",
        secret=NEW,
        faketime={2},
    ) as g:
        g.step_clock(2, 3600)
        g.start([0, 1])
        g.start([2])  # joins with its clocks an hour ahead
        a0, _, a2 = g.addresses
        lost: list[Any] = []
        with (
            LockClient(servers=[[a0]], timeout=10) as c0,
            LockClient(servers=[[a2, a0]], timeout=10) as c2,
            c0.session(max_age=4.0, session_id="holder") as holder,
            c2.session(max_age=10.0, session_id="busy") as busy,
        ):
            holder.add_lost_listener(lost.append)
            assert holder.execute("ns", acquire("x", "holder")).ok
            up0, t0 = c0.ping().uptime, time.monotonic()
            steps = {15: 7200, 30: 0}
            noticed = 0
            for i in range(45):
                if i in steps:
                    g.step_clock(2, steps[i])
                if i == 29:  # the step ahead: clamped, or followed by the replica itself
                    with (
                        contextlib.suppress(LockClientError),
                        LockClient(servers=[[a2]], timeout=5) as c,
                    ):
                        r2 = c.statistics()["replication"]
                        noticed = r2["clamped_stamps"] + r2["clock_resets"]
                with contextlib.suppress(LockClientError):  # its replica may reset it
                    busy.execute("ns", acquire("z", "busy"))
                    busy.execute("ns", release("z"))
                assert holder.execute("ns", TOUCH).ok
                time.sleep(0.2)
            up1, t1 = c0.ping().uptime, time.monotonic()
            stats = c0.statistics()["replication"]
            assert [h.session for h in c0.holders("ns", "L", "x").holders] == ["holder"]
        assert lost == []
        assert up1 - up0 <= (t1 - t0) + 2 * CLOCK_WINDOW
        assert up1 - up0 >= (t1 - t0) - 3.0
        assert noticed >= 1 or stats["clamped_stamps"] >= 1, stats
        text = g.replicas[0].log_tail(200)
        assert "Traceback" not in text
