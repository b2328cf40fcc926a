"""Watching the change feed from a recipe: the sink its events go to, and the steps that use it.

Why: an election's ``observe()`` and a group's ``watch()`` learn of changes from the server's
change feed (PROTOCOL.md, "subscribe"), never by polling. Their subscription is made with a
sink (``client._core.FeedSink``), so its events reach the recipe and nobody else: the
application's own ``feed_events()`` neither takes them nor loses its own to them. The sink
also hears what a watcher must not hide: the subscription was made again on a new connection
(``gap``: the events of the reconnect were never sent), the connection dropped
(``connection_lost``), or more events came than a watcher that did not keep up may buffer
(an overflow is a gap too).

The logic is written once, as the steps of ``_ops`` (a generator yields them, a face's
driver runs them): :class:`SubscribeFeed` and :class:`UnsubscribeFeed` go to the session's client,
:class:`NextFeed` waits on the sink (the sync face reads the connection itself while no
other thread does; the async face's reader task fills the sink), and :class:`Emit` hands a
value to the caller of an iterator (``observe``, ``watch``). The face-specific part of a sink
is only how it wakes a waiter (``_wake``, ``next``): ``SyncFeedSink`` in ``_sync_coord``,
``AsyncFeedSink`` in ``_async_coord``.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Generator
from typing import Any

import attrs

from client._errors import LockClientError
from protocol import FeedEvent, FeedKind

__all__ = [
    "FEED_LIMIT",
    "DEATHS",
    "Emit",
    "FeedBatch",
    "FeedSinkBase",
    "NextFeed",
    "StopWatching",
    "SubscribeFeed",
    "UnsubscribeFeed",
    "unsubscribe_all",
]

#: Events a watcher's sink keeps while its caller is not taking them; one more is a gap (the
#: watcher reads the state again instead of replaying what it missed).
FEED_LIMIT = 10_000

#: Feed kinds that say an entry went without its holder asking (its session expired or was
#: ended, an operator released it): the holder is gone, or no longer holds.
DEATHS = frozenset({FeedKind.EXPIRED, FeedKind.KILLED, FeedKind.LOST})


@attrs.frozen
class FeedBatch:
    """What a sink had when a watcher looked: the events in arrival order; ``gap``: events
    may have been missed since the last batch (a reconnect, an overflow, the server dropped
    some: the watcher must read the state again); ``lost``: the connection dropped (the next
    request reconnects, which makes the subscription again)."""

    events: tuple[FeedEvent, ...] = ()
    gap: bool = False
    lost: bool = False

    def __bool__(self) -> bool:
        return bool(self.events) or self.gap or self.lost


class FeedSinkBase:
    """The face-independent half of a watcher's sink: a bounded buffer and two flags, guarded
    by a lock (the sync face's events are put by whichever thread reads the connection)."""

    def __init__(self, limit: int = FEED_LIMIT) -> None:
        self._mu = threading.Lock()
        self._events: deque[FeedEvent] = deque()
        self._limit = limit
        self._gap = False
        self._lost = False

    # --- FeedSink (called by the reading thread or task) --------------------------------------

    def put(self, event: FeedEvent) -> None:
        with self._mu:
            if len(self._events) >= self._limit:
                self._events.clear()  # it fell behind: read the state again instead
                self._gap = True
            else:
                self._events.append(event)
            if event.dropped:
                self._gap = True  # the server could not send some before this one
        self._wake()

    def gap(self) -> None:
        with self._mu:
            self._gap = True
        self._wake()

    def connection_lost(self) -> None:
        with self._mu:
            self._lost = True
        self._wake()

    # --- the watcher's side ---------------------------------------------------------------

    def take(self) -> FeedBatch:
        """Everything since the last ``take`` (an empty batch when nothing happened)."""
        with self._mu:
            batch = FeedBatch(tuple(self._events), self._gap, self._lost)
            self._events.clear()
            self._gap = self._lost = False
        return batch

    def peek(self) -> tuple[FeedEvent, ...]:
        """The events waiting (not taken): what arrived before a read's reply describes
        changes that read already saw (a watcher takes reasons from them)."""
        with self._mu:
            return tuple(self._events)

    def _pending(self) -> bool:
        """True when a watcher has something to take (events, a gap, the loss)."""
        with self._mu:
            return bool(self._events) or self._gap or self._lost

    def _wake(self) -> None:
        """Wake a watcher waiting in the face's ``next`` (called after every change)."""
        raise NotImplementedError


class SubscribeFeed:
    """The step "subscribe to ``table`` of the recipe's namespace with ``sink``": the
    driver sends back the subscription's id."""

    __slots__ = ("sink", "table")
    cleanup = False

    def __init__(self, table: str, sink: FeedSinkBase) -> None:
        self.table = table
        self.sink = sink

    def __repr__(self) -> str:
        return f"<SubscribeFeed {self.table}>"

    def run(self, session: Any, namespace: str) -> Any:
        """``client.subscribe(...)``: the id (sync face) or an awaitable of it (async)."""
        return session.client.subscribe(namespace, self.table, sink=self.sink)


class UnsubscribeFeed:
    """The step "end subscription ``subscription``" (a cleanup: it runs even when the
    watcher is being cancelled; bounded on the async face)."""

    __slots__ = ("subscription",)
    cleanup = True

    def __init__(self, subscription: int) -> None:
        self.subscription = subscription

    def __repr__(self) -> str:
        return f"<UnsubscribeFeed {self.subscription}>"

    def run(self, session: Any, namespace: str) -> Any:
        return session.client.unsubscribe(self.subscription)


class NextFeed:
    """The step "wait until the sink has something, at most ``timeout`` seconds (None: no
    bound)": the driver sends back a :class:`FeedBatch` (empty when the time ran out)."""

    __slots__ = ("sink", "timeout")
    cleanup = False

    def __init__(self, sink: FeedSinkBase, timeout: float | None = None) -> None:
        self.sink = sink
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"<NextFeed timeout={self.timeout}>"

    def run(self, session: Any, namespace: str) -> Any:
        """The face's sink waits (sync: blocking, reading the connection when nobody else
        does; async: an awaitable)."""
        return self.sink.next(session.client, self.timeout)  # type: ignore[attr-defined]


class Emit:
    """The step "hand ``value`` to the caller of the iterator" (``observe``, ``watch``); the
    driver yields it and sends back None."""

    __slots__ = ("value",)
    cleanup = False

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"<Emit {self.value!r}>"


class StopWatching(Exception):
    """Thrown into a watching operation by its driver when the caller stops iterating: the
    operation ends its subscriptions and returns."""


def unsubscribe_all(subscriptions: list[int]) -> Generator[UnsubscribeFeed, Any, None]:
    """End each subscription (cleanup steps); one that fails is gone with its connection."""
    for subscription in subscriptions:
        with contextlib.suppress(LockClientError):
            yield UnsubscribeFeed(subscription)
    subscriptions.clear()
