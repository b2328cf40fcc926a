"""``execute_many`` (pipelined batches) on both faces: the core's one-waiter-per-batch
bookkeeping without sockets, then end to end against the real server (order, mixed results,
a refused call in the middle, empty and 1000-call batches) and the fake one (a connection drop
mid-batch, cancellation and timeouts mid-batch, closing with a batch in flight)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing
from client_support import ThreadedServer
from fake_lockserver import FakeServer

from client import (
    TRUE,
    AnywayContinueAfter,
    Assert,
    BatchError,
    ClientClosed,
    ClientTimeout,
    ConnectionLost,
    DeleteVar,
    ErrorCode,
    LimitExceeded,
    LockClient,
    LockClientError,
    Not,
    Result,
    SelectConstantValue,
    ServerError,
    Session,
    SetVar,
    open_lock_client,
)
from client._core import ClientCore
from client._session_state import SessionState
from client._sync_session import BATCH_CHUNK
from client._wire import EXECUTE, Batch, Wire, batch_results
from lockserver import RunningServer, ServerConfig, serve
from protocol import (
    Cause,
    Connection,
    ErrorReply,
    Execute,
    Pong,
    Reply,
    Role,
    Status,
    TransactionResult,
    request_from_wire,
    unpack,
)

NS = "Batch"

_server = Connection(Role.SERVER)


def encode(*messages: Any) -> bytes:
    return b"".join(_server.send(m) for m in messages)


def tx_result(value: int) -> TransactionResult:
    return TransactionResult(
        Status.TRANSACTION_OK, Cause.UNSPECIFIED, "", "host", 1.0, 1.0, None, (("v", value),), 7
    )


def too_deep() -> Any:
    """A condition nested deeper than the server's max_depth (32): refused TREE_TOO_DEEP."""
    deep: Any = TRUE
    for _ in range(40):
        deep = Not(deep)
    return deep


def echo_calls(n: int, tag: str = "e") -> list[tuple[str, list[Any]]]:
    return [(NS, [SelectConstantValue(tag, i)]) for i in range(n)]


def decode_frames(data: bytes) -> list[Any]:
    conn = Connection(Role.SERVER)
    conn.receive_data(data)
    out = []
    while (payload := conn.next_frame()) is not None:
        out.append(request_from_wire(unpack(payload)))
    return out


async def until(predicate: Any, step: float = 0.005) -> None:
    while not predicate():
        await trio.sleep(step)


# --- the core ---------------------------------------------------------------------------------


def test_a_batch_resolves_once_in_call_order_whatever_the_reply_order() -> None:
    """Every call of a batch has its own table entry; the batch resolves once, when the last
    reply is in, with the outcomes in call order (replies matched by id, not position)."""
    wire: Wire[str] = Wire(ClientCore("t"))
    wire.register(9, EXECUTE, "single")
    batch = Batch([10, 11, 12], "batch")
    wire.register_batch(batch)
    assert wire.core.requests_sent == 4
    resolved, _ = wire.feed(encode(Reply(12, tx_result(12)), Reply(10, tx_result(10))))
    assert resolved == []  # not before the last call
    resolved, _ = wire.feed(encode(Reply(9, tx_result(9)), Reply(11, tx_result(11))))
    assert [w for w, _, _ in resolved] == ["single", "batch"]
    _, outcomes, error = resolved[1]
    assert error is None
    assert [r["v"] for r in batch_results(outcomes)] == [10, 11, 12]
    assert wire.pending == {}


def test_an_error_reply_in_a_batch_is_kept_in_place() -> None:
    """A refused call's ServerError takes its place among the outcomes; the batch still waits
    for every call, and batch_results raises BatchError carrying all of them."""
    wire: Wire[str] = Wire(ClientCore("t"))
    wire.register_batch(Batch([1, 2, 3], "b"))
    data = encode(
        Reply(1, tx_result(1)),
        ErrorReply(2, ErrorCode.TOO_MANY_OPS, "too many"),
        Reply(3, tx_result(3)),
    )
    [(_, outcomes, _)] = wire.feed(data)[0]
    with pytest.raises(BatchError) as info:
        batch_results(outcomes)
    err = info.value
    assert [type(r) for r in err.results] == [Result, LimitExceeded, Result]
    assert [i for i, _ in err.failures] == [1]
    assert err.__cause__ is err.results[1]
    assert not err.outcome_unknown
    assert "1 of 3 calls" in str(err) and "call 1" in str(err) and "TOO_MANY_OPS" in str(err)


def test_a_reply_of_the_wrong_kind_fails_only_that_call() -> None:
    """A batch call answered with another kind of body gets a LockClientError in place."""
    wire: Wire[str] = Wire(ClientCore("t"))
    wire.register_batch(Batch([1, 2], "b"))
    [(_, outcomes, _)] = wire.feed(encode(Reply(1, Pong(1.0, 1.0)), Reply(2, tx_result(2))))[0]
    assert type(outcomes[0]) is LockClientError and "execute request with Pong" in str(outcomes[0])
    assert outcomes[1]["v"] == 2


def test_a_dropped_connection_settles_the_unanswered_calls_as_unknown() -> None:
    """fail_all gives the calls still in flight a ConnectionLost each (never RETRY: they are
    Executes) and resolves the batch once, keeping the Results that had arrived."""
    wire: Wire[str] = Wire(ClientCore("t"))
    wire.register_batch(Batch([1, 2, 3], "b"))
    assert wire.feed(encode(Reply(2, tx_result(2))))[0] == []
    [(waiter, outcomes, error)] = wire.fail_all("gone")
    assert waiter == "b" and error is None
    assert [type(o) for o in outcomes] == [ConnectionLost, Result, ConnectionLost]
    assert "outcome is unknown" in str(outcomes[0])
    with pytest.raises(BatchError) as info:
        batch_results(outcomes)
    assert info.value.outcome_unknown
    assert [i for i, _ in info.value.failures] == [0, 2]


def test_an_abandoned_batch_drops_its_late_replies() -> None:
    """abandon_batch forgets every call still in flight; their replies are dropped and
    counted, and nobody is resolved."""
    wire: Wire[str] = Wire(ClientCore("t"))
    batch = Batch([1, 2, 3], "b")
    wire.register_batch(batch)
    assert wire.feed(encode(Reply(1, tx_result(1))))[0] == []
    assert wire.abandon_batch(batch)
    assert not wire.abandon_batch(batch)
    assert wire.feed(encode(Reply(2, tx_result(2)), Reply(3, tx_result(3))))[0] == []
    assert wire.core.replies_dropped == 2 and wire.pending == {}


def test_building_a_batch_validates_every_call_before_anything_is_sent() -> None:
    """Each call is a (namespace, statements[, transaction_id]) tuple, validated by the
    protocol; an error names the call. The frames carry the ids in call order, the batch's
    reliability contract and each call's transaction id; the last namespace is kept for the
    keepalive."""
    core = ClientCore("t")
    state = SessionState(core, "s1", 30.0, "", True)
    rids, data = state._build_batch(
        [("A", [SelectConstantValue("x", 1)]), ("B", (), "tx-2"), ("C", [], None)], 5.0, 0.5
    )
    sent = decode_frames(data)
    assert [type(m) for m in sent] == [Execute] * 3
    assert [m.request_id for m in sent] == rids == sorted(rids)
    assert [m.transaction.namespace for m in sent] == ["A", "B", "C"]
    assert [m.transaction.transaction_id for m in sent] == ["", "tx-2", ""]
    assert {(m.transaction.min_uptime, m.transaction.min_trust) for m in sent} == {(5.0, 0.5)}
    assert {m.session.session_id for m in sent} == {"s1"} and sent[0].wait is None
    assert state._namespace == "C"
    for bad, exc, text in (
        ([("A", []), ["B", []]], TypeError, r"calls\[1\]: a call must be a tuple"),
        ([("A", [], "t", "x")], TypeError, r"calls\[0\]"),
        ([("A", []), (" ", [])], ValueError, r"calls\[1\]: namespace"),
        ([("A", [Not(TRUE)])], TypeError, r"calls\[0\]: statements\[0\]"),
        ([("A", [], 7)], TypeError, r"calls\[0\]: transaction_id"),
    ):
        with pytest.raises(exc, match=text):
            state._build_batch(bad, 0.0, 0.0)
    with pytest.raises(ValueError, match="min_trust"):
        state._build_batch([("A", [])], 0.0, 2.0)
    assert state._namespace == "C"  # a refused batch changes nothing
    assert state._build_batch([], 0.0, 0.0) == ([], b"")
    state._mark_ended()
    with pytest.raises(ClientClosed):
        state._build_batch([], 0.0, 0.0)


# --- async face, real server -----------------------------------------------------------------


async def test_async_results_come_in_call_order_ok_or_not(server: RunningServer) -> None:
    """One batch: results in call order; each call is its own transaction (a later call sees
    an earlier one's lock, a failed call does not undo the others), transaction ids are
    echoed; the locks are then released in a second batch."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            rs = await s.execute_many(
                [
                    (NS, [Assert(SetVar("L", "a"))], "t-0"),
                    (NS, [Assert(SetVar("L", "a"))], "t-1"),  # held by the call before
                    (NS, [Assert(SetVar("L", "b"))]),
                    (NS, [SelectConstantValue("x", "three")]),
                ]
            )
            assert [r.ok for r in rs] == [True, False, True, True]
            assert rs[1].failed_statement == "0:/AssertOp/"
            assert [r.transaction_id for r in rs] == ["t-0", "t-1", "", ""]
            assert rs[3]["x"] == "three"
            assert rs[0].fence < rs[2].fence
            released = await s.execute_many(
                [(NS, [AnywayContinueAfter(DeleteVar("L", k))]) for k in "ab"]
            )
            assert [r.ok for r in released] == [True, True]
            assert (await s.execute(NS, [Assert(SetVar("L", "a"))])).ok
            assert c.local_statistics().in_flight == 0


async def test_async_a_refused_call_in_the_middle_loses_no_results(server: RunningServer) -> None:
    """A call the server refuses (TREE_TOO_DEEP) raises BatchError once every reply is in:
    the other calls ran and their Results are in place; the connection stays usable."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            with pytest.raises(BatchError) as info:
                await s.execute_many(
                    [
                        (NS, [Assert(SetVar("L", "m1"))]),
                        (NS, [Assert(too_deep())]),
                        (NS, [Assert(SetVar("L", "m2"))]),
                    ]
                )
            first, refused, last = info.value.results
            assert isinstance(first, Result) and first.ok
            assert isinstance(refused, LimitExceeded)
            assert refused.code is ErrorCode.TREE_TOO_DEEP
            assert isinstance(last, Result) and last.ok
            assert info.value.__cause__ is refused
            assert not info.value.outcome_unknown
            again = await s.execute(NS, [Assert(SetVar("L", "m2"))])
            assert not again.ok  # the third call did run
            assert c.local_statistics().in_flight == 0


async def test_async_empty_and_1000_call_batches(server: RunningServer) -> None:
    """No calls: [] (after a checkpoint). 1000 calls: one batch, 1000 results in order."""
    with trio.fail_after(20):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            with trio.testing.assert_checkpoints():
                assert await s.execute_many([]) == []
            sent = c.local_statistics().requests_sent
            rs = await s.execute_many(echo_calls(1000))
            assert [r["e"] for r in rs] == list(range(1000))
            assert c.local_statistics().requests_sent == sent + 1000
            assert c.local_statistics().in_flight == 0
        with pytest.raises(ClientClosed):
            await s.execute_many([])


async def test_async_a_batch_keeps_the_session_alive(server: RunningServer) -> None:
    """A batch counts as activity and starts the session's keepalive, in its last
    namespace, as execute does."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session(max_age=30) as s:
            assert s._keepalive_scope is None
            await s.execute_many([("A", []), ("Z", [])])
            assert s._keepalive_scope is not None and s._namespace == "Z"


async def test_async_cancelled_batches_never_desynchronise_the_connection(
    server: RunningServer,
) -> None:
    """Batches cancelled at random points, among concurrent honest callers: every caller gets
    only its own replies, the late ones are dropped, nothing stays in flight."""
    with trio.fail_after(30):
        async with open_lock_client(port=server.port) as c, c.session() as s:

            async def racer(i: int) -> None:
                for j in range(20):
                    with trio.move_on_after(0.0002 * (j % 5)):
                        rs = await s.execute_many(
                            [(NS, [SelectConstantValue("e", [i, j, k])]) for k in range(8)]
                        )
                        assert [r["e"] for r in rs] == [[i, j, k] for k in range(8)]

            async def honest(i: int) -> None:
                for j in range(20):
                    assert (await s.execute(NS, [SelectConstantValue("h", [i, j])]))["h"] == [i, j]

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(racer, i)
                    nursery.start_soon(honest, i)
            rs = await s.execute_many(echo_calls(5, "after"))
            assert [r["after"] for r in rs] == list(range(5))
            await trio.sleep(0.05)
            stats = c.local_statistics()
            assert stats.in_flight == 0
            assert stats.replies_dropped > 0  # some batches were cancelled in flight


# --- async face, fake server -----------------------------------------------------------------


async def test_async_connection_drop_mid_batch(fake: FakeServer) -> None:
    """The connection drops after the server answered 2 of 5 calls: BatchError with those 2
    Results and a ConnectionLost (outcome unknown) for the other 3, nothing re-sent. The
    next call reconnects; repeating the batch with the same transaction ids in the same
    session returns the remembered outcomes of the calls that ran."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, c.session() as s:
            calls = [(NS, [Assert(SetVar("L", f"k{i}"))], f"tx-{i}") for i in range(5)]
            await s.execute(NS, [])
            fake.hold_after = 2
            failure: list[BatchError] = []

            async def call() -> None:
                with pytest.raises(BatchError) as info:
                    await s.execute_many(calls)
                failure.append(info.value)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(call)
                await until(lambda: len(fake.held) == 3)
                fake.hold = False
                fake.held.clear()
                await fake.drop_connections()
            err = failure[0]
            assert err.outcome_unknown
            assert [type(r) for r in err.results] == [Result] * 2 + [ConnectionLost] * 3
            assert all(isinstance(r, Result) and r.ok for r in err.results[:2])
            executes = [m for m in fake.received if type(m) is Execute and m.transaction.statements]
            assert len(executes) == 5  # nothing was re-sent
            retried = await s.execute_many(calls)
            assert [r.ok for r in retried] == [True] * 5
            for before, after in zip(err.results[:2], retried[:2], strict=True):
                assert isinstance(before, Result) and after.fence == before.fence  # remembered
            assert c.local_statistics().connections == 2


async def test_async_cancelling_a_batch_in_flight_then_the_client_still_works(
    fake: FakeServer,
) -> None:
    """A batch cancelled while all its calls are in flight is abandoned as a whole: its late
    replies are dropped by id, and the next calls on the same connection get their own."""
    with trio.fail_after(10):
        async with open_lock_client(port=fake.port) as c, c.session() as s:
            fake.hold = True
            with trio.move_on_after(0.05) as scope:
                await s.execute_many(echo_calls(10, "late"))
            assert scope.cancelled_caught
            assert c.local_statistics().in_flight == 0
            await fake.release()
            rs = await s.execute_many(echo_calls(3, "mine"))
            assert [r["mine"] for r in rs] == [0, 1, 2]
            assert (await s.execute(NS, [SelectConstantValue("one", 1)]))["one"] == 1
            stats = c.local_statistics()
            assert (stats.replies_dropped, stats.connections, stats.in_flight) == (10, 1, 0)


async def test_async_reversed_replies_and_closing_with_a_batch_in_flight(
    fake: FakeServer,
) -> None:
    """Replies answered in reverse order still come back in call order; leaving the client's
    block with a batch in flight fails it with ClientClosed."""
    with trio.fail_after(10):
        fake.reverse = True
        async with open_lock_client(port=fake.port) as c:
            s = c.session(keepalive=False)
            assert [r["e"] for r in await s.execute_many(echo_calls(20))] == list(range(20))
        fake.reverse = False
        async with trio.open_nursery() as nursery, open_lock_client(port=fake.port) as c:
            s = c.session(keepalive=False)
            fake.hold = True

            async def call() -> None:
                with pytest.raises(ClientClosed):
                    await s.execute_many(echo_calls(4))

            nursery.start_soon(call)
            await until(lambda: len(fake.held) == 4)


# --- sync face -------------------------------------------------------------------------------


def test_sync_batches_against_the_real_server(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """The sync face: results in call order (ok or not), a refused call in the middle raises
    BatchError with the others' Results, an empty batch is [], 1000 calls in one batch."""
    with LockClient(port=threaded_server.port, timeout=10) as c, c.session() as s:
        rs = s.execute_many(
            [(NS, [Assert(SetVar("L", "a"))], "t-0"), (NS, [Assert(SetVar("L", "a"))])]
        )
        assert [r.ok for r in rs] == [True, False] and rs[0].transaction_id == "t-0"
        with pytest.raises(BatchError) as info:
            s.execute_many(
                [(NS, [SelectConstantValue("x", 0)]), (NS, [Assert(too_deep())]), (NS, [])]
            )
        kinds = [type(r) for r in info.value.results]
        assert kinds == [Result, LimitExceeded, Result]
        assert isinstance(info.value.__cause__, ServerError)
        assert s.execute_many([]) == []
        assert [r["e"] for r in s.execute_many(echo_calls(1000))] == list(range(1000))
        assert s._thread is not None and s._namespace == NS  # keepalive started
        assert c.local_statistics().in_flight == 0
    with pytest.raises(ClientClosed):
        s.execute_many([])


def test_sync_threads_share_the_connection_with_batches(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """Threads sending batches and single calls at once, replies reversed per read: the
    caller-reads hand-off delivers each batch whole, in call order."""
    threaded_fake.server.reverse = True
    errors: list[BaseException] = []
    with LockClient(port=threaded_fake.port) as c, c.session() as s:

        def worker(i: int) -> None:
            try:
                for j in range(30):
                    if i % 2:
                        assert s.execute(NS, [SelectConstantValue("e", [i, j])])["e"] == [i, j]
                        continue
                    calls = [(NS, [SelectConstantValue("e", [i, j, k])]) for k in range(6)]
                    assert [r["e"] for r in s.execute_many(calls)] == [[i, j, k] for k in range(6)]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        assert c.local_statistics().in_flight == 0


def test_sync_timeout_mid_batch_then_late_replies_are_dropped(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """The client's timeout bounds the whole batch: ClientTimeout, every call abandoned; the
    late replies are dropped and the next batch gets its own."""
    fake = threaded_fake.server
    with LockClient(port=threaded_fake.port, timeout=0.2) as c:
        s = c.session(keepalive=False)
        fake.hold_after = 1
        with pytest.raises(ClientTimeout, match="batch of 3 calls"):
            s.execute_many(echo_calls(3, "late"))
        threaded_fake.acall(fake.release)
        assert [r["mine"] for r in s.execute_many(echo_calls(2, "mine"))] == [0, 1]
        stats = c.local_statistics()
        assert (stats.replies_dropped, stats.connections, stats.in_flight) == (2, 1, 0)


def _drop_mid_batch(
    threaded_fake: ThreadedServer[FakeServer],
    s: Session,
    calls: list[tuple[str, list[Any]]],
    *,
    answered: int,
    held: int,
) -> BaseException:
    """Run ``s.execute_many(calls)`` in a thread while the fake answers ``answered`` calls and
    holds the rest; once ``held`` are held, drop the connection. The batch's exception."""
    fake = threaded_fake.server
    fake.hold_after = answered
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            s.execute_many(calls)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=call)
    t.start()
    threaded_fake.acall(lambda: until(lambda: len(fake.held) == held))
    fake.hold = False
    fake.held.clear()
    threaded_fake.acall(fake.drop_connections)
    t.join(10)
    return outcome[0]


def test_sync_connection_drop_mid_batch(threaded_fake: ThreadedServer[FakeServer]) -> None:
    """The connection drops after 1 of 3 calls was answered: BatchError, 1 Result and 2
    ConnectionLost in place; the next batch reconnects."""
    with LockClient(port=threaded_fake.port) as c:
        s = c.session(keepalive=False)
        err = _drop_mid_batch(threaded_fake, s, echo_calls(3), answered=1, held=2)
        assert isinstance(err, BatchError) and err.outcome_unknown
        assert [type(r) for r in err.results] == [Result, ConnectionLost, ConnectionLost]
        assert [r["e"] for r in s.execute_many(echo_calls(2))] == [0, 1]
        assert c.local_statistics().connections == 2
        s._mark_ended()


def test_sync_close_with_a_batch_in_flight(threaded_fake: ThreadedServer[FakeServer]) -> None:
    """close() from another thread fails a batch in flight with ClientClosed."""
    fake = threaded_fake.server
    c = LockClient(port=threaded_fake.port)
    s = c.session(keepalive=False)
    fake.hold = True
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            s.execute_many(echo_calls(3))
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=call)
    t.start()
    threaded_fake.acall(lambda: until(lambda: len(fake.held) == 3))
    c.close()
    t.join(5)
    assert isinstance(outcome[0], ClientClosed)


def test_sync_a_batch_bigger_than_the_buffers_is_not_cut_off() -> None:
    """The sync face reads between chunks of a big batch: 20,000 calls whose replies (~3 MB)
    outgrow the kernel's buffers plus a tiny server ``max_send_buffer`` all come back, in
    order, instead of the client being dropped as a slow consumer."""

    async def start(nursery: trio.Nursery) -> RunningServer:
        config = ServerConfig(host="127.0.0.1", port=0, log_level="WARNING", max_send_buffer=1024)
        running: RunningServer = await nursery.start(serve, config)
        return running

    ts = ThreadedServer(start).start()
    try:
        with LockClient(port=ts.port, timeout=30) as c, c.session() as s:
            results = s.execute_many(echo_calls(100_000))
            assert [r["e"] for r in results] == list(range(100_000))
            assert c.local_statistics().in_flight == 0
        stats = ts.call(ts.server.statistics)
        assert stats["server"]["slow_consumers_dropped"] == 0
    finally:
        ts.stop()


def test_sync_connection_drop_in_a_later_chunk_of_a_big_batch(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """A batch of three chunks whose connection drops in the second: the first chunk and the
    answered part of the second keep their Results, the rest of the second is ConnectionLost
    (unknown), and the third chunk was never sent (ConnectionLost saying so)."""
    n = 3 * BATCH_CHUNK
    answered = BATCH_CHUNK + 10
    with LockClient(port=threaded_fake.port, timeout=30) as c:
        s = c.session(keepalive=False)
        err = _drop_mid_batch(
            threaded_fake, s, echo_calls(n), answered=answered, held=BATCH_CHUNK - 10
        )
        assert isinstance(err, BatchError) and err.outcome_unknown
        assert [r["e"] for r in err.results[:answered]] == list(range(answered))  # type: ignore[index]
        lost = err.results[answered:]
        assert len(lost) == n - answered and all(type(r) is ConnectionLost for r in lost)
        assert all("not sent" not in str(r) for r in lost[: BATCH_CHUNK - 10])
        assert all("not sent" in str(r) for r in lost[BATCH_CHUNK - 10 :])
        assert [r["e"] for r in s.execute_many(echo_calls(2))] == [0, 1]
        s._mark_ended()


def test_sync_the_timeout_bounds_a_chunked_batch(
    threaded_fake: ThreadedServer[FakeServer],
) -> None:
    """The client's timeout bounds the whole chunked batch: the second chunk goes
    unanswered, ClientTimeout names the batch and the chunk; the client still works."""
    fake = threaded_fake.server
    with LockClient(port=threaded_fake.port, timeout=0.3) as c:
        s = c.session(keepalive=False)
        fake.hold_after = BATCH_CHUNK + 5
        n = 3 * BATCH_CHUNK
        with pytest.raises(ClientTimeout) as info:
            s.execute_many(echo_calls(n, "late"))
        assert f"batch of {n} calls" in str(info.value)
        assert f"calls {BATCH_CHUNK}..{2 * BATCH_CHUNK - 1} timed out" in str(info.value)
        threaded_fake.acall(fake.release)
        assert [r["mine"] for r in s.execute_many(echo_calls(2, "mine"))] == [0, 1]
        assert c.local_statistics().in_flight == 0
