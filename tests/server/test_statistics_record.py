"""Statistics as a frozen record (issue 32): the ``stats`` reply's bytes are what the nested map
the shell built by hand gave -- whole-server and scoped -- so an older client reads them as
before, and the record is frozen.

``legacy_statistics`` below is that hand-built map, kept here as the oracle: the code it was
(lockserver/shell/_server.py before the record), reading the same counters at the same ``now``.
"""

from __future__ import annotations

import gc
from typing import Any

import attrs
import pytest
import trio

from lockserver import RunningServer
from lockserver._auth import TokenSpec
from lockserver.shell._server import Server
from lockserver.shell._statistics import ServerStatistics
from protocol import (
    Assert,
    Execute,
    Hello,
    Reply,
    SessionSpec,
    SetVar,
    Statistics,
    Transaction,
    pack,
    server_message_to_wire,
)

from ._wire import WireClient
from .conftest import start_server


def legacy_statistics(shell: Server, now: float) -> dict[str, Any]:
    """The whole server's map as the shell built it before the record (issue 32)."""
    core, losses = shell.core.statistics(now, trust=shell.trust.trust(now))
    shell.requests.deliver(losses)
    requests = shell.requests
    extra: dict[str, Any] = {}
    if shell.replica is not None:
        extra["replication"] = shell.replica.statistics()
    return {
        "server": {
            "version": shell.version,
            "build": shell.build,
            "host": shell.hostname,
            "address": shell.address,
            "uptime": core.engine.uptime,
            "connections": len(shell.clients),
            "connections_blocked": shell.totals.blocked,
            "connections_total": shell.connections_total,
            "connections_refused": shell.connections_refused,
            "requests_total": requests.requests_total,
            "protocol_errors": requests.protocol_errors,
            "internal_errors": shell.internal_errors + requests.internal_errors,
            "slow_consumers_dropped": shell.slow_consumers_dropped,
            "handshake_timeouts": shell.handshake_timeouts,
            "idle_timeouts": shell.idle_timeouts,
            "frame_timeouts": shell.frame_timeouts,
            "overloaded_drops": shell.reader.overloaded_drops,
            "receive_buffered": shell.totals.received,
            "send_buffered": shell.totals.unsent,
            "events_sent": requests.events_sent,
            "feed_events_sent": requests.feed_sent,
            "feed_events_dropped": requests.feed_dropped,
            "sessions_tracked": core.sessions_routed,
            "http_connections": shell.http.open,
            "http_connections_evicted": shell.http.evicted,
            "http_requests_total": shell.http.requests,
            **shell.reader.busy_poll.to_wire(),
            **shell.durations.passes_to_wire(),
        },
        "waiting": core.waiting.to_wire(),
        "trust": attrs.asdict(shell.trust.statistics(now)),
        "engine": core.engine.to_wire(),
        "limits": dict(shell.limits),
        "gc": shell.gc_pauses.to_wire(),
        **extra,
    }


def legacy_scoped(shell: Server, now: float, scope: Any) -> dict[str, Any]:
    """A scoped principal's map as the shell built it before the record."""
    stats = legacy_statistics(shell, now)
    counts = shell.core.visible_counts(scope)
    stats["engine"] = {
        **stats["engine"],
        "namespaces": counts.namespaces,
        "tables": counts.tables,
        "entries": counts.entries,
        "sessions": counts.sessions,
        "scope": scope.name,
    }
    stats["waiting"] = {**stats["waiting"], "waiters": counts.waiters}
    del stats["server"]["sessions_tracked"]
    return stats


def reply_bytes(values: dict[str, Any]) -> bytes:
    """The ``stats`` reply's payload as the server encodes it."""
    return pack(server_message_to_wire(Reply(7, Statistics(values))))


def shell_of(running: RunningServer) -> Server:
    shell = running._shell
    assert isinstance(shell, Server)
    return shell


async def test_the_reply_bytes_are_the_hand_built_maps(nursery: trio.Nursery) -> None:
    """With a session, an entry and a parked waiter in the server, the record's ``stats`` reply
    encodes to the same bytes as the hand-built map (sections, keys, their order, values)."""
    running = await start_server(nursery)
    holder = await WireClient.connect(running)
    waiter = await WireClient.connect(running)
    tx = Transaction("ns", (Assert(SetVar("t", "v")),))
    await holder.send(Execute(holder.rid(), SessionSpec("s1", 60.0), tx))
    await holder.receive()
    await waiter.send(Execute(waiter.rid(), SessionSpec("s2", 60.0), tx, 30.0))
    for _ in range(100):  # the waiter parks when its request has been read
        if shell_of(running).statistics(trio.current_time()).waiting.waiters:
            break
        await trio.sleep(0.01)
    shell = shell_of(running)
    now = trio.current_time()
    # No collection between the two reads: the server counts GC pauses as they happen.
    gc.disable()
    try:
        record = shell.statistics(now)
        legacy = legacy_statistics(shell, now)
    finally:
        gc.enable()
    assert record.to_wire() == legacy
    assert list(record.to_wire()["server"]) == list(legacy["server"])
    assert reply_bytes(record.to_wire()) == reply_bytes(legacy)
    assert record.waiting.waiters == 1 and record.engine.entries == 1
    assert running.statistics()["engine"]["entries"] == 1  # the public map is the wire map
    await holder.aclose()
    await waiter.aclose()


async def test_a_scoped_view_encodes_as_the_hand_built_scoped_map(nursery: trio.Nursery) -> None:
    """A restricted token's view: its own counts, ``engine.scope`` its name, no
    ``sessions_tracked``: the same bytes as the hand-built scoped map."""
    alice = TokenSpec("alice", "alice-secret-0123", ("orders",))
    root = TokenSpec("root", "root-secret-0123", admin=True)
    running = await start_server(nursery, tokens=(alice, root))
    c = await WireClient.connect(running, hello=False)
    await c.send(Hello(c.rid(), client_name="t", token="alice-secret-0123"))
    await c.receive()
    tx = Transaction("orders", (Assert(SetVar("t", "v")),))
    await c.send(Execute(c.rid(), SessionSpec("s1", 60.0), tx))
    await c.receive()
    shell = shell_of(running)
    principal = next(p.principal for p in shell.clients if p.principal.name == "alice")
    now = trio.current_time()
    record = shell.statistics(now, principal)
    legacy = legacy_scoped(shell, now, principal)
    assert "sessions_tracked" not in record.to_wire()["server"]
    assert record.to_wire()["engine"]["scope"] == "alice"
    assert reply_bytes(record.to_wire()) == reply_bytes(legacy)
    await c.aclose()


async def test_the_record_is_frozen(nursery: trio.Nursery) -> None:
    """A statistics record cannot be changed after it was taken, nor its sections."""
    running = await start_server(nursery)
    record = shell_of(running).statistics(trio.current_time())
    assert isinstance(record, ServerStatistics)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.limits = {}  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        record.server.connections = 5  # type: ignore[misc]
