"""The face-independent halves of the composite recipes: ReadWriteLock (two locks on one name)
and MultiLock (seed 003). Each face's class only names its lock classes and adds its calls.

ReadWriteLock is a read lock and a write lock of the same name and session, built once here
(:class:`ReadWriteBase`); the writer preference lives in their transactions (``_kinds``).

MultiLock: seed 003's lock service identifies a set of read/write locks by a *stamp* returned
by ``tryLocks`` and released by ``releaseLocks(stamp)`` (an unknown stamp is an error), and on
start-up an application removes what a killed instance of itself left behind
(``releaseAllLocks``, by ``app_id``). Here (:class:`MultiLockBase`):

- a set is a :class:`LockSet` (``_kinds.LockSetKind``): its stamp is the random value of all
  its entries, so the one release transaction deletes exactly that set's entries;
- the stamps handed out are remembered in a :class:`StampRegistry`; releasing one that is not
  there raises :class:`UnknownStamp`;
- the MultiLock's session id is **derived from the app id** (``app:<app_id>``). Every instance
  of the application therefore uses the same session, and ``release_all`` ends that session
  on the server: every entry it holds goes at once, atomically — including those of a crashed
  predecessor whose session has not expired yet. The next call re-creates the session, empty.
  (Two *live* instances with the same app id would share one session, and ``release_all``
  by one removes the other's locks: give every concurrently running instance its own id.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar, cast

from client._errors import LockClientError

from ._base import OnLost, RecipeCore, UnknownStamp, check_name
from ._ops import Op, acquire

__all__ = ["MultiLockBase", "ReadWriteBase", "StampRegistry", "app_session_id", "try_locks"]

T = TypeVar("T")
C = TypeVar("C")  # the client
S = TypeVar("S")  # the session
R = TypeVar("R", bound=RecipeCore[Any])  # the read lock
W = TypeVar("W", bound=RecipeCore[Any])  # the write lock
L = TypeVar("L", bound=RecipeCore[Any])  # the lock set

log = logging.getLogger("client.recipes")


def app_session_id(app_id: str) -> str:
    """The session id of a MultiLock of ``app_id``."""
    return "app:" + check_name("app_id", app_id)


class StampRegistry(Generic[T]):
    """Stamps handed out and not yet released -> their lock sets. Thread-safe."""

    def __init__(self) -> None:
        self._sets: dict[str, T] = {}
        self._mu = threading.Lock()

    def add(self, stamp: str, lock_set: T) -> None:
        with self._mu:
            self._sets[stamp] = lock_set

    def pop(self, stamp: object) -> T:
        """Forget ``stamp`` and return its set; UnknownStamp when it is not here."""
        with self._mu:
            if type(stamp) is str and stamp in self._sets:
                return self._sets.pop(stamp)
        raise UnknownStamp(
            f"unknown stamp {stamp!r}: not handed out by this MultiLock, or already released"
        )

    def take_all(self) -> list[T]:
        """Forget every stamp; return their sets."""
        with self._mu:
            sets = list(self._sets.values())
            self._sets.clear()
        return sets

    def stamps(self) -> list[str]:
        with self._mu:
            return list(self._sets)

    def __len__(self) -> int:
        return len(self._sets)


class ReadWriteBase(Generic[S, R, W]):
    """Many readers or one writer: ``read`` and ``write`` are the two locks of ``name`` (each
    one holder, with the whole lock interface). A face names its lock classes."""

    _read_lock: Callable[..., R]
    _write_lock: Callable[..., W]

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        options: dict[str, Any] = {
            "on_lost": on_lost,
            "min_uptime": min_uptime,
            "min_trust": min_trust,
            "description": description,
        }
        self.read: R = self._read_lock(session, namespace, name, **options)
        self.write: W = self._write_lock(session, namespace, name, **options)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.read.namespace}/{self.read.name}>"


class MultiLockBase(Generic[C, S, L]):
    """The state of a MultiLock: its client, its application's session, the stamps handed
    out. A face names its lock-set class, opens the session and adds the calls."""

    _lock_set: Callable[..., L]

    def __init__(
        self,
        client: C,
        namespace: str,
        app_id: str,
        *,
        max_age: float = 60.0,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
    ) -> None:
        self.client = client
        self.app_id = app_id
        self.namespace = namespace
        self.session: S = self._open(client, max_age, f"MultiLock {app_id}", app_session_id(app_id))
        self._options = (on_lost, min_uptime, min_trust)
        self._stamps: StampRegistry[L] = StampRegistry()

    def _open(self, client: C, max_age: float, description: str, session_id: str) -> S:
        """The application's session on ``client`` (either face's ``session()``: no I/O)."""
        opened: S = cast(Any, client).session(
            max_age=max_age, description=description, session_id=session_id
        )
        return opened

    def lock_set(self, locks: Mapping[str, str] | Iterable[tuple[str, str]]) -> L:
        """A lock object for the set ``locks`` in this application's session."""
        on_lost, min_uptime, min_trust = self._options
        return self._lock_set(
            self.session,
            self.namespace,
            locks,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
        )

    def stamps(self) -> list[str]:
        """The stamps handed out and not released."""
        return self._stamps.stamps()

    def _granted(self, lock_set: L) -> str:
        """Remember a granted set; its stamp."""
        stamp = lock_set.ticket
        assert stamp is not None
        self._stamps.add(stamp, lock_set)
        return stamp

    def _forget_all(self) -> None:
        """Forget every stamp (the session is about to end, taking their entries)."""
        for lock_set in self._stamps.take_all():
            lock_set._forget()

    def _end_failed(self, error: LockClientError, exc: BaseException | None) -> None:
        """Ending the session at the end of a ``with`` block failed with ``error``: raise it,
        unless the block itself raised ``exc`` (then log it; the session expires anyway)."""
        if exc is None:
            raise error
        log.warning(
            "ending MultiLock session %s failed", app_session_id(self.app_id), exc_info=error
        )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.namespace} app={self.app_id} stamps={len(self._stamps)}>"
        )


def try_locks(
    m: MultiLockBase[Any, Any, Any],
    locks: Mapping[str, str] | Iterable[tuple[str, str]],
    *,
    blocking: bool = False,
    timeout: float | None = None,
) -> Op[str | None]:
    """Take every lock of ``locks`` or none, in one transaction; the stamp, or None when
    not granted. Tries once unless ``blocking`` (then as ``acquire``)."""
    lock_set = m.lock_set(locks)
    granted = yield from acquire(lock_set, blocking, timeout)
    return m._granted(lock_set) if granted else None
