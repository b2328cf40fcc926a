"""The reliability contract end to end: real server, real client, real sockets (issue #4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from client import Assert, Cause, LockClient, SetVar, Status, open_lock_client
from lockserver import ServerConfig, serve

ROOT = Path(__file__).resolve().parent.parent.parent
LOCK = [Assert(SetVar("locks", "printer", "x"))]


async def test_uptime_gate_refusal_is_a_result_and_leaves_the_session_alone() -> None:
    """A server up 10 s refuses min_uptime=30 with a *result* (TransactionError /
    MinimumRequirements, no data, no path, uptime and trust echoed), does not refresh the
    session's idle timer, and accepts the same call from 30 s of uptime on."""
    clock = trio.testing.MockClock(rate=1.0)

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            running = await nursery.start(serve, ServerConfig(host="127.0.0.1", port=0))
            with trio.fail_after(120):  # virtual time: includes the jumps below
                async with open_lock_client("127.0.0.1", running.port) as c:
                    s = c.session(max_age=12.0, keepalive=False)
                    holder = c.session(max_age=600.0, keepalive=False)
                    assert (await s.execute("ns", LOCK)).ok  # t=0: s holds the printer
                    clock.jump(10.0)
                    r = await s.execute("ns", [], min_uptime=30.0)
                    assert r.status is Status.TRANSACTION_ERROR
                    assert r.cause is Cause.MINIMUM_REQUIREMENTS
                    assert r.data == () and r.failed_statement is None
                    assert 10.0 <= r.server_uptime < 11.0 and r.server_trust == 1.0
                    # Had the refused call touched the session, it would live until t≈22.
                    clock.jump(2.5)
                    assert (await holder.execute("ns", LOCK)).ok  # s expired at t=12
                    clock.jump(18.0)  # uptime ≈ 30.5
                    ok = await holder.execute("ns", [], min_uptime=30.0)
                    assert ok.ok
            nursery.cancel_scope.cancel()

    # Run under its own MockClock: virtual time that also passes at real speed.
    await _run_under(clock, scenario)


async def _run_under(clock: trio.testing.MockClock, fn: object) -> None:
    """Run ``fn`` in a fresh trio run with ``clock`` (pytest-trio's run has its own)."""
    await trio.to_thread.run_sync(lambda: trio.run(fn, clock=clock))  # type: ignore[arg-type]


# --- restart safety ---------------------------------------------------------------------------


def _start_server(port: int) -> tuple[subprocess.Popen[str], int]:
    """A real ``lockserver`` subprocess; returns it and its port."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockserver", "--port", str(port), "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("lockserver listening on 127.0.0.1:"), line
    return proc, int(line.rpartition(":")[2])


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout is not None:
            p.stdout.close()


def test_restart_safety_rule(servers: list[subprocess.Popen[str]]) -> None:
    """A client whose min_uptime is at least the longest session max age can never be granted
    a lock by a restarted server that forgot the earlier holder; a client without it can.

    Alice holds the printer (session max age 1.5 s). The server is killed and restarted on the
    same port: it forgot Alice. Bob demanding min_uptime=1.5 is refused until the new server
    has been up 1.5 s; by then Alice's session would have expired on the old server too, so
    there is no moment at which both believe they hold the printer. Carol (min_uptime=0) is
    granted at once: the hazard the rule prevents."""
    max_age = 1.5
    first, port = _start_server(0)
    servers.append(first)
    with LockClient("127.0.0.1", port) as c:
        alice = c.session(max_age=max_age, keepalive=False)
        granted = alice.execute("ns", LOCK)
        assert granted.ok
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)

    second, _ = _start_server(port)
    servers.append(second)
    with LockClient("127.0.0.1", port) as c:
        bob = c.session(max_age=max_age, keepalive=False)
        refused = bob.execute("ns", LOCK, min_uptime=max_age)
        assert refused.cause is Cause.MINIMUM_REQUIREMENTS
        # Refused because the new server has been up less than max_age. It started after
        # Alice's last call, so her session may still be live in her eyes.
        assert refused.server_uptime < max_age
        carol = c.session(max_age=max_age, keepalive=False)
        hazard = carol.execute("ns", [Assert(SetVar("locks", "printer-2", "c"))])
        assert hazard.ok  # without the rule, a restarted server grants at once
        # The server's own uptime says when it will qualify: wait exactly that long (a real
        # subprocess has a real clock; this is bounded by max_age).
        time.sleep(max(0.0, max_age - refused.server_uptime) + 0.05)
        r = bob.execute("ns", LOCK, min_uptime=max_age)
        # Granted from max_age of uptime on: the server started after Alice's last call, so
        # her session (max age max_age) was over by then on any server.
        assert r.ok and r.server_uptime >= max_age
        assert r.fence > granted.fence  # fences keep increasing across the restart
