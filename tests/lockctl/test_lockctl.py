"""``lockctl`` end to end: the real command in a subprocess against real servers (loopback).
Its exit statuses and one-line errors (docs/operations.md#lockctl), ``status``, ``kill``, and
``lock`` with a command that exits 0, exits 3, cannot be started, waits in vain for the lock,
and loses its lock while it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ThreadedServer

from client import Assert, LockClient, SetVar
from lockserver import RunningServer
from lockserver._auth import TokenSpec

SECRET = "s3cret-token-for-tests-0123456789"
BOUND = 30.0  # seconds: no lockctl run of these tests may take longer


def lockctl(
    *args: str, server: str | None = None, env: dict[str, str] | None = None, timeout: float = BOUND
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKSERVER_")}
    full_env.update(env or {})
    prefix = [] if server is None else ["--server", server]
    return subprocess.run(
        [sys.executable, "-m", "lockctl", *prefix, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def one_line_error(proc: subprocess.CompletedProcess[str], status: int, text: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lockctl: error: "), proc.stderr
    assert text in lines[0], lines[0]


@pytest.fixture
def server() -> Iterator[ThreadedServer[RunningServer]]:
    s = ThreadedServer().start()
    try:
        yield s
    finally:
        s.stop()


def address(s: ThreadedServer[RunningServer]) -> str:
    return f"127.0.0.1:{s.port}"


# --- errors and exit statuses -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (("kill",), "SESSION_ID"),
        (("lock", "ns", "name"), "give the command to run after --"),
        (("lock", "ns", "name", "--timeout", "-1", "--", "true"), "must be a number > 0"),
        (("lock", "ns", "name", "--ttl", "x", "--", "true"), "not a number"),
        (("--server", "nohost", "status"), "--server: "),
        (("--call-timeout", "0", "status"), "must be a number > 0"),
    ],
)
def test_a_bad_command_line_is_one_line_and_status_2(args: tuple[str, ...], text: str) -> None:
    one_line_error(lockctl(*args), 2, text)


def test_an_unreachable_server_is_status_69() -> None:
    one_line_error(lockctl("status", server="127.0.0.1:1"), 69, "server unreachable")
    proc = lockctl("status", env={"LOCKSERVER_ADDRESS": "127.0.0.1:1"})
    one_line_error(proc, 69, "127.0.0.1:1")


def test_unauthorized_is_status_77() -> None:
    s = ThreadedServer(tokens=(TokenSpec("ops", SECRET),)).start()
    try:
        one_line_error(lockctl("status", server=address(s)), 77, "unauthorized")
        one_line_error(lockctl("--token", "wrong", "status", server=address(s)), 77, "unauthorized")
        ok = lockctl("status", server=address(s), env={"LOCKSERVER_TOKEN": SECRET})
        assert ok.returncode == 0, ok.stderr
    finally:
        s.stop()


# --- status and kill ------------------------------------------------------------------------------


def test_status_human_and_json(server: ThreadedServer[RunningServer]) -> None:
    with LockClient(port=server.port) as client, client.session() as session:
        session.execute("ns", [Assert(SetVar("t", "v"))])
        human = lockctl("status", server=address(server))
        assert human.returncode == 0, human.stderr
        header, row = human.stdout.strip().splitlines()
        assert header.split() == [
            "SERVER", "UPTIME", "TRUST", "NORM", "CONNS", "SESSIONS", "ENTRIES", "WAITERS", "TX/S"
        ]  # fmt: skip
        assert row.split()[0] == address(server) and row.split()[5:7] == ["1", "1"]
        proc = lockctl("--json", "status", env={"LOCKSERVER_ADDRESS": address(server)})
        assert proc.returncode == 0, proc.stderr
        (record,) = json.loads(proc.stdout)
        assert record["server"] == address(server)
        assert (record["sessions"], record["entries"], record["waiters"]) == (1, 1, 0)
        assert record["connections"] == 2  # ours and lockctl's
        assert record["started_at"].endswith("Z") and 0 <= record["uptime_seconds"] < BOUND
        assert "replication" not in record  # a standalone server (a replica: its group)


def test_status_of_several_servers(server: ThreadedServer[RunningServer]) -> None:
    other = ThreadedServer().start()
    try:
        servers = f"{address(server)},{address(other)}"
        proc = lockctl("--json", "status", server=servers)
        assert proc.returncode == 0, proc.stderr
        assert [r["server"] for r in json.loads(proc.stdout)] == servers.split(",")
    finally:
        other.stop()


def test_kill_ends_a_session_and_an_unknown_one_is_status_3(
    server: ThreadedServer[RunningServer],
) -> None:
    with LockClient(port=server.port) as client:
        session = client.session()
        session.execute("ns", [Assert(SetVar("t", "v"))])
        proc = lockctl("--json", "kill", session.id, server=address(server))
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {"session": session.id, "ended": True}
        assert client.statistics()["engine"]["entries"] == 0
        one_line_error(lockctl("kill", session.id, server=address(server)), 3, "not found")


# --- lock -----------------------------------------------------------------------------------------


def child(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def test_lock_runs_the_command_with_the_fence_and_passes_its_status(
    server: ThreadedServer[RunningServer], tmp_path: Path
) -> None:
    out = tmp_path / "env.json"
    code = (
        "import json, os, sys; json.dump({k: v for k, v in os.environ.items() "
        f"if k.startswith('LOCKSERVER_')}}, open({str(out)!r}, 'w')); sys.exit(0)"
    )
    proc = lockctl("lock", "jobs", "nightly", *child(code), server=address(server))
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(out.read_text())
    assert int(seen["LOCKSERVER_FENCE"]) > 0 and seen["LOCKSERVER_LOCK"] == "jobs/nightly"
    with LockClient(port=server.port) as client:  # released, and its session ended
        assert client.statistics()["engine"]["entries"] == 0
        assert client.statistics()["engine"]["sessions"] == 0
    three = lockctl(
        "lock", "jobs", "nightly", *child("raise SystemExit(3)"), server=address(server)
    )
    assert three.returncode == 3 and three.stderr == ""
    gone = lockctl("lock", "jobs", "n", "--", "/nonexistent/cmd", server=address(server))
    one_line_error(gone, 127, "cannot run '/nonexistent/cmd'")


def test_lock_not_obtained_in_time_is_status_75_and_the_command_never_runs(
    server: ThreadedServer[RunningServer], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with LockClient(port=server.port) as client, client.session() as holder:
        from client import Mutex

        with Mutex(holder, "jobs", "nightly"):
            proc = lockctl(
                "lock",
                "jobs",
                "nightly",
                "--timeout",
                "0.5",
                *child(f"open({str(marker)!r}, 'w')"),
                server=address(server),
            )
    one_line_error(proc, 75, "lock jobs/nightly not obtained within 0.5 s")
    assert not marker.exists()


def test_a_lost_lock_terminates_the_command_and_is_status_76(
    server: ThreadedServer[RunningServer], tmp_path: Path
) -> None:
    started = tmp_path / "session"
    code = (
        "import os, signal, sys, time\n"
        f"open({str(started)!r}, 'w').write(os.environ['LOCKSERVER_SESSION'])\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lockctl",
            "--server",
            address(server),
            "lock",
            "jobs",
            "x",
            *child(code),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + BOUND
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        with LockClient(port=server.port) as admin:
            assert admin.end_session(started.read_text())  # an operator kills the session
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    assert proc.returncode == 76, stderr
    assert stderr.strip().startswith("lockctl: error: lock jobs/x lost (")
    assert "the command was terminated" in stderr
