"""Liveness of a tooz coordinator: its heartbeats keep its session (locks, memberships,
leadership) alive; without them the server expires it after ``session_max_age`` and
everything it held goes, as tooz's other timeout-based drivers behave. Time is the server's
mock clock, jumped from the test (no sleeping for expiry)."""

from __future__ import annotations

from support import ThreadedServer
from tooz import coordination
from tooz_support import Make, member, url_of

from lockserver import RunningServer

MAX_AGE = 3.0


def test_heartbeats_keep_the_session_and_silence_expires_it(
    mock_threaded_server: ThreadedServer[RunningServer], coordinators: Make
) -> None:
    """A coordinator beating every 2 s of server time (max age 3 s) keeps its lock,
    membership and leadership over 4 s; when it stops beating, 4 s later all three are
    gone: the lock is free for another, the member left, nobody leads."""
    url = url_of(mock_threaded_server.port, f"session_max_age={MAX_AGE:g}")
    a_id = member()
    a, b = coordinators(a_id, url), coordinators(url_=url)
    assert a.heartbeat() == MAX_AGE / 3  # when the next one is due
    lock = a.get_lock(b"alive")
    assert lock.acquire()
    a.create_group(b"hb").get()
    a.join_group(b"hb").get()
    won: list[coordination.LeaderElected] = []
    a.watch_elected_as_leader(b"hb", won.append)
    a.run_watchers()
    assert len(won) == 1
    for _ in range(2):
        mock_threaded_server.jump(2.0)
        a.heartbeat()
        b.heartbeat()
    assert lock.is_still_owner()
    assert b.get_members(b"hb").get() == {a_id}
    assert b.get_leader(b"hb").get() == a_id
    mock_threaded_server.jump(2.0)
    b.heartbeat()
    mock_threaded_server.jump(2.0)  # a silent for 4 s > 3 s
    b.heartbeat()
    assert b.get_lock(b"alive").acquire(blocking=False)
    assert b.get_members(b"hb").get() == set()
    assert b.get_leader(b"hb").get() is None
    assert not lock.is_still_owner()


def test_the_heart_thread_beats(url: str, coordinators: Make) -> None:
    """``start(start_heart=True)`` runs tooz's heart: it calls this driver's heartbeat,
    which needs beating (tooz's ``requires_beating``)."""
    c = coordinators(start=False)
    assert c.requires_beating
    c.start(start_heart=True)
    assert c.heart.is_alive()
    c.heart.stop()
    c.heart.wait(10)
    assert c.heart.beats >= 1
