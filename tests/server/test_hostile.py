"""Issue 14's attacks on a real server (127.0.0.1, raw frames where the client library would
refuse to send them): items 1, 2, 4 and 6. Each test reproduces the attack as the issue
describes it and pins the fixed behaviour."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import pytest
import trio
import trio.testing
from support import PoisoningDoor, poisoned_setvar

from lockserver import RunningServer
from lockserver._auth import TokenSpec
from protocol import (
    DEFAULT_MAX_FRAME,
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    ErrorCode,
    ErrorReply,
    Exists,
    GetStatistics,
    Hello,
    LockLost,
    LostReason,
    Not,
    Ping,
    Reply,
    SelectVarValue,
    SetVar,
    TransactionResult,
    frame,
    pack,
)

from ._wire import WireClient, wait_for
from .conftest import start_server

LOCK = Assert(SetVar("locks", "printer", "ticket"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))


def raw_execute(rid: int, statements: list[Any], session: str = "s", **fields: Any) -> bytes:
    wire = {
        "type": "execute",
        "id": rid,
        "session": session,
        "namespace": "ns",
        "statements": statements,
        **fields,
    }
    return frame(pack(wire))


# --- item 1: a tiny period, and a waiter that crashes ---------------------------------------


@pytest.mark.parametrize("period", [1e-300, 5e-324])
async def test_a_tiny_period_is_refused_and_the_connection_stays(
    server: RunningServer, period: float
) -> None:
    """SetVar(period=1e-300) made floor(inf) fail in the engine: INTERNAL_ERROR and a closed
    connection. Now the decoder refuses it (INVALID_TRANSACTION) and the connection serves
    the next request."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            node = ["SetVar", "t", "v", None, None, None, None, period]
            await c.send_raw(raw_execute(5, [["Assert", node]]))
            err = await c.reply(5)
            assert isinstance(err, ErrorReply)
            assert err.code is ErrorCode.INVALID_TRANSACTION
            assert "period" in err.message
            await c.ping()
            assert server.engine.entry_count == 0


async def test_a_crashing_waiter_loses_no_other_answer_and_closes_only_its_connection(
    nursery: trio.Nursery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The poisoned variable: a parked transaction whose re-run hits a bug (here injected:
    the server's validation now stops the issue's tiny period) used to make every release of
    the variable fail with INTERNAL_ERROR although it committed, and to lose the answer of a
    waiter granted in the same pass. Now the release is answered OK, the other waiter gets
    its grant, the bad waiter gets INTERNAL_ERROR and only its connection closes."""
    server = await start_server(nursery)
    # Its first run fails on the held lock (and parks); a re-run passes that and hits the bug.
    rerun_bug = [Assert(Not(Exists("locks", "printer"))), Assert(poisoned_setvar())]
    monkeypatch.setattr(
        server._shell.requests, "core", PoisoningDoor(server._shell.requests.core, "bad", rerun_bug)
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(trio.fail_after(10))
        holder = await stack.enter_async_context(await WireClient.connect(server))
        good = await stack.enter_async_context(await WireClient.connect(server))
        bad = await stack.enter_async_context(await WireClient.connect(server))
        assert (await holder.execute("holder", LOCK)).ok
        good_req = good.execute_message("good", [LOCK], wait=30)
        bad_req = bad.execute_message(
            "bad", [Assert(Not(Exists("locks", "printer")))], wait=30, description="rerun-bug"
        )
        await bad.send(bad_req)
        await good.send(good_req)
        await wait_for(lambda: len(server.core.waits) == 2)
        release = await holder.execute("holder", UNLOCK)
        assert release.ok
        granted = await good.reply(good_req.request_id)
        assert isinstance(granted, Reply) and granted.body.ok  # type: ignore[union-attr]
        err = await bad.reply(bad_req.request_id)
        assert isinstance(err, ErrorReply) and err.code is ErrorCode.INTERNAL_ERROR
        await bad.read_until_closed()
        await holder.ping()  # the releasing connection is untouched
        await good.ping()
        assert server.statistics()["server"]["internal_errors"] == 1


# --- item 2: memory per frame, per value, per name ------------------------------------------------


async def test_a_frame_of_a_million_empty_maps_is_refused_while_decoding(
    server: RunningServer,
) -> None:
    """A 1,040,083-byte frame whose SetVar value is 1,040,000 empty maps added ~71 MB per
    stored entry and stalled the loop ~350 ms per frame. Now the frame is refused while it
    is decoded (more than max_frame / 16 arrays and maps): TOO_LARGE, no id (none was
    read), nothing stored, and the connection goes on."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            value = [{}] * 1_040_000
            data = raw_execute(9, [["Assert", ["SetVar", "t", "v", value]]])
            assert len(data) > 1_040_000
            await c.send_raw(data)
            err = await c.reply(None)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.TOO_LARGE
            assert str(DEFAULT_MAX_FRAME // 16) in err.message
            await c.ping()
            assert server.engine.entry_count == 0


async def test_a_dense_value_within_the_frame_bound_is_refused_by_its_size(
    server: RunningServer,
) -> None:
    """60,000 empty maps pass the frame's container bound, but as a stored value they count
    60,001 * 32 bytes: TOO_LARGE (max_value), with the request's id, nothing stored."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            await c.send_raw(raw_execute(9, [["Assert", ["SetVar", "t", "v", [{}] * 60_000]]]))
            err = await c.reply(9)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.TOO_LARGE
            assert "max_value" in err.message
            assert server.engine.entry_count == 0
            assert len(server.engine.sessions) == 0


@pytest.mark.parametrize("field", ["session", "session_description"])
async def test_a_megabyte_session_id_or_description_is_refused(
    server: RunningServer, field: str
) -> None:
    """A 1 MiB session id or description cost ~1 MiB per session: refused (TOO_LARGE), no
    session created."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            fields = {field: "x" * (1024 * 1024 - 200)}
            if field == "session":
                data = frame(
                    pack(
                        {
                            "type": "execute",
                            "id": 3,
                            "namespace": "ns",
                            "statements": [],
                            **fields,
                        }
                    )
                )
            else:
                data = raw_execute(3, [], **fields)
            await c.send_raw(data)
            err = await c.reply(3)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.TOO_LARGE
            assert repr(field) in err.message
            assert len(server.engine.sessions) == 0


async def test_before_hello_a_big_frame_is_refused_unread_on_a_token_server(
    nursery: trio.Nursery,
) -> None:
    """A frame sent before hello on a token-protected server was decoded (its whole
    1,040,000-map tree) before the missing hello was noticed, delaying authenticated
    clients' pings by ~400 ms. Now its header alone is refused (FRAME_TOO_LARGE: more than
    16 KiB before the handshake) and the connection closed; an authenticated client is
    served throughout."""
    server = await start_server(nursery, tokens=(TokenSpec("app", "secret-app"),))
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(trio.fail_after(10))
        good = await stack.enter_async_context(await WireClient.connect(server, hello=False))
        reply = await good.request(Hello(good.rid(), client_name="ok", token="secret-app"))
        assert isinstance(reply, Reply)
        attacker = await stack.enter_async_context(await WireClient.connect(server, hello=False))
        await attacker.send_raw(
            raw_execute(1, [["Assert", ["SetVar", "t", "v", [{}] * 1_040_000]]])
        )
        messages = await attacker.read_until_closed()
        assert len(messages) == 1
        err = messages[0]
        assert isinstance(err, ErrorReply) and err.code is ErrorCode.FRAME_TOO_LARGE
        assert "before the handshake" in err.message
        await good.ping()


async def test_before_hello_a_small_request_is_refused_without_decoding_it(
    server: RunningServer,
) -> None:
    """A small request before hello gets HANDSHAKE_REQUIRED with its id, whatever its tree
    holds (an invalid tree is not reported: it was not decoded); the connection stays."""
    with trio.fail_after(10):
        async with await WireClient.connect(server, hello=False) as c:
            await c.send_raw(raw_execute(4, [["NoSuchOp"]]))
            err = await c.reply(4)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.HANDSHAKE_REQUIRED
            await c.hello()
            await c.ping()


# --- item 4: lost events never cross principals -----------------------------------------------


@pytest.mark.parametrize("with_stats", [True, False])
async def test_a_lost_event_goes_only_to_the_principal_that_owned_the_session(
    nursery: trio.Nursery, clock: trio.testing.MockClock, with_stats: bool
) -> None:
    """``other``'s session S expires; ``app`` sends [stats, execute(S)] in one write: stats
    expired S inside the engine, the execute re-created S for ``app`` before the events were
    routed, and ``app`` received ``other``'s lost event (namespace payroll, which it may not
    use) while ``other``'s connection stayed registered on S and later got ``app``'s TTL
    event. Now ``other`` alone hears of its loss, and ``app`` alone of its own. Without the
    stats the execute itself expires S and re-creates it in one engine call: the same."""
    tokens = (
        TokenSpec("other", "secret-other", namespaces=("payroll",)),
        TokenSpec("app", "secret-app", namespaces=("app",)),
    )
    server = await start_server(nursery, tokens=tokens)
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(trio.fail_after(20))
        other = await stack.enter_async_context(await WireClient.connect(server, hello=False))
        await other.call(Hello(other.rid(), client_name="other", token="secret-other"))
        app = await stack.enter_async_context(await WireClient.connect(server, hello=False))
        await app.call(Hello(app.rid(), client_name="app", token="secret-app"))
        held = await other.execute(
            "S", Assert(SetVar("salaries", "bob")), namespace="payroll", max_age=5
        )
        assert held.ok
        clock.jump(6)  # S is due; nothing has expired it yet
        stats = GetStatistics(app.rid())
        ttl_lock = Assert(SetVar("jobs", "j1", ttl=2))
        execute = app.execute_message("S", [ttl_lock], namespace="app", max_age=5)
        if with_stats:
            await app.send(stats, execute)
            assert isinstance(await app.reply(stats.request_id), Reply)
        else:
            await app.send(execute)
        mine = await app.reply(execute.request_id)
        assert isinstance(mine, Reply) and mine.body.ok  # type: ignore[union-attr]
        lost = await other.event()
        assert (lost.session_id, lost.reason) == ("S", LostReason.EXPIRED)
        assert lost.entries[0][:3] == ("payroll", "salaries", "bob")
        await app.ping()
        assert app.events() == []  # not other's loss
        clock.jump(3)  # app's TTL entry expires
        ttl = await app.event()
        assert (ttl.reason, ttl.entries[0][:3]) == (LostReason.TTL, ("app", "jobs", "j1"))
        await other.ping()
        assert other.events() == []  # not app's loss


# --- item 6: no frame larger than a client accepts ------------------------------------------------


async def test_a_lost_event_of_thirty_thousand_entries_is_split_into_frames_a_client_accepts(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A session holding 30,000 entries expired: its lost event was over the client's 1 MiB
    receive limit, the client dropped the connection and the loss was never heard. Now the
    entries arrive over several lost events, every frame within 1 MiB, all 30,000 of them."""
    server = await start_server(nursery)
    sizes: list[int] = []
    with trio.fail_after(30):
        async with await WireClient.connect(server) as c:
            for batch in range(60):
                statements = [
                    Assert(SetVar("t", f"variable-name-of-some-length-{batch}-{i:04d}"))
                    for i in range(500)
                ]
                assert (await c.execute("big", *statements, max_age=5)).ok
            assert server.engine.entry_count == 30_000
            original_fill = c._fill

            async def fill() -> None:
                data = await c.stream.receive_some(1 << 20)
                if not data:
                    c.closed = True
                    raise AssertionError("closed")
                c.proto.receive_data(data)
                while (payload := c.proto.next_frame()) is not None:
                    sizes.append(len(payload))
                    c.inbox.append(c.proto.decode(msgpack.unpackb(payload)))  # type: ignore[arg-type]

            c._fill = fill  # type: ignore[method-assign]
            clock.jump(6)
            entries: set[str] = set()
            while len(entries) < 30_000:
                event = await c.event()
                assert isinstance(event, LockLost) and event.reason is LostReason.EXPIRED
                entries.update(var for _, _, var, _ in event.entries)
            assert len(entries) == 30_000
            assert len(sizes) >= 2
            assert max(sizes) <= DEFAULT_MAX_FRAME
            c._fill = original_fill  # type: ignore[method-assign]


async def test_a_reply_over_the_client_limit_is_refused_not_sent(nursery: trio.Nursery) -> None:
    """A peer appended two 600 KB entries to a task's state variable: every acquire that
    selected them got a 1.2 MB reply and the client dropped the connection. Now (with
    max_value raised to allow such entries at all) the transaction fails whole with
    TOO_LARGE: nothing is changed, the connection stays, a smaller select passes."""
    server = await start_server(nursery, max_value=1024 * 1024, max_frame=2 * 1024 * 1024)
    with trio.fail_after(20):
        async with await WireClient.connect(server) as c:
            big = "x" * 600_000
            for sid in ("p1", "p2"):
                state = Assert(SetVar("state", "task-7", big, allow_duplicates=True))
                assert (await c.execute(sid, state)).ok
            claim = c.execute_message(
                "worker",
                [
                    Assert(SetVar("claim", "task-7")),
                    SelectVarValue("states", "state", "task-7", select_many=True),
                ],
            )
            err = await c.error(claim)
            assert err.code is ErrorCode.TOO_LARGE
            assert server.engine.entry_count == 2  # the claim was rolled back
            one = await c.execute(
                "worker", Assert(SetVar("claim", "task-7")), SelectVarValue("s", "state", "task-7")
            )
            assert isinstance(one, TransactionResult) and one.ok
            await c.call(Ping(c.rid()))
