"""Graceful shutdown in-process (RunningServer.aclose) and of the real command on SIGTERM /
SIGINT."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from support import fail_after_real

from protocol import (
    Connection,
    ErrorCode,
    ErrorReply,
    Hello,
    Ping,
    Pong,
    Reply,
    Role,
    SelectConstantValue,
    TransactionResult,
    Welcome,
)

from ._wire import WireClient, flood, wait_for
from .conftest import start_server

REPO = Path(__file__).resolve().parents[2]


async def test_aclose_drains_replies_then_closes(nursery: trio.Nursery) -> None:
    """shutdown: queued replies are delivered, then SHUTTING_DOWN (no request id), then a
    clean close; serve() returns; nobody can connect any more."""
    server = await start_server(nursery)
    with trio.fail_after(5):
        c = await WireClient.connect(server)
        msgs = [c.execute_message("s", [SelectConstantValue("i", i)]) for i in range(50)]
        await c.send(*msgs)
        first = await c.reply(msgs[0].request_id)
        assert isinstance(first, Reply)
        await server.aclose()
        rest = await c.read_until_closed()
        replies = [m for m in rest if isinstance(m, Reply)]
        assert [r.request_id for r in replies] == [m.request_id for m in msgs[1:]]
        assert all(isinstance(r.body, TransactionResult) for r in replies)
        assert isinstance(rest[-1], ErrorReply)
        assert rest[-1].code is ErrorCode.SHUTTING_DOWN
        assert rest[-1].request_id is None
        await c.aclose()
        with pytest.raises(OSError):
            await trio.open_tcp_stream("127.0.0.1", server.port)


async def test_aclose_is_prompt_even_with_a_stuck_client(
    nursery: trio.Nursery, clock: trio.testing.MockClock
) -> None:
    """A client that does not read cannot hold shutdown up beyond its grace period. With the
    clock stopped, aclose() is still waiting on the stuck client after the idle one got
    SHUTTING_DOWN and was closed; once one second of virtual time has passed (the bound that
    lets SIGTERM exit within a second), it returns without any more time passing."""
    server = await start_server(nursery, max_send_buffer=64 * 1024 * 1024)
    with trio.fail_after(10):
        stuck = await WireClient.connect(server)
        await flood(stuck, 300)  # 18 MB of replies: more than the kernel's buffers hold
        await wait_for(lambda: server.statistics()["server"]["connections_blocked"] == 1)
        idle = await WireClient.connect(server)
    clock.rate = 0  # virtual time stands still from here: only clock.jump moves it
    closed = trio.Event()

    async def close() -> None:
        await server.aclose()
        closed.set()

    with fail_after_real(10):  # trio.fail_after cannot fire while the clock stands still
        nursery.start_soon(close)
        messages = await idle.read_until_closed()
        assert [m.code for m in messages] == [ErrorCode.SHUTTING_DOWN]  # type: ignore[union-attr]
        await idle.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert not closed.is_set()  # the stuck client holds shutdown up for now
        clock.jump(1.0)
        await closed.wait()
    await stuck.aclose()


async def test_cancelling_serve_closes_everything() -> None:
    """Cancelling serve() stops it at once and closes its connections."""
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            server = await start_server(nursery)
            c = await WireClient.connect(server)
            nursery.cancel_scope.cancel()
        assert await c.read_until_closed() == []
        await c.aclose()


# --- the real command ----------------------------------------------------------------------------


def _spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "lockserver", *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_listening_line(proc: subprocess.Popen[str]) -> tuple[str, int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    prefix = "lockserver listening on "
    assert line.startswith(prefix), (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
    host, _, port = line[len(prefix) :].strip().rpartition(":")
    return host, int(port)


def _sync_exchange(sock: socket.socket, proto: Connection, *msgs: object) -> list[object]:
    sock.sendall(b"".join(proto.send(m) for m in msgs))  # type: ignore[arg-type]
    got: list[object] = []
    while len(got) < len(msgs):
        data = sock.recv(65536)
        assert data
        proto.receive_data(data)
        while (m := proto.next_message()) is not None:
            got.append(m)
    return got


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_the_command_down(signum: signal.Signals) -> None:
    """`lockserver --port 0` prints exactly one "listening" line with the real port, serves,
    and on SIGTERM/SIGINT closes its connections (SHUTTING_DOWN, EOF) and exits 0; logs are
    JSON lines with --log-json. How soon it exits is pinned in-process under a MockClock
    (test_aclose_is_prompt_even_with_a_stuck_client); the timeouts here are hang guards."""
    proc = _spawn("--port", "0", "--log-json", "--log-level", "debug")
    try:
        host, port = _read_listening_line(proc)
        assert host == "127.0.0.1"
        assert port > 0
        with socket.create_connection((host, port), timeout=5) as sock:
            proto = Connection(Role.CLIENT)
            welcome, pong = _sync_exchange(sock, proto, Hello(1), Ping(2))
            assert isinstance(welcome, Reply) and isinstance(welcome.body, Welcome)
            assert isinstance(pong, Reply) and isinstance(pong.body, Pong)
            proc.send_signal(signum)
            rest: list[object] = []
            while data := sock.recv(65536):
                proto.receive_data(data)
                while (m := proto.next_message()) is not None:
                    rest.append(m)
            code = proc.wait(timeout=5)
        assert code == 0
        assert [m.code for m in rest] == [ErrorCode.SHUTTING_DOWN]  # type: ignore[attr-defined]
        out, err = proc.communicate(timeout=5)
        assert out == ""  # nothing after the listening line
        lines = [json.loads(line) for line in err.splitlines()]
        assert all({"time", "level", "logger", "message"} <= set(e) for e in lines)
        assert any("shutting down" in e["message"] for e in lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_command_reports_a_port_in_use() -> None:
    """A port that cannot be bound: one line on stderr, exit code 1, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _spawn("--port", str(port))
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"lockserver: error: cannot listen on 127.0.0.1:{port}: ")
