"""Replicated groups on the sync face (docs/client.md#replicated-groups): failover to the next
member with the session carried on (same instance) or reported lost (another instance),
replicas learned from the welcome, every member down, a parked wait at a failover, and
groups as shards.

Real servers on 127.0.0.1, each in a thread of its own (``ThreadedServer``): standalone
servers whose welcome may say one group's name, instance and replicas (the server's internal
hook), which is all a client sees of a group; they do not share lock state, so what is
checked is the client's side."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from client_support import (
    GroupIdentity,
    Replica,
    ThreadedServer,
    free_port,
    start_replica,
    wait_until,
)

from client import (
    Assert,
    ConnectionLost,
    LockClient,
    LockLost,
    LostReason,
    ServerUnavailable,
    SetVar,
)
from client._placement import parse_groups

NS = "GroupsSync"
Server = ThreadedServer[Replica]


def take(var: str) -> list[Assert]:
    return [Assert(SetVar("T", var))]


def start_threaded(count: int, group: GroupIdentity | None, ports: list[int]) -> list[Server]:
    """``count`` replicas in threads, on ``ports``, with the welcome identity ``group``."""

    def starter(port: int) -> Any:
        async def start(nursery: trio.Nursery) -> Replica:
            return await start_replica(nursery, port=port, group=group)

        return start

    return [ThreadedServer(starter(ports[i])).start() for i in range(count)]


@pytest.fixture
def standalone() -> Iterator[list[Server]]:
    """Two standalone servers (each its own instance, no group)."""
    servers = start_threaded(2, None, [0, 0])
    try:
        yield servers
    finally:
        for ts in servers:
            ts.stop()


@pytest.fixture
def group() -> Iterator[list[Server]]:
    """Two replicas whose welcomes say group "orders", one instance and both addresses."""
    ports = [free_port(), free_port()]
    ident = GroupIdentity("orders", "5e0b7c11d2aa4f03", tuple(f"127.0.0.1:{p}" for p in ports))
    servers = start_threaded(2, ident, ports)
    try:
        yield servers
    finally:
        for ts in servers:
            ts.stop()


def crash(ts: Server) -> None:
    ts.call(ts.server.crash)


def has_session(ts: Server, session_id: str) -> bool:
    return bool(ts.call(lambda: session_id in ts.server.running.engine.sessions))


def test_sync_standalone_servers_as_a_group_fail_over_and_report_the_restart(
    standalone: list[Server],
) -> None:
    """Two standalone servers given as one group: when the first dies the next call
    connects to the second, whose welcome names another instance: the used session gets
    LockLost(RESTARTED, no entries), as after a server restart."""
    a, b = (ts.server.id for ts in standalone)
    with LockClient(servers=[[a, b]], timeout=5) as c:
        assert c.members == (a, b) and c.local_statistics().server == a
        s = c.session(keepalive=False)
        assert s.execute(NS, take("k")).ok
        seen: list[LockLost] = []
        s.add_lost_listener(seen.append)
        crash(standalone[0])
        assert c.ping().uptime >= 0
        assert seen == [LockLost(s.id, LostReason.RESTARTED, ())]
        stats = c.local_statistics()
        assert (stats.server, stats.failovers, stats.restarts) == (b, 1, 1)
        assert f"127.0.0.1:{c.port}" == b
        assert s.end() is True  # re-created (empty) on b by the reconnect's keepalive


def test_sync_replicas_carry_the_session_on_and_are_learned(group: list[Server]) -> None:
    """A client given one replica of a group learns the other from the welcome; when its
    replica dies the next call goes to the learned one, nothing is reported lost, and the
    session carries on under the same id there."""
    a, b = (ts.server.id for ts in group)
    with LockClient(servers=[[a]], timeout=5) as c:
        assert c.servers == (a,) and c.members == (a, b)
        assert (c.welcome.group, c.welcome.replicas) == ("orders", (a, b))
        s = c.session()
        assert s.execute(NS, take("k")).ok
        crash(group[0])
        assert c.ping().uptime >= 0
        assert not s.lost
        stats = c.local_statistics()
        assert (stats.server, stats.failovers, stats.restarts, stats.events_synthetic) == (
            b,
            1,
            0,
            0,
        )
        wait_until(lambda: has_session(group[1], s.id))
        assert s.execute(NS, take("after")).ok
        assert s.end() is True


def test_sync_every_member_down_raises_server_unavailable_naming_each() -> None:
    """The constructor connects at once: with no member answering, one round and then
    ServerUnavailable naming every member."""
    members = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    with pytest.raises(ServerUnavailable, match="no member of group") as info:
        LockClient(servers=[members], connect_timeout=2)
    assert all(f"{m}: cannot connect to {m}" in str(info.value) for m in members)


def test_sync_a_parked_wait_raises_connection_lost_and_a_resend_goes_on(
    group: list[Server],
) -> None:
    """A wait parked on the replica that dies raises ConnectionLost (never re-sent by the
    client); sent again, it runs on the other replica."""
    a, b = (ts.server.id for ts in group)
    with (
        LockClient(servers=[a], timeout=5) as on_a,
        LockClient(servers=[[a, b]], timeout=40) as c,
    ):
        assert on_a.session().execute(NS, take("L")).ok
        waiter = c.session()
        outcome: list[Any] = []

        def wait() -> None:
            try:
                outcome.append(waiter.execute(NS, take("L"), wait=30))
            except ConnectionLost as exc:
                outcome.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()

        def parked() -> bool:
            ts = group[0]
            return bool(ts.call(lambda: ts.server.running.statistics()["waiting"]["waiters"]))

        wait_until(parked)
        crash(group[0])
        thread.join(10)
        assert not thread.is_alive() and isinstance(outcome[0], ConnectionLost)
        assert waiter.execute(NS, take("L"), wait=30).ok
        assert c.local_statistics().server == b


def test_sync_groups_as_shards(group: list[Server], standalone: list[Server]) -> None:
    """A group beside a plain server: ``servers`` lists the group's id and the server's,
    ``repr`` shows the group in brackets, ``shard(member)`` is the group's client, and a
    failover in the group leaves the plain server's connection alone."""
    a, b = (ts.server.id for ts in group)
    plain = standalone[0].server.id
    entries = parse_groups([[b, a], plain])
    with LockClient(servers=[[b, a], plain], timeout=5) as c:
        assert c.servers == (entries[0].id, plain)
        assert repr(c) == f"<LockClient [{entries[0].id}],{plain} open>"
        shard = c.shard(a)
        assert shard is c.shard(entries[0].id) and shard.members == (b, a)
        assert shard.local_statistics().server == b
        other = c.shard(plain)
        other.ping()
        crash(group[1])
        shard.ping()
        assert shard.local_statistics().server == a
        assert other.local_statistics().connections == 1
        assert c.local_statistics().failovers == 1
