"""Time-driven behaviour under a MockClock running at real speed: session and entry expiry with
LockLost events pushed to the holders' connections, and the handshake and idle timeouts.

Jumps happen outside any fail_after block (a jump would eat its virtual deadline); every
network wait is bounded by its own fail_after.
"""

from __future__ import annotations

import trio
import trio.testing

from protocol import (
    Assert,
    LockLost,
    LostReason,
    Ping,
    SetVar,
)

from ._wire import WireClient, wait_for
from .conftest import start_server

LOCK = Assert(SetVar("locks", "printer", "job"))


async def test_session_expiry_frees_the_lock_and_tells_the_holder(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A session idle past its max age expires: its holder's connection gets
    LockLost(expired) listing the lost entry with its fence, and another client then gets the
    lock."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        holder = await WireClient.connect(server)
        other = await WireClient.connect(server)
        granted = await holder.execute("holder", LOCK, max_age=60)
        assert granted.ok
        assert not (await other.execute("other", LOCK, max_age=600)).ok
    clock.jump(61)
    with trio.fail_after(5):
        event = await holder.event()
        assert event == LockLost(
            "holder", LostReason.EXPIRED, (("ns", "locks", "printer", granted.fence),)
        )
        assert (await other.execute("other", LOCK, max_age=600)).ok
        assert other.events() == []
        assert server.statistics()["server"]["sessions_tracked"] == 1  # only "other"
        # The expired id starts a new, empty session.
        assert not (await holder.execute("holder", LOCK)).ok
        await holder.aclose()
        await other.aclose()


async def test_a_session_kept_alive_does_not_expire(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """Every call refreshes the idle timer: touched every 40 s, a 60 s session lives on."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        assert (await c.execute("s", LOCK, max_age=60)).ok
    for _ in range(3):
        clock.jump(40)
        with trio.fail_after(5):
            assert (await c.execute("s", max_age=60)).ok
    with trio.fail_after(5):
        assert c.events() == []
        assert not (await c.execute("intruder", LOCK)).ok
        await c.aclose()


async def test_expiry_is_pushed_to_every_connection_that_used_the_session(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """Two connections acting in one session both hear of its expiry; a connection that
    never used it hears nothing."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        a = await WireClient.connect(server)
        b = await WireClient.connect(server)
        bystander = await WireClient.connect(server)
        assert (await a.execute("shared", LOCK, max_age=30)).ok
        assert (await b.execute("shared", max_age=30)).ok
    clock.jump(31)
    with trio.fail_after(5):
        assert (await a.event()).reason is LostReason.EXPIRED
        assert (await b.event()).reason is LostReason.EXPIRED
        await bystander.ping()
        assert bystander.events() == []
        for c in (a, b, bystander):
            await c.aclose()


async def test_events_follow_a_resumed_session_to_its_new_connection(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """After a reconnect, the expiry of the resumed session is pushed to the new connection
    (the old one is gone); an expiring session without entries is reported too."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        first = await WireClient.connect(server)
        granted = await first.execute("s", LOCK, max_age=30)
        assert granted.ok
        assert (await first.execute("empty", max_age=30)).ok
        await first.aclose()
        second = await WireClient.connect(server)
        assert (await second.execute("s", max_age=30)).ok
    clock.jump(31)
    with trio.fail_after(5):
        event = await second.event()
        assert event == LockLost(
            "s", LostReason.EXPIRED, (("ns", "locks", "printer", granted.fence),)
        )
        await wait_for(lambda: server.statistics()["server"]["sessions_tracked"] == 0)
        assert server.statistics()["engine"]["sessions_expired"] == 2
        await second.ping()
        assert second.events() == []  # "empty" was never used by this connection
        await second.aclose()


async def test_entry_ttl_expiry_is_pushed(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """An entry with a TTL vanishes on its own: LockLost(ttl) for that entry; the session
    stays alive and keeps receiving events."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        res = await c.execute("s", Assert(SetVar("locks", "lease", ttl=5.0)), max_age=600)
        assert res.ok
    clock.jump(6)
    with trio.fail_after(5):
        event = await c.event()
        assert event == LockLost("s", LostReason.TTL, (("ns", "locks", "lease", res.fence),))
        assert server.statistics()["server"]["sessions_tracked"] == 1
        again = await c.execute("s", Assert(SetVar("locks", "lease", ttl=5.0)), max_age=600)
        assert again.ok
    clock.jump(6)
    with trio.fail_after(5):
        assert (await c.event()).reason is LostReason.TTL
        await c.aclose()


async def test_end_session_by_another_connection_tells_the_holder(
    nursery: trio.Nursery,
) -> None:
    """Ending a session from another connection pushes LockLost(ended) to the connections
    that used it, not to the one that ended it."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        holder = await WireClient.connect(server)
        admin = await WireClient.connect(server)
        granted = await holder.execute("h", LOCK)
        assert granted.ok
        assert (await admin.execute("h")).ok  # the admin uses the session too
        assert await admin.end_session("h")
        event = await holder.event()
        assert event == LockLost(
            "h", LostReason.ENDED, (("ns", "locks", "printer", granted.fence),)
        )
        await admin.ping()
        assert admin.events() == []
        # The holder ending its own session hears no event.
        assert (await holder.execute("h2", Assert(SetVar("locks", "x")))).ok
        assert await holder.end_session("h2")
        await holder.ping()
        assert holder.events() == []
        await holder.aclose()
        await admin.aclose()


async def test_handshake_timeout(nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    """A connection that sends no Hello within handshake_timeout is closed, even if it sends
    other requests meanwhile; a greeted connection is unaffected."""
    server = await start_server(nursery, handshake_timeout=5.0)
    with trio.fail_after(5):
        greeted = await WireClient.connect(server)
        silent = await WireClient.connect(server, hello=False)
        chatty = await WireClient.connect(server, hello=False)
        await chatty.error(Ping(chatty.rid()))
    clock.jump(6)
    with trio.fail_after(5):
        assert await silent.read_until_closed() == []
        assert await chatty.read_until_closed() == []
        await greeted.ping()
        assert server.statistics()["server"]["handshake_timeouts"] == 2
        for c in (greeted, silent, chatty):
            await c.aclose()


async def test_idle_timeout(nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
    """A connection that sends nothing for idle_timeout is closed; one that spoke within it
    stays."""
    server = await start_server(nursery, idle_timeout=30.0)
    with trio.fail_after(5):
        idle = await WireClient.connect(server)
        busy = await WireClient.connect(server)
    clock.jump(20)
    with trio.fail_after(5):
        await busy.ping()
    clock.jump(11)
    with trio.fail_after(5):
        assert await idle.read_until_closed() == []
        await busy.ping()
        assert server.statistics()["server"]["idle_timeouts"] == 1
        await wait_for(lambda: server.statistics()["server"]["connections"] == 1)
        await idle.aclose()
        await busy.aclose()


async def test_zero_timeouts_mean_never(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """idle_timeout = 0 and handshake_timeout = 0 never close a connection."""
    server = await start_server(nursery, idle_timeout=0.0, handshake_timeout=0.0)
    with trio.fail_after(5):
        greeted = await WireClient.connect(server)
        silent = await WireClient.connect(server, hello=False)
    clock.jump(100_000)
    with trio.fail_after(5):
        await greeted.ping()
        await silent.hello()
        await silent.ping()
        await greeted.aclose()
        await silent.aclose()
