"""Issue 14, item 10: a sync LockClient dropped without ``close()`` does not live on through
its keepalive threads. The threads hold their session only weakly, so once the client and its
sessions are unreachable they are collected, the threads end and the socket is closed (the
server then expires the sessions after their max age). A keepalive that keeps failing logs
its first failure and then at most one line a minute (FailureLog), not one per retry."""

from __future__ import annotations

import gc
import logging
import threading

import pytest
import trio
import trio.testing
from client_support import ThreadedServer, wait_until
from fake_lockserver import FakeServer

from client import LockClient, Mutex, SelectConstantValue, ServerUnavailable, open_lock_client
from client._core import FailureLog
from lockserver import RunningServer

NS = "Dropped"
Server = ThreadedServer[RunningServer]


def connections(ts: Server) -> int:
    """Connections the server has open now."""
    return int(ts.call(lambda: ts.server.statistics()["server"]["connections"]))


def keepalive_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lockclient-keepalive-")]


def drop_a_client_holding_a_lock(port: int, name: str, max_age: float = 2.0) -> threading.Thread:
    """Make a client whose session holds a Mutex (its keepalive thread running), and drop
    it without close(): every reference to it is gone when this returns. Returns the
    session's keepalive thread."""
    c = LockClient(port=port, timeout=5)
    s = c.session(max_age=max_age)
    m = Mutex(s, NS, name)
    assert m.acquire(blocking=False)
    thread = s._thread
    assert thread is not None and thread.is_alive()
    return thread


def collected(threads: list[threading.Thread]) -> bool:
    """Collect garbage, then: have all ``threads`` ended? (Collected again on every poll:
    a thread that was pinging held its session for that moment.)"""
    gc.collect()
    for t in threads:
        t.join(0.01)
    return not any(t.is_alive() for t in threads)


def test_a_dropped_client_ends_its_keepalive_and_closes_its_connection(
    threaded_server: Server,
) -> None:
    """The finding: a client with a session holding a lock (max_age=2), dropped without
    close(), stayed alive through its keepalive thread, which kept the lock for ever. Now,
    once collected, its keepalive thread ends and the server sees its connection closed."""
    ts = threaded_server
    baseline = connections(ts)
    thread = drop_a_client_holding_a_lock(ts.port, "dropped")
    assert connections(ts) == baseline + 1
    wait_until(lambda: collected([thread]))
    assert not thread.is_alive()
    wait_until(lambda: connections(ts) == baseline)  # the finalizer closed the socket


def test_a_session_still_referenced_keeps_its_client_and_keepalive(
    threaded_server: Server,
) -> None:
    """The counterpart: dropping the client object while its session is still referenced
    does not stop anything (the session keeps its client); close() then stops the thread."""
    ts = threaded_server
    c = LockClient(port=ts.port, timeout=5)
    s = c.session(max_age=60)
    s.execute(NS, [SelectConstantValue("x", 1)])
    thread = s._thread
    assert thread is not None
    del c
    gc.collect()
    thread.join(0.05)
    assert thread.is_alive()
    assert s.execute(NS, [SelectConstantValue("y", 2)])["y"] == 2  # the client still works
    s._client.close()
    thread.join(10)
    assert not thread.is_alive()


def test_fifty_dropped_clients_leave_no_keepalive_thread(threaded_server: Server) -> None:
    """The finding: 50 clients dropped without close() left 51 threads that kept logging
    'keepalive failed' after the server was gone. Now, server gone or not, once the clients
    are collected no keepalive thread of theirs is left."""
    ts = threaded_server
    before = set(keepalive_threads())
    # (Each was alive when its client was dropped; the collector may end some already.)
    threads = [drop_a_client_holding_a_lock(ts.port, f"m{n}", max_age=60) for n in range(50)]
    ts.stop()  # the server is gone
    wait_until(lambda: collected(threads))
    assert set(keepalive_threads()) <= before


def test_failure_log_reports_the_first_failure_then_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """FailureLog (time passed in): the first failure at WARNING, then nothing until a
    minute has passed, then one line counting the failures since; a success ends the run
    (INFO) and the next failure is reported at once again."""
    flog = FailureLog("keepalive of session s")
    error = ServerUnavailable("cannot connect")
    with caplog.at_level(logging.INFO, logger="client"):
        for now in range(60):
            flog.failed(error, float(now))
        lines = [r.getMessage() for r in caplog.records]
        assert lines == ["keepalive of session s failed: cannot connect"]
        flog.failed(error, 60.0)
        assert len(caplog.records) == 2
        assert "60 more time(s) (61 in a row)" in caplog.records[-1].getMessage()
        assert caplog.records[-1].levelno == logging.WARNING
        assert flog.failures == 61
        flog.succeeded()
        assert caplog.records[-1].levelno == logging.INFO
        assert "works again after 61 failure(s)" in caplog.records[-1].getMessage()
        flog.failed(error, 61.0)
        assert caplog.records[-1].getMessage() == "keepalive of session s failed: cannot connect"
    assert flog.failures == 1


async def test_async_keepalive_failures_are_rate_limited(
    fake: FakeServer, clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """A keepalive retried every second against a server that is gone logs one warning,
    not one per second; after a minute (of trio's clock) one more, with the count."""
    with trio.fail_after(300), caplog.at_level(logging.WARNING, logger="client"):
        async with open_lock_client(port=fake.port) as c:
            s = c.session(max_age=3.0)
            await s.execute(NS, [SelectConstantValue("x", 1)])
            fake.stop()

            def warnings() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.getMessage().startswith(f"keepalive of session {s.id}")
                ]

            while s._failures.failures < 20:
                clock.jump(0.5)
                await trio.sleep(0.01)
            assert len(warnings()) == 1
            while len(warnings()) < 2:  # the once-a-minute line (bounded by fail_after)
                clock.jump(5.0)
                await trio.sleep(0.01)
            assert "more time(s)" in warnings()[1]
            assert isinstance(s.keepalive_error, ServerUnavailable)
            s._mark_ended()
