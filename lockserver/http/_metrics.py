"""What the server exposes for monitoring: the request-duration histogram the reader keeps,
the history ring behind the status page's chart, and the Prometheus collector of ``/metrics``.

Rules kept (issue 16 section 3):
- **The hot path pays nothing it did not pay before, or next to nothing.** The collector
  reads the server's existing counters when Prometheus scrapes (a custom ``Collector`` on a
  private ``CollectorRegistry`` per server, never the global one), so nothing is counted
  twice. The one new per-traffic cost is :class:`Durations`: the poller already reads the
  clock before and after each pass over the ready connections (its busy-poll policy); each
  pass adds its duration to one bucket, weighted by the requests it served (a bisect and two
  additions per pass, not per request).
- Names follow Prometheus conventions: ``lockserver_`` prefix, ``_total`` counters, base
  units (seconds, bytes), no session ids or other unbounded values as labels.
- :class:`History` is bounded (:data:`HISTORY_SIZE` samples, taken on the trust monitor's
  ticks), so a server up for a year holds the same few kilobytes as one up for a minute.

Theory of operation: a pass's duration is the time from the poller's wake-up to the last
reply of the pass being sent, so it is an upper bound of the server time of every request it
served (read, decode, the door, encode, send), and exactly that of its last. Waits of parked
transactions are not in it (they are in ``lockserver_waits_total``).
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from lockserver._gcstats import GcPauses

from ._http import HttpCounters

__all__ = ["DURATION_BOUNDS", "HISTORY_SIZE", "Durations", "History", "ServerCollector"]

#: Upper bounds (seconds) of the request-duration buckets: 50 µs (a pipelined request) to
#: one second (a pass stalled by a collector pause or a huge transaction).
DURATION_BOUNDS: Final = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)

#: Samples the history keeps: ten minutes at the default trust tick of one second.
HISTORY_SIZE: Final = 600


class Durations:
    """Bucket counts of request durations and of the read passes that served them, kept as
    plain ints (the reader observes them).

    Why the passes too: a request's duration is its pass's, so a long pass shows in the
    request buckets weighted by the requests it served; counted once per pass, with the
    longest, it answers "did the server itself stall?" -- a client that saw an 8 ms reply
    while no pass took over 3 ms was delayed elsewhere (the network, its own process, the
    machine's scheduler)."""

    __slots__ = ("bounds", "counts", "longest", "pass_total", "passes", "total")

    def __init__(self, bounds: tuple[float, ...] = DURATION_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: over every bound (+Inf)
        self.total = 0.0  # sum of the observed durations, in seconds
        self.passes = [0] * (len(bounds) + 1)  # read passes by duration, same buckets
        self.pass_total = 0.0  # sum of the passes' durations, in seconds
        self.longest = 0.0  # the longest pass since start, in seconds

    def observe(self, seconds: float, n: int) -> None:
        """A read pass of ``seconds`` served ``n`` requests (each took at most that)."""
        i = bisect_left(self.bounds, seconds)
        self.counts[i] += n
        self.total += seconds * n
        self.passes[i] += 1
        self.pass_total += seconds
        self.longest = max(self.longest, seconds)

    def passes_to_wire(self) -> dict[str, Any]:
        """The read passes for the statistics reply: ``read_passes`` (count),
        ``read_pass_histogram`` (upper bound in seconds as text, ``"+inf"`` last -> passes
        in that bucket, not cumulative) and ``read_pass_longest`` (seconds, since start)."""
        labels = (*map(repr, self.bounds), "+inf")
        return {
            "read_passes": sum(self.passes),
            "read_pass_histogram": dict(zip(labels, self.passes, strict=True)),
            "read_pass_longest": self.longest,
        }

    def cumulative_passes(self) -> list[tuple[str, float]]:
        """The pass buckets as Prometheus wants them."""
        return _cumulative(self.bounds, self.passes)

    def cumulative(self) -> list[tuple[str, float]]:
        """The buckets as Prometheus wants them: ``(upper bound, count at or below)``."""
        return _cumulative(self.bounds, self.counts)


def _cumulative(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, float]]:
    out = []
    running = 0
    for bound, count in zip((*map(repr, bounds), "+Inf"), counts, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


class History:
    """The last :data:`HISTORY_SIZE` samples of uptime, trust, NORM, load and transactions
    per second, for the status page's chart. Sampled on the trust monitor's ticks."""

    __slots__ = ("_last", "_samples")

    def __init__(self, size: int = HISTORY_SIZE) -> None:
        self._samples: deque[tuple[float, float, float, float, float]] = deque(maxlen=size)
        self._last: tuple[float, int] | None = None  # (uptime, calls) of the last sample

    def sample(self, uptime: float, trust: float, norm: float, load: float, calls: int) -> None:
        """Add a sample; ``calls`` is the running count of transactions (the trust
        monitor's ``calls_total``): the rate is its change since the previous sample."""
        last = self._last
        rate = 0.0
        if last is not None and uptime > last[0]:
            rate = (calls - last[1]) / (uptime - last[0])
        self._last = (uptime, calls)
        self._samples.append((uptime, trust, norm, load, rate))

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def rate(self) -> float:
        """Transactions per second over the last sampling interval (0 before two samples)."""
        return self._samples[-1][4] if self._samples else 0.0

    def to_json(self) -> dict[str, list[float]]:
        """Columns, oldest first: ``uptime``, ``trust``, ``norm``, ``load``,
        ``transactions_per_second``."""
        names = ("uptime", "trust", "norm", "load", "transactions_per_second")
        columns: dict[str, list[float]] = {name: [] for name in names}
        lists = [columns[name] for name in names]
        for sample in self._samples:
            for column, value in zip(lists, sample, strict=True):
                column.append(round(value, 4))
        return columns


def _outcome_labels(outcome: str) -> tuple[str, str]:
    """``"TransactionError:Statement"`` -> ``("TransactionError", "Statement")``; an outcome
    without a cause (``TransactionOK``) has cause ``Unspecified`` (PROTOCOL.md section 6)."""
    status, _, cause = outcome.partition(":")
    return status, cause or "Unspecified"


class ServerCollector(Collector):
    """Reads the server's figures at scrape time. ``statistics()`` is the shell's statistics
    map (what ``stats`` answers); the other arguments are the live objects whose raw figures
    it rounds (GC pauses in seconds, not milliseconds) or does not hold."""

    def __init__(
        self,
        statistics: Callable[[], dict[str, Any]],
        *,
        durations: Durations,
        gc_pauses: GcPauses,
        http: HttpCounters,
        version: str,
    ) -> None:
        self._statistics = statistics
        self._durations = durations
        self._gc = gc_pauses
        self._http = http
        self._version = version

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        server = stats["server"]
        engine = stats["engine"]
        trust = stats["trust"]
        waiting = stats["waiting"]

        info = InfoMetricFamily("lockserver_build", "The lockserver version and its runtime.")
        info.add_metric(
            [],
            {
                "version": self._version,
                "build": stats["server"]["build"],
                "python": platform.python_version(),
                "implementation": platform.python_implementation(),
            },
        )
        yield info

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, value=value)

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=value)

        yield gauge(
            "lockserver_uptime_seconds", "Seconds since the server started.", trust["uptime"]
        )
        yield gauge(
            "lockserver_trust",
            "Trust in the server's own state: current load / NORM, capped at 1 (docs/trust.md).",
            trust["trust"],
        )
        yield gauge(
            "lockserver_norm_calls_per_second",
            "NORM: the transaction rate the server is used to.",
            trust["norm"],
        )
        yield gauge(
            "lockserver_load_calls_per_second",
            "The current transaction rate estimate the trust monitor compares with NORM.",
            trust["rate"],
        )
        outcomes = CounterMetricFamily(
            "lockserver_transactions",
            "Transactions run, by result status and cause (PROTOCOL.md section 6).",
            labels=["status", "cause"],
        )
        for outcome, count in sorted(engine["by_outcome"].items()):
            outcomes.add_metric(_outcome_labels(outcome), count)
        yield outcomes
        durations = self._durations
        for name, doc, buckets, total in (
            (
                "lockserver_request_duration_seconds",
                "Server time from the read that brought a request to its reply being sent "
                "(the duration of the read pass that served it: an upper bound; waits not "
                "included).",
                durations.cumulative(),
                durations.total,
            ),
            (
                "lockserver_read_pass_duration_seconds",
                "Read passes of the server by duration: each serves every ready connection, "
                "so a long one is a stall every request in it waited for.",
                durations.cumulative_passes(),
                durations.pass_total,
            ),
        ):
            histogram = HistogramMetricFamily(name, doc)
            histogram.add_metric([], buckets, total)
            yield histogram
        yield gauge("lockserver_sessions", "Live sessions.", engine["sessions"])
        yield gauge("lockserver_entries", "Lock entries held.", engine["entries"])
        yield gauge("lockserver_tables", "Tables with at least one entry.", engine["tables"])
        yield gauge(
            "lockserver_namespaces", "Namespaces with at least one entry.", engine["namespaces"]
        )
        yield gauge(
            "lockserver_stored_bytes",
            "What the store budget (max_store_bytes) counts now.",
            engine["stored_bytes"],
        )
        yield gauge("lockserver_waiters", "Parked (waiting) transactions.", waiting["waiters"])
        waits = CounterMetricFamily(
            "lockserver_waits",
            "Finished waits of parked transactions, by how they ended.",
            labels=["outcome"],
        )
        for outcome in ("granted", "timed_out", "cancelled"):
            waits.add_metric([outcome], waiting[f"{outcome}_total"])
        yield waits
        yield counter(
            "lockserver_waits_parked", "Transactions parked to wait.", waiting["parked_total"]
        )
        yield counter(
            "lockserver_sessions_expired",
            "Sessions that expired (max age passed without a call).",
            engine["sessions_expired"],
        )
        yield counter(
            "lockserver_entries_expired",
            "Entries removed because their TTL ran out.",
            engine["entries_expired"],
        )
        yield counter(
            "lockserver_lost_events", "lost events queued to connections.", server["events_sent"]
        )
        yield gauge("lockserver_connections", "Protocol connections open.", server["connections"])
        yield counter(
            "lockserver_connections_accepted",
            "Connections accepted (protocol and HTTP).",
            server["connections_total"],
        )
        closed = CounterMetricFamily(
            "lockserver_connections_dropped",
            "Protocol connections the server closed, by reason.",
            labels=["reason"],
        )
        for reason, key in (
            ("refused", "connections_refused"),
            ("handshake_timeout", "handshake_timeouts"),
            ("idle_timeout", "idle_timeouts"),
            ("frame_timeout", "frame_timeouts"),
            ("slow_consumer", "slow_consumers_dropped"),
            ("overloaded", "overloaded_drops"),
        ):
            closed.add_metric([reason], server[key])
        yield closed
        yield counter(
            "lockserver_requests",
            "Protocol requests received, valid or not.",
            server["requests_total"],
        )
        yield counter(
            "lockserver_protocol_errors",
            "Malformed frames and invalid requests answered with an error.",
            server["protocol_errors"],
        )
        yield counter(
            "lockserver_internal_errors",
            "Unexpected exceptions (each logged with its traceback).",
            server["internal_errors"],
        )
        yield gauge(
            "lockserver_receive_buffered_bytes",
            "Bytes of incomplete request frames buffered, all connections (max_receive_total).",
            server["receive_buffered"],
        )
        yield gauge(
            "lockserver_send_buffered_bytes",
            "Unsent bytes of blocked connections, all together (max_send_total).",
            server["send_buffered"],
        )
        yield counter(
            "lockserver_busy_poll_seconds",
            "Time the poller spent spinning for the next request (busy_poll).",
            server["busy_poll_seconds"],
        )
        gc = self._gc
        collections = CounterMetricFamily(
            "lockserver_gc_collections",
            "Collections of Python's cyclic garbage collector while serving, by generation.",
            labels=["generation"],
        )
        paused = CounterMetricFamily(
            "lockserver_gc_pause_seconds",
            "Time the collector stopped the server, by generation.",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            "lockserver_gc_pause_max_seconds",
            "The longest single collector pause since start, by generation.",
            labels=["generation"],
        )
        for generation in range(3):
            label = [str(generation)]
            collections.add_metric(label, gc.collections[generation])
            paused.add_metric(label, gc.total[generation])
            longest.add_metric(label, gc.longest[generation])
        yield collections
        yield paused
        yield longest
        http = self._http
        yield gauge("lockserver_http_connections", "HTTP connections open.", http.open)
        yield counter(
            "lockserver_http_connections_evicted",
            "HTTP connections closed to make room for a new one at http_max_connections "
            "(the one waiting longest on its client).",
            http.evicted,
        )
        yield counter(
            "lockserver_http_connections_refused",
            "HTTP connections refused by http_max_connections (none was waiting on its client).",
            http.refused,
        )
        responses = CounterMetricFamily(
            "lockserver_http_responses", "HTTP responses sent, by status code.", labels=["code"]
        )
        for code, count in sorted(http.responses.items()):
            responses.add_metric([str(code)], count)
        yield responses
        replication = stats.get("replication")
        if replication is not None:  # a replica of a group (docs/replication.md)
            yield from _replication_metrics(replication)


def _replication_metrics(repl: dict[str, Any]) -> Iterator[Metric]:
    """A replica's figures (its statistics' ``replication`` section)."""
    yield GaugeMetricFamily(
        "lockserver_replication_revision", "The last etcd revision applied.", value=repl["revision"]
    )
    yield GaugeMetricFamily(
        "lockserver_replication_authenticated",
        "1 when the group's log is authenticated (a group secret), 0 when anyone who can "
        "write to its etcd can write what the replicas apply.",
        value=int(repl["authenticated"]),
    )
    yield GaugeMetricFamily(
        "lockserver_replication_halted",
        "1 when this replica halted (an entry of a format it does not know, or secrets that "
        "differ): it serves no request.",
        value=int(repl["halted"] is not None),
    )
    yield CounterMetricFamily(
        "lockserver_replication_rejected_entries",
        "Log entries and registrations rejected: not sealed by the group's secret (forged, "
        "replayed, or written with another secret).",
        value=repl["rejected_entries"],
    )
    yield CounterMetricFamily(
        "lockserver_replication_clamped_stamps",
        "Entry stamps that would have moved the group's time past the window (a replica's "
        "clock leapt, or time stood still while nothing could be committed).",
        value=repl["clamped_stamps"],
    )
    yield CounterMetricFamily(
        "lockserver_replication_time_jumps",
        "Jumps of the group's time by the witness (the whole group was down).",
        value=repl["time_jumps"],
    )
    yield CounterMetricFamily(
        "lockserver_replication_commit_poll_seconds",
        "Time this replica polled for its puts' answers instead of sleeping "
        "(replica_commit_poll): the CPU the poll costs.",
        value=repl["commit_poll_seconds"],
    )
    yield GaugeMetricFamily(
        "lockserver_replication_clock_ahead_seconds",
        "This replica's estimate of the group's time minus the group's time last applied.",
        value=repl["clock_ahead"],
    )
