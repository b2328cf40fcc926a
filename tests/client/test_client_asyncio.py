"""The async face in a plain asyncio program: ``asyncio.run``, asyncio tasks, events and
timeouts, and no trio or anyio in the program's own code, against the real server running in a
thread of its own. Also pins the helper that runs the async-face tests on both loops."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from asyncio_support import on_both_loops

from client import (
    Assert,
    AsyncMutex,
    AsyncSession,
    LockLostError,
    LostReason,
    SelectVarValue,
    SetVar,
    open_lock_client,
)
from client.recipes import MUTEX_TABLE
from lockserver import RunningServer, ServerConfig, serve

NS = "asyncio"


def parked(server: Any) -> int:
    """Transactions parked on the server (called in the server's run)."""
    return int(server.statistics()["waiting"]["waiters"])


async def holders(s: AsyncSession, var: str) -> list[str]:
    r = await s.execute(NS, [SelectVarValue("h", MUTEX_TABLE, var, select_many=True)])
    return [rec["session"] for rec in r["h"] or []]


def test_an_asyncio_program_locks_waits_and_learns_of_a_loss(threaded_server: Any) -> None:
    """Under asyncio: connect, open a session, acquire and release a Mutex; a blocking
    acquire is parked on the server (an asyncio task) and granted as soon as the holder
    releases; a session ended by another connection is a LockLost event that cancels the
    ``async with`` body and raises LockLostError, with the lock's lost_event an
    ``asyncio.Event``."""

    async def count_parked() -> int:
        return int(await asyncio.to_thread(threaded_server.call, parked, threaded_server.server))

    async def main(port: int) -> None:
        async with asyncio.timeout(20):
            async with open_lock_client(port=port) as c, c.session() as a, c.session() as b:
                assert (await c.ping()).uptime >= 0

                m = AsyncMutex(a, NS, "m")
                assert await m.acquire()
                assert m.held and m.fence is not None and await holders(b, "m") == [a.id]
                assert await m.release() is True
                assert not m.held and await holders(b, "m") == []

                holder, waiter = AsyncMutex(a, NS, "door"), AsyncMutex(b, NS, "door")
                assert await holder.acquire(blocking=False)
                first_fence = holder.fence
                assert first_fence is not None
                acquiring = asyncio.create_task(waiter.acquire())  # blocking: parked
                while await count_parked() != 1:  # test-side setup: the server has parked it
                    await asyncio.sleep(0.005)
                assert not acquiring.done()
                assert await holder.release() is True
                assert await acquiring is True
                assert waiter.fence is not None and waiter.fence > first_fence
                assert await waiter.release() is True

                async with open_lock_client(port=port) as admin:
                    doomed = c.session()
                    lock = AsyncMutex(doomed, NS, "lost")
                    body_cancelled = False
                    with pytest.raises(LockLostError) as raised:
                        async with lock:
                            try:
                                # The loss may cancel the body here already, or in the wait.
                                await admin.end_session(doomed.id)
                                await asyncio.Event().wait()  # only the loss ends this
                            except asyncio.CancelledError:
                                body_cancelled = True
                                raise
                    assert body_cancelled
                    event = raised.value.event
                    assert event is not None and event.reason is LostReason.ENDED
                    assert isinstance(lock.lost_event, asyncio.Event) and lock.lost_event.is_set()
                    assert (await doomed.wait_lost()) is event
                    await doomed.end()
            assert c.closed

    asyncio.run(main(threaded_server.port))


def test_a_cancelled_asyncio_waiter_leaves_nothing_behind(threaded_server: Any) -> None:
    """``asyncio.wait_for`` around a blocking acquire: the timeout cancels the wait on the
    server, nothing stays parked or held, and the client's connection still answers."""

    async def main(port: int) -> None:
        async with asyncio.timeout(20):
            async with open_lock_client(port=port) as c, c.session() as a, c.session() as b:
                holder = AsyncMutex(a, NS, "busy")
                assert await holder.acquire(blocking=False)
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(AsyncMutex(b, NS, "busy").acquire(), 0.2)
                assert await holders(b, "busy") == [a.id]
                assert await holder.release() is True
                assert await AsyncMutex(b, NS, "busy").acquire(blocking=False)
                assert c.local_statistics().in_flight == 0

    asyncio.run(main(threaded_server.port))
    assert threaded_server.call(parked, threaded_server.server) == 0


async def test_tls_under_asyncio(nursery: trio.Nursery, tmp_path: Path) -> None:
    """The TLS path (handshake driven by the loop's readiness waits, then the same reader)
    under asyncio: a pipelined burst of 50 executes over TLS from asyncio tasks."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key = tmp_path / "server.pem", tmp_path / "server.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    config = ServerConfig(
        host="127.0.0.1", port=0, log_level="WARNING", tls_cert=str(chain), tls_key=str(key)
    )
    server: RunningServer = await nursery.start(serve, config)
    context = ssl.create_default_context()
    ca.configure_trust(context)

    async def main() -> list[bool]:
        async with asyncio.timeout(20):
            async with (
                open_lock_client(port=server.port, ssl_context=context) as c,
                c.session() as s,
            ):
                calls = [s.execute(NS, [Assert(SetVar("tls", f"v{i}"))]) for i in range(50)]
                return [r.ok for r in await asyncio.gather(*calls)]

    with trio.fail_after(30):
        oks = await trio.to_thread.run_sync(asyncio.run, main())
    assert oks == [True] * 50


async def test_on_both_loops_runs_the_body_on_the_named_loop(server: RunningServer) -> None:
    """The helper itself: ``loop="asyncio"`` runs the body in a running asyncio loop (not in
    trio), ``loop="trio"`` in the test's trio run; the body gets the test's arguments."""
    seen: list[tuple[str, int]] = []

    async def body(port: int) -> None:
        try:
            asyncio.get_running_loop()
            running = "asyncio"
        except RuntimeError:
            running = "trio" if trio.lowlevel.in_trio_run() else "none"
        seen.append((running, port))

    wrapped = on_both_loops(body)
    await wrapped(server.port, loop="asyncio")
    await wrapped(server.port, loop="trio")
    assert seen == [("asyncio", server.port), ("trio", server.port)]
