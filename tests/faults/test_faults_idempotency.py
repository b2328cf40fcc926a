"""Idempotent retry by transaction id: in the pure engine, and end to end through a TCP proxy
that cuts the connection mid-transaction (docs/faults.md).

The rule pinned down: a transaction with a non-empty id has its result remembered in its
session; the same id again in the same session returns that result without running again,
whether it committed or failed. Without an id nothing is remembered. Refusals are not
remembered. The memory holds the last RETRY_MEMORY ids and goes with the session.
"""

from __future__ import annotations

import trio

from client import Assert, ConnectionLost, LockClient, SetVar
from lockserver import RunningServer
from lockserver.engine import Engine
from lockserver.engine._engine import RETRY_MEMORY
from protocol import Abort, Cause, SessionSpec, Status, Transaction

START = 1000.0
NS = "ns"


def _engine() -> Engine:
    return Engine(started_at=START, host="h", fence_epoch=1_000_000)


def _lock(var: str = "v", tid: str = "", min_uptime: float = 0.0) -> Transaction:
    stmts = (Assert(SetVar("t", var, "x")),)
    return Transaction(NS, stmts, transaction_id=tid, min_uptime=min_uptime)


def test_same_id_twice_returns_the_first_result_and_runs_once() -> None:
    """The retry gets the same fence and result object; the data changed once (the fence
    did not move again, the entry is still the first one)."""
    e = _engine()
    s = SessionSpec("a")
    first = e.execute(s, _lock(tid="tx-1"), now=START)
    assert first.status is Status.TRANSACTION_OK
    fence = e.fence
    again = e.execute(s, _lock(tid="tx-1"), now=START + 1)
    assert again == first and again.fence == fence == e.fence
    assert e.statistics(START + 1).transactions == 1
    assert e.retries_answered == 1
    # A new id runs for real: the exclusive SetVar now conflicts with the session's own entry.
    third = e.execute(s, _lock(tid="tx-2"), now=START + 2)
    assert third.cause is Cause.STATEMENT


def test_a_failure_is_remembered_too() -> None:
    """A retry of a failed transaction answers the original failure even when the same
    transaction would now succeed."""
    e = _engine()
    e.execute(SessionSpec("holder"), _lock(), now=START)
    failed = e.execute(SessionSpec("b"), _lock(tid="try"), now=START)
    assert failed.cause is Cause.STATEMENT
    assert e.end_session("holder", now=START + 1)
    again = e.execute(SessionSpec("b"), _lock(tid="try"), now=START + 2)
    assert again == failed
    assert e.entry_count == 0


def test_without_an_id_nothing_is_remembered() -> None:
    """An empty id keeps the old behaviour: each call runs."""
    e = _engine()
    assert e.execute(SessionSpec("a"), _lock(), now=START).status is Status.TRANSACTION_OK
    assert e.execute(SessionSpec("a"), _lock(), now=START).cause is Cause.STATEMENT
    assert e.sessions["a"].retry_memory is None


def test_ids_are_per_session() -> None:
    """The same id in another session is another transaction."""
    e = _engine()
    assert e.execute(SessionSpec("a"), _lock(tid="x"), now=START).status is Status.TRANSACTION_OK
    assert e.execute(SessionSpec("b"), _lock(tid="x"), now=START).cause is Cause.STATEMENT


def test_refusals_are_not_remembered() -> None:
    """A MinimumRequirements refusal ran nothing: the retry runs once the gate opens."""
    e = _engine()
    tx = _lock(tid="late", min_uptime=10.0)
    assert e.execute(SessionSpec("a"), tx, now=START).cause is Cause.MINIMUM_REQUIREMENTS
    ok = e.execute(SessionSpec("a"), _lock(tid="late", min_uptime=10.0), now=START + 10)
    assert ok.status is Status.TRANSACTION_OK


def test_memory_is_bounded_and_oldest_first() -> None:
    """Only the last RETRY_MEMORY ids are kept; the oldest one runs again."""
    e = _engine()
    s = SessionSpec("a")
    for i in range(RETRY_MEMORY + 1):
        tx = Transaction(NS, (Abort(),), transaction_id=f"id-{i}")
        e.execute(s, tx, now=START)
    memory = e.sessions["a"].retry_memory
    assert memory is not None and len(memory) == RETRY_MEMORY
    assert "id-0" not in memory and f"id-{RETRY_MEMORY}" in memory
    before = e.statistics(START).transactions
    e.execute(s, Transaction(NS, (Abort(),), transaction_id="id-0"), now=START)
    e.execute(s, Transaction(NS, (Abort(),), transaction_id="id-5"), now=START)
    assert e.statistics(START).transactions == before + 1  # id-0 ran, id-5 was remembered


def test_memory_goes_with_the_session() -> None:
    """After the session ended (or expired), the id is unknown: the call runs."""
    e = _engine()
    s = SessionSpec("a", max_age=5.0)
    assert e.execute(s, _lock(tid="x"), now=START).status is Status.TRANSACTION_OK
    e.sweep(START + 6)  # expired: entries and memory gone
    assert "a" not in e.sessions and e.entry_count == 0
    assert e.execute(s, _lock(tid="x"), now=START + 7).status is Status.TRANSACTION_OK
    assert e.end_session("a", now=START + 7)
    assert e.execute(s, _lock(tid="x"), now=START + 8).status is Status.TRANSACTION_OK


def test_a_retry_touches_the_session() -> None:
    """A retry is a call in the session: it restarts the idle timer."""
    e = _engine()
    s = SessionSpec("a", max_age=5.0)
    e.execute(s, _lock(tid="x"), now=START)
    e.execute(s, _lock(tid="x"), now=START + 4)
    e.sweep(START + 6)
    assert "a" in e.sessions


def test_the_same_transaction_object_is_a_re_evaluation() -> None:
    """The WaitQueue re-runs a parked transaction with the very same object: that runs
    again (and replaces the remembered result), so server-side waiting keeps working."""
    e = _engine()
    e.execute(SessionSpec("holder"), _lock(), now=START)
    tx = _lock(tid="w")
    assert e.execute(SessionSpec("b"), tx, now=START).cause is Cause.STATEMENT
    e.end_session("holder", now=START + 1)
    granted = e.execute(SessionSpec("b"), tx, now=START + 1)
    assert granted.status is Status.TRANSACTION_OK
    assert e.execute(SessionSpec("b"), _lock(tid="w"), now=START + 2) == granted


# --- end to end through a proxy that cuts the connection ----------------------------------------


class CuttingProxy:
    """Forwards TCP between a client and the server; when ``cut`` is armed it forwards the
    client's next bytes to the server, then drops both sides as soon as the server answers,
    before forwarding the reply (``drop_request``: drop before forwarding the request)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cut = False
        self.drop_request = False
        self.cuts = 0
        self.port = 0

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, down: trio.SocketStream) -> None:
        up = await trio.open_tcp_stream("127.0.0.1", self.upstream_port)
        async with down, up, trio.open_nursery() as nursery:

            async def pump(src: trio.SocketStream, dst: trio.SocketStream, reply: bool) -> None:
                while data := await src.receive_some(65536):
                    if self.cut and (reply or self.drop_request):
                        self.cut = False
                        self.cuts += 1
                        nursery.cancel_scope.cancel()  # closes both sides unforwarded
                        return
                    await dst.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(pump, down, up, False)
            nursery.start_soon(pump, up, down, True)


async def test_cut_after_commit_then_retry_gets_the_original_outcome(
    server: RunningServer, nursery: trio.Nursery
) -> None:
    """The reply of a committed lock is lost with the connection (ConnectionLost: outcome
    unknown); retrying with the same transaction id answers the original grant (same fence),
    executed once; a retry of a cut whose request never reached the server runs it now."""
    proxy = CuttingProxy(server.port)
    await nursery.start(proxy.serve)

    def scenario() -> list[str]:
        seen = []
        with LockClient("127.0.0.1", proxy.port, timeout=5.0) as c:
            s = c.session(max_age=30.0, keepalive=False)
            s.execute(NS, [])  # the session exists before the cut
            proxy.cut = True
            try:
                s.execute(NS, [Assert(SetVar("t", "a", "x"))], transaction_id="lock-a-1")
            except ConnectionLost:
                seen.append("lost")
            r = s.execute(NS, [Assert(SetVar("t", "a", "x"))], transaction_id="lock-a-1")
            assert r.ok, r
            seen.append(f"fence:{r.fence}")
            # A fresh id runs for real: the lock is held (by this very session).
            again = s.execute(NS, [Assert(SetVar("t", "a", "x"))], transaction_id="lock-a-2")
            assert not again.ok
            # Now a cut that loses the request itself: the retry runs it, once.
            proxy.cut = proxy.drop_request = True
            try:
                s.execute(NS, [Assert(SetVar("t", "b", "x"))], transaction_id="lock-b-1")
            except ConnectionLost:
                seen.append("lost")
            proxy.drop_request = False
            rb = s.execute(NS, [Assert(SetVar("t", "b", "x"))], transaction_id="lock-b-1")
            assert rb.ok, rb
            assert rb.fence > r.fence
            s.end()
        return seen

    with trio.fail_after(30):
        seen = await trio.to_thread.run_sync(scenario)
    assert seen[0] == "lost" and seen[2] == "lost" and proxy.cuts == 2
    fence_a = int(seen[1].split(":")[1])
    engine = server.engine
    assert engine.retries_answered == 1
    # "a" committed exactly once: one changing transaction for it, one for "b"
    assert engine.fence >= fence_a + 1
    stats = server.statistics()
    assert stats["server"]["internal_errors"] == 0
    assert stats["engine"]["entries"] == 0
