"""One sync client over several servers (``LockClient(servers=[...])``, docs/client.md#several-
servers): placement on the real servers, lazy connections, sessions that span servers (one id,
keepalive, end, expiry and lost events from any server), batches split by server, one server
down and back, and the recipes over three servers checked by the safety checker."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import pytest
import trio.testing
from support import ThreadedServer

from client import (
    Assert,
    BatchError,
    Cause,
    Exists,
    LockClient,
    LockClientError,
    LockLost,
    LostReason,
    Mutex,
    Result,
    ServerUnavailable,
    SetVar,
)
from client._placement import parse_servers, place
from client._sync_session import Session, ShardedSession
from lockbench.safety import Recorder
from lockserver import RunningServer

Servers = list[ThreadedServer[RunningServer]]


@pytest.fixture
def servers() -> Iterator[Servers]:
    started = [ThreadedServer().start() for _ in range(3)]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture
def mock_servers() -> Iterator[Servers]:
    started = [ThreadedServer(clock=trio.testing.MockClock()).start() for _ in range(3)]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def ids(servers: Servers) -> list[str]:
    return [f"127.0.0.1:{s.port}" for s in servers]


def namespaces_on(server_ids: list[str], count: int = 1) -> dict[str, list[str]]:
    """``count`` namespaces that live on each server (PROTOCOL.md §12)."""
    parsed = parse_servers(server_ids)
    out: dict[str, list[str]] = {s: [] for s in server_ids}
    i = 0
    while any(len(v) < count for v in out.values()):
        name = f"ns-{i}"
        where = place(name, parsed).id
        if len(out[where]) < count:
            out[where].append(name)
        i += 1
    return out


def engine_stats(server: ThreadedServer[RunningServer]) -> dict[str, int]:
    stats: dict[str, int] = server.call(lambda: server.server.statistics()["engine"])
    return stats


def connections(server: ThreadedServer[RunningServer]) -> int:
    n: int = server.call(lambda: server.server.statistics()["server"]["connections"])
    return n


def take(name: str) -> list[Assert]:
    return [Assert(SetVar("t", name))]


# --- construction -------------------------------------------------------------------------------


def test_one_server_in_the_list_is_the_host_port_form(servers: Servers) -> None:
    with LockClient(servers=[ids(servers)[0]]) as client:
        assert client.port == servers[0].port and client.welcome.version == 1
        assert client.servers == (ids(servers)[0],)
        with client.session() as session:
            assert type(session) is Session  # no routing layer for one server
            assert client.server_for("anything") == ids(servers)[0]
    with pytest.raises(ServerUnavailable, match="cannot connect"):
        LockClient(servers="127.0.0.1:1", connect_timeout=1)  # connected at once, as today


def test_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="either host and port or servers"):
        LockClient("10.0.0.1", servers=["a:1", "b:1"])
    with pytest.raises(ValueError, match="named twice"):
        LockClient(servers="a:1,A:1")
    with pytest.raises(ValueError, match="empty"):
        LockClient(servers=[])


def test_each_namespace_runs_on_its_server_and_connections_are_lazy(servers: Servers) -> None:
    server_ids = ids(servers)
    with LockClient(servers=server_ids) as client:
        assert [connections(s) for s in servers] == [0, 0, 0]  # nothing opened yet
        names = [f"tenant-{i}" for i in range(30)]
        where = {name: client.server_for(name) for name in names}
        with client.session() as session:
            first = names[0]
            session.execute(first, take("x"))
            assert [connections(s) for s in servers] == [
                int(sid == where[first]) for sid in server_ids
            ]
            for name in names[1:]:
                assert session.execute(name, take("x")).ok
            for sid, server in zip(server_ids, servers, strict=True):
                expected = sum(1 for n in names if where[n] == sid)
                assert engine_stats(server)["namespaces"] == expected
                assert engine_stats(server)["entries"] == expected
                assert connections(server) == 1  # one connection per server, shared


def test_a_session_spans_servers_with_one_id_and_ends_everywhere(servers: Servers) -> None:
    server_ids = ids(servers)
    on = namespaces_on(server_ids)
    with LockClient(servers=server_ids) as client:
        session = client.session(description="spanning")
        assert isinstance(session, ShardedSession)
        for sid in server_ids:
            assert session.execute(on[sid][0], take("v")).ok
            assert session.server_for(on[sid][0]) == sid
        assert sorted(session.servers) == sorted(server_ids)
        for sid, server in zip(server_ids, servers, strict=True):
            assert engine_stats(server)["sessions"] == 1
            with LockClient(port=server.port) as probe, probe.session() as other:
                held = other.execute(on[sid][0], [Assert(Exists("t", "v"))])
                assert held.ok  # the entry is there, under the same session id ...
                refused = other.execute(on[sid][0], take("v"))
                assert not refused.ok  # ... and it is another session's
        assert session.end() is True
        assert [engine_stats(s)["sessions"] for s in servers] == [0, 0, 0]
        assert session.end() is False  # once


def test_lost_events_from_any_server_reach_the_session(servers: Servers) -> None:
    server_ids = ids(servers)
    on = namespaces_on(server_ids)
    with LockClient(servers=server_ids) as client, client.session() as session:
        heard: list[LockLost] = []
        session.add_lost_listener(heard.append)
        for sid in server_ids:
            session.execute(on[sid][0], take("v"))
        victim = servers[1]
        with LockClient(port=victim.port) as admin:
            assert admin.end_session(session.id)
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            client.process_events(0.05)
        assert [e.reason for e in heard] == [LostReason.ENDED]
        assert heard[0].session_id == session.id
        assert session.lost and session.lost_events == tuple(heard)
        # The other servers still hold theirs.
        assert engine_stats(servers[0])["entries"] == 1 == engine_stats(servers[2])["entries"]


def test_expiry_on_one_server_reaches_the_session(mock_servers: Servers) -> None:
    server_ids = ids(mock_servers)
    on = namespaces_on(server_ids)
    with LockClient(servers=server_ids) as client:
        session = client.session(max_age=5.0, keepalive=False)
        for sid in server_ids:
            session.execute(on[sid][0], take("v"))
        mock_servers[2].jump(6.0)  # only this server's clock passes the max age
        heard: list[LockLost] = []
        session.add_lost_listener(heard.append)
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            client.process_events(0.05)
        assert [(e.session_id, e.reason) for e in heard] == [(session.id, LostReason.EXPIRED)]
        assert [engine_stats(s)["sessions"] for s in mock_servers] == [1, 1, 0]


def test_keepalive_runs_on_every_server_the_session_uses(servers: Servers) -> None:
    server_ids = ids(servers)
    on = namespaces_on(server_ids)
    with LockClient(servers=server_ids) as client, client.session(max_age=0.6) as session:
        for sid in server_ids:
            session.execute(on[sid][0], take("v"))
        before = [engine_stats(s)["transactions"] for s in servers]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            now = [engine_stats(s)["transactions"] for s in servers]
            if all(n >= b + 2 for n, b in zip(now, before, strict=True)):
                break
            time.sleep(0.02)
        else:
            pytest.fail(f"keepalives did not reach every server: {before} -> {now}")


def test_execute_many_splits_by_server_and_answers_in_the_callers_order(servers: Servers) -> None:
    server_ids = ids(servers)
    on = namespaces_on(server_ids, count=2)
    names = [n for sid in server_ids for n in on[sid]]
    random.Random(5).shuffle(names)
    with LockClient(servers=server_ids) as client, client.session() as blocker:
        blocker.execute(names[3], take("busy"))
        with client.session() as session:
            calls = [
                (n, take("busy" if i == 3 else f"v{i}"), f"tx{i}") for i, n in enumerate(names)
            ]
            with pytest.raises(TypeError, match=r"calls\[4\]"):
                session.execute_many([*calls[:4], (names[4], ["not a statement"])])
            assert sum(engine_stats(s)["entries"] for s in servers) == 1  # nothing was sent
            results = session.execute_many(calls)
            assert [r.ok for r in results] == [i != 3 for i in range(len(names))]
            assert [r.transaction_id for r in results] == [f"tx{i}" for i in range(len(names))]
            assert session.execute_many([]) == []


def test_one_server_down_fails_only_its_namespaces_and_comes_back(servers: Servers) -> None:
    server_ids = ids(servers)
    on = namespaces_on(server_ids)
    down_id, up_id = server_ids[2], server_ids[0]
    with LockClient(servers=server_ids, connect_timeout=2) as client:
        used = client.session()
        used.execute(on[down_id][0], take("v"))  # a part on the server about to go
        heard: list[LockLost] = []
        used.add_lost_listener(heard.append)
        port = servers[2].port
        servers[2].stop()
        fresh = client.session()
        for session in (used, fresh):
            with pytest.raises(ServerUnavailable) as raised:
                session.execute(on[down_id][0], take("w"))
            assert raised.value.server == down_id and down_id in str(raised.value)
            assert session.execute(on[up_id][0], take(f"w-{session.id}")).ok  # not slowed
        with pytest.raises(BatchError) as batch:
            fresh.execute_many([(on[up_id][0], take("b1")), (on[down_id][0], take("b2"))])
        first, second = batch.value.results
        assert isinstance(first, Result) and first.ok
        assert isinstance(second, ServerUnavailable) and second.server == down_id
        with pytest.raises(ServerUnavailable, match=down_id):
            client.ping()
        # The server comes back (a new instance on the same port): it serves again, and the
        # session that had entries there hears that they are gone.
        servers[2] = ThreadedServer(port=port).start()
        assert fresh.execute(on[down_id][0], take("again")).ok
        # Its reliability contract applies as for one server: it has just started.
        gated = fresh.execute(on[down_id][0], take("gated"), min_uptime=3600)
        assert not gated.ok and gated.cause is Cause.MINIMUM_REQUIREMENTS
        assert used.execute(on[down_id][0], take("v2")).ok
        assert [e.reason for e in heard] == [LostReason.RESTARTED]
        used.end()
        fresh.end()


def test_the_routers_own_calls(servers: Servers) -> None:
    server_ids = ids(servers)
    with LockClient(servers=server_ids) as client:
        assert client.servers == tuple(server_ids)
        assert repr(client) == f"<LockClient {','.join(server_ids)} open>"
        with pytest.raises(LockClientError, match="one welcome per server"):
            _ = client.welcome
        assert client.shard(server_ids[1]).welcome.limits["max_wait"] > 0
        with pytest.raises(ValueError, match="not one of this client's servers"):
            client.shard("127.0.0.1:1")
        pong = client.ping()
        assert pong.trust == min(client.shard(s).ping().trust for s in server_ids)
        stats = client.statistics()
        assert list(stats) == server_ids and all("engine" in v for v in stats.values())
        on = namespaces_on(server_ids)
        with client.session() as session:
            for sid in server_ids:
                session.execute(on[sid][0], take("v"))
            assert client.local_statistics().open_sessions == 1
            assert client.local_statistics().connections == 3
            assert session.welcome_for(on[server_ids[2]][0]).limits == (
                client.shard(server_ids[2]).welcome.limits
            )
            assert client.end_session(session.id) is True  # on every server
            assert [engine_stats(s)["sessions"] for s in servers] == [0, 0, 0]
        assert client.end_session("nobody") is False
    assert client.closed
    with pytest.raises(LockClientError, match="closed"):
        client.session()


def test_mutexes_over_three_servers_never_overlap(servers: Servers) -> None:
    """Recipes over a client of three servers: 12 threads, 3 clients, mutexes whose
    namespaces live on all three servers; no overlap, fences increasing per lock."""
    server_ids = ids(servers)
    on = namespaces_on(server_ids)
    locks = [(on[sid][0], f"m{k}") for sid in server_ids for k in range(2)]
    recorder = Recorder()
    errors: list[BaseException] = []
    clients = [LockClient(servers=server_ids, timeout=20) for _ in range(3)]
    deadline = time.monotonic() + 2.0

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            with clients[i % 3].session() as session:
                for n in range(100):
                    if n and time.monotonic() >= deadline:
                        break
                    namespace, name = rng.choice(locks)
                    with Mutex(session, namespace, name) as lock:
                        assert lock.fence is not None
                        with recorder.hold(f"{namespace}/{name}", "w", lock.fence, f"t{i}"):
                            time.sleep(0)
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        for c in clients:
            c.close()
    assert not errors, errors
    report = recorder.check()
    report.assert_ok()
    assert len(report.holders) == 12
    granted = {i.lock.split("/")[0] for i in recorder.intervals}
    assert granted == {on[sid][0] for sid in server_ids}  # every server served grants
