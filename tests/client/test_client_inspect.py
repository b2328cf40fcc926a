"""The client's operator pieces (issue 16): the request builders of client/_inspect.py, the
reply kinds and the feed inbox of the Wire, rendering for people and JSON, and the holders a
denial names in both faces (``Result.holders``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
import trio
from support import ThreadedServer

from client import LockClient, open_lock_client
from client._core import ClientCore
from client._inspect import (
    describe_holders,
    iso_utc,
    listing_request,
    pages,
    release_request,
    subscribe_request,
    to_json,
    unsubscribe_request,
)
from client._wire import HOLDERS, RELEASE, RETRY, SESSIONS, SUBSCRIBE, UNSUBSCRIBE, WAITERS, Wire
from lockserver import RunningServer
from protocol import (
    Assert,
    Connection,
    FeedEvent,
    FeedKind,
    ForceRelease,
    HolderInfo,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    Released,
    Reply,
    Role,
    SessionsPage,
    SetVar,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    WaitersPage,
)

HOLDER = HolderInfo(
    "ns", "L", "k", "3f2c1a9e77", "worker-7 pid 4411", "t", None, 1795780985.25, None, 17
)


def decoded(data: bytes) -> Any:
    server = Connection(Role.SERVER)
    server.receive_data(data)
    return server.next_message()


def test_the_builders_frame_exactly_the_protocol_requests() -> None:
    """Each builder's bytes decode, on the server side, to the request it names."""
    assert decoded(listing_request("holders", 1)) == ListHolders(1)
    assert decoded(
        listing_request(
            "holders", 2, "ns", "jobs-", "v", session="s", match="w", cursor="c", limit=1000
        )
    ) == ListHolders(2, ListQuery("ns", "jobs-", "v", "s", "w", "c", 1000))
    assert decoded(listing_request("sessions", 3, match="pid")) == ListSessions(
        3, ListQuery(match="pid")
    )
    assert decoded(listing_request("waiters", 4, "ns")) == ListWaiters(4, ListQuery("ns"))
    with pytest.raises(KeyError):
        listing_request("entries", 5)
    assert decoded(release_request(5, "ns", "L", "k", "s")) == ForceRelease(5, "ns", "L", "k", "s")
    assert decoded(subscribe_request(6, "ns", "L")) == Subscribe(6, "ns", "L")
    assert decoded(unsubscribe_request(7, 6)) == Unsubscribe(7, 6)


def test_the_builders_refuse_what_the_server_would() -> None:
    """A page past 1,000 or a blank namespace fails where the request is built."""
    with pytest.raises(ValueError, match="limit"):
        listing_request("holders", 1, limit=1001)
    with pytest.raises(ValueError, match="blank"):
        subscribe_request(1, " ")


def test_the_wire_resolves_the_operator_replies_and_keeps_feed_events() -> None:
    """Replies of the operator's kinds resolve to their values (pages and Released as they
    are, Subscribed to its id, Unsubscribed to its flag); feed events go to the feed inbox,
    not to the lost events; listings are retried after a reconnect, a release is not."""
    server = Connection(Role.SERVER)
    wire: Wire[str] = Wire(ClientCore("t"))
    page = HoldersPage((HOLDER,), "next")
    answers = [
        (HOLDERS, page),
        (SESSIONS, SessionsPage(())),
        (WAITERS, WaitersPage(())),
        (RELEASE, Released(1, 18)),
        (SUBSCRIBE, Subscribed(5)),
        (UNSUBSCRIBE, Unsubscribed(True)),
    ]
    for rid, (kind, _) in enumerate(answers, 1):
        wire.register(rid, kind, f"w{rid}")
    event = FeedEvent(5, FeedKind.GRANTED, "ns", "L", "k", "s", 17, 1.5)
    data = b"".join(server.send(Reply(rid, body)) for rid, (_, body) in enumerate(answers, 1))
    resolved, lost = wire.feed(data + server.send(event))
    assert [value for _, value, _ in resolved] == [
        page,
        SessionsPage(()),
        WaitersPage(()),
        Released(1, 18),
        5,
        True,
    ]
    assert lost == [] and wire.take_feed() == [event] and wire.take_feed() == []
    wire.register(10, HOLDERS, "h")
    wire.register(11, RELEASE, "r")
    outcomes = {waiter: value for waiter, value, _ in wire.fail_all("gone")}
    assert outcomes["h"] is RETRY and outcomes["r"] is None


def test_rendering_for_people_and_json() -> None:
    """Times render as ISO 8601 UTC; a record becomes a JSON-ready map with the wire's field
    names; the holders of a denial read as one line naming session, description, time and
    fence."""
    assert iso_utc(1795780985.25) == "2026-11-27T12:03:05.250Z"
    as_json = to_json(HOLDER)
    assert as_json["acquired_at"] == "2026-11-27T12:03:05.250Z"
    assert as_json["expires_at"] is None and as_json["session"] == "3f2c1a9e77"
    assert describe_holders((HOLDER,)) == (
        "held by session 3f2c1a9e77 'worker-7 pid 4411' since 12:03:05 UTC, fence 17"
    )
    long_id = HolderInfo("n", "t", "v", "f" * 32, "", None, None, 0.0, None, 1)
    assert (
        describe_holders((long_id,)) == "held by session ffffffff\u2026 since 00:00:00 UTC, fence 1"
    )


def test_pages_follow_cursors_to_the_end() -> None:
    """``pages`` fetches with each page's cursor until a page has none."""
    asked: list[str | None] = []
    book = {None: HoldersPage((HOLDER,), "2"), "2": HoldersPage((HOLDER, HOLDER), None)}

    def fetch(cursor: str | None) -> HoldersPage:
        asked.append(cursor)
        return book[cursor]

    assert len(list(pages(fetch))) == 3 and asked == [None, "2"]


# --- denial holders in both faces ---------------------------------------------------------------


def test_the_sync_face_result_names_the_holders(threaded_server: ThreadedServer[Any]) -> None:
    """LockClient: a grant's Result has no holders; a denied one names the session holding
    the lock, its description, value and fence, with acquired_at in wall-clock time."""
    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        c.session(description="worker-7 pid 4411") as a,
        c.session() as b,
    ):
        ok = a.execute("ns", [Assert(SetVar("L", "k", "ticket"))])
        assert ok.ok and ok.holders == ()
        denied = b.execute("ns", [Assert(SetVar("L", "k"))])
        assert not denied.ok
        [h] = denied.holders
        assert (h.session, h.session_description, h.value, h.fence) == (
            a.id,
            "worker-7 pid 4411",
            "ticket",
            ok.fence,
        )
        assert c.welcome is not None and c.welcome.started_at is not None
        assert h.acquired_at == pytest.approx(c.welcome.started_at + ok.server_uptime)


async def test_the_async_face_result_names_the_holders(server: RunningServer) -> None:
    """AsyncLockClient: the same Result.holders."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(description="holder") as a,
            c.session() as b,
        ):
            ok = await a.execute("ns", [Assert(SetVar("L", "k"))])
            denied = await b.execute("ns", [Assert(SetVar("L", "k"))])
            assert [(h.session, h.fence) for h in denied.holders] == [(a.id, ok.fence)]
            assert denied.holders[0].session_description == "holder"
            assert "holders=" in repr(denied)


async def test_a_force_release_reaches_the_holders_client_as_a_released_loss(
    server: RunningServer,
) -> None:
    """A force-release sent with the client's builder (over a plain connection) is heard by
    the holder's client as a LockLost with reason RELEASED, which its lock recipe treats as a
    loss."""
    from client import AsyncMutex, LostReason
    from protocol import Hello

    with anyio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            m = AsyncMutex(s, "ns", "printer")
            assert await m.acquire()
            stream = await trio.open_tcp_stream("127.0.0.1", server.port)
            async with stream:
                proto = Connection(Role.CLIENT)
                await stream.send_all(proto.send(Hello(1)) + release_request(2, "ns", *m_key()))
                got: list[Any] = []
                while len(got) < 2:
                    proto.receive_data(await stream.receive_some(65536))
                    while (msg := proto.next_message()) is not None:
                        got.append(msg)
                assert got[1] == Reply(2, Released(1, got[1].body.fence))
            while not m.lost:  # the client's reader dispatches the event
                await trio.sleep(0.01)
            assert m.lost_event_info is not None
            assert m.lost_event_info.reason is LostReason.RELEASED


def m_key() -> tuple[str, str]:
    """The table and variable of AsyncMutex(_, "ns", "printer")."""
    from client.recipes import MUTEX_TABLE

    return MUTEX_TABLE, "printer"
