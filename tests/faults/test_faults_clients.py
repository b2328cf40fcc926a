"""Faulty clients (issue #8): killed while holding locks, silent, stalled mid-frame, not
reading. Pinned down: the server frees a killed client's locks within its session max age and
hands them to the parked waiters in arrival order; a silent or stalled client is dropped by
the handshake/idle timeouts, one that does not read by its send buffer; and meanwhile another
client keeps full service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import msgpack
import pytest
import trio
import trio.testing
from support import fail_after_real

from lockserver import RunningServer, ServerConfig, serve
from protocol import (
    Assert,
    Connection,
    DeleteVar,
    ErrorReply,
    Execute,
    GetStatistics,
    Reply,
    Role,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TransactionResult,
)

ROOT = Path(__file__).resolve().parents[2]
NS = "faults"

HOLDER = textwrap.dedent(
    """
    import sys, time
    from client import LockClient, Mutex
    c = LockClient("127.0.0.1", int(sys.argv[1]))
    s = c.session(max_age=float(sys.argv[2]))
    m = Mutex(s, "faults", "printer")
    assert m.acquire(blocking=False)
    print(m.fence, flush=True)
    time.sleep(3600)
    """
)


class Wire:
    """A raw protocol connection over a trio stream (replies matched by id)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT, max_frame=1 << 26)
        self.inbox: list[object] = []
        self.rid = 0

    @classmethod
    async def open(cls, port: int, *, hello: bool = True) -> Wire:
        w = cls(await trio.open_tcp_stream("127.0.0.1", port))
        if hello:
            await w.send_raw(_frame({"type": "hello", "id": 0, "version": 1}))
            await w.reply(0)
        return w

    async def __aenter__(self) -> Wire:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stream.aclose()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def reply(self, rid: int) -> Reply | ErrorReply:
        while True:
            for i, m in enumerate(self.inbox):
                if isinstance(m, (Reply, ErrorReply)) and m.request_id == rid:
                    del self.inbox[i]
                    return m
            data = await self.stream.receive_some(1 << 16)
            if not data:
                raise EOFError("closed by the server")
            self.proto.receive_data(data)
            while (m := self.proto.next_message()) is not None:
                self.inbox.append(m)

    async def execute(self, session: str, *stmts: object, wait: float | None = None) -> int:
        """Send an Execute; return its request id (read the answer with ``result``)."""
        self.rid += 1
        tx = Transaction(NS, tuple(stmts))  # type: ignore[arg-type]
        msg = Execute(self.rid, SessionSpec(session, 30.0), tx, wait)
        await self.send_raw(self.proto.send(msg))
        return self.rid

    async def result(self, rid: int) -> TransactionResult:
        r = await self.reply(rid)
        assert isinstance(r, Reply) and isinstance(r.body, TransactionResult), r
        return r.body

    async def closed(self) -> bool:
        """Read until EOF (True) — replies are discarded; a reset counts as closed."""
        try:
            while await self.stream.receive_some(1 << 16):
                pass
        except trio.BrokenResourceError:
            pass
        return True


def _frame(m: object) -> bytes:
    p: bytes = msgpack.packb(m)
    return len(p).to_bytes(4, "big") + p


LOCK = Assert(SetVar("locks", "printer"))


async def _good_round(w: Wire, n: int) -> None:
    """A well-behaved client's lock + release, with the right answers."""
    r = await w.result(await w.execute(f"good-{n}", Assert(SetVar("good", "v", n))))
    assert r.status is Status.TRANSACTION_OK
    r = await w.result(await w.execute(f"good-{n}", Assert(DeleteVar("good", "v"))))
    assert r.status is Status.TRANSACTION_OK


async def test_killed_holder_frees_its_lock_and_waiters_get_it_in_order(
    server: RunningServer, clock: trio.testing.MockClock
) -> None:
    """A client process holding a Mutex is killed (SIGKILL): within its max age (1 s) the
    lock is free and the two parked waiters get it one after the other, in arrival order,
    with growing fences; the killed holder's session is gone. The server's clock is stopped at
    the kill and jumped past the max age: the first waiter is granted at that virtual instant
    (the expiry hands the lock over; no real time and no later timer involved)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(server.port), "1.0"],
        stdout=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        with trio.fail_after(20):
            assert proc.stdout is not None
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            held_fence = int(line)
            # The holder's recipe key: look the variable up rather than rebuild its name.
            assert server.engine.entry_count == 1
            w1, w2 = await Wire.open(server.port), await Wire.open(server.port)
            async with w1, w2:
                await _hand_over(server, proc, w1, w2, held_fence, clock)
    finally:
        proc.kill()
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()


async def _hand_over(
    server: RunningServer,
    proc: subprocess.Popen[bytes],
    w1: Wire,
    w2: Wire,
    held_fence: int,
    clock: trio.testing.MockClock,
) -> None:
    """Park two waiters behind the killed holder's lock, kill it, check the hand-over."""
    key = _only_key(server)
    first = await w1.execute("w1", Assert(SetVar(*key)), wait=10)
    await trio.sleep(0.05)  # arrival order on the server
    second = await w2.execute("w2", Assert(SetVar(*key)), wait=10)
    await trio.sleep(0.05)
    assert server.statistics()["waiting"]["waiters"] == 2
    clock.rate = 0  # virtual time stands still from here: only the jump below moves it
    os.kill(proc.pid, signal.SIGKILL)
    t0 = trio.current_time()
    clock.jump(1.1)  # past the killed holder's 1 s max age
    with fail_after_real(10):  # trio.fail_after cannot fire while the clock stands still
        r1 = await w1.result(first)
    assert r1.status is Status.TRANSACTION_OK and r1.fence > held_fence
    assert trio.current_time() - t0 == pytest.approx(1.1)  # granted at the expiry itself
    assert server.statistics()["waiting"]["waiters"] == 1  # w2 still parked
    clock.rate = 1.0  # real speed again, so the caller's fail_after guards the rest
    released = await w1.execute("w1", Assert(DeleteVar(*key)))
    assert (await w1.result(released)).status is Status.TRANSACTION_OK
    r2 = await w2.result(second)
    assert r2.status is Status.TRANSACTION_OK and r2.fence > r1.fence
    assert server.statistics()["engine"]["sessions_expired"] >= 1


def _only_key(server: RunningServer) -> tuple[str, str]:
    tables = server.engine.namespaces[NS]
    ((table, vars_),) = tables.items()
    ((var, _),) = vars_.items()
    return table, var


async def test_silent_stalled_and_non_reading_clients_are_dropped(
    clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    """One client connects and says nothing, one sends half a frame and stalls, one pipelines
    requests and never reads: a well-behaved client keeps getting correct answers throughout;
    the non-reader is dropped as a slow consumer, the silent one at the handshake timeout, the
    staller at the idle timeout (virtual time jumps)."""
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        handshake_timeout=5.0,
        idle_timeout=30.0,
        max_send_buffer=64 * 1024,
        send_timeout=5.0,
    )
    server: RunningServer = await nursery.start(serve, config)
    with trio.fail_after(60):
        good = await Wire.open(server.port)
        silent = await Wire.open(server.port, hello=False)
        staller = await Wire.open(server.port)
        reader_less = await Wire.open(server.port)
        async with good, silent, staller, reader_less:
            await _stalls(clock, server, good, silent, staller, reader_less)
    nursery.cancel_scope.cancel()


async def _stalls(
    clock: trio.testing.MockClock,
    server: RunningServer,
    good: Wire,
    silent: Wire,
    staller: Wire,
    reader_less: Wire,
) -> None:
    if True:
        half = _frame({"type": "ping", "id": 5})
        await staller.send_raw(half[: len(half) // 2])
        stats_req = reader_less.proto.send(GetStatistics(1))
        # Pipeline stats requests (multi-KiB replies each) and never read them.
        with trio.move_on_after(3):
            for _ in range(20_000):
                try:
                    await reader_less.send_raw(stats_req * 50)
                except trio.BrokenResourceError:  # dropped: the server reset it
                    break
        await _good_round(good, 1)
        for _ in range(100):
            if server.statistics()["server"]["slow_consumers_dropped"]:
                break
            await trio.sleep(0.05)
        assert server.statistics()["server"]["slow_consumers_dropped"] == 1
        await _good_round(good, 2)
        clock.jump(5.5)  # past the handshake timeout
        assert await silent.closed()
        await _good_round(good, 3)  # keeps the good client from idling
        assert server.statistics()["server"]["handshake_timeouts"] == 1
        clock.jump(25.0)  # the staller's last bytes are now 30.5 s old
        assert await staller.closed()
        stats = server.statistics()["server"]
        assert stats["idle_timeouts"] == 1
        await _good_round(good, 4)
        assert server.statistics()["server"]["internal_errors"] == 0
