"""The tooz driver against a replicated group: three replicas sharing one lock state through a
real etcd (lockbench.etcd), coordinators on different replicas (``lockserver://a,b,c``, each
listing the replicas in its own order). A lock taken through one replica excludes a holder on
another; groups and the leader are the same everywhere; when the replica a holder talks to
dies, its coordinator carries on through the next one, its lock intact.

Time is real here (etcd's leases run on its clock); the replicas' leases are the shortest
allowed (2 s)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from support import ThreadedServer
from tooz import coordination
from tooz_support import Make, member

from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started
from lockserver import RunningServer, ServerConfig, serve

pytestmark = pytest.mark.one_build(
    "real etcd and three replicas: the subject is the replicated group, not the build"
)

_groups = itertools.count()


class Replicas:
    """Three replicas of one group, served in one trio run; ``kill(i)`` cancels replica
    ``i`` at once (no goodbye to etcd: its lease lapses as a dead machine's would)."""

    def __init__(self) -> None:
        self.running: list[RunningServer] = []
        self.scopes: list[trio.CancelScope] = []

    def kill(self, i: int) -> None:
        self.scopes[i].cancel()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ThreadedServer[Replicas], list[int]]]:
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    for etcd in started(tmp_path, 1):
        yield from _replicas(etcd)


def _replicas(etcd: EtcdCluster) -> Iterator[tuple[ThreadedServer[Replicas], list[int]]]:
    group = f"tooz-{next(_groups)}"

    async def start(nursery: trio.Nursery) -> Replicas:
        out = Replicas()
        for _ in range(3):
            config = ServerConfig(
                host="127.0.0.1",
                port=0,
                log_level="WARNING",
                replicate="etcd://" + ",".join(etcd.endpoints),
                group=group,
                replica_lease_ttl=2,
            )
            out.running.append(await nursery.start(_serve, config, out))
        return out

    ts: ThreadedServer[Replicas] = ThreadedServer(start).start()
    try:
        yield ts, [r.port for r in ts.server.running]
    finally:
        ts.stop()


async def _serve(config: ServerConfig, out: Replicas, *, task_status: Any) -> None:
    with trio.CancelScope() as scope:
        out.scopes.append(scope)
        await serve(config, task_status=task_status)


def _url(ports: list[int], first: int) -> str:
    order = ports[first:] + ports[:first]
    return "lockserver://" + ",".join(f"127.0.0.1:{p}" for p in order) + "?call_timeout=3"


def test_a_replicated_group_through_tooz(
    replicas: tuple[ThreadedServer[Replicas], list[int]], coordinators: Make
) -> None:
    """Coordinators on replicas 0 and 1 exclude each other's locks, see the same group and
    leader; killing replica 0 moves its coordinator to the next replica with its lock, its
    membership and its leadership intact, and the other still cannot take them."""
    ts, ports = replicas
    a_id, b_id = member(), member()
    a = coordinators(a_id, _url(ports, 0))
    b = coordinators(b_id, _url(ports, 1))
    lock = a.get_lock(b"replicated")
    assert lock.acquire(blocking=False)
    assert not b.get_lock(b"replicated").acquire(blocking=False)
    a.create_group(b"rg").get()
    a.join_group(b"rg", {"where": "replica 0"}).get()
    b.join_group(b"rg").get()
    assert b.get_members(b"rg").get() == {a_id, b_id}
    assert b.get_member_capabilities(b"rg", a_id).get() == {"where": "replica 0"}
    won: list[coordination.LeaderElected] = []
    a.watch_elected_as_leader(b"rg", won.append)
    b.watch_elected_as_leader(b"rg", won.append)
    a.run_watchers()
    b.run_watchers()
    assert [e.member_id for e in won] == [a_id]

    ts.call(ts.server.kill, 0)
    a.heartbeat()  # reconnects to the next replica; the session carries on there
    assert lock.is_still_owner()
    assert not b.get_lock(b"replicated").acquire(blocking=False)
    assert a.get_members(b"rg").get() == {a_id, b_id}
    assert b.get_leader(b"rg").get() == a_id
    b.run_watchers()
    assert [e.member_id for e in won] == [a_id]
    assert lock.release()
    assert b.get_lock(b"replicated").acquire(blocking=False)
