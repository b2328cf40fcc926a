"""The reentrant mutex: the same owner acquires again and releases as many times; written once.

Why: code that takes a lock and calls code that takes it again (a recursive walk, a public
method calling another) needs a lock that counts, as ``threading.RLock`` does in a process,
Curator's ``InterProcessMutex`` and Redisson's ``RLock`` do across processes. Here the
server holds **one** exclusive grant (``recipes.mutex``, the same table and transaction as
:class:`~client.recipes.Mutex`, so a ReentrantMutex and a Mutex of one name exclude each
other) and the client counts the owner's nested holds: the first acquire is one round trip,
the nested ones and all but the last release are none.

What "owner" means (the choice of this module, as Curator and Redisson state theirs):

- the sync face (``ReentrantMutex``): the **thread** (``threading.get_ident()``), as with
  ``threading.RLock`` and Redisson (which adds the process's id: here the process is in the
  session);
- the async faces (``AsyncReentrantMutex``, trio and asyncio): the **task**
  (``anyio.get_current_task().id``). A child task started inside the protected block is
  another owner: it waits for the lock like anyone else (give it the lock's fence, not the
  lock).

Every other owner waits as usual, on the server: an owner that does not hold the lock
acquires with its own mutex object, so a second thread or task of the same session parks its
transaction behind the first (an exclusive SetVar fails on the session's own entry too),
another session's likewise. The object is shared by its owners (unlike the other recipes,
where one object is one holder); its per-owner state is guarded by a lock.

Why a class and not ``Mutex(reentrant=True)``: the two have different contracts for the
same call. ``Mutex.acquire`` while holding is misuse (RuntimeError: one object is one
holder) and ``Mutex.release`` by a non-holder answers False; a reentrant lock succeeds on the
first and, like ``threading.RLock``, raises RuntimeError on the second, and its object is
shared between owners. A flag would make one class keep two sets of rules.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from client._session_state import SessionState

from ._base import LockLostError, OnLost, RecipeCore, S, check_name, seconds
from ._ops import Op, acquire, locked, release

__all__ = [
    "Hold",
    "ReentrantCore",
    "reentrant_acquire",
    "reentrant_locked",
    "reentrant_release",
]

L = TypeVar("L", bound=RecipeCore[Any])


class Hold(Generic[L]):
    """One owner's hold: its mutex object and how many times it acquired (0: acquiring)."""

    __slots__ = ("count", "lock")

    def __init__(self, lock: L) -> None:
        self.lock = lock
        self.count = 0


class ReentrantCore(Generic[S, L]):
    """The owner bookkeeping both faces share; the face supplies ``_owner`` (who is
    calling) and ``_new_lock`` (a mutex of its face for one owner)."""

    KIND = "reentrant mutex"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        ttl: float | None = None,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        if not isinstance(session, SessionState):
            raise TypeError(f"session must be a client session, got {type(session).__name__}")
        self._session = session
        self.namespace = check_name("namespace", namespace)
        self.name = check_name("name", name)
        self._options: dict[str, Any] = {
            "ttl": None if ttl is None else seconds("ttl", ttl, positive=True),
            "on_lost": on_lost,
            "min_uptime": min_uptime,
            "min_trust": min_trust,
            "description": description,
        }
        self._probe = self._new_lock()  # validates the options once; used by locked()
        self._mu = threading.Lock()
        self._holds: dict[Hashable, Hold[L]] = {}

    # --- what the faces provide -----------------------------------------------------------------

    def _owner(self) -> Hashable:
        raise NotImplementedError

    #: The face's mutex class, made as ``_lock_class(session, namespace, name, **options)``.
    _lock_class: Callable[..., L]

    def _new_lock(self) -> L:
        return self._lock_class(self._session, self.namespace, self.name, **self._options)

    # --- state of the calling owner -------------------------------------------------------

    def _hold(self) -> Hold[L] | None:
        with self._mu:
            hold = self._holds.get(self._owner())
        return hold if hold is not None and hold.count > 0 else None

    @property
    def session(self) -> S:
        """The session the lock is held in."""
        return self._session

    @property
    def held(self) -> bool:
        """True while the calling owner holds the lock (local knowledge, no call)."""
        return self._hold() is not None

    @property
    def count(self) -> int:
        """How many times the calling owner holds the lock (0: not at all)."""
        hold = self._hold()
        return 0 if hold is None else hold.count

    @property
    def fence(self) -> int | None:
        """The fencing token of the calling owner's grant (None when it does not hold)."""
        hold = self._hold()
        return None if hold is None else hold.lock.fence

    @property
    def lost(self) -> bool:
        """True when the calling owner's grant has been lost."""
        hold = self._hold()
        return hold is not None and hold.lock.lost

    @property
    def owners(self) -> int:
        """How many owners of this process hold the lock or are acquiring it."""
        with self._mu:
            return len(self._holds)

    def valid_for(self) -> float:
        """Seconds the calling owner's grant is certainly valid (0.0 when it does not hold)."""
        hold = self._hold()
        return 0.0 if hold is None else hold.lock.valid_for()

    def _check_lost(self) -> None:
        hold = self._hold()
        if hold is not None:
            hold.lock._check()

    def __repr__(self) -> str:
        with self._mu:
            holding = sum(1 for h in self._holds.values() if h.count > 0)
        state = "held" if holding else "free"
        return f"<{type(self).__name__} {self.namespace}/{self.name} {state}>"

    # --- the bookkeeping the operations use ----------------------------------------------------

    def _enter_nested(self, owner: Hashable) -> Hold[L] | None:
        """The owner's hold, counted once more, when it holds already (None otherwise: a
        fresh hold, count 0, is registered for it). LockLostError when its grant was lost:
        the owner must release what it holds."""
        lost: Hold[L] | None = None
        with self._mu:  # (nothing in here may call __repr__: it takes the lock too)
            hold = self._holds.get(owner)
            if hold is not None and hold.count > 0:
                if not hold.lock.lost:
                    hold.count += 1
                    return hold
                lost = hold
            elif hold is None:
                self._holds[owner] = Hold(self._new_lock())
                return None
        if lost is not None:
            raise LockLostError(self, lost.lock.lost_event_info)
        raise RuntimeError(f"{self!r}: this owner is already acquiring it")  # pragma: no cover

    def _fresh(self, owner: Hashable) -> Hold[L]:
        with self._mu:
            return self._holds[owner]

    def _acquired(self, owner: Hashable, granted: bool) -> None:
        with self._mu:
            if granted:
                self._holds[owner].count = 1
            else:
                self._holds.pop(owner, None)

    def _forget(self, owner: Hashable) -> None:
        with self._mu:
            self._holds.pop(owner, None)

    def _leave_nested(self, owner: Hashable) -> Hold[L] | None:
        """Count one release of the owner: None when it still holds (nested), its hold when
        this was the last one (the caller releases the grant and forgets the hold).
        RuntimeError when the owner does not hold the lock (``threading.RLock``'s rule)."""
        with self._mu:
            hold = self._holds.get(owner)
            if hold is not None and hold.count > 1:
                hold.count -= 1
                return None
            if hold is not None and hold.count == 1:
                hold.count = 0
                return hold
        raise RuntimeError(f"{self!r}: cannot release, the calling owner does not hold it")


def reentrant_acquire(
    rm: ReentrantCore[Any, Any], owner: Hashable, blocking: bool, timeout: float | None
) -> Op[bool]:
    """The owner's acquire: no call when it holds already (counted once more), else the
    mutex's acquire with a mutex object of its own (one round trip, waiting on the server)."""
    if rm._enter_nested(owner) is not None:
        return True
    granted = False
    try:
        granted = yield from acquire(rm._fresh(owner).lock, blocking, timeout)
    finally:
        rm._acquired(owner, granted)
    return granted


def reentrant_release(rm: ReentrantCore[Any, Any], owner: Hashable) -> Op[bool]:
    """The owner's release: no call while nested holds remain; the last one releases the
    grant (LockLostError when it was lost; the owner is free again either way)."""
    hold = rm._leave_nested(owner)
    if hold is None:
        return True
    try:
        return (yield from release(hold.lock))
    finally:
        rm._forget(owner)


def reentrant_locked(rm: ReentrantCore[Any, Any]) -> Op[bool]:
    """Whether an acquire by a new owner would not succeed now (held by anyone, this
    process's owners included); one transaction that changes nothing."""
    return (yield from locked(rm._probe))
