"""Server restart while clients hold locks (issue #8), recorded with the safety checker.

Pinned down: after a restart the old holder's connection fails and its client reconnects; the
new server knows nothing of the old grants, so a client that demands ``min_uptime`` >= the
session max age is refused until that much uptime has passed, by which time every grant of
the previous run has run out of validity on its holder's own clock: no lock is ever held by
two holders across the restart, and fences keep increasing. A client that does *not* demand
it can be granted the lock while the old holder still believes it holds it -- the checker
flags exactly that, which shows the check has teeth.
"""

from __future__ import annotations

import contextlib
import socket

import trio
import trio.testing

from client import AsyncMutex, Cause, ConnectionLost, open_lock_client
from lockbench.safety import EXCLUSIVE, Recorder
from lockserver import ServerConfig, serve

NS = "restart"
MAX_AGE = 2.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_restart_with_min_uptime_never_grants_a_lock_twice(
    clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """A holds the lock on run 1; the server restarts; A's client reconnects; B (min_uptime =
    max age) is refused until run 2 is MAX_AGE old, then granted with a larger fence; C
    (no min_uptime) is granted at once and overlaps A's belief. The history of A and B checks
    clean; adding C is a violation."""
    port = _free_port()
    config = ServerConfig(host="127.0.0.1", port=port, max_session_age=60.0)
    recorder = Recorder(clock=trio.current_time)
    with trio.fail_after(60):
        run1 = trio.CancelScope()

        async def first_run(task_status: trio.TaskStatus[None]) -> None:
            with run1:
                async with trio.open_nursery() as n:
                    await n.start(serve, config)
                    task_status.started()

        await nursery.start(first_run)
        clock.jump(MAX_AGE)  # run 1 is old enough for the contract
        async with open_lock_client("127.0.0.1", port) as a_client:
            sa = a_client.session(max_age=MAX_AGE, keepalive=False)
            a_lock = AsyncMutex(sa, NS, "m", min_uptime=MAX_AGE)
            assert await a_lock.acquire(blocking=False)
            a_start = trio.current_time()
            # A believes it holds the lock until its validity runs out (no refresh can succeed
            # on run 2: the session is unknown there, and min_uptime refuses it anyway).
            a_end = a_start + a_lock.valid_for()
            recorder.record("m", EXCLUSIVE, a_start, a_end, a_lock.fence, "A")

            run1.cancel()  # the restart: run 1 dies with its state
            await trio.sleep(0.05)
            await nursery.start(serve, config)

            # A's connection failed; its client reconnects on the next call.
            with contextlib.suppress(ConnectionLost):
                await sa.execute(NS, [])
            assert (await sa.execute(NS, [])).ok  # reconnected (a new, empty session on run 2)

            async with open_lock_client("127.0.0.1", port) as b_client:
                sb = b_client.session(max_age=MAX_AGE, keepalive=False)
                b_lock = AsyncMutex(sb, NS, "m", min_uptime=MAX_AGE)
                assert not await b_lock.acquire(blocking=False)
                assert b_lock.last_result is not None
                assert b_lock.last_result.cause is Cause.MINIMUM_REQUIREMENTS

                # C ignores the contract: run 2 grants it while A still believes it holds.
                sc = b_client.session(max_age=MAX_AGE, keepalive=False)
                c_lock = AsyncMutex(sc, NS, "m")
                assert await c_lock.acquire(blocking=False)
                c_start = trio.current_time()
                assert c_start < a_end
                await c_lock.release()
                c_interval = ("m", EXCLUSIVE, c_start, trio.current_time(), c_lock.fence, "C")

                clock.jump(MAX_AGE)  # run 2 is now MAX_AGE old; A's belief has run out
                assert trio.current_time() > a_end
                assert await b_lock.acquire(blocking=False)
                b_start = trio.current_time()
                assert b_lock.fence is not None and a_lock.fence is not None
                assert b_lock.fence > a_lock.fence  # fences keep increasing across restarts
                await b_lock.release()
                recorder.record("m", EXCLUSIVE, b_start, trio.current_time(), b_lock.fence, "B")

    report = recorder.check()
    assert report.ok, report.summary()
    recorder.record(*c_interval)
    bad = recorder.check()
    assert not bad.ok and "A" in bad.summary() and "C" in bad.summary()
    nursery.cancel_scope.cancel()
