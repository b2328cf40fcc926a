"""Deadlines that can be forgotten: what the engine and the wait queue keep to expire things.

Why: a plain heap cannot drop an item before it surfaces, so everything that ended early (an
entry released before its TTL, a session ended before its max age, a waiter cancelled before
its wait ran out) stayed in memory until the deadline its client chose: 200,000
acquire+release with ``ttl=1e9`` kept 66 MB, 200,000 sessions created and ended with
``max_age=3600`` kept 78 MB, every round of 16,000 cancelled waiters kept 28 MB (issue 14).
Compacting a heap when dead items dominate would free that memory, but in one O(n) pass that
stalls every client (~0.4 s for two million items).

Theory of operation (a two-level timing wheel, as in Varghese & Lauck's "hashed and
hierarchical timing wheels", Kafka's purgatory and Netty's HashedWheelTimer): items due
before ``horizon`` sit in a heap (``near``), exactly ordered; later ones sit in dicts keyed by
their owner's key, one dict per ``span``-second bucket (``far``), with a heap of bucket
starts. Adding is O(log buckets) at most; forgetting a far item is a dict delete, O(1), and
frees it at once. A far bucket moves into the near heap when its start time comes
(``advance``): O(its items), spread over time as buckets come due. Forgetting a near item is
lazy: it stays until popped (at most ``span`` seconds), so the owner checks every popped item
(the engine already did, since a session's deadline moves lazily too).

``next_time`` is a time at or before the earliest deadline, in O(1): the near heap's head, or
the start of the earliest far bucket (the engine's hot path compares with it); ``first`` is
the exact earliest deadline (for timers), moving a bucket early when it has to. Items are
tuples whose first element is their time and second a unique sequence number, so no two
items ever compare further. Pure: no clock, deterministic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from typing import Any

from mypy_extensions import mypyc_attr

__all__ = ["Deadlines"]

Item = tuple[Any, ...]  # (time, unique seq, ...payload)


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class Deadlines:
    """Items keyed by their owner, due at their time. ``key`` must identify one live item."""

    __slots__ = ("far", "far_starts", "horizon", "near", "span")

    def __init__(self, span: float = 1.0) -> None:
        if not span > 0:
            raise ValueError(f"span must be > 0, got {span!r}")
        self.span = span
        #: Items due before ``horizon``, a heap by (time, seq).
        self.near: list[Item] = []
        #: Bucket start -> key -> item, for items due at or after ``horizon``.
        self.far: dict[float, dict[Hashable, Item]] = {}
        #: Heap of bucket starts (a start whose bucket emptied stays until it surfaces).
        self.far_starts: list[float] = []
        self.horizon = -math.inf

    def __len__(self) -> int:
        """Items held, the forgotten near ones included (until they surface)."""
        return len(self.near) + sum(len(b) for b in self.far.values())

    def add(self, key: Hashable, item: Item) -> None:
        """Queue ``item`` (``item[0]`` its time) for ``key``, which has no far item queued."""
        t = item[0]
        if t < self.horizon:
            heapq.heappush(self.near, item)
            return
        start = math.floor(t / self.span) * self.span
        bucket = self.far.get(start)
        if bucket is None:
            self.far[start] = bucket = {}
            heapq.heappush(self.far_starts, start)
            if len(self.far_starts) > 2 * len(self.far) + 1024:
                self._compact()
        bucket[key] = item

    def discard(self, key: Hashable, t: float) -> None:
        """Forget ``key``'s item queued at time ``t`` (nothing if there is none). A far item is
        freed at once; a near one is left to surface, where its owner skips it."""
        if t < self.horizon:
            return
        start = math.floor(t / self.span) * self.span
        bucket = self.far.get(start)
        if bucket is None:
            return
        item = bucket.get(key)
        if item is not None and item[0] == t:
            del bucket[key]
            if not bucket:
                del self.far[start]

    def next_time(self) -> float:
        """A time at or before the earliest deadline held (inf when empty)."""
        near = self.near[0][0] if self.near else math.inf
        far = self.far_starts[0] if self.far_starts else math.inf
        return near if near < far else far

    def first(self) -> float:
        """The earliest deadline held, exactly (inf when empty; a forgotten near item's time
        may show until it is popped). Moves the earliest far bucket into the near heap ahead
        of its time when it holds the earliest deadline: harmless, the heap is exact."""
        near = self.near
        starts = self.far_starts
        while starts and (not near or starts[0] < near[0][0]):
            self.advance(starts[0])
        return near[0][0] if near else math.inf

    def advance(self, now: float) -> None:
        """Move every far bucket whose start is at or before ``now`` into the near heap, so
        every item due by ``now`` is there, in order; from then on an item added for a time
        before the end of ``now``'s bucket goes straight to the near heap."""
        starts = self.far_starts
        near = self.near
        span = self.span
        while starts and starts[0] <= now:
            bucket = self.far.pop(heapq.heappop(starts), None)
            if bucket:
                if len(bucket) > len(near):
                    near.extend(bucket.values())
                    heapq.heapify(near)
                else:
                    for item in bucket.values():
                        heapq.heappush(near, item)
        horizon = math.floor(now / span) * span + span
        self.horizon = max(self.horizon, horizon)

    def due(self, now: float) -> bool:
        """Whether the near heap's head is due by ``now`` (call ``advance(now)`` first)."""
        return bool(self.near) and self.near[0][0] <= now

    def pop(self) -> Item:
        """Take the near heap's head (the earliest item, maybe one its owner forgot)."""
        return heapq.heappop(self.near)

    def _compact(self) -> None:
        """Drop the starts of emptied buckets (O(buckets), amortised by the doubling)."""
        self.far_starts = sorted(self.far)
