"""``/metrics`` (issue 16 section 3): Prometheus text format read back with prometheus_client's
own parser, and the pieces behind it.

Pinned down: every named family is there with the Prometheus naming rules (``lockserver_``
prefix, counters ending in ``_total``, seconds as the unit, no session ids in labels); the
figures move with the traffic (transactions by status and cause, the request-duration
histogram, sessions, entries, tables, protocol errors, HTTP responses); the registry is the
server's own (two servers in one process do not mix, the global registry is untouched); the
duration buckets and the history ring keep their bounds.
"""

from __future__ import annotations

import prometheus_client
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from server._wire import WireClient

from lockserver._build import build as lockserver_build
from lockserver.http._metrics import HISTORY_SIZE, Durations, History
from protocol import Assert, Exists, Not, SetVar

from ._client import get
from .conftest import start_server

FAMILIES = {
    "lockserver_build_info": "gauge",  # an info metric, in the 0.0.4 text format
    "lockserver_uptime_seconds": "gauge",
    "lockserver_trust": "gauge",
    "lockserver_norm_calls_per_second": "gauge",
    "lockserver_load_calls_per_second": "gauge",
    "lockserver_transactions": "counter",
    "lockserver_request_duration_seconds": "histogram",
    "lockserver_read_pass_duration_seconds": "histogram",
    "lockserver_sessions": "gauge",
    "lockserver_entries": "gauge",
    "lockserver_tables": "gauge",
    "lockserver_namespaces": "gauge",
    "lockserver_stored_bytes": "gauge",
    "lockserver_waiters": "gauge",
    "lockserver_waits": "counter",
    "lockserver_waits_parked": "counter",
    "lockserver_sessions_expired": "counter",
    "lockserver_entries_expired": "counter",
    "lockserver_lost_events": "counter",
    "lockserver_connections": "gauge",
    "lockserver_connections_accepted": "counter",
    "lockserver_connections_dropped": "counter",
    "lockserver_requests": "counter",
    "lockserver_protocol_errors": "counter",
    "lockserver_internal_errors": "counter",
    "lockserver_receive_buffered_bytes": "gauge",
    "lockserver_send_buffered_bytes": "gauge",
    "lockserver_busy_poll_seconds": "counter",
    "lockserver_gc_collections": "counter",
    "lockserver_gc_pause_seconds": "counter",
    "lockserver_gc_pause_max_seconds": "gauge",
    "lockserver_http_connections": "gauge",
    "lockserver_http_connections_evicted": "counter",
    "lockserver_http_connections_refused": "counter",
    "lockserver_http_responses": "counter",
}


async def scrape(port: int) -> dict[str, list[Sample]]:
    response = await get(port, "/metrics")
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {}
    for family in text_string_to_metric_families(response.body.decode()):
        assert family.name not in families
        assert family.type == FAMILIES.get(family.name), family.name
        families[family.name] = family.samples
    return families


def value(samples: list[Sample], name: str, **labels: str) -> float:
    [found] = [s.value for s in samples if s.name == name and s.labels == labels]
    return found


@pytest.mark.both_builds("reports which build runs")
async def test_every_family_is_there_and_moves_with_the_traffic(nursery: trio.Nursery) -> None:
    """All named families, typed as named; after transactions (two OK, one failing on a
    statement), an invalid request and a scrape, the counters and gauges moved by exactly
    that; no label carries a session id."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        before = await scrape(server.port)
        assert set(before) == set(FAMILIES)
        client = await WireClient.connect(server)
        await client.execute("session-a", Assert(SetVar("t", "v")))
        await client.execute("session-b", Assert(SetVar("u", "v")))
        await client.execute("session-b", Assert(Not(Exists("t", "v"))))
        await client.error(client.execute_message("s", [], max_age=10**9))
        after = await scrape(server.port)
        await client.aclose()
    tx = after["lockserver_transactions"]
    assert (
        value(tx, "lockserver_transactions_total", status="TransactionOK", cause="Unspecified") == 2
    )
    assert (
        value(tx, "lockserver_transactions_total", status="TransactionError", cause="Statement")
        == 1
    )
    assert value(after["lockserver_sessions"], "lockserver_sessions") == 2
    assert value(after["lockserver_entries"], "lockserver_entries") == 2
    assert value(after["lockserver_tables"], "lockserver_tables") == 2
    assert value(after["lockserver_protocol_errors"], "lockserver_protocol_errors_total") == 1
    assert value(after["lockserver_connections"], "lockserver_connections") == 1
    # hello, 3 executes, the invalid one: 5 requests, each in the duration histogram; they
    # came one at a time, so each was a read pass of its own (the scrape is HTTP, not a pass)
    for family in ("lockserver_request_duration_seconds", "lockserver_read_pass_duration_seconds"):
        hist = after[family]
        count = value(hist, f"{family}_count")
        assert count - value(before[family], f"{family}_count") == 5, family
        assert value(hist, f"{family}_bucket", le="+Inf") == count
        assert value(hist, f"{family}_sum") > 0
    responses = after["lockserver_http_responses"]
    assert value(responses, "lockserver_http_responses_total", code="200") == 1  # the first
    build = after["lockserver_build_info"]
    assert build[0].labels["version"] == server.statistics()["server"]["version"]
    assert build[0].labels["build"] == lockserver_build()  # pure or compiled, as loaded
    for samples in after.values():
        for sample in samples:
            assert "session" not in " ".join(sample.labels), sample
            assert not any("session-" in v for v in sample.labels.values()), sample


async def test_each_server_has_its_own_registry(nursery: trio.Nursery) -> None:
    """Two servers in one process report their own figures; the global registry of
    prometheus_client knows nothing of either."""
    one = await start_server(nursery)
    two = await start_server(nursery)
    with trio.fail_after(10):
        client = await WireClient.connect(one)
        await client.execute("s", Assert(SetVar("t", "v")))
        await client.aclose()
        first = await scrape(one.port)
        second = await scrape(two.port)
    assert value(first["lockserver_entries"], "lockserver_entries") == 1
    assert value(second["lockserver_entries"], "lockserver_entries") == 0
    names = {m.name for m in prometheus_client.REGISTRY.collect()}
    assert not any(n.startswith("lockserver") for n in names)


def test_durations_buckets_are_upper_bounds() -> None:
    """A duration equal to a bound counts in that bucket (``le``); one past the last bound in
    +Inf; the buckets come out cumulative, the sum weighted by the requests."""
    d = Durations((0.001, 0.01))
    d.observe(0.001, 2)
    d.observe(0.005, 1)
    d.observe(3.0, 4)
    assert d.counts == [2, 1, 4]
    assert d.cumulative() == [("0.001", 2.0), ("0.01", 3.0), ("+Inf", 7.0)]
    assert d.total == 0.002 + 0.005 + 12.0


def test_history_is_bounded() -> None:
    """The ring keeps the last HISTORY_SIZE samples whatever the uptime, and each rate is
    the change of the call count since the previous sample."""
    h = History()
    for second in range(HISTORY_SIZE + 100):
        h.sample(float(second), 1.0, 5.0, 5.0, calls=second * 7)
    assert len(h) == HISTORY_SIZE
    columns = h.to_json()
    assert columns["uptime"][0] == 100.0
    assert len(columns["trust"]) == HISTORY_SIZE
    assert set(columns["transactions_per_second"]) == {7.0}
    assert h.rate == 7.0
