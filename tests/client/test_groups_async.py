"""Replicated groups on the async face (docs/client.md#replicated-groups): a group given as
the list of its replicas, failover to the next member when the connection is lost, the
session carried on when the new member's welcome names the group's instance (and reported
lost, RESTARTED, when it names another, as a standalone server's does), replicas learned
from the welcome, parked waits at a failover, groups as shards.

Real servers on 127.0.0.1 in the test's trio run. They are standalone servers: a "group"
here is servers whose welcome says one group's name, instance and replicas (the server's
internal hook, ``lockserver.shell._server.GroupIdentity``), which is all a client sees of a group;
they do not share lock state, so what is checked is the client's side: where it connects,
what it reports, which session id it carries on with, and what it sends."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import trio
from asyncio_support import on_both_loops, on_server
from asyncio_support import until as asyncio_until
from client_support import GroupIdentity, Replica, free_port, start_replica

from client import (
    Assert,
    ConnectionLost,
    DeleteVar,
    ErrorCode,
    LockLost,
    LostReason,
    ServerError,
    ServerUnavailable,
    SetVar,
    open_lock_client,
)
from client._placement import parse_groups, place

NS = "Groups"


async def until(predicate: Any) -> None:
    while not predicate():
        await trio.sleep(0.005)


def waiting(replica: Replica) -> int:
    """Transactions parked on ``replica`` (its statistics)."""
    return int(replica.running.statistics()["waiting"]["waiters"])


def take(var: str) -> list[Assert]:
    return [Assert(SetVar("T", var))]


def release(var: str) -> list[Assert]:
    return [Assert(DeleteVar("T", var))]


async def start_group(
    nursery: trio.Nursery, count: int, name: str = "orders", instance: str = "9f2c41d07a3b55aa"
) -> list[Replica]:
    """``count`` replicas whose welcomes all say group ``name``, ``instance`` and every
    replica's address."""
    ports = [free_port() for _ in range(count)]
    ident = GroupIdentity(name, instance, tuple(f"127.0.0.1:{p}" for p in ports))
    return [await start_replica(nursery, port=p, group=ident) for p in ports]


# --- failover -------------------------------------------------------------------------------


async def test_standalone_servers_as_a_group_fail_over_and_report_the_restart(
    nursery: trio.Nursery,
) -> None:
    """Two standalone servers given as one group: the client connects to the first; when it
    dies the next call connects to the second, whose welcome names another instance, so the
    used session gets LockLost(RESTARTED, no entries) exactly as after a server restart, and
    its keepalive then makes it on the second server."""
    with trio.fail_after(20):
        a = await start_replica(nursery)
        b = await start_replica(nursery)
        async with open_lock_client(servers=[[a.id, b.id]]) as c:
            assert c.servers == (",".join(sorted([a.id, b.id])),)
            assert c.members == (a.id, b.id)
            assert (c.port, c.local_statistics().server) == (a.running.port, a.id)
            s = c.session(keepalive=False)
            assert (await s.execute(NS, take("k"))).ok
            seen: list[LockLost] = []
            s.add_lost_listener(seen.append)
            a.crash()
            await c.ping()
            assert seen == [LockLost(s.id, LostReason.RESTARTED, ())]
            stats = c.local_statistics()
            assert (stats.server, stats.failovers, stats.restarts, stats.connections) == (
                b.id,
                1,
                1,
                2,
            )
            assert (c.host, c.port) == ("127.0.0.1", b.running.port)
            assert c.welcome.group == ""
            await until(lambda: s.id in b.running.engine.sessions)  # the keepalive, after
            await s.end()


async def test_replicas_of_a_group_carry_the_same_session_on(nursery: trio.Nursery) -> None:
    """Two replicas of one group (same instance in their welcomes): when the client's
    replica dies, the next call goes to the other one and nothing is reported lost: the
    session carries on under the same id (the reconnect's keepalive touches it there), and a
    change-feed subscription is made again there under the same id (events of a grant on
    the new replica arrive)."""
    with trio.fail_after(20):
        a, b = await start_group(nursery, 2)
        async with open_lock_client(servers=[[a.id, b.id]]) as c, c.session() as s:
            assert (c.welcome.group, c.welcome.instance) == ("orders", "9f2c41d07a3b55aa")
            assert c.welcome.replicas == (a.id, b.id)
            assert (await s.execute(NS, take("k"))).ok
            subscription = await c.subscribe(NS)
            a.crash()
            await c.ping()
            assert not s.lost
            stats = c.local_statistics()
            assert (stats.server, stats.failovers, stats.restarts) == (b.id, 1, 0)
            assert stats.events_synthetic == 0
            await until(lambda: s.id in b.running.engine.sessions)
            assert (await s.execute(NS, take("after"))).ok
            events = await c.next_feed_events()
            assert [(e.subscription, e.var, e.session) for e in events] == [
                (subscription, "after", s.id)
            ]


@pytest.fixture
async def group_of_two(nursery: trio.Nursery) -> list[Replica]:
    return await start_group(nursery, 2)


@on_both_loops
async def test_failover_carries_the_session_on_both_loops(group_of_two: list[Replica]) -> None:
    """The same failover under trio and under asyncio: the replica dies, the next call goes
    to the other one, the session is not reported lost and its keepalive reaches the new
    replica under the same id."""
    a, b = group_of_two
    with anyio.fail_after(20):
        async with open_lock_client(servers=[[a.id, b.id]]) as c, c.session() as s:
            assert (await s.execute(NS, take("k"))).ok
            on_server(a.crash)
            await c.ping()
            assert not s.lost
            assert c.local_statistics().server == b.id

            def on_b() -> bool:
                return s.id in b.running.engine.sessions

            await asyncio_until(lambda: on_server(on_b))


async def test_a_client_given_one_replica_learns_the_others(nursery: trio.Nursery) -> None:
    """A group given by one of its replicas: the welcome's ``replicas`` adds the others to
    the members (after the configured one), and the client fails over to a learned one."""
    with trio.fail_after(20):
        a, b, c3 = await start_group(nursery, 3)
        async with open_lock_client(servers=[[a.id]]) as c:
            assert c.servers == (a.id,)  # the configured member's id: placement unchanged
            assert c.members == (a.id, b.id, c3.id)
            a.crash()
            await c.ping()
            assert c.local_statistics().server == b.id
            assert c.members == (a.id, b.id, c3.id)  # a configured member is never dropped


async def test_a_plain_server_learns_nothing_and_does_not_fail_over(
    nursery: trio.Nursery,
) -> None:
    """A server not given as a group is the single-server client it always was, even when
    its welcome lists replicas: ``members`` is that server, and once it is gone calls raise
    ServerUnavailable ("not sent") instead of moving to another replica."""
    with trio.fail_after(20):
        a, b = await start_group(nursery, 2)
        for how in ({"port": a.running.port}, {"servers": [a.id]}):
            async with open_lock_client(**how) as c:
                assert c.welcome.replicas == (a.id, b.id)
                assert c.members == (a.id,)
        async with open_lock_client(port=a.running.port) as c:
            a.crash()
            with pytest.raises(ServerUnavailable, match="not sent"):
                await c.ping()
            assert c.local_statistics().server == a.id


async def test_a_reconnect_skips_members_that_are_down(nursery: trio.Nursery) -> None:
    """Members are tried from the one after the lost member, round robin, once each: with
    the second member down, losing the first goes to the third; then losing the third wraps
    round to the first (back again), skipping the second once more."""
    with trio.fail_after(20):
        ports = [free_port() for _ in range(3)]
        ident = GroupIdentity("g", "00000000000000aa", tuple(f"127.0.0.1:{p}" for p in ports))
        first = await start_replica(nursery, port=ports[0], group=ident)
        third = await start_replica(nursery, port=ports[2], group=ident)
        members = [f"127.0.0.1:{p}" for p in ports]
        async with open_lock_client(servers=[members], connect_timeout=2) as c:
            assert c.local_statistics().server == members[0]
            first.crash()
            await c.ping()
            assert c.local_statistics().server == members[2]
            first = await start_replica(nursery, port=ports[0], group=ident)
            third.crash()
            await c.ping()
            stats = c.local_statistics()
            assert (stats.server, stats.failovers, stats.restarts) == (members[0], 2, 0)


async def test_every_member_down_raises_server_unavailable_naming_each() -> None:
    """No member answers: one round, then ServerUnavailable naming every member and its
    error (a group of one member raises that member's own error, as a single server)."""
    with trio.fail_after(20):
        members = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        with pytest.raises(ServerUnavailable) as info:
            async with open_lock_client(servers=[members], connect_timeout=2):
                pass  # pragma: no cover - not connected
        text = str(info.value)
        assert "no member of group" in text
        assert all(f"{m}: cannot connect to {m}" in text for m in members)
        with pytest.raises(ServerUnavailable, match=f"^cannot connect to {members[0]}"):
            async with open_lock_client(servers=[members[:1]], connect_timeout=2):
                pass  # pragma: no cover - not connected


# --- parked waits ---------------------------------------------------------------------------


async def test_a_parked_wait_raises_connection_lost_and_a_resend_queues_at_the_end(
    nursery: trio.Nursery,
) -> None:
    """What the client does today with a wait parked on a replica that dies: the Execute
    raises ConnectionLost (its outcome is unknown; the client never re-sends an Execute by
    itself). Sent again, it goes to the next replica and joins that replica's queue at its
    end: a waiter already queued there is granted first."""
    with trio.fail_after(20):
        a, b = await start_group(nursery, 2)
        async with (
            open_lock_client(port=a.running.port) as on_a,
            open_lock_client(port=b.running.port) as on_b,
            open_lock_client(servers=[[a.id, b.id]]) as group,
        ):
            holder_a, holder_b, first = on_a.session(), on_b.session(), on_b.session()
            assert (await holder_a.execute(NS, take("L"))).ok
            assert (await holder_b.execute(NS, take("L"))).ok
            waiter = group.session()
            outcome: list[Any] = []

            async def wait_on_group() -> None:
                try:
                    outcome.append(await waiter.execute(NS, take("L"), wait=30))
                except ConnectionLost as exc:
                    outcome.append(exc)

            nursery.start_soon(wait_on_group)
            await until(lambda: waiting(a) == 1)
            granted: list[str] = []

            async def wait_first() -> None:
                assert (await first.execute(NS, take("L"), wait=30)).ok
                granted.append("first")
                assert (await first.execute(NS, release("L"))).ok

            nursery.start_soon(wait_first)
            await until(lambda: waiting(b) == 1)
            a.crash()
            await until(lambda: bool(outcome))
            assert isinstance(outcome[0], ConnectionLost)
            again = trio.Event()

            async def resend() -> None:
                assert (await waiter.execute(NS, take("L"), wait=30)).ok
                granted.append("resent")
                again.set()

            nursery.start_soon(resend)
            await until(lambda: waiting(b) == 2)
            assert group.local_statistics().server == b.id
            assert (await holder_b.execute(NS, release("L"))).ok
            await again.wait()
            assert granted == ["first", "resent"]


async def test_a_parked_wait_at_a_graceful_stop_is_refused_not_run(
    nursery: trio.Nursery,
) -> None:
    """A replica that stops gracefully answers the wait parked on it SHUTTING_DOWN (a
    ServerError: it was not run, so sending it again is safe); the next call goes to the
    other replica."""
    with trio.fail_after(20):
        a, b = await start_group(nursery, 2)
        async with (
            open_lock_client(port=a.running.port) as on_a,
            open_lock_client(servers=[[a.id, b.id]]) as group,
        ):
            assert (await on_a.session().execute(NS, take("L"))).ok
            waiter = group.session()
            outcome: list[Any] = []

            async def wait_on_group() -> None:
                try:
                    outcome.append(await waiter.execute(NS, take("L"), wait=30))
                except ServerError as exc:
                    outcome.append(exc)

            nursery.start_soon(wait_on_group)
            await until(lambda: waiting(a) == 1)
            await a.running.aclose()
            await until(lambda: bool(outcome))
            assert isinstance(outcome[0], ServerError)
            assert outcome[0].code is ErrorCode.SHUTTING_DOWN
            assert (await waiter.execute(NS, take("L"), wait=30)).ok
            assert group.local_statistics().server == b.id


# --- groups as shards -----------------------------------------------------------------------


async def test_two_groups_as_shards_fail_over_each_on_its_own(nursery: trio.Nursery) -> None:
    """Two groups beside each other: a namespace lives on the group its id places it on
    (PROTOCOL.md §12 item 4), each group has its own failover, and losing a replica of one
    group moves only that group's connection."""
    with trio.fail_after(20):
        g1 = await start_group(nursery, 2, "one", "00000000000000a1")
        g2 = await start_group(nursery, 2, "two", "00000000000000a2")
        groups = [[r.id for r in g1], [r.id for r in g2]]
        parsed = parse_groups(groups)
        on: dict[str, str] = {}
        i = 0
        while len(on) < 2:
            on.setdefault(place(f"ns-{i}", parsed).id, f"ns-{i}")
            i += 1
        async with open_lock_client(servers=groups) as c:
            assert c.servers == tuple(g.id for g in parsed)
            async with c.session() as s:
                for group in parsed:
                    assert c.server_for(on[group.id]) == group.id
                    assert (await s.execute(on[group.id], take("k"))).ok
                one = await c.shard(g1[1].id)  # any member names its group
                two = await c.shard(parsed[1].id)
                assert one.members == tuple(groups[0]) and two.members == tuple(groups[1])
                assert one.welcome.group == "one" and two.welcome.group == "two"
                g1[0].crash()
                # Once the reader has seen the close, the next Execute goes to the other
                # member (one sent before that would raise ConnectionLost: outcome unknown).
                await until(lambda: one._conn is not None and one._conn.broken is not None)
                assert (await s.execute(on[parsed[0].id], take("again"))).ok
                assert not s.lost
                assert one.local_statistics().server == g1[1].id
                assert two.local_statistics().server == g2[0].id
                stats = c.local_statistics()
                assert (stats.failovers, stats.restarts, stats.server) == (1, 0, "")
                assert sorted(await c.statistics()) == sorted(g.id for g in parsed)
