"""One change-feed event encoded once for every subscription that hears it.

Why: a change in a namespace with 6,400 subscriptions is one ``feed`` event for each, and the
events differ only in ``subscription`` and ``dropped`` (PROTOCOL.md §4 "feed event"). Packing
the whole map per subscription made the fan-out cost ~1 µs of msgpack per subscriber; here
the nine shared fields are packed once (:class:`FeedFrames`) and each subscriber's frame is
its length prefix, a map header, its two own fields and those shared bytes. A msgpack map's
order means nothing: the frame decodes to the same map as ``frame(pack(feed_to_wire(...)))``
of the subscriber's own event (the tests hold the two equal).
"""

from __future__ import annotations

from typing import Final

from ._codec import pack
from ._inspect import FeedEvent
from ._inspect_codec import feed_to_wire

__all__ = ["FeedFrames"]

_OWN: Final = ("subscription", "dropped")
_SUBSCRIPTION: Final = pack("subscription")
_DROPPED: Final = pack("dropped")


class FeedFrames:
    """``event``'s shared fields, packed once; :meth:`frame` is one subscriber's frame. The
    event's own ``subscription`` and ``dropped`` are ignored (each frame says its own)."""

    __slots__ = ("_fixed", "_head", "_shared")

    def __init__(self, event: FeedEvent) -> None:
        wire = feed_to_wire(event)
        for name in _OWN:
            del wire[name]
        packed = pack(wire)
        count = len(wire) + len(_OWN)
        assert packed[0] == 0x80 | len(wire) and count < 16  # fixmaps, one byte of header
        self._shared = packed[1:]
        self._head = bytes((0x80 | count,)) + _SUBSCRIPTION
        self._fixed = len(self._head) + len(_DROPPED) + len(self._shared)

    def frame(self, subscription: int, dropped: int = 0) -> bytes:
        """The framed ``feed`` event of ``subscription``, saying ``dropped``."""
        sub = pack(subscription)
        drop = pack(dropped)
        size = self._fixed + len(sub) + len(drop)
        return b"".join((size.to_bytes(4, "big"), self._head, sub, _DROPPED, drop, self._shared))
