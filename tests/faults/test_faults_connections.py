"""10,000 concurrent idle connections (issue #8): the server holds them all and still serves
a working client promptly. The server runs as a subprocess (``python -m lockserver``) so the
two ends of 10,000 connections do not share one process's file-descriptor limit."""

from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio

from client import Assert, DeleteVar, SetVar, open_lock_client

ROOT = Path(__file__).resolve().parents[2]
IDLE = int(os.environ.get("FAULTS_IDLE_CONNECTIONS", "10000"))
BATCH = 500
_LISTENING = re.compile(rb"listening on (\S+):(\d+)")


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {needed} needed for {IDLE} connections")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    except (ValueError, OSError) as exc:
        pytest.skip(f"cannot raise RLIMIT_NOFILE to {needed}: {exc}")


async def test_ten_thousand_idle_connections_and_a_working_client() -> None:
    """Open 10,000 connections (in batches), none says anything; the server counts them all
    and a working client on connection 10,001 locks, sees a conflict and releases, fast."""
    _raise_fd_limit(IDLE + 1000)  # the server subprocess inherits the limit
    log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockserver",
            "--port",
            "0",
            "--max-connections",
            str(IDLE + 10),
            "--handshake-timeout",
            "0",
            "--idle-timeout",
            "0",
        ],
        # A file, not a pipe: nobody drains a pipe, and a server blocked on a full one hangs.
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    streams: list[trio.SocketStream] = []
    try:
        with trio.fail_after(10):
            while True:
                log.seek(0)
                match = _LISTENING.search(log.read())
                if match:
                    break
                await trio.sleep(0.02)
        port = int(match.group(2))
        with trio.fail_after(60):
            for _ in range(IDLE // BATCH):
                batch: list[trio.SocketStream] = []

                async def one(out: list[trio.SocketStream] = batch) -> None:
                    out.append(await trio.open_tcp_stream("127.0.0.1", port))

                async with trio.open_nursery() as nursery:
                    for _ in range(BATCH):
                        nursery.start_soon(one)
                streams.extend(batch)
            stats = await _working_client(port)
        assert stats["server"]["connections"] >= IDLE + 1
        assert stats["server"]["connections_refused"] == 0
        assert stats["server"]["internal_errors"] == 0
    finally:
        for s in streams:
            s.socket.close()
        proc.kill()
        proc.wait()
        log.close()


async def _working_client(port: int) -> dict[str, Any]:
    # The trio client: the sync LockClient's idle check uses select(), which cannot take a
    # descriptor >= 1024 (FD_SETSIZE) -- with 10,000 sockets open it never gets a connection.
    async with open_lock_client("127.0.0.1", port) as c:
        a = c.session(keepalive=False)
        b = c.session(keepalive=False)
        assert (await a.execute("idle", [Assert(SetVar("t", "v"))])).ok
        assert not (await b.execute("idle", [Assert(SetVar("t", "v"))])).ok
        assert (await a.execute("idle", [Assert(DeleteVar("t", "v"))])).ok
        await a.end()
        await b.end()
        return await c.statistics()
