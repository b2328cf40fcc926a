"""Group membership (issue 33): join with metadata, members (with since and fence), update,
leave; a member id held by another session is refused; watch() reports joins, updates and
leaves with their reasons (left, expired, ended, released) from the change feed; a member
whose session dies leaves by itself and its object reports the loss.

Tests marked ``@on_both_loops`` run under trio and under asyncio (tests/asyncio_support.py);
those that jump trio's MockClock run under trio only.
"""

from __future__ import annotations

import time

import anyio
import pytest
import trio
import trio.testing
from asyncio_support import on_both_loops
from recipes_support import NS, ThreadedServer

from client import AsyncGroup, Group, LockClient, LockLostError, open_lock_client
from client.recipes import GROUP_TABLE, GroupChange
from lockserver import RunningServer


@on_both_loops
async def test_join_members_update_leave(server: RunningServer) -> None:
    """Two members join with metadata; members() lists them in join order with their
    metadata, since and fence; update changes the metadata only; a member id another session
    holds, and a second join from a session already in, are refused (False); leave removes
    the member."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(description="api-1") as a,
            c.session() as b,
        ):
            ga = AsyncGroup(a, NS, "api", member_id="api-1")
            gb = AsyncGroup(b, NS, "api", member_id="api-2")
            before = time.time()
            assert await ga.join({"cap": ["read"]})
            assert await gb.join()
            [m1, m2] = await gb.members()
            assert (m1.member_id, m1.session, m1.metadata) == ("api-1", a.id, {"cap": ["read"]})
            assert m1.description == "api-1" and m1.fence == ga.fence
            assert m1.since is not None and before - 5 < m1.since < time.time() + 5
            assert (m2.member_id, m2.metadata) == ("api-2", None)
            await ga.update({"cap": ["read", "write"]})
            [m1b, _] = await gb.members()
            assert m1b.metadata == {"cap": ["read", "write"]}
            assert (m1b.since, m1b.fence) == (m1.since, m1.fence)
            async with c.session() as x:
                dup = AsyncGroup(x, NS, "api", member_id="api-1")
                assert await dup.join() is False
                assert dup.last_result is not None
                assert dup.last_result.failed_statement == "0:/AssertOp/"
            again = AsyncGroup(a, NS, "api", member_id="other")
            assert await again.join() is False
            assert again.last_result is not None
            assert again.last_result.failed_statement == "1:/IfOp/AbortOp/"
            with pytest.raises(RuntimeError):
                await ga.join()
            assert await ga.leave()
            assert [m.member_id for m in await gb.members()] == ["api-2"]
            with pytest.raises(RuntimeError, match="not a member"):
                await ga.update({})


@on_both_loops
async def test_watch_reports_joins_updates_and_why_members_left(server: RunningServer) -> None:
    """watch() starts with every member as joined, then reports a join, an update, a clean
    leave ("left"), an operator's removal ("released") and a session ended by another
    connection ("ended"), each once, with the members after it."""
    with anyio.fail_after(10):
        async with (
            open_lock_client(port=server.port) as c,
            open_lock_client(port=server.port) as admin,
            c.session() as watcher,
            c.session() as a,
            c.session() as b,
            c.session() as d,
        ):
            ga = AsyncGroup(a, NS, "w", member_id="a")
            assert await ga.join(1)
            changes: list[GroupChange] = []
            async with AsyncGroup(watcher, NS, "w").watch() as feed:
                it = feed.__aiter__()
                changes.append(await it.__anext__())
                gb = AsyncGroup(b, NS, "w", member_id="b")
                assert await gb.join(2)
                changes.append(await it.__anext__())
                await ga.update(10)
                changes.append(await it.__anext__())
                assert await ga.leave()
                changes.append(await it.__anext__())
                await c.release(NS, GROUP_TABLE, "w", session=b.id)
                changes.append(await it.__anext__())
                gd = AsyncGroup(d, NS, "w", member_id="d")
                assert await gd.join()
                changes.append(await it.__anext__())
                assert await admin.end_session(d.id)
                changes.append(await it.__anext__())
            assert [m.member_id for m in changes[0].joined] == ["a"]
            assert [m.member_id for m in changes[1].joined] == ["b"]
            assert [(m.member_id, m.metadata) for m in changes[2].updated] == [("a", 10)]
            assert [(m.member_id, why) for m, why in changes[3].left] == [("a", "left")]
            assert [(m.member_id, why) for m, why in changes[4].left] == [("b", "released")]
            assert [m.member_id for m in changes[5].joined] == ["d"]
            assert [(m.member_id, why) for m, why in changes[6].left] == [("d", "ended")]
            assert changes[6].members == ()
            assert not any(ch.gap for ch in changes)
            assert gb.lost


async def test_a_member_whose_session_expires_leaves_and_is_told(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A member's process stops (no keepalive): at its max age its session expires, it
    leaves the group, the watcher hears why ("expired"), and its ``membership()`` block is
    cancelled (LockLostError). Trio only: it jumps trio's MockClock."""
    with trio.fail_after(30):
        async with (
            open_lock_client(port=server.port) as c,
            c.session(max_age=60) as watcher,
            c.session(max_age=5, keepalive=False) as m,
            AsyncGroup(watcher, NS, "exp").watch() as feed,
        ):
            it = feed.__aiter__()
            assert (await it.__anext__()).members == ()
            with pytest.raises(LockLostError):
                async with AsyncGroup(m, NS, "exp", member_id="m").membership({"x": 1}):
                    assert [j.member_id for j in (await it.__anext__()).joined] == ["m"]
                    await watcher.execute(NS, [])
                    clock.jump(6)
                    await trio.sleep_forever()
            change = await it.__anext__()
            assert [(j.member_id, why) for j, why in change.left] == [("m", "expired")]


def test_sync_group(threaded_server: ThreadedServer[RunningServer]) -> None:
    """The sync face: ``with group.membership(md):``, members(), and watch() as an iterator
    that stops cleanly on close()."""
    with LockClient(port=threaded_server.port) as c, c.session() as a, c.session() as b:
        changes = Group(b, NS, "sync").watch()
        assert next(changes).members == ()
        with Group(a, NS, "sync", member_id="a").membership({"v": 1}) as g:
            assert [m.member_id for m in g.members()] == ["a"]
            assert [m.member_id for m in next(changes).joined] == ["a"]
        assert [(m.member_id, why) for m, why in next(changes).left] == [("a", "left")]
        changes.close()
        assert c._core.feed_sinks == {}
