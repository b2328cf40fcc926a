"""The sync face of every recipe against a real server in a thread: the same semantics as
the trio face (both share one transaction builder), with blocking calls and threads."""

from __future__ import annotations

import threading
import time

import pytest
from recipes_support import NS, ThreadedServer, sync_entries

from client import (
    LockClient,
    LockSet,
    MultiLock,
    Mutex,
    NotAcquired,
    ReadWriteLock,
    Semaphore,
    StateLock,
    TimeWindowLock,
    UnknownStamp,
    get_permits,
    set_permits,
)
from client.recipes import DONE, FAILED, IN_PROGRESS, MUTEX_TABLE, READ_TABLE


def test_mutex(threaded_server: ThreadedServer) -> None:
    """acquire/release, with, tickets, non-holders, timeouts, misuse — sync."""
    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        c.session() as a,
        c.session() as b,
    ):
        ma, mb = Mutex(a, NS, "m"), Mutex(b, NS, "m")
        assert ma.acquire(blocking=False) and ma.held
        [record] = sync_entries(a, MUTEX_TABLE, "m")
        assert c.welcome is not None and c.welcome.started_at is not None
        assert record["value"] == ma.ticket
        assert ma.acquired_at == c.welcome.started_at + record["set_at"]  # wall clock
        assert not mb.acquire(blocking=False)
        # A failed non-blocking acquire names who held it (the server's records).
        [holder] = mb.holders
        assert (holder.session, holder.fence) == (a.id, ma.fence)
        assert holder.acquired_at == pytest.approx(ma.acquired_at, abs=1e-6)
        assert holder.value == ma.ticket
        assert mb.locked() is True

        def timed_out() -> int:
            stats = threaded_server.call(threaded_server.server.statistics)
            return int(stats["waiting"]["timed_out_total"])

        before = timed_out()
        assert mb.acquire(timeout=0.3) is False
        assert timed_out() == before + 1  # it waited on the server, to its deadline
        assert mb.release() is False
        with pytest.raises(RuntimeError):
            ma.acquire()
        assert 59 < ma.valid_for() <= 60
        ma.check()
        ma.refresh()
        assert ma.release() is True
        with mb as held:
            assert held is mb and mb.fence is not None
        assert not mb.held and mb.locked() is False
        with pytest.raises(NotAcquired), Mutex(a, NS, "m", min_uptime=10_000):
            pass  # pragma: no cover


def test_mutex_blocking_between_threads(threaded_server: ThreadedServer) -> None:
    """A thread blocked in acquire() is parked on the server and gets the lock right after
    the holder (another thread, another session) releases it."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as a:
        holder = Mutex(a, NS, "threads")
        assert holder.acquire()
        got = threading.Event()

        def waiter() -> None:
            with c.session() as b, Mutex(b, NS, "threads"):
                got.set()

        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)
        assert not got.is_set()
        holder.release()
        t.join(5)
        assert got.is_set()


def test_read_write_lock_and_permits(threaded_server: ThreadedServer) -> None:
    """Readers share, writers exclude, configured permits — sync."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as admin:
        sessions = [c.session() for _ in range(3)]
        rws = [ReadWriteLock(s, NS, "doc") for s in sessions]
        assert rws[0].read.acquire(blocking=False) and rws[1].read.acquire(blocking=False)
        assert not rws[2].write.acquire(blocking=False)
        assert len(sync_entries(admin, READ_TABLE, "doc")) == 2
        rws[0].read.release()
        rws[1].read.release()
        with rws[2].write:
            assert not rws[0].read.acquire(blocking=False)
        assert set_permits(admin, NS, "doc", "r", 1) is True
        assert get_permits(admin, NS, "doc", "r") == 1
        assert rws[0].read.acquire(blocking=False)
        assert not rws[1].read.acquire(blocking=False)
        rws[0].read.release()
        for s in sessions:
            s.end()


def test_multilock(threaded_server: ThreadedServer) -> None:
    """try_locks / release_locks / unknown stamps / release_all — sync."""
    with (
        LockClient(port=threaded_server.port, timeout=5) as c,
        MultiLock(c, NS, "one") as one,
        MultiLock(c, NS, "two") as two,
    ):
        stamp = one.try_locks({"WS1": "w", "WS2": "r"})
        assert stamp is not None and one.stamps() == [stamp]
        assert two.try_locks({"WS1": "r"}) is None
        assert two.try_locks({"WS2": "r"}) is not None
        one.release_locks(stamp)
        with pytest.raises(UnknownStamp):
            one.release_locks(stamp)
        assert one.try_locks({"WS1": "w"}) is not None
        assert one.release_all() is True
        assert one.stamps() == []
        assert two.try_locks({"WS1": "w"}) is not None
        assert isinstance(two.lock_set({"Z": "w"}), LockSet)
        assert "two" in repr(two)


def test_semaphore_and_state_lock(threaded_server: ThreadedServer) -> None:
    """Semaphore N and task claims — sync."""
    with LockClient(port=threaded_server.port, timeout=5) as c:
        sessions = [c.session() for _ in range(3)]
        sems = [Semaphore(s, NS, "pool", permits=2) for s in sessions]
        assert sems[0].acquire(blocking=False) and sems[1].acquire(blocking=False)
        assert not sems[2].acquire(blocking=False)
        sems[0].release()
        assert sems[2].acquire(blocking=False)

        t0, t1 = StateLock(sessions[0], NS, "task"), StateLock(sessions[1], NS, "task")
        assert t1.state() == DONE
        with t0:
            assert t1.state() == IN_PROGRESS and not t1.acquire(blocking=False)
        assert t1.state() == DONE
        with pytest.raises(RuntimeError), t1:
            raise RuntimeError("job failed")
        assert t0.state() == FAILED
        assert t0.acquire() and t0.previous_state == FAILED
        assert t0.release(DONE) and t1.state() == DONE
        for s in sessions:
            s.end()


def test_time_window(mock_threaded_server: ThreadedServer) -> None:
    """Once per period; the next window (server time jumped) frees it — sync."""
    ts = mock_threaded_server
    with LockClient(port=ts.port, timeout=5) as c, c.session() as a, c.session() as b:
        wa, wb = (
            TimeWindowLock(a, NS, "daily", period=60),
            TimeWindowLock(b, NS, "daily", period=60),
        )
        with wa:
            assert wa.window_ends_at is not None
        assert not wb.acquire(blocking=False)
        ts.jump(60)
        deadline = time.monotonic() + 5
        while not wb.acquire(blocking=False):  # the server's sweep runs at its own pace
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not wa.acquire(blocking=False)
