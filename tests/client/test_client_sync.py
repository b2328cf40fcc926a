"""The sync face end to end against the real server, run in a thread with its own trio.run
(127.0.0.1, port 0, real sockets). Every call is bounded by the client's timeout."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from client_support import ThreadedServer

from client import (
    FALSE,
    TRUE,
    Abort,
    And,
    AnywayContinueAfter,
    Assert,
    Block,
    Cause,
    ClientClosed,
    DeleteVar,
    ErrorCode,
    Exists,
    If,
    LimitExceeded,
    LockClient,
    LockClientError,
    LockLost,
    LostReason,
    Not,
    Or,
    Result,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SetVar,
    Status,
    Xor,
)
from lockserver import RunningServer

NS = "SyncTest"
Server = ThreadedServer[RunningServer]


def acquire(table: str, var: str, value: Any = None) -> list[Any]:
    return [Assert(Not(Exists(table, var))), Assert(SetVar(table, var, value))]


def holders(c: LockClient, table: str, var: str) -> list[str]:
    with c.session(keepalive=False) as probe:
        r = probe.execute(NS, [SelectVarValue("h", table, var, select_many=True)])
    return [rec["session"] for rec in r["h"] or []]


def server_has_session(ts: Server, session_id: str) -> bool:
    return bool(ts.call(lambda: session_id in ts.server.engine.sessions))


def test_ping_statistics_welcome_and_close(threaded_server: Server) -> None:
    """ping, statistics and welcome work; the context manager closes the client."""
    with LockClient(port=threaded_server.port, timeout=5, client_name="sync-test") as c:
        assert c.ping().uptime >= 0
        assert isinstance(c.statistics(), dict)
        assert c.welcome.limits["max_ops"] == 1000
        assert "open" in repr(c)
    assert c.closed
    with pytest.raises(ClientClosed):
        c.ping()


def test_every_op_and_data_lookup(threaded_server: Server) -> None:
    """Each op end to end on the sync face: results, data by name, failed paths, rollback."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as a:
        b = c.session()
        r1 = a.execute(NS, [Assert(SetVar("T", "k", "va", description="held"))])
        assert r1.ok and r1.status is Status.TRANSACTION_OK and r1.fence > 0
        r = b.execute(
            NS,
            [
                SelectOperatorValue("exists", Exists("T", "k")),
                SelectOperatorValue("va", Exists("T", "k", "va")),
                SelectOperatorValue("vb", Exists("T", "k", "vb")),
                SelectOperatorValue("and", And(TRUE, FALSE)),
                SelectOperatorValue("or", Or(FALSE, TRUE)),
                SelectOperatorValue("xor", Xor(TRUE, FALSE)),
                SelectVarValue("rec", "T", "k"),
                SelectConstantValue("c", {"nested": [1, 2]}),
                SelectConstantValue("c", "again"),
                If(
                    SetVar("T", "k"),
                    SelectConstantValue("got", True),
                    SelectConstantValue("got", False),
                ),
            ],
        )
        assert isinstance(r, Result) and r.ok
        assert (r["exists"], r["va"], r["vb"]) == (True, True, False)
        assert (r["and"], r["or"], r["xor"], r["got"]) == (False, True, True, False)
        assert r["rec"]["value"] == "va" and r["rec"]["description"] == "held"
        assert r["rec"]["session"] == a.id
        assert r.all("c") == [{"nested": [1, 2]}, "again"]
        with pytest.raises(KeyError):
            r["nope"]

        failed = b.execute(
            NS,
            [
                Assert(SetVar("T", "other")),
                SelectConstantValue("seen", 1),
                Block(SelectConstantValue("in", 2), Assert(SetVar("T", "k"))),
            ],
        )
        assert not failed.ok
        assert (failed.status, failed.cause) == (Status.TRANSACTION_ERROR, Cause.STATEMENT)
        assert failed.failed_statement == "2:/BlockOp/AssertOp/"
        assert failed.data == (("seen", 1), ("in", 2))
        assert holders(c, "T", "other") == []  # rolled back

        assert b.execute(NS, [If(TRUE, Abort())]).failed_statement == "0:/IfOp/AbortOp/"
        assert not b.execute(NS, [Assert(DeleteVar("T", "k"))]).ok  # not b's entry
        assert b.execute(NS, [AnywayContinueAfter(DeleteVar("T", "k"))]).ok
        r2 = a.execute(NS, [Assert(DeleteVar("T", "k", "va"))])
        assert r2.ok and r2.fence > r1.fence
        assert holders(c, "T", "k") == []
        b.end()


def test_two_clients_contend(threaded_server: Server) -> None:
    """Threads of two clients race for one lock: exactly one wins per round; the losers see
    the failed assert's path."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as c1, LockClient(port=port, timeout=5) as c2:
        sessions = [c.session() for c in (c1, c2, c1, c2)]
        for rnd in range(20):
            results: list[Result] = []
            barrier = threading.Barrier(len(sessions))

            def grab(s: Any, key: str, barrier: threading.Barrier, results: list[Result]) -> None:
                barrier.wait()
                results.append(s.execute(NS, acquire("C", key)))

            threads = [
                threading.Thread(target=grab, args=(s, f"k{rnd}", barrier, results))
                for s in sessions
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert sum(r.ok for r in results) == 1
            assert {r.failed_statement for r in results if not r.ok} == {"0:/AssertOp/"}
        for s in sessions:
            s.end()


def test_mds_example(threaded_server: Server) -> None:
    """SEMANTICS.md's seed: two entries OK, a review of an entered patient fails at
    "1:/AssertOp/"."""
    with LockClient(port=threaded_server.port, timeout=5) as c:
        u1, u2, u3 = c.session(), c.session(), c.session()

        def entry(f: str, p: str) -> list[Any]:
            return [
                Assert(Not(Exists("Month-End", f))),
                Assert(Not(Exists("MDS-Review", f, p))),
                Assert(SetVar("MDS-Entry", f, p, allow_duplicates=True)),
            ]

        def review(f: str, p: str) -> list[Any]:
            return [
                Assert(Not(Exists("Month-End", f))),
                Assert(Not(Exists("MDS-Entry", f, p))),
                Assert(SetVar("MDS-Review", f, p)),
            ]

        assert u1.execute("Clinical", entry("F", "P1")).ok
        assert u2.execute("Clinical", entry("F", "P2")).ok
        r = u3.execute("Clinical", review("F", "P1"))
        assert not r.ok and r.failed_statement == "1:/AssertOp/"
        assert u3.execute("Clinical", review("F", "P9")).ok
        unlock = [AnywayContinueAfter(DeleteVar("MDS-Review", "F", "P9"))]
        assert u3.execute("Clinical", unlock).ok
        for u in (u1, u2, u3):
            assert u.end() is True


def test_session_context_manager_ends_the_session(threaded_server: Server) -> None:
    """The session ends on leaving the block, also on an exception (which propagates)."""
    with LockClient(port=threaded_server.port, timeout=5) as c:
        with c.session() as s:
            s.execute(NS, acquire("E", "a"))
            assert server_has_session(threaded_server, s.id)
        assert s.ended and not server_has_session(threaded_server, s.id)
        assert s.end() is False
        with pytest.raises(ZeroDivisionError), c.session() as s2:
            s2.execute(NS, acquire("E", "b"))
            1 / 0  # noqa: B018
        assert s2.ended and not server_has_session(threaded_server, s2.id)
        assert holders(c, "E", "b") == []
        with pytest.raises(ClientClosed):
            s2.execute(NS, acquire("E", "b"))
        assert "ended" in repr(s2)


def test_keepalive_keeps_an_idle_session_alive(threaded_server: Server) -> None:
    """While the caller is idle, the keepalive thread touches the session before its max age
    runs out (the server sees its idle timer refreshed); a session without keepalive is not
    touched. Expiry itself is tested under a mock clock elsewhere: nothing here waits for it."""

    def last_touch(session_id: str) -> float:
        return float(
            threaded_server.call(
                lambda: threaded_server.server.engine.sessions[session_id].last_touch
            )
        )

    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        c.session(max_age=0.6) as kept,
        c.session(max_age=0.6, keepalive=False) as bare,
    ):
        kept.execute(NS, acquire("K", "kept"))
        bare.execute(NS, acquire("K", "bare"))
        kept_first, bare_first = last_touch(kept.id), last_touch(bare.id)
        deadline = time.monotonic() + 5  # bounded wait for the keepalive timer (every 0.2 s)
        while last_touch(kept.id) == kept_first:
            assert time.monotonic() < deadline, "no keepalive reached the server"
            time.sleep(0.02)
        refreshed = last_touch(kept.id)
        assert refreshed - kept_first < 0.6  # touched before the max age ran out
        assert last_touch(bare.id) == bare_first
        assert kept.keepalive_error is None


def test_a_keepalive_ping_sends_the_deferred_cleanups_first(threaded_server: Server) -> None:
    """A cleanup whose outcome was unknown (``defer_cleanup``: a recipe's cancel) is sent by
    the keepalive thread when no call comes (bounded wait for its timer, every 0.2 s)."""

    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        c.session(max_age=0.6) as s,
        c.session(keepalive=False) as probe,
    ):

        def held() -> bool:
            r = probe.execute(NS, [SelectOperatorValue("h", Exists("D", "k"))])
            return r["h"] is True

        s.execute(NS, acquire("D", "k"))
        s.defer_cleanup(NS, [AnywayContinueAfter(DeleteVar("D", "k"))])
        assert held()
        deadline = time.monotonic() + 5
        while held():
            assert time.monotonic() < deadline, "the keepalive did not send the cleanup"
            time.sleep(0.02)
        assert s._deferred == [] and s.keepalive_error is None


def test_reconnect_resumes_the_session(threaded_server: Server) -> None:
    """The connection dies under the client; the next call reconnects, the session still
    holds its entry."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as s:
        s.execute(NS, acquire("R", "k", "v"))
        assert c._conn is not None
        c._conn.sock.shutdown(socket.SHUT_RDWR)
        r = s.execute(NS, [SelectVarValue("me", "R", "k", ignore_this_session=False)])
        assert r["me"]["session"] == s.id and r["me"]["value"] == "v"
        assert c.local_statistics().connections == 2


def test_threads_share_one_connection(threaded_server: Server) -> None:
    """8 threads on one client each get their own replies (caller-reads under contention)."""
    errors: list[BaseException] = []
    with LockClient(port=threaded_server.port, timeout=10) as c, c.session() as s:

        def worker(i: int) -> None:
            try:
                for j in range(200):
                    r = s.execute(NS, [SelectConstantValue("echo", [i, j])])
                    assert r["echo"] == [i, j]
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        stats = c.local_statistics()
        assert stats.connections == 1 and stats.in_flight == 0


def test_server_error_mapping(threaded_server: Server) -> None:
    """A too-deep tree raises LimitExceeded(TREE_TOO_DEEP); the connection stays usable."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as s:
        deep: Any = FALSE
        for _ in range(40):
            deep = Not(deep)
        with pytest.raises(LimitExceeded) as info:
            s.execute(NS, [Assert(deep)])
        assert info.value.code is ErrorCode.TREE_TOO_DEEP
        assert s.execute(NS, [SelectConstantValue("ok", 1)])["ok"] == 1


def test_lock_lost_reaches_the_listener_of_the_reading_thread(threaded_server: Server) -> None:
    """When another connection ends the session, the LockLost event is dispatched to its
    listeners by whichever thread reads next: here process_events() in this thread."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as holder, LockClient(port=port, timeout=5) as admin:
        s = holder.session(keepalive=False)
        got: list[tuple[LockLost, str]] = []
        s.add_lost_listener(lambda ev: got.append((ev, threading.current_thread().name)))
        s.execute(NS, acquire("X", "a"))
        assert admin.end_session(s.id) is True
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            holder.process_events(0.05)
        [(event, thread_name)] = got
        assert event.reason is LostReason.ENDED and event.session_id == s.id
        assert [e[2] for e in event.entries] == ["a"]
        assert thread_name == threading.current_thread().name
        assert s.lost and s.lost_events == (event,)
        assert holder.local_statistics().events == 1
        assert s.end() is False  # already gone on the server


def test_a_listener_calling_the_client_is_refused(threaded_server: Server) -> None:
    """A lost-listener runs in the reading thread; calling the client from it would
    deadlock, so it raises LockClientError at once (logged by the dispatcher)."""
    port = threaded_server.port
    with LockClient(port=port, timeout=5) as holder, LockClient(port=port, timeout=5) as admin:
        s = holder.session(keepalive=False)
        seen: list[BaseException] = []

        def bad_listener(event: LockLost) -> None:
            try:
                holder.ping()
            except LockClientError as exc:
                seen.append(exc)

        s.add_lost_listener(bad_listener)
        s.execute(NS, acquire("X", "b"))
        admin.end_session(s.id)
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            holder.process_events(0.05)
        assert "must not call the client" in str(seen[0])
        assert holder.ping().uptime >= 0  # and the client is fine
        s._mark_ended()


def test_works_with_file_descriptors_above_1024(threaded_server: Server) -> None:
    """The idle-connection check must not use select(): a process with more than 1,024 open
    files would see every connection as dead and reconnect forever."""
    import os
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the fd limit cannot reach 2048 here (hard limit {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as s:
            assert s.execute(NS, [Assert(SetVar("fd", "k"))]).ok
            assert s.execute(NS, []).ok  # the second call runs the idle check
            assert c.local_statistics().connections == 1  # no reconnect
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
