"""The server's statistics as one frozen record: what ``stats`` answers, what ``/metrics``,
``/readyz`` and the status page read, what ``lockctl status`` shows.

Rules kept (issue 32; PROTOCOL.md "stats", docs/configuration.md "Statistics"):
- **The wire does not change.** :meth:`ServerStatistics.to_wire` is the map the shell built by
  hand before: the same sections in the same order (``server``, ``waiting``, ``trust``,
  ``engine``, ``limits``, ``gc``, then ``replication`` on a replica), the same keys in the same
  order inside each, so its msgpack bytes are what an older client already reads
  (tests/server/test_statistics_record.py compares the bytes).
- **A scoped view is the same record, narrowed** (:meth:`ServerStatistics.scoped`): a principal
  that may not see the whole server gets its own counts (``LockCore.visible_counts``) in
  ``engine`` and ``waiting``, ``engine.scope`` names it, and ``server.sessions_tracked`` (of every
  principal) is left out (docs/security.md).
- The sections that already were records stay the engine's and the trust monitor's own
  (``EngineStatistics``, ``WaitStatistics``, ``TrustStatistics``); the figures of the shell are
  :class:`ShellFigures`. Sections other parts hand over as maps (busy polling, read passes, GC
  pauses, replication) stay maps inside the record: their owners keep their keys.

Taken at most once per ``stats`` turn and per scrape, never on the request path: a frozen
attrs record costs nothing that matters here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from lockserver._trust import TrustStatistics
from lockserver.engine import EngineStatistics, VisibleCounts, WaitStatistics

__all__ = ["ServerStatistics", "ShellFigures"]


@attrs.frozen
class ShellFigures:
    """The ``server`` section: who and where this server is, its connections, requests and
    what they cost (the counters of the shell, the request handler, the reader and HTTP)."""

    version: str
    build: str  # "pure" or "compiled" (lockserver/_build.py)
    host: str
    address: str
    uptime: float
    connections: int
    connections_blocked: int
    connections_total: int
    connections_refused: int
    requests_total: int
    protocol_errors: int
    internal_errors: int
    slow_consumers_dropped: int
    handshake_timeouts: int
    idle_timeouts: int
    frame_timeouts: int
    overloaded_drops: int
    receive_buffered: int
    send_buffered: int
    events_sent: int
    feed_events_sent: int
    feed_events_dropped: int
    #: Sessions whose owners the door routes to; None in a scoped view (not counted per
    #: principal), and then absent from the wire.
    sessions_tracked: int | None
    http_connections: int
    http_connections_evicted: int
    http_requests_total: int
    #: ``BusyPoll.to_wire()`` and ``Durations.passes_to_wire()``: their keys follow the ones
    #: above in the section, as their owners name them.
    busy_poll: Mapping[str, Any]
    passes: Mapping[str, Any]

    def to_wire(self) -> dict[str, Any]:
        """The section as the ``stats`` reply carries it."""
        wire: dict[str, Any] = {}
        for field in attrs.fields(ShellFigures):
            name = field.name
            value = getattr(self, name)
            if name in ("busy_poll", "passes"):
                wire.update(value)
            elif value is not None or name != "sessions_tracked":
                wire[name] = value
        return wire


@attrs.frozen
class ServerStatistics:
    """Everything the server reports about itself at one instant, in sections."""

    server: ShellFigures
    waiting: WaitStatistics
    trust: TrustStatistics
    engine: EngineStatistics
    limits: Mapping[str, Any]  # advertised_limits(config): what the welcome reports too
    gc: Mapping[str, Any]  # GcPauses.to_wire()
    replication: Mapping[str, Any] | None = None  # Replica.statistics(); None: standalone
    #: A scoped view's counts and whose they are (None: the whole server).
    visible: VisibleCounts | None = None
    scope: str | None = None

    def scoped(self, scope: str, counts: VisibleCounts) -> ServerStatistics:
        """The view of a principal named ``scope`` that may not see the whole server: its own
        counts, and no figure that counts every principal's."""
        return attrs.evolve(
            self,
            server=attrs.evolve(self.server, sessions_tracked=None),
            visible=counts,
            scope=scope,
        )

    def to_wire(self) -> dict[str, Any]:
        """The ``stats`` reply's map (PROTOCOL.md), also what ``/metrics``, ``/readyz``, the
        status page and ``RunningServer.statistics()`` read."""
        engine = self.engine.to_wire()
        waiting = self.waiting.to_wire()
        counts = self.visible
        if counts is not None:
            engine = {
                **engine,
                "namespaces": counts.namespaces,
                "tables": counts.tables,
                "entries": counts.entries,
                "sessions": counts.sessions,
                "scope": self.scope,
            }
            waiting = {**waiting, "waiters": counts.waiters}
        wire: dict[str, Any] = {
            "server": self.server.to_wire(),
            "waiting": waiting,
            "trust": attrs.asdict(self.trust),
            "engine": engine,
            "limits": dict(self.limits),
            "gc": dict(self.gc),
        }
        if self.replication is not None:
            wire["replication"] = self.replication
        return wire
