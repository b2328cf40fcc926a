"""One async client over several servers (``open_lock_client(servers=[...])``), on trio and on
asyncio: placement and lazy connections, sessions spanning servers (one id, end everywhere,
lost events from any server), batches split by server, a server that is down, and AsyncMutex
over three servers checked by the safety checker."""

from __future__ import annotations

import random

import anyio
import pytest
import trio
from asyncio_support import on_both_loops, on_server
from support import start_server

from client import (
    Assert,
    AsyncMutex,
    BatchError,
    LockClientError,
    LockLost,
    LostReason,
    Result,
    ServerUnavailable,
    SetVar,
    open_lock_client,
)
from client._async_session import AsyncSession, AsyncShardedSession
from client._placement import parse_servers, place
from lockbench.safety import Recorder
from lockserver import RunningServer


@pytest.fixture
async def servers(nursery: trio.Nursery) -> list[RunningServer]:
    return [await start_server(nursery) for _ in range(3)]


def ids(servers: list[RunningServer]) -> list[str]:
    return [f"127.0.0.1:{s.port}" for s in servers]


def one_namespace_on_each(server_ids: list[str]) -> dict[str, str]:
    parsed = parse_servers(server_ids)
    out: dict[str, str] = {}
    i = 0
    while len(out) < len(server_ids):
        out.setdefault(place(f"ns-{i}", parsed).id, f"ns-{i}")
        i += 1
    return out


def take(name: str) -> list[Assert]:
    return [Assert(SetVar("t", name))]


@on_both_loops
async def test_one_server_in_the_list_is_the_host_port_form(servers: list[RunningServer]) -> None:
    async with open_lock_client(servers=ids(servers)[:1]) as client:
        assert client.welcome.version == 1
        async with client.session() as session:
            assert type(session) is AsyncSession
            assert session.server_for("x") == ids(servers)[0]


@on_both_loops
async def test_a_session_spans_servers_and_ends_everywhere(servers: list[RunningServer]) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    with anyio.fail_after(20):
        async with open_lock_client(servers=server_ids) as client:
            assert [on_server(s.statistics)["server"]["connections"] for s in servers] == [0, 0, 0]
            session = client.session()
            assert isinstance(session, AsyncShardedSession)
            for sid in server_ids:
                assert (await session.execute(on[sid], take("v"))).ok
                assert client.server_for(on[sid]) == sid
            assert sorted(session.servers) == sorted(server_ids)
            assert [on_server(s.statistics)["engine"]["sessions"] for s in servers] == [1, 1, 1]
            limits = (await session.welcome_for(on[server_ids[1]])).limits
            assert limits == (await client.shard(server_ids[1])).welcome.limits
            assert await session.end() is True
            assert [on_server(s.statistics)["engine"]["sessions"] for s in servers] == [0, 0, 0]
            assert await session.end() is False
            with pytest.raises(LockClientError, match="one welcome per server"):
                _ = client.welcome
            assert set(await client.statistics()) == set(server_ids)
            assert (await client.ping()).trust <= 1.0


@on_both_loops
async def test_lost_events_from_any_server_reach_the_session(servers: list[RunningServer]) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    with anyio.fail_after(20):
        async with open_lock_client(servers=server_ids) as client, client.session() as session:
            heard: list[LockLost] = []
            session.add_lost_listener(heard.append)
            for sid in server_ids:
                await session.execute(on[sid], take("v"))
            async with open_lock_client(port=servers[2].port) as admin:
                assert await admin.end_session(session.id)
            event = await session.wait_lost()
            assert (event.session_id, event.reason) == (session.id, LostReason.ENDED)
            assert heard == [event]


@on_both_loops
async def test_execute_many_splits_by_server_in_order(servers: list[RunningServer]) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    names = [on[sid] for sid in server_ids] * 2
    random.Random(3).shuffle(names)
    with anyio.fail_after(20):
        async with open_lock_client(servers=server_ids) as client, client.session() as session:
            calls = [(n, take(f"v{i}"), f"tx{i}") for i, n in enumerate(names)]
            results = await session.execute_many(calls)
            assert [r.transaction_id for r in results] == [f"tx{i}" for i in range(len(names))]
            assert all(r.ok for r in results)
            with pytest.raises(TypeError, match=r"calls\[2\]"):
                await session.execute_many([*calls[:2], (names[2], [object()])])
            assert await session.execute_many([]) == []


async def test_a_server_that_is_down_fails_only_its_namespaces(
    servers: list[RunningServer],
) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    down, up = server_ids[1], server_ids[0]
    await servers[1].aclose()
    with trio.fail_after(20):
        async with (
            open_lock_client(servers=server_ids, connect_timeout=2) as client,
            client.session() as session,
        ):
            with pytest.raises(ServerUnavailable) as raised:
                await session.execute(on[down], take("v"))
            assert raised.value.server == down and down in str(raised.value)
            assert (await session.execute(on[up], take("v"))).ok
            with pytest.raises(BatchError) as batch:
                await session.execute_many([(on[up], take("w")), (on[down], take("w"))])
            first, second = batch.value.results
            assert isinstance(first, Result) and first.ok
            assert isinstance(second, ServerUnavailable) and second.server == down
            with pytest.raises(ServerUnavailable, match=down):
                await client.end_session(session.id)


@on_both_loops
async def test_async_mutexes_over_three_servers_never_overlap(
    servers: list[RunningServer],
) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    locks = [(on[sid], f"m{k}") for sid in server_ids for k in range(2)]
    recorder = Recorder()
    with anyio.fail_after(30):
        async with open_lock_client(servers=server_ids) as client:

            async def task(i: int) -> None:
                rng = random.Random(i)
                async with client.session() as session:
                    for _ in range(40):
                        namespace, name = rng.choice(locks)
                        lock = AsyncMutex(session, namespace, name)
                        assert await lock.acquire()
                        assert lock.fence is not None
                        with recorder.hold(f"{namespace}/{name}", "w", lock.fence, f"t{i}"):
                            await anyio.sleep(0)
                        assert await lock.release()

            async with anyio.create_task_group() as tasks:
                for i in range(12):
                    tasks.start_soon(task, i)
    report = recorder.check()
    report.assert_ok()
    assert len(report.holders) == 12
    assert {i.lock.split("/")[0] for i in recorder.intervals} == set(on.values())


async def test_keepalive_keeps_every_part_alive(
    servers: list[RunningServer], clock: trio.testing.MockClock
) -> None:
    """Each server's part pings on its own: past several max ages of (virtual) idleness the
    session lives on every server."""
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    with trio.fail_after(20):
        async with open_lock_client(servers=server_ids) as client:
            session = client.session(max_age=3.0)
            for sid in server_ids:
                await session.execute(on[sid], take("v"))
            for _ in range(4):  # 4 x 1.1 s > max_age: alive only through keepalives
                before = [s.statistics()["engine"]["transactions"] for s in servers]
                clock.jump(1.1)
                while any(
                    s.statistics()["engine"]["transactions"] <= b
                    for s, b in zip(servers, before, strict=True)
                ):
                    await trio.sleep(0.01)
            assert [s.statistics()["engine"]["sessions"] for s in servers] == [1, 1, 1]
            assert not session.lost
            await session.end()


async def test_expiry_on_one_server_reaches_the_session(
    servers: list[RunningServer], clock: trio.testing.MockClock
) -> None:
    server_ids = ids(servers)
    on = one_namespace_on_each(server_ids)
    with trio.fail_after(20):
        async with open_lock_client(servers=server_ids) as client:
            session = client.session(max_age=5.0, keepalive=False)
            for sid in server_ids:
                await session.execute(on[sid], take("v"))
            clock.jump(4.0)
            for sid in server_ids[:2]:  # touch two parts; the third stays idle
                await session.execute(on[sid], [])
            clock.jump(2.0)
            event = await session.wait_lost()
            assert (event.session_id, event.reason) == (session.id, LostReason.EXPIRED)
            assert [s.statistics()["engine"]["sessions"] for s in servers] == [1, 1, 0]
