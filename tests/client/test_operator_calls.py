"""The operator's calls on both client faces (``holders``, ``sessions``, ``waiters``,
``release``, ``subscribe`` / ``feed_events`` / ``unsubscribe``), on one server and on a client of
three servers: paging with the router's cursor through every server, force-release heard as a
``released`` loss, feed events with the router's subscription ids."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import trio
from support import ThreadedServer, start_server

from client import (
    Assert,
    LockClient,
    LockLost,
    LostReason,
    SetVar,
    open_lock_client,
)
from client._placement import parse_servers, place
from lockserver import RunningServer


@pytest.fixture
def servers() -> Iterator[list[ThreadedServer[RunningServer]]]:
    started = [ThreadedServer().start() for _ in range(3)]
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def namespaces_on(server_ids: list[str]) -> dict[str, str]:
    parsed = parse_servers(server_ids)
    out: dict[str, str] = {}
    i = 0
    while len(out) < len(server_ids):
        out.setdefault(place(f"ops-{i}", parsed).id, f"ops-{i}")
        i += 1
    return out


def test_listings_page_through_every_server(servers: list[ThreadedServer[RunningServer]]) -> None:
    server_ids = [f"127.0.0.1:{s.port}" for s in servers]
    on = namespaces_on(server_ids)
    with LockClient(servers=server_ids) as client, client.session(description="w-7") as session:
        for sid in server_ids:  # 3 entries on each server
            for k in range(3):
                session.execute(on[sid], [Assert(SetVar("jobs", f"v{k}"))])
        seen = []
        cursors = []
        cursor = None
        while True:
            page = client.holders(cursor=cursor, limit=2)
            seen += [(h.namespace, h.var) for h in page.holders]
            cursors.append(page.cursor)
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(seen) == sorted((on[sid], f"v{k}") for sid in server_ids for k in range(3))
        assert len(cursors) >= 6  # 2 pages on each of 3 servers (at least)
        assert all(
            h.session_description == "w-7" for h in client.holders(on[server_ids[1]]).holders
        )
        one = client.holders(on[server_ids[2]], "jobs", "v1")
        assert [(h.namespace, h.var, h.session) for h in one.holders] == [
            (on[server_ids[2]], "v1", session.id)
        ]
        assert one.cursor is None
        sessions = client.sessions(match="w-7")
        assert [s.session for s in sessions.sessions] == [session.id]
        assert client.waiters().waiters == ()
        with pytest.raises(ValueError, match="not a cursor of this client's listings"):
            client.holders(cursor="7~x")


def test_release_is_heard_as_released_and_feed_events_carry_our_ids(
    servers: list[ThreadedServer[RunningServer]],
) -> None:
    server_ids = [f"127.0.0.1:{s.port}" for s in servers]
    on = namespaces_on(server_ids)
    ns = on[server_ids[1]]
    with LockClient(servers=server_ids) as watcher, LockClient(servers=server_ids) as client:
        sub = watcher.subscribe(ns)
        session = client.session()
        heard: list[LockLost] = []
        session.add_lost_listener(heard.append)
        session.execute(ns, [Assert(SetVar("jobs", "nightly"))])
        released = watcher.release(ns, "jobs", "nightly")
        assert released.entries == 1 and released.fence > 0
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            client.process_events(0.05)
        assert [e.reason for e in heard] == [LostReason.RELEASED]
        events = []
        while len(events) < 2 and time.monotonic() < deadline:
            watcher.process_events(0.05)
            events += watcher.feed_events()
        assert [(e.kind, e.var, e.subscription, e.reason) for e in events][:2] == [
            ("granted", "nightly", sub, None),
            ("lost", "nightly", sub, "released"),  # a force-release: lost, reason released
        ]
        assert watcher.unsubscribe(sub) is True
        assert watcher.unsubscribe(sub) is False
        assert watcher.release(ns, "jobs", "nightly").entries == 0


async def test_async_face_operator_calls(nursery: trio.Nursery) -> None:
    server = await start_server(nursery)
    with trio.fail_after(20):
        async with (
            open_lock_client(port=server.port) as admin,
            open_lock_client(port=server.port) as client,
            client.session(description="async-holder") as session,
        ):
            sub = await admin.subscribe("ns", "t")
            await session.execute("ns", [Assert(SetVar("t", "a"))])
            await session.execute("ns", [Assert(SetVar("other", "b"))])
            page = await admin.holders("ns")
            assert sorted(h.var for h in page.holders) == ["a", "b"]
            assert (await admin.sessions(session=session.id)).sessions[0].entries == 2
            assert (await admin.waiters("ns")).waiters == ()
            events = await admin.next_feed_events()  # only table t: the grant of a
            assert [(e.kind, e.table, e.var, e.subscription) for e in events] == [
                ("granted", "t", "a", sub)
            ]
            assert (await admin.release("ns", "t", "a")).entries == 1
            lost = await session.wait_lost()
            assert lost.reason is LostReason.RELEASED
            assert [(e.kind, e.reason) for e in await admin.next_feed_events()] == [
                ("lost", "released")
            ]
            assert await admin.unsubscribe(sub) is True


async def test_async_router_listing_and_release(nursery: trio.Nursery) -> None:
    servers = [await start_server(nursery) for _ in range(2)]
    server_ids = [f"127.0.0.1:{s.port}" for s in servers]
    on = namespaces_on(server_ids)
    with trio.fail_after(20):
        async with (
            open_lock_client(servers=server_ids) as client,
            client.session() as session,
        ):
            sub = await client.subscribe(on[server_ids[1]])
            for sid in server_ids:
                await session.execute(on[sid], [Assert(SetVar("t", "x"))])
            first = await client.holders(limit=1)
            second = await client.holders(cursor=first.cursor, limit=1)
            assert first.cursor is not None and second.cursor is None
            assert {h.namespace for h in (*first.holders, *second.holders)} == set(on.values())
            events = await client.next_feed_events()
            assert [(e.kind, e.subscription) for e in events] == [("granted", sub)]
            assert (await client.release(on[server_ids[0]], "t", "x")).entries == 1


def test_a_subscription_outlives_a_reconnect_with_its_id() -> None:
    """The server restarts (a new connection after the drop): the client subscribes again by
    itself, under the same id, before anything else goes out; later events arrive."""
    first = ThreadedServer().start()
    port = first.port
    with LockClient(port=port) as watcher:
        sub = watcher.subscribe("ns")
        first.stop()
        second = ThreadedServer(port=port).start()
        try:
            watcher.ping()  # reconnects; the subscription goes out again with it
            assert watcher.local_statistics().connections == 2
            with LockClient(port=port) as client, client.session() as session:
                session.execute("ns", [Assert(SetVar("t", "after"))])
            events = []
            deadline = time.monotonic() + 10
            while not events and time.monotonic() < deadline:
                watcher.process_events(0.05)
                events = watcher.feed_events()
            assert [(e.kind, e.var, e.subscription) for e in events][:1] == [
                ("granted", "after", sub)
            ]
            assert watcher.unsubscribe(sub) is True  # the server knows it under that id
        finally:
            second.stop()


async def test_async_subscription_outlives_a_reconnect(nursery: trio.Nursery) -> None:
    first = await start_server(nursery)
    port = first.port
    with trio.fail_after(20):
        async with open_lock_client(port=port) as watcher:
            sub = await watcher.subscribe("ns")
            await first.aclose()
            await start_server(nursery, port=port)
            with trio.move_on_after(5):
                while watcher.local_statistics().connections < 2:
                    try:
                        await watcher.ping()
                    except Exception:  # the drop is noticed by the first call or two
                        await trio.sleep(0.05)
            assert watcher.local_statistics().connections == 2
            async with open_lock_client(port=port) as client, client.session() as session:
                await session.execute("ns", [Assert(SetVar("t", "after"))])
            events = await watcher.next_feed_events()
            assert [(e.kind, e.var, e.subscription) for e in events][:1] == [
                ("granted", "after", sub)
            ]
