"""tooz locks over the lock server, through tooz's API only: mutual exclusion between
coordinators (and between threads of one), shared and exclusive, ``is_still_owner`` after the
holder's session is ended or its lock force-released by an operator (``lockctl``), ``break_``,
and timeouts."""

from __future__ import annotations

import threading

import tooz
from tooz import coordination
from tooz_support import Make, url_of

from lockctl import main as lockctl

#: Bound (wall-clock seconds) on a thread's wait in these tests: a hang guard.
BOUND = 10.0


def test_two_coordinators_exclude_each_other(coordinators: Make) -> None:
    """While one coordinator holds a lock, another's non-blocking acquire fails; after the
    release it succeeds; the lock's name is tooz's."""
    a, b = coordinators(), coordinators()
    la, lb = a.get_lock(b"jobs"), b.get_lock(b"jobs")
    assert la.name == b"jobs"
    assert la.acquire(blocking=False)
    assert not lb.acquire(blocking=False)
    assert la.is_still_owner() and not lb.is_still_owner()
    assert la.release()
    assert not la.release()  # nothing held any more
    assert lb.acquire(blocking=False)
    assert lb.release()


def test_a_blocked_acquire_is_granted_at_the_release(coordinators: Make) -> None:
    """A blocking acquire waits on the server and is granted when the holder releases,
    not before (the holder still owns the lock while the other waits)."""
    a, b = coordinators(), coordinators()
    la, lb = a.get_lock(b"queue"), b.get_lock(b"queue")
    assert la.acquire()
    granted = threading.Event()

    def wait_for_it() -> None:
        if lb.acquire(blocking=True):
            granted.set()

    t = threading.Thread(target=wait_for_it, daemon=True)
    t.start()
    assert not granted.wait(0.3)  # still waiting: the lock is held
    assert la.is_still_owner()
    assert la.release()
    assert granted.wait(BOUND)
    t.join(BOUND)
    assert lb.is_still_owner()
    assert lb.release()


def test_acquire_with_a_timeout_gives_up(coordinators: Make) -> None:
    """``acquire(blocking=0.2)`` and ``acquire(timeout=0.2)`` return False when the lock
    stays held; the context manager raises tooz's LockAcquireFailed."""
    a, b = coordinators(), coordinators()
    assert a.get_lock(b"t").acquire()
    lock = b.get_lock(b"t")
    assert not lock.acquire(blocking=0.2)
    assert not lock.acquire(blocking=True, timeout=0.2)
    try:
        with lock(False):
            raise AssertionError("the lock was granted while held elsewhere")
    except coordination.LockAcquireFailed:
        pass


def test_threads_of_one_lock_object_take_turns(coordinators: Make) -> None:
    """One lock object used by two threads: the second waits for the first's release
    (tooz: a second acquire blocks or returns False)."""
    lock = coordinators().get_lock(b"shared-object")
    order: list[str] = []
    with lock:
        assert not lock.acquire(blocking=False)

        def other() -> None:
            assert lock.acquire()
            order.append("other")
            assert lock.release()

        t = threading.Thread(target=other, daemon=True)
        t.start()
        t.join(0.3)
        order.append("first")
    t.join(BOUND)
    assert order == ["first", "other"]


def test_shared_holders_exclude_an_exclusive_one(coordinators: Make) -> None:
    """Shared holders of two coordinators hold together; an exclusive acquire fails while
    they do; a shared re-acquire of one object is counted (as many releases)."""
    a, b, c = coordinators(), coordinators(), coordinators()
    la, lb, lc = (x.get_lock(b"rw") for x in (a, b, c))
    assert la.acquire(shared=True)
    assert la.acquire(shared=True)  # counted
    assert lb.acquire(shared=True)
    assert not lc.acquire(blocking=False)
    assert la.release() and lb.release()
    assert not lc.acquire(blocking=False)  # la still holds once
    assert la.release()
    assert not la.release()
    assert lc.acquire(blocking=False)
    assert not la.acquire(shared=True, blocking=False)
    assert lc.release()


def test_is_still_owner_is_false_after_lockctl_kill(coordinators: Make, url: str) -> None:
    """An operator ends the holder's session (``lockctl kill``): the holder is no longer
    the owner, its release says False, and another coordinator gets the lock."""
    a, b = coordinators(), coordinators()
    lock = a.get_lock(b"killed")
    assert lock.acquire()
    server = url.removeprefix("lockserver://")
    assert lockctl(["--server", server, "kill", a.session_id]) == 0  # type: ignore[attr-defined]
    assert not lock.is_still_owner()
    assert not lock.release()
    assert b.get_lock(b"killed").acquire(blocking=False)


def test_is_still_owner_is_false_after_lockctl_release(coordinators: Make, url: str) -> None:
    """An operator force-releases the lock's variable (``lockctl release``): the holder
    learns it lost the lock (is_still_owner False) while its session lives on."""
    a, b = coordinators(), coordinators()
    lock = a.get_lock(b"released")
    assert lock.acquire()
    server = url.removeprefix("lockserver://")
    assert lockctl(["--server", server, "release", "tooz", "recipes.rw.write", "released"]) == 0
    assert not lock.is_still_owner()
    assert not lock.release()
    assert b.get_lock(b"released").acquire(blocking=False)
    assert a.get_lock(b"other").acquire(blocking=False)  # the session is alive


def test_break_frees_the_lock_for_the_next(coordinators: Make) -> None:
    """``break_()`` (tooz's forced release) frees a held lock: True, the next acquire wins,
    the broken holder's release says False and does not break the new holder's grant."""
    a, b, c = coordinators(), coordinators(), coordinators()
    la, lb = a.get_lock(b"broken"), b.get_lock(b"broken")
    assert la.acquire(blocking=False)
    assert lb.break_()
    assert lb.acquire(blocking=False)
    assert not la.release()
    assert not c.get_lock(b"broken").acquire(blocking=False)
    assert lb.is_still_owner()
    assert not c.get_lock(b"free").break_()  # nothing held: False


def test_stop_releases_everything(coordinators: Make) -> None:
    """A stopped coordinator's locks are free at once (its session ends)."""
    a, b = coordinators(), coordinators()
    assert a.get_lock(b"x").acquire()
    a.stop()
    assert b.get_lock(b"x").acquire(blocking=False)


def test_namespaces_are_apart(coordinators: Make, url: str) -> None:
    """Coordinators of two namespaces (the ``namespace`` option or the URL's path) hold
    locks of the same name independently; the path and the option name the same thing."""
    port = int(url.rsplit(":", 1)[1])
    a = coordinators(url_=url_of(port, "namespace=one"))
    b = coordinators(url_=url_of(port) + "/two")
    c = coordinators(url_=url_of(port) + "/one")
    assert a.get_lock(b"n").acquire(blocking=False)
    assert b.get_lock(b"n").acquire(blocking=False)
    assert not c.get_lock(b"n").acquire(blocking=False)


def test_calls_before_start_are_tooz_errors(coordinators: Make) -> None:
    """A coordinator that was not started says so with a ToozError."""
    c = coordinators(start=False)
    lock = c.get_lock(b"early")
    try:
        lock.acquire(blocking=False)
    except tooz.ToozError as exc:
        assert "not been started" in str(exc)
    else:
        raise AssertionError("acquire worked without start()")
