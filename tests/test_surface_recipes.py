"""The public surface of ``client.recipes`` (docs/recipes.md): every name in ``__all__`` with
its kind, the table names and task states (other clients read and write the same tables), the
constructors and the lock interface of both faces. Only public names are pinned here —
nothing below imports a private module — so the recipes' internals may change freely; a
change that fails this file changes what users call."""

from __future__ import annotations

import inspect
import threading
import types
from collections.abc import Callable
from typing import Any

import pytest
import trio
from support import ThreadedServer

import client
from client import LockClient, LockClientError, open_lock_client, recipes
from client.recipes import (
    AsyncBarrier,
    AsyncCountDownLatch,
    AsyncDoubleBarrier,
    AsyncElection,
    AsyncGroup,
    AsyncLock,
    AsyncLockSet,
    AsyncMultiLock,
    AsyncMutex,
    AsyncReadLock,
    AsyncReadWriteLock,
    AsyncReentrantMutex,
    AsyncSemaphore,
    AsyncStateLock,
    AsyncTimeWindowLock,
    AsyncWriteLock,
    Barrier,
    CountDownLatch,
    DoubleBarrier,
    Election,
    Group,
    LockLostError,
    LockSet,
    MultiLock,
    Mutex,
    NotAcquired,
    ReadLock,
    ReadWriteLock,
    ReentrantMutex,
    Semaphore,
    StateLock,
    SyncLock,
    TimeWindowLock,
    UnknownStamp,
    WriteLock,
)
from lockserver import RunningServer

CLASS, FUNCTION, CONSTANT = "class", "function", "constant"

#: Every public name and what it is.
PUBLIC = {
    # sync face
    "Mutex": CLASS,
    "ReadWriteLock": CLASS,
    "ReadLock": CLASS,
    "WriteLock": CLASS,
    "LockSet": CLASS,
    "MultiLock": CLASS,
    "Semaphore": CLASS,
    "TimeWindowLock": CLASS,
    "StateLock": CLASS,
    "SyncLock": CLASS,
    # async face
    "AsyncMutex": CLASS,
    "AsyncReadWriteLock": CLASS,
    "AsyncReadLock": CLASS,
    "AsyncWriteLock": CLASS,
    "AsyncLockSet": CLASS,
    "AsyncMultiLock": CLASS,
    "AsyncSemaphore": CLASS,
    "AsyncTimeWindowLock": CLASS,
    "AsyncStateLock": CLASS,
    "AsyncLock": CLASS,
    # coordination recipes, sync face
    "Election": CLASS,
    "ReentrantMutex": CLASS,
    "Barrier": CLASS,
    "DoubleBarrier": CLASS,
    "CountDownLatch": CLASS,
    "Group": CLASS,
    # ... async face
    "AsyncElection": CLASS,
    "AsyncReentrantMutex": CLASS,
    "AsyncBarrier": CLASS,
    "AsyncDoubleBarrier": CLASS,
    "AsyncCountDownLatch": CLASS,
    "AsyncGroup": CLASS,
    "AsyncWatch": CLASS,
    # ... and what they report
    "LeaderInfo": CLASS,
    "LeaderChange": CLASS,
    "Member": CLASS,
    "GroupChange": CLASS,
    # permits (both faces)
    "set_permits": FUNCTION,
    "clear_permits": FUNCTION,
    "get_permits": FUNCTION,
    # errors
    "LockLostError": CLASS,
    "NotAcquired": CLASS,
    "UnknownStamp": CLASS,
    # task states and tables
    "DONE": CONSTANT,
    "FAILED": CONSTANT,
    "IN_PROGRESS": CONSTANT,
    "MUTEX_TABLE": CONSTANT,
    "CANCELLED_TABLE": CONSTANT,
    "TOMBSTONE_LINGER": CONSTANT,
    "READ_TABLE": CONSTANT,
    "WRITE_TABLE": CONSTANT,
    "PERMITS_TABLES": CONSTANT,
    "SEMAPHORE_TABLE": CONSTANT,
    "WINDOW_TABLE": CONSTANT,
    "CLAIM_TABLE": CONSTANT,
    "STATE_TABLE": CONSTANT,
    "ELECTION_TABLE": CONSTANT,
    "ELECTION_VALUE_TABLE": CONSTANT,
    "BARRIER_TABLE": CONSTANT,
    "BARRIER_OUT_TABLE": CONSTANT,
    "LATCH_TABLE": CONSTANT,
    "GROUP_TABLE": CONSTANT,
    "GROUP_META_TABLE": CONSTANT,
}


def kind_of(obj: object) -> str:
    if isinstance(obj, type):
        return CLASS
    if isinstance(obj, types.FunctionType):
        return FUNCTION
    return CONSTANT


def plain_signature(obj: Callable[..., Any]) -> str:
    """The signature as users call it: names, kinds and defaults, without annotations."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))


def test_all_is_exactly_the_public_surface() -> None:
    """client.recipes.__all__ lists exactly these names, once each, each of its kind (class,
    function, constant); no other public attribute; star-import gives exactly __all__."""
    assert len(recipes.__all__) == len(set(recipes.__all__))
    assert set(recipes.__all__) == set(PUBLIC)
    assert {n: kind_of(getattr(recipes, n)) for n in recipes.__all__} == PUBLIC
    public_attrs = {
        n
        for n in dir(recipes)
        if not n.startswith("_") and not isinstance(getattr(recipes, n), types.ModuleType)
    }
    assert public_attrs == set(recipes.__all__)
    namespace: dict[str, object] = {}
    exec("from client.recipes import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(recipes.__all__)


def test_client_re_exports_are_the_same_objects() -> None:
    """The recipes that ``client`` also exports (docs/recipes.md: "also importable from
    client") are the very same objects, and include every lock, both MultiLocks, the permits
    functions and the errors."""
    shared = [n for n in client.__all__ if n in recipes.__all__]
    for name in shared:
        assert getattr(client, name) is getattr(recipes, name), name
    assert set(shared) == {
        "Mutex",
        "ReadWriteLock",
        "LockSet",
        "MultiLock",
        "Semaphore",
        "TimeWindowLock",
        "StateLock",
        "AsyncMutex",
        "AsyncReadWriteLock",
        "AsyncLockSet",
        "AsyncMultiLock",
        "AsyncSemaphore",
        "AsyncTimeWindowLock",
        "AsyncStateLock",
        "Election",
        "ReentrantMutex",
        "Barrier",
        "DoubleBarrier",
        "CountDownLatch",
        "Group",
        "AsyncElection",
        "AsyncReentrantMutex",
        "AsyncBarrier",
        "AsyncDoubleBarrier",
        "AsyncCountDownLatch",
        "AsyncGroup",
        "set_permits",
        "clear_permits",
        "get_permits",
        "LockLostError",
        "NotAcquired",
        "UnknownStamp",
    }


def test_tables_and_task_states() -> None:
    """The recipes' table names and task states: they are data on the server that every
    client of a lock (in any language) must spell the same way."""
    assert recipes.MUTEX_TABLE == "recipes.mutex"
    assert recipes.CANCELLED_TABLE == "recipes.cancelled"
    assert recipes.READ_TABLE == "recipes.rw.read"
    assert recipes.WRITE_TABLE == "recipes.rw.write"
    assert recipes.PERMITS_TABLES == {"r": "recipes.permits.read", "w": "recipes.permits.write"}
    assert recipes.SEMAPHORE_TABLE == "recipes.semaphore"
    assert recipes.WINDOW_TABLE == "recipes.window"
    assert recipes.CLAIM_TABLE == "recipes.task.claim"
    assert recipes.STATE_TABLE == "recipes.task.state"
    assert (recipes.DONE, recipes.FAILED, recipes.IN_PROGRESS) == ("done", "failed", "in_progress")
    assert recipes.ELECTION_TABLE == "recipes.election"
    assert recipes.ELECTION_VALUE_TABLE == "recipes.election.value"
    assert recipes.BARRIER_TABLE == "recipes.barrier"
    assert recipes.BARRIER_OUT_TABLE == "recipes.barrier.out"
    assert recipes.LATCH_TABLE == "recipes.latch"
    assert recipes.GROUP_TABLE == "recipes.group"
    assert recipes.GROUP_META_TABLE == "recipes.group.meta"


def test_errors() -> None:
    """The three errors are LockClientErrors; LockLostError carries ``lock`` and ``event``,
    NotAcquired ``lock`` and ``result``."""
    for error in (LockLostError, NotAcquired, UnknownStamp):
        assert issubclass(error, LockClientError)
    lock = object()
    lost = LockLostError(lock, None)
    assert (lost.lock, lost.event) == (lock, None)
    refused = NotAcquired(lock, None)
    assert (refused.lock, refused.result) == (lock, None)
    assert isinstance(UnknownStamp("no such stamp"), LockClientError)


COMMON = "on_lost=None, min_uptime=0.0, min_trust=0.0, description=''"

#: The constructor of every lock, one signature per kind, the same on both faces.
CONSTRUCTORS = {
    (Mutex, AsyncMutex): f"(session, namespace, name, *, ttl=None, ticket=None, {COMMON})",
    (ReadLock, AsyncReadLock): f"(session, namespace, name, *, {COMMON})",
    (WriteLock, AsyncWriteLock): f"(session, namespace, name, *, {COMMON})",
    (ReadWriteLock, AsyncReadWriteLock): f"(session, namespace, name, *, {COMMON})",
    (LockSet, AsyncLockSet): f"(session, namespace, locks, *, {COMMON})",
    (Semaphore, AsyncSemaphore): f"(session, namespace, name, *, permits, {COMMON})",
    (TimeWindowLock, AsyncTimeWindowLock): f"(session, namespace, name, *, period, {COMMON})",
    (StateLock, AsyncStateLock): f"(session, namespace, task, *, {COMMON})",
    (SyncLock, AsyncLock): f"(session, namespace, name, *, {COMMON})",
    (Election, AsyncElection): f"(session, namespace, name, *, {COMMON})",
    (ReentrantMutex, AsyncReentrantMutex): f"(session, namespace, name, *, ttl=None, {COMMON})",
    (Barrier, AsyncBarrier): (
        f"(session, namespace, name, *, parties, on_party_lost=None, {COMMON})"
    ),
    (DoubleBarrier, AsyncDoubleBarrier): (
        f"(session, namespace, name, *, parties, on_party_lost=None, {COMMON})"
    ),
    (CountDownLatch, AsyncCountDownLatch): (
        "(session, namespace, name, *, count, max_age=None, description='')"
    ),
    (Group, AsyncGroup): f"(session, namespace, name, *, member_id=None, {COMMON})",
    (MultiLock, AsyncMultiLock): (
        "(client, namespace, app_id, *, max_age=60.0, on_lost=None, min_uptime=0.0, min_trust=0.0)"
    ),
}


@pytest.mark.parametrize(
    ("classes", "expected"), list(CONSTRUCTORS.items()), ids=[c[0].__name__ for c in CONSTRUCTORS]
)
def test_constructors(classes: tuple[type, type], expected: str) -> None:
    """Each recipe is built with these arguments (keyword-only after the names), the same on
    the sync and the async face."""
    for cls in classes:
        assert plain_signature(cls) == expected, cls.__name__


SYNC_LOCKS = [Mutex, ReadLock, WriteLock, LockSet, Semaphore, TimeWindowLock, StateLock]
ASYNC_LOCKS = [
    AsyncMutex,
    AsyncReadLock,
    AsyncWriteLock,
    AsyncLockSet,
    AsyncSemaphore,
    AsyncTimeWindowLock,
    AsyncStateLock,
]
#: Read-only state every lock has (docs/recipes.md, "The common interface").
STATE = ["session", "held", "fence", "ticket", "lost", "lost_event", "lost_event_info"]


def _method(cls: type, name: str) -> Any:
    found = inspect.getattr_static(cls, name)
    assert inspect.isfunction(found), (cls.__name__, name)
    return found


def _check_state(cls: type) -> None:
    for name in STATE:
        assert isinstance(inspect.getattr_static(cls, name), property), (cls.__name__, name)


@pytest.mark.parametrize("cls", SYNC_LOCKS, ids=lambda c: c.__name__)
def test_sync_lock_interface(cls: type) -> None:
    """Every sync lock is a SyncLock with the blocking interface (threading.Lock
    conventions): acquire(blocking=True, timeout=None), release(), locked(), check(),
    refresh(), valid_for(), ``with``; plain calls, none of them a coroutine."""
    assert issubclass(cls, SyncLock)
    release = "(self, state=None)" if cls is StateLock else "(self)"
    for name, signature in [
        ("acquire", "(self, blocking=True, timeout=None)"),
        ("release", release),
        ("locked", "(self)"),
        ("check", "(self)"),
        ("refresh", "(self)"),
        ("valid_for", "(self)"),
        ("__enter__", "(self)"),
        ("__exit__", "(self, exc_type, exc, tb)"),
    ]:
        method = _method(cls, name)
        assert not inspect.iscoroutinefunction(method), (cls.__name__, name)
        assert plain_signature(method) == signature, (cls.__name__, name)
    _check_state(cls)


@pytest.mark.parametrize("cls", ASYNC_LOCKS, ids=lambda c: c.__name__)
def test_async_lock_interface(cls: type) -> None:
    """Every async-face lock is an AsyncLock: acquire, release, locked, refresh, wait_lost and
    ``async with`` are coroutines; check() and valid_for() are plain calls (no I/O)."""
    assert issubclass(cls, AsyncLock)
    release = "(self, state=None)" if cls is AsyncStateLock else "(self)"
    for name, signature, is_async in [
        ("acquire", "(self, blocking=True, timeout=None)", True),
        ("release", release, True),
        ("locked", "(self)", True),
        ("refresh", "(self)", True),
        ("wait_lost", "(self)", True),
        ("__aenter__", "(self)", True),
        ("__aexit__", "(self, exc_type, exc, tb)", True),
        ("check", "(self)", False),
        ("valid_for", "(self)", False),
    ]:
        method = _method(cls, name)
        assert inspect.iscoroutinefunction(method) is is_async, (cls.__name__, name)
        assert plain_signature(method) == signature, (cls.__name__, name)
    _check_state(cls)


@pytest.mark.parametrize(
    ("sync_cls", "async_cls", "extra"),
    [
        (Mutex, AsyncMutex, ["acquired_at", "expires_at"]),
        (LockSet, AsyncLockSet, ["stamp", "locks"]),
        (TimeWindowLock, AsyncTimeWindowLock, ["window_ends_at"]),
        (StateLock, AsyncStateLock, ["task", "previous_state"]),
    ],
    ids=["mutex", "lock-set", "time-window", "state"],
)
def test_kind_specific_state(sync_cls: type, async_cls: type, extra: list[str]) -> None:
    """The state some kinds add, as read-only properties on both faces."""
    for cls in (sync_cls, async_cls):
        for name in extra:
            assert isinstance(inspect.getattr_static(cls, name), property), (cls.__name__, name)


def test_state_lock_reads_the_task_state() -> None:
    """StateLock.state() reads the task's state now: a plain call on the sync face, a
    coroutine on the async face."""
    assert plain_signature(_method(StateLock, "state")) == "(self)"
    assert not inspect.iscoroutinefunction(_method(StateLock, "state"))
    assert plain_signature(_method(AsyncStateLock, "state")) == "(self)"
    assert inspect.iscoroutinefunction(_method(AsyncStateLock, "state"))


MULTI_METHODS = [
    ("lock_set", "(self, locks)", False),
    ("try_locks", "(self, locks, *, blocking=False, timeout=None)", True),
    ("release_locks", "(self, stamp)", True),
    ("release_all", "(self)", True),
    ("stamps", "(self)", False),
]


def test_multilock_interface() -> None:
    """MultiLock (seed 003's lock service): lock_set, try_locks, release_locks, release_all,
    stamps, close and ``with``; AsyncMultiLock the same with coroutines for what calls the
    server, aclose and ``async with``."""
    for name, signature, calls in MULTI_METHODS:
        sync_method = _method(MultiLock, name)
        async_method = _method(AsyncMultiLock, name)
        assert plain_signature(sync_method) == plain_signature(async_method) == signature, name
        assert not inspect.iscoroutinefunction(sync_method), name
        assert inspect.iscoroutinefunction(async_method) is calls, name
    assert plain_signature(_method(MultiLock, "close")) == "(self)"
    assert plain_signature(_method(MultiLock, "__enter__")) == "(self)"
    assert plain_signature(_method(MultiLock, "__exit__")) == "(self, exc_type, exc, tb)"
    assert inspect.iscoroutinefunction(_method(AsyncMultiLock, "aclose"))
    assert inspect.iscoroutinefunction(_method(AsyncMultiLock, "__aenter__"))
    assert inspect.iscoroutinefunction(_method(AsyncMultiLock, "__aexit__"))


def test_permits_functions() -> None:
    """set_permits / clear_permits / get_permits take (session, namespace, lock, mode[,
    permits]) and serve both faces (one function each)."""
    assert plain_signature(recipes.set_permits) == "(session, namespace, lock, mode, permits)"
    assert plain_signature(recipes.clear_permits) == "(session, namespace, lock, mode)"
    assert plain_signature(recipes.get_permits) == "(session, namespace, lock, mode)"


def test_a_new_sync_lock_holds_nothing_and_sends_nothing(
    threaded_server: ThreadedServer[RunningServer],
) -> None:
    """A new lock object is free: not held, no fence or ticket, not lost, an unset
    threading.Event, valid for 0 s, no result yet; ``on_lost`` is settable; building it sends
    nothing. A ReadWriteLock is its ``read`` and ``write`` locks; a MultiLock's session is
    ``app:<app_id>``."""
    with LockClient(port=threaded_server.port, timeout=5) as c, c.session() as s:
        sent = c.local_statistics().requests_sent
        lock = Mutex(s, "surface", "m")
        assert (lock.namespace, lock.name, lock.session) == ("surface", "m", s)
        assert (lock.held, lock.fence, lock.ticket, lock.lost) == (False, None, None, False)
        assert isinstance(lock.lost_event, threading.Event) and not lock.lost_event.is_set()
        assert (lock.lost_event_info, lock.last_result, lock.valid_for()) == (None, None, 0.0)
        assert lock.on_lost is None
        lock.on_lost = print
        assert lock.on_lost is print
        rw = ReadWriteLock(s, "surface", "rw")
        assert isinstance(rw.read, ReadLock) and isinstance(rw.write, WriteLock)
        assert (rw.read.name, rw.write.name) == ("rw", "rw")
        assert c.local_statistics().requests_sent == sent
        with MultiLock(c, "surface", "app1") as multi:
            assert (multi.client, multi.namespace, multi.app_id) == (c, "surface", "app1")
            assert multi.session.id == "app:app1"
            assert multi.stamps() == []


async def test_a_new_async_lock_holds_nothing(server: RunningServer) -> None:
    """The async face's new lock is free the same way, with an unset event to ``await
    wait()`` on; an AsyncReadWriteLock is its ``read`` and ``write`` locks."""
    with trio.fail_after(10):
        async with open_lock_client(port=server.port) as c, c.session() as s:
            lock = AsyncMutex(s, "surface", "m")
            assert (lock.held, lock.fence, lock.ticket, lock.lost) == (False, None, None, False)
            event = lock.lost_event  # an event of the running loop's library (trio here)
            assert not event.is_set() and inspect.iscoroutinefunction(type(event).wait)
            assert (lock.lost_event_info, lock.last_result, lock.valid_for()) == (None, None, 0.0)
            rw = AsyncReadWriteLock(s, "surface", "rw")
            assert isinstance(rw.read, AsyncReadLock) and isinstance(rw.write, AsyncWriteLock)
