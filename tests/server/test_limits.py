"""Every limit at and past its bound, with the server and another client carrying on."""

from __future__ import annotations

import trio

from lockserver import RunningServer
from protocol import (
    TRUE,
    Assert,
    DeleteVar,
    ErrorCode,
    ErrorReply,
    Not,
    Ping,
    SelectConstantValue,
    SetVar,
)

from ._wire import WireClient, frame_of_size, wait_for
from .conftest import start_server


async def _bystander_ok(server: RunningServer) -> None:
    async with await WireClient.connect(server) as other:
        await other.ping()


async def test_max_frame_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """A frame of exactly max_frame bytes is served; one byte more gets FRAME_TOO_LARGE and
    the connection is closed; another client is unaffected."""
    server = await start_server(nursery, max_frame=4096)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            data, rid = frame_of_size(c, 4096)
            await c.send_raw(data)
            reply = await c.reply(rid)
            assert not isinstance(reply, ErrorReply)
            data, rid = frame_of_size(c, 4097)
            await c.send_raw(data)
            messages = await c.read_until_closed()
        assert [m.code for m in messages] == [ErrorCode.FRAME_TOO_LARGE]  # type: ignore[union-attr]
        await _bystander_ok(server)


async def test_max_ops_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """max_ops nodes are accepted, one more is TOO_MANY_OPS; the connection stays usable and
    nothing ran."""
    server = await start_server(nursery, max_ops=10)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            ok = await c.execute("s", *[SelectConstantValue(f"k{i}", i) for i in range(10)])
            assert ok.ok and len(ok.data) == 10
            before = server.engine.statistics(trio.current_time()).transactions
            err = await c.error(
                c.execute_message("s", [SelectConstantValue(f"k{i}", i) for i in range(11)])
            )
            assert err.code is ErrorCode.TOO_MANY_OPS
            assert server.engine.statistics(trio.current_time()).transactions == before
            # Nesting counts too: Assert(Not(...)) is several nodes.
            deep = Assert(Not(Not(Not(Not(Not(Not(Not(Not(Not(TRUE))))))))))  # 11 nodes
            err = await c.error(c.execute_message("s", [deep]))
            assert err.code in (ErrorCode.TOO_MANY_OPS, ErrorCode.TREE_TOO_DEEP)
            assert (await c.execute("s", Assert(TRUE))).ok
        await _bystander_ok(server)


async def test_max_depth_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """A tree max_depth levels deep is accepted, one level more is TREE_TOO_DEEP; the
    connection stays usable."""
    server = await start_server(nursery, max_depth=5)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            # Assert is level 1, each Not one more, TRUE the last.
            at_bound = Assert(Not(Not(Not(TRUE))))  # 5 levels
            res = await c.execute("s", at_bound)
            assert res.ok is False and res.failed_statement == "0:/AssertOp/"
            past = Assert(Not(Not(Not(Not(TRUE)))))  # 6 levels
            err = await c.error(c.execute_message("s", [past]))
            assert err.code is ErrorCode.TREE_TOO_DEEP
            assert (await c.execute("s", Assert(TRUE))).ok
        await _bystander_ok(server)


async def test_max_connections_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """max_connections clients are served; the next one gets TOO_MANY_CONNECTIONS and is
    closed cleanly; the others are unaffected; a slot freed is usable again."""
    server = await start_server(nursery, max_connections=3)
    with trio.fail_after(5):
        clients = [await WireClient.connect(server) for _ in range(3)]
        extra = await WireClient.connect(server, hello=False)
        await extra.send_raw(b"")  # nothing: the refusal needs no request
        messages = await extra.read_until_closed()
        assert len(messages) == 1
        assert isinstance(messages[0], ErrorReply)
        assert messages[0].code is ErrorCode.TOO_MANY_CONNECTIONS
        assert messages[0].request_id is None
        await extra.aclose()
        for c in clients:
            await c.ping()
        assert server.statistics()["server"]["connections_refused"] == 1
        await clients.pop().aclose()
        await wait_for(lambda: server.statistics()["server"]["connections"] == 2)
        async with await WireClient.connect(server) as again:
            await again.ping()
        for c in clients:
            await c.ping()
            await c.aclose()


async def test_refused_connection_that_already_sent_hello(nursery: trio.Nursery) -> None:
    """A refused client that already sent its Hello still reads the refusal (no reset)."""
    server = await start_server(nursery, max_connections=1)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as first:
            extra = await WireClient.connect(server, hello=False)
            await extra.send(*[Ping(i) for i in range(1, 200)])
            messages = await extra.read_until_closed()
            assert [m.code for m in messages] == [ErrorCode.TOO_MANY_CONNECTIONS]  # type: ignore[union-attr]
            await extra.aclose()
            await first.ping()


async def test_max_sessions_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """max_sessions sessions live; a new one is TOO_MANY_SESSIONS (nothing created);
    existing sessions keep working; ending one makes room."""
    server = await start_server(nursery, max_sessions=3)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c, await WireClient.connect(server) as d:
            for i in range(3):
                assert (await c.execute(f"s{i}", Assert(SetVar("t", f"v{i}")))).ok
            err = await d.error(d.execute_message("s3", [Assert(SetVar("t", "v3"))]))
            assert err.code is ErrorCode.TOO_MANY_SESSIONS
            assert server.engine.statistics(trio.current_time()).sessions == 3
            assert (await d.execute("s0", Assert(SetVar("t", "other")))).ok
            assert await c.end_session("s1")
            assert (await d.execute("s3", Assert(SetVar("t", "v3")))).ok


async def test_max_entries_per_session_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """A session holds up to max_entries_per_session entries; the next SetVar fails the whole
    transaction with TOO_MANY_ENTRIES and rolls it back; other sessions carry on."""
    server = await start_server(nursery, max_entries_per_session=2)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c, await WireClient.connect(server) as d:
            assert (await c.execute("s", Assert(SetVar("t", "a")), Assert(SetVar("t", "b")))).ok
            err = await c.error(
                c.execute_message("s", [SelectConstantValue("x", 1), Assert(SetVar("t", "c"))])
            )
            assert err.code is ErrorCode.TOO_MANY_ENTRIES
            assert "max_entries_per_session" in err.message
            assert server.engine.statistics(trio.current_time()).entries == 2
            assert (await d.execute("other", Assert(SetVar("t", "c")))).ok
            await c.ping()
            freed = await c.execute("s", Assert(DeleteVar("t", "a")), Assert(SetVar("t", "d")))
            assert freed.ok


async def test_max_entries_at_and_past_the_bound(nursery: trio.Nursery) -> None:
    """The server holds up to max_entries entries; past it any session's SetVar is
    TOO_MANY_ENTRIES; releasing an entry makes room."""
    server = await start_server(nursery, max_entries=3)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c, await WireClient.connect(server) as d:
            assert (await c.execute("a", Assert(SetVar("t", "1")), Assert(SetVar("t", "2")))).ok
            assert (await d.execute("b", Assert(SetVar("t", "3")))).ok
            err = await d.error(d.execute_message("b", [Assert(SetVar("t", "4"))]))
            assert err.code is ErrorCode.TOO_MANY_ENTRIES
            assert "max_entries" in err.message
            await c.ping()
            assert await c.end_session("a")
            assert (await d.execute("b", Assert(SetVar("t", "4")))).ok
