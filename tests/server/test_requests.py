"""Every request type end to end over a real socket, contention, sessions across connections,
and pipelining."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import trio

from lockserver import RunningServer
from lockserver._peer import Peer
from lockserver.shell._requests import _EARLY_FLUSH
from protocol import (
    PROTOCOL_VERSION,
    AnywayContinueAfter,
    Assert,
    Cancel,
    Cancelled,
    Cause,
    DeleteVar,
    EndSession,
    ErrorCode,
    ErrorReply,
    Exists,
    GetStatistics,
    Hello,
    Not,
    Ping,
    Pong,
    Reply,
    SelectConstantValue,
    SelectVarValue,
    SessionEnded,
    SetVar,
    Statistics,
    Status,
    TransactionResult,
)

from ._wire import WireClient, wait_for

LOCK = Assert(SetVar("locks", "printer", "job-1"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))


async def test_hello_is_answered_with_welcome_and_limits(server: RunningServer) -> None:
    """Hello -> Welcome: protocol version, "lockserver <version>", host, and the limits a
    client must respect."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            welcome = await c.hello()
    assert welcome.version == PROTOCOL_VERSION
    assert welcome.server_name.startswith("lockserver ")
    assert welcome.host == server.engine.host
    cfg = server.config
    assert welcome.limits["max_frame"] == cfg.max_frame
    assert welcome.limits["max_ops"] == cfg.max_ops
    assert welcome.limits["max_depth"] == cfg.max_depth
    assert welcome.limits["max_session_age"] == cfg.max_session_age
    assert welcome.limits["max_entries_per_session"] == cfg.max_entries_per_session


async def test_execute_ok_and_statement_failure(server: RunningServer) -> None:
    """Execute runs in the engine: OK with data and a fence, then a failed statement with its
    path; the reply echoes the transaction id, host, uptime and trust."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            ok = await c.execute("s1", LOCK, SelectConstantValue("x", 42), transaction_id="tx-1")
            assert ok.status is Status.TRANSACTION_OK
            assert ok.transaction_id == "tx-1"
            assert ok.data == (("x", 42),)
            assert ok.host == server.engine.host
            assert ok.trust == 1.0
            assert ok.uptime >= 0
            assert ok.fence > 0
            assert ok.valid_until is not None
            again = await c.execute("s1", SelectConstantValue("y", 1), LOCK)
            assert again.status is Status.TRANSACTION_ERROR
            assert again.cause is Cause.STATEMENT
            assert again.failed_statement == "1:/AssertOp/"
            assert again.data == (("y", 1),)


async def test_ping_pong(server: RunningServer) -> None:
    """Ping -> Pong(uptime, trust); it touches no session."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            body = await c.call(Ping(c.rid()))
    assert isinstance(body, Pong)
    assert body.uptime >= 0
    assert 0 <= body.trust <= 1
    assert server.engine.statistics(trio.current_time()).sessions == 0


async def test_end_session_reports_whether_it_existed(server: RunningServer) -> None:
    """EndSession -> SessionEnded(existed); the session's entries are gone."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            await c.execute("s1", LOCK)
            assert await c.end_session("s1") is True
            assert await c.end_session("s1") is False
            assert await c.end_session("never-seen") is False
            res = await c.execute("s2", LOCK)
            assert res.ok


async def test_statistics_sections(server: RunningServer) -> None:
    """GetStatistics -> Statistics with the server, waiting, trust, engine, limits and gc
    sections."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            await c.execute("s1", LOCK)
            body = await c.call(GetStatistics(c.rid()))
    assert isinstance(body, Statistics)
    values = body.values
    assert set(values) == {"server", "waiting", "trust", "engine", "limits", "gc"}
    srv = values["server"]
    for key in (
        "uptime",
        "connections",
        "connections_total",
        "slow_consumers_dropped",
        "protocol_errors",
        "host",
        "version",
        "requests_total",
    ):
        assert key in srv, key
    assert srv["connections"] == 1
    assert srv["connections_total"] == 1
    assert srv["requests_total"] == 3  # hello, execute, stats
    assert values["trust"]["calls_total"] == 1
    assert set(values["trust"]) >= {"uptime", "trust", "norm", "rate"}
    assert values["engine"]["entries"] == 1
    assert values["engine"]["sessions"] == 1
    assert values["limits"]["max_frame"] == server.config.max_frame
    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert len(values["gc"]["collections"]) == 3
    for section in ("server", "trust", "engine", "limits", "gc"):
        for key in values[section]:
            assert f"`{key}`" in doc, f"statistics key {section}.{key} is not documented"
    with trio.fail_after(5):
        await wait_for(lambda: server.statistics()["server"]["connections"] == 0)


async def test_cancel_of_unknown_request_finds_nothing(server: RunningServer) -> None:
    """Cancel -> Cancelled(found=False) when the target is not parked on this connection."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            body = await c.call(Cancel(c.rid(), 12345))
    assert body == Cancelled(False)


async def test_two_clients_contend_for_one_lock(server: RunningServer) -> None:
    """Mutual exclusion across connections: B fails while A holds the lock, succeeds once A
    releases it, and sees A's entry meanwhile."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as a, await WireClient.connect(server) as b:
            assert (await a.execute("alice", LOCK)).ok
            refused = await b.execute("bob", LOCK)
            assert refused.status is Status.TRANSACTION_ERROR
            assert refused.failed_statement == "0:/AssertOp/"
            seen = await b.execute("bob", SelectVarValue("holder", "locks", "printer"))
            assert seen.data[0][0] == "holder"
            assert seen.data[0][1] is not None
            assert (await a.execute("alice", UNLOCK)).ok
            assert (await b.execute("bob", LOCK)).ok
            assert not (await a.execute("alice", LOCK)).ok


async def test_reconnect_and_resume_a_session(server: RunningServer) -> None:
    """A session outlives its connection: a new connection presenting the same id owns the
    same entries (it can release the lock, and its own lock is not 'someone else's')."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as first:
            assert (await first.execute("worker-7", LOCK)).ok
        async with await WireClient.connect(server) as other:
            assert not (await other.execute("intruder", LOCK)).ok
        async with await WireClient.connect(server) as second:
            mine = await second.execute(
                "worker-7", Assert(Exists("locks", "printer", ignore_this_session=False))
            )
            assert mine.ok
            assert (await second.execute("worker-7", Assert(DeleteVar("locks", "printer")))).ok
        async with await WireClient.connect(server) as other:
            assert (await other.execute("intruder", LOCK)).ok


async def test_one_connection_many_sessions(server: RunningServer) -> None:
    """One connection may act in many sessions; each is a distinct owner."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            for i in range(20):
                res = await c.execute(f"s{i}", Assert(SetVar("t", f"v{i}", i)))
                assert res.ok
            assert not (await c.execute("s0", Assert(SetVar("t", "v1", 0)))).ok
            assert (await c.execute("s1", Assert(Not(Exists("t", "v1"))))).ok
            stats = server.engine.statistics(trio.current_time())
            assert stats.sessions == 20
            assert stats.entries == 20
            for i in range(20):
                assert await c.end_session(f"s{i}")
    assert server.engine.statistics(trio.current_time()).entries == 0


async def test_pipelined_requests_are_all_answered(server: RunningServer) -> None:
    """100 requests in ONE write get 100 replies, matched by id, executed in order."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            messages = [
                c.execute_message(f"s{i % 7}", [SelectConstantValue("i", i)]) for i in range(98)
            ]
            messages.append(Ping(c.rid()))
            messages.append(EndSession(c.rid(), "s0"))
            await c.send(*messages)
            answers = [await c.reply(m.request_id) for m in messages]
    for i, answer in enumerate(answers[:98]):
        assert isinstance(answer, Reply)
        assert isinstance(answer.body, TransactionResult)
        assert answer.body.data == (("i", i),)
    assert isinstance(answers[98], Reply) and isinstance(answers[98].body, Pong)
    assert answers[99] == Reply(messages[99].request_id, SessionEnded(True))
    # Order: fences observed never go back.
    fences = [a.body.fence for a in answers[:98]]  # type: ignore[union-attr]
    assert fences == sorted(fences)


async def test_long_pipelined_batch_replies_go_out_early(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replies of a long batch read in one receive leave in chunks of at most about
    _EARLY_FLUSH bytes while the batch is served (the client decodes them meanwhile), not all
    at its end; they still arrive complete and in order."""
    sends: list[int] = []
    real_flush = Peer.flush

    def counting_flush(self: Peer) -> None:
        sends.append(len(self.outbox))
        real_flush(self)

    monkeypatch.setattr(Peer, "flush", counting_flush)
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            messages = [c.execute_message("s", [SelectConstantValue("i", i)]) for i in range(200)]
            sends.clear()
            await c.send(*messages)
            answers = [await c.reply(m.request_id) for m in messages]
    assert [a.body.data for a in answers] == [(("i", i),) for i in range(200)]  # type: ignore[union-attr]
    # Each chunk went out when it was full, or earlier: at the end of the connection's turn
    # (TURN_SECONDS), which a loaded machine reaches sooner; never all at the batch's end.
    sends = [n for n in sends if n]
    assert sum(sends) > 200 * 100  # replies are > 100 bytes each
    assert len(sends) >= 200 * 100 // (_EARLY_FLUSH + 1024)
    assert all(n < _EARLY_FLUSH + 1024 for n in sends)


async def test_pipelined_frames_split_across_writes(server: RunningServer) -> None:
    """Frames cut at every byte boundary still decode: the server buffers partial frames."""
    with trio.fail_after(10):
        async with await WireClient.connect(server) as c:
            msgs = [Ping(c.rid()) for _ in range(3)]
            data = b"".join(c.proto.send(m) for m in msgs)
            for i in range(len(data)):
                await c.send_raw(data[i : i + 1])
                await trio.sleep(0)
            for m in msgs:
                assert isinstance(await c.reply(m.request_id), Reply)


async def test_request_before_hello_is_refused_but_connection_stays(
    server: RunningServer,
) -> None:
    """Any request before Hello gets HANDSHAKE_REQUIRED with its id; the connection stays
    open and the handshake can still happen."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            err = await c.error(Ping(c.rid()))
            assert err.code is ErrorCode.HANDSHAKE_REQUIRED
            err = await c.error(c.execute_message("s", [LOCK]))
            assert err.code is ErrorCode.HANDSHAKE_REQUIRED
            await c.hello()
            assert (await c.execute("s", LOCK)).ok
    assert server.statistics()["server"]["protocol_errors"] == 2


async def test_wrong_version_is_refused_and_closed(server: RunningServer) -> None:
    """Hello with another protocol version: UNSUPPORTED_VERSION, then the server closes."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            await c.send(
                Hello(c.rid(), PROTOCOL_VERSION + 1, "future"),
                Ping(c.rid()),
            )
            messages = await c.read_until_closed()
    assert len(messages) == 1
    assert isinstance(messages[0], ErrorReply)
    assert messages[0].code is ErrorCode.UNSUPPORTED_VERSION
    assert messages[0].request_id == 1


async def test_second_hello_is_an_error_only(server: RunningServer) -> None:
    """A second Hello is an invalid request: answered with an error, connection usable."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            err = await c.error(Hello(c.rid()))
            assert err.code is ErrorCode.INVALID_MESSAGE
            await c.ping()


async def test_max_session_age_cap(nursery: trio.Nursery) -> None:
    """A session max_age above max_session_age is refused (INVALID_MESSAGE, nothing
    created); at the cap it is accepted."""
    from .conftest import start_server

    server = await start_server(nursery, max_session_age=120.0)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            err = await c.error(c.execute_message("s", [LOCK], max_age=120.5))
            assert err.code is ErrorCode.INVALID_MESSAGE
            assert "max_session_age" in err.message
            assert server.engine.statistics(trio.current_time()).sessions == 0
            res = await c.execute("s", LOCK, max_age=120.0)
            assert res.ok
            await c.ping()


async def test_half_closed_client_still_gets_its_replies(server: RunningServer) -> None:
    """A client that sends its requests and then shuts down its sending side (EOF) still
    receives every reply before the server closes."""
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            msgs = [Ping(c.rid()) for _ in range(50)]
            await c.send(*msgs)
            await c.stream.send_eof()
            messages = await c.read_until_closed()
    assert [m.request_id for m in messages] == [m.request_id for m in msgs]  # type: ignore[union-attr]


async def test_statistics_report_garbage_collector_pauses(server: RunningServer) -> None:
    """A full collection while serving shows up in the gc section: one more generation-2
    collection, its pause counted in the total and bounding the maximum."""
    before = server.statistics()["gc"]
    gc.collect()
    after = server.statistics()["gc"]
    assert after["collections"][2] == before["collections"][2] + 1
    assert after["pause_total_ms"][2] > before["pause_total_ms"][2]
    assert 0 < after["pause_max_ms"][2] <= after["pause_total_ms"][2]


async def test_a_hello_refused_with_a_non_closing_code_may_be_retried(
    server: RunningServer,
) -> None:
    """A hello that does not decode (INVALID_MESSAGE, TOO_LARGE) is refused and changes
    nothing: the same connection may send a good hello next (PROTOCOL.md, the lifecycle)."""
    with trio.fail_after(5):
        async with await WireClient.connect(server, hello=False) as c:
            from protocol import frame, pack

            await c.send_raw(frame(pack({"type": "hello", "id": 1, "version": "one"})))
            err = await c.reply(1)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.INVALID_MESSAGE
            name = "x" * (server.config.max_name + 1)
            await c.send_raw(frame(pack({"type": "hello", "id": 2, "version": 1, "client": name})))
            err = await c.reply(2)
            assert isinstance(err, ErrorReply) and err.code is ErrorCode.TOO_LARGE
            await c.hello()
            assert (await c.execute("s", LOCK)).ok


async def test_one_session_spans_namespaces_and_its_entry_limit_counts_them_all(
    nursery: trio.Nursery,
) -> None:
    """A session may hold entries in several namespaces; max_entries_per_session counts them
    all (TOO_MANY_ENTRIES past it, nothing kept of that transaction), and ending the session
    frees every namespace."""
    from .conftest import start_server

    server = await start_server(nursery, max_entries_per_session=2)
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c, await WireClient.connect(server) as d:
            assert (await c.execute("s", LOCK, namespace="ns1")).ok
            assert (await c.execute("s", LOCK, namespace="ns2")).ok
            err = await c.error(c.execute_message("s", [LOCK], namespace="ns3"))
            assert err.code is ErrorCode.TOO_MANY_ENTRIES
            assert not (await d.execute("t1", LOCK, namespace="ns1")).ok
            assert not (await d.execute("t2", LOCK, namespace="ns2")).ok
            assert (await d.execute("t3", LOCK, namespace="ns3")).ok  # nothing kept there
            assert await c.end_session("s")
            assert (await d.execute("t1", LOCK, namespace="ns1")).ok
            assert (await d.execute("t2", LOCK, namespace="ns2")).ok


async def test_a_closed_connection_is_freed_at_once(server: RunningServer) -> None:
    """Once a connection that made calls is closed and the server has dropped it, nothing
    keeps its Peer alive: the trust monitor counts the calls under the connection's number,
    not under the Peer (it keeps a source's counts for ticks after its last call). Another
    connection's call first, so that the accept loop's and the poller's loop variables (the
    last connection accepted, the last pass) no longer name it."""
    shell = server._shell
    with trio.fail_after(5):
        async with await WireClient.connect(server) as c:
            assert (await c.execute("freed", Assert(SetVar("t", "v")))).ok
            [peer] = shell.clients
            ref = weakref.ref(peer)
            del peer
        await wait_for(lambda: not shell.clients)
        async with await WireClient.connect(server) as other:
            assert (await other.execute("other", Assert(SetVar("t", "w")))).ok
    gc.collect()
    assert ref() is None
    assert shell.trust.statistics(trio.current_time()).calls_total >= 2
