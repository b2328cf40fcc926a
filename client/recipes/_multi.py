"""The face-independent half of MultiLock (seed 003): the application's session and its stamps.

Why: seed 003's lock service identifies a set of read/write locks by a *stamp* returned by
``tryLocks`` and released by ``releaseLocks(stamp)`` (an unknown stamp is an error), and on
start-up an application removes what a killed instance of itself left behind
(``releaseAllLocks``, by ``app_id``). Here:

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

import threading
from typing import Generic, TypeVar

from ._base import UnknownStamp, check_name

__all__ = ["StampRegistry", "app_session_id"]

T = TypeVar("T")


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
