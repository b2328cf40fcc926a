"""``lockctl``'s inspection and action commands end to end (subprocess, real servers):
``holders``, ``sessions``, ``session``, ``waiters``, ``release`` (with and without an admin
token), ``watch`` until Ctrl-C, and ``top --once``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from support import ThreadedServer
from test_lockctl import BOUND, address, lockctl, one_line_error

from client import Assert, LockClient, LockLost, LostReason, SetVar
from lockserver import RunningServer
from lockserver._auth import TokenSpec

ADMIN = "admin-token-0123456789abcdef0123"
USER = "user-token-0123456789abcdef01234"


@pytest.fixture
def server() -> Iterator[ThreadedServer[RunningServer]]:
    s = ThreadedServer().start()
    try:
        yield s
    finally:
        s.stop()


def test_holders_sessions_and_session(server: ThreadedServer[RunningServer]) -> None:
    with LockClient(port=server.port) as client, client.session(description="worker-7") as s:
        for var in ("nightly", "hourly", "weekly"):
            s.execute("jobs", [Assert(SetVar("cron", var))])
        s.execute("jobs", [Assert(SetVar("other", "x"))])
        proc = lockctl("--json", "holders", "jobs", "cron", server=address(server))
        assert proc.returncode == 0, proc.stderr
        records = json.loads(proc.stdout)
        assert sorted(r["var"] for r in records) == ["hourly", "nightly", "weekly"]
        assert all(r["session"] == s.id and r["session_description"] == "worker-7" for r in records)
        assert all(r["acquired_at"].endswith("Z") and r["fence"] > 0 for r in records)
        one = lockctl("--json", "holders", "jobs", "cron", "night", server=address(server))
        assert [r["var"] for r in json.loads(one.stdout)] == ["nightly"]
        human = lockctl("holders", "jobs", "--max", "2", server=address(server))
        assert human.returncode == 0
        header, *rows = human.stdout.strip().splitlines()
        assert header.split()[:4] == ["NAMESPACE", "TABLE", "VAR", "SESSION"]
        assert len(rows) == 2 and "worker-7" in rows[0]
        assert "more records left (printed 2" in human.stderr
        sessions = lockctl("--json", "sessions", "--match", "worker", server=address(server))
        (record,) = json.loads(sessions.stdout)
        assert (record["session"], record["entries"]) == (s.id, 4)
        detail = lockctl("session", s.id, server=address(server))
        assert detail.returncode == 0 and "entries (4):" in detail.stdout
        one_line_error(lockctl("session", "nobody", server=address(server)), 3, "not found")


def test_waiters_shows_the_queue(server: ThreadedServer[RunningServer]) -> None:
    with LockClient(port=server.port) as client:
        holder = client.session(description="holder")
        holder.execute("jobs", [Assert(SetVar("cron", "nightly"))])
        results: list[bool] = []
        waiting = client.session(description="waiting")

        def wait() -> None:
            results.append(waiting.execute("jobs", [Assert(SetVar("cron", "nightly"))], wait=20).ok)

        thread = threading.Thread(target=wait)
        thread.start()
        deadline = time.monotonic() + BOUND
        while not client.waiters().waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        proc = lockctl("--json", "waiters", "jobs", server=address(server))
        (record,) = json.loads(proc.stdout)
        assert record["session"] == waiting.id and record["variables"] == [["cron", "nightly", 0]]
        human = lockctl("waiters", server=address(server))
        assert "cron/nightly#1" in human.stdout  # people count from 1: first in line
        holder.end()
        thread.join(BOUND)
        assert results == [True]


def test_release_needs_an_admin_token_and_the_holder_hears_it() -> None:
    s = ThreadedServer(tokens=(TokenSpec("ops", ADMIN, admin=True), TokenSpec("app", USER))).start()
    try:
        with LockClient(port=s.port, token=USER) as client, client.session() as holder:
            heard: list[LockLost] = []
            holder.add_lost_listener(heard.append)
            holder.execute("jobs", [Assert(SetVar("cron", "nightly"))])
            denied = lockctl("--token", USER, "release", "jobs", "cron", "nightly",
                             server=address(s))  # fmt: skip
            one_line_error(denied, 77, "forbidden")
            ok = lockctl("--json", "release", "jobs", "cron", "nightly", server=address(s),
                         env={"LOCKSERVER_TOKEN": ADMIN})  # fmt: skip
            assert ok.returncode == 0, ok.stderr
            assert json.loads(ok.stdout)["entries"] == 1
            deadline = time.monotonic() + BOUND
            while not heard and time.monotonic() < deadline:
                client.process_events(0.05)
            assert [e.reason for e in heard] == [LostReason.RELEASED]
            again = lockctl("--token", ADMIN, "release", "jobs", "cron", "nightly",
                            server=address(s))  # fmt: skip
            one_line_error(again, 3, "no entry holds jobs/cron/nightly")
    finally:
        s.stop()


def test_watch_prints_one_line_per_event_until_ctrl_c(
    server: ThreadedServer[RunningServer],
) -> None:
    # The test's Ctrl-C must reach the command: a suite run as a background job (`cmd &` in a
    # script) ignores SIGINT, and a child started meanwhile would inherit that and never stop;
    # a handler (not an ignore) is reset to the default in the child.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "lockctl", "--server", address(server), "watch", "jobs"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        with LockClient(port=server.port) as client, client.session() as s:
            deadline = time.monotonic() + BOUND
            while client.statistics()["server"]["connections"] < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)  # the subscription follows the connection's handshake
            s.execute("jobs", [Assert(SetVar("cron", "nightly"))])
            s.execute("other", [Assert(SetVar("cron", "nightly"))])  # another namespace
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    assert proc.returncode == 0, stderr
    assert "granted jobs/cron/nightly" in lines[0]
    assert "killed (ended) jobs/cron/nightly" in lines[1]  # the session's end


def test_top_once(server: ThreadedServer[RunningServer]) -> None:
    with LockClient(port=server.port) as client, client.session() as s:
        for k in range(3):
            s.execute("jobs", [Assert(SetVar("cron", f"v{k}"))])
        proc = lockctl("top", "--once", server=address(server))
    assert proc.returncode == 0, proc.stderr
    assert "busiest tables" in proc.stdout and "jobs/cron" in proc.stdout
    assert "longest waits" in proc.stdout
