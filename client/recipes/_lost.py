"""Which ``LockLost`` events are about a recipe's grant, and what a loss does: the lost
listener every recipe registers on its session.

Why: the rules are subtle and both faces must keep them exactly (``_base``' header states
them: an event is about the grant when it names one of its variables at its fence; events
seen while acquiring are buffered; an entry-less RESTARTED or EXPIRED, made by the client at
a reconnect, is about every grant of the session). :class:`LostTracking` is the base of
:class:`~client.recipes._base.RecipeCore`, which owns the state it reads (under ``_mu``);
the listener runs in the sync face's reading thread or the async face's reader task, so it
is quick and never calls the client.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from collections.abc import Sequence
from typing import ClassVar, Generic

from protocol import LockLost, LostReason

from ._values import OnLost, S

__all__ = ["LostTracking"]

log = logging.getLogger("client.recipes")

# Reasons of the entry-less events a client makes at a reconnect (every grant is lost).
_WHOLE_SESSION = frozenset({LostReason.RESTARTED, LostReason.EXPIRED})


class LostTracking(Generic[S]):
    """The lost listener of a recipe (state and kinds' answers: ``RecipeCore``'s)."""

    TTL_IS_LOSS: ClassVar[bool]
    MATCH_LATER: ClassVar[bool]
    _session: S
    namespace: str
    on_lost: OnLost | None
    _mu: threading.Lock
    _fence: int | None
    _acquiring: bool
    _listening: bool
    _early: deque[LockLost]
    _lost_info: LockLost | None
    _lost: bool

    def _variables(self) -> Sequence[tuple[str, str]]:
        raise NotImplementedError

    def _signal_lost(self) -> None:
        raise NotImplementedError

    def _listen(self) -> None:
        with self._mu:
            if self._listening:
                return
            self._listening = True
        self._session.add_lost_listener(self._on_event)

    def _unlisten(self) -> None:
        with self._mu:
            if not self._listening or self._acquiring or self._fence is not None:
                return
            self._listening = False
        with contextlib.suppress(ValueError):  # removed twice: harmless
            self._session.remove_lost_listener(self._on_event)

    def _matches(self, event: LockLost, fence: int) -> bool:
        if not event.entries:
            # The client's notice at a reconnect: every grant of the session is gone. (A
            # server's EXPIRED with no entries says the session held none: a grant still
            # believed held was not in it either.)
            return event.reason in _WHOLE_SESSION
        if event.reason is LostReason.TTL and not self.TTL_IS_LOSS:
            return False
        variables = self._variables()
        ns = self.namespace
        later = self.MATCH_LATER
        return any(
            e_ns == ns
            and (e_fence == fence or (later and e_fence > fence))
            and (e_table, e_var) in variables
            for e_ns, e_table, e_var, e_fence in event.entries
        )

    def _on_event(self, event: LockLost) -> None:
        """The session's lost listener (reader thread / reader task): quick, no calls."""
        with self._mu:
            fence = self._fence
            if fence is None:
                if self._acquiring and event.entries:  # not a reconnect's notice: see header
                    self._early.append(event)
                return
            if self._lost or not self._matches(event, fence):
                return
        self._mark_lost(event)

    def _mark_lost(self, event: LockLost) -> None:
        with self._mu:
            if self._lost:
                return
            self._lost = True
            self._lost_info = event
        self._signal_lost()
        callback = self.on_lost
        if callback is not None:
            try:
                callback(event)
            except Exception:
                log.exception("on_lost callback %r of %r raised", callback, self)
