"""Real etcd on this machine, for the replication tests, the soak, the benchmark and the demo:
:class:`EtcdCluster` starts one or three etcd members as child processes on loopback ports,
with their data and logs in a temporary directory, and injects the faults the tests need
(SIGKILL, SIGSTOP/SIGCONT, restart).

Rules kept:
- **Only loopback, only free ports.** Client and peer URLs are 127.0.0.1 on ports the kernel
  just handed out; a member that cannot bind (another process took the port in between) makes
  :meth:`EtcdCluster.start` try again on new ports, up to :data:`START_ATTEMPTS` times.
- **Bounded.** Starting (or restarting) waits at most :data:`START_TIMEOUT` seconds for every
  member to answer ``/health`` with a leader, then raises with the tail of each member's log.
- **No process outlives the test.** :meth:`EtcdCluster.terminate` SIGCONTs and SIGKILLs
  every member, reaps it and removes its data (the logs stay, for a failure's post-mortem);
  the fixtures call it in ``finally``, and an ``atexit`` hook calls it once more if the
  interpreter leaves without teardown.
- **Fast settings for tests**: heartbeat 50 ms and election timeout 500 ms, so a three-member
  cluster elects a leader (and re-elects after a kill) within about a second.

The member's readiness probe speaks plain HTTP with the standard library, not the client
under test, so a bug in ``lockserver._etcd`` cannot make the fixture look healthy.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Generator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import trio

#: The etcd binary (Debian's ``etcd-server`` puts it in /usr/bin), or None when not installed.
ETCD: Final = shutil.which("etcd")
SKIP_REASON: Final = "etcd not installed: apt-get install etcd-server"

#: Seconds a start or restart may take until every member is healthy.
START_TIMEOUT: Final = 20.0
#: Fresh ports a start tries before it gives up (a port taken between choice and bind).
START_ATTEMPTS: Final = 3
#: Raft timing for tests (milliseconds): a leader within about a second, also after a kill.
HEARTBEAT_MS: Final = 50
ELECTION_MS: Final = 500


class EtcdMember:
    """One member: its name, ports, data directory, log file and process (None when not
    running)."""

    def __init__(self, name: str, client_port: int, peer_port: int, directory: Path) -> None:
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = directory / f"{name}.data"
        self.log_path = directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of its client URL."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its log (all runs of it), for a failure message."""
        return log_tail(self.log_path, lines)


class EtcdCluster:
    """Real etcd members under ``directory``: ``start(n_members)``, ``endpoints``, faults by
    member index, and ``terminate()``. Usable as a context manager (terminates on exit)."""

    def __init__(self, directory: Path, *, binary: str | None = ETCD) -> None:
        if binary is None:
            raise FileNotFoundError(SKIP_REASON)
        self.directory = directory
        self.binary = binary
        self.members: list[EtcdMember] = []
        self._registered = False

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()

    @property
    def endpoints(self) -> list[str]:
        """Every member's ``127.0.0.1:PORT``, in member order."""
        return [m.endpoint for m in self.members]

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, n_members: int = 1) -> EtcdCluster:
        """Start a new cluster of ``n_members`` (1 or 3) and return once every member is
        healthy (a leader elected, reads served). Raises RuntimeError with the members' logs
        when it does not get there."""
        if n_members not in (1, 3):
            raise ValueError(f"a test cluster has 1 or 3 members, not {n_members}")
        if self.members:
            raise RuntimeError("this cluster was already started")
        if not self._registered:
            atexit.register(self.terminate)
            self._registered = True
        for attempt in range(1, START_ATTEMPTS + 1):
            ports = free_ports(2 * n_members)
            run = self.directory / f"run{attempt}"
            run.mkdir(parents=True)
            self.members = [
                EtcdMember(f"m{i}", ports[2 * i], ports[2 * i + 1], run) for i in range(n_members)
            ]
            for i in range(n_members):
                self._spawn(i)
            try:
                self.wait_healthy()
            except RuntimeError:
                if attempt == START_ATTEMPTS or all(self.running(i) for i in range(n_members)):
                    self.terminate()
                    raise
                self.terminate()  # a member died early (a port taken?): new ports
                continue
            return self
        raise AssertionError("unreachable")

    def _spawn(self, i: int) -> None:
        member = self.members[i]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        client_url = f"http://{member.endpoint}"
        args = [
            self.binary,
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"lockserver-test-{os.getpid()}-{id(self)}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
        ]
        with member.log_path.open("ab") as log:
            member.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is the test run's, not etcd's
            )

    def running(self, i: int) -> bool:
        """Whether member ``i``'s process exists (it may be stopped)."""
        process = self.members[i].process
        return process is not None and process.poll() is None

    def terminate(self) -> None:
        """Kill every member (SIGCONT first, so a stopped one dies too), reap it and remove
        its data directory (etcd preallocates ~120 MB there); the logs stay. Safe to call
        twice and after a failed start."""
        for i, member in enumerate(self.members):
            self.kill(i)
            shutil.rmtree(member.data_dir, ignore_errors=True)
        if self._registered:
            atexit.unregister(self.terminate)
            self._registered = False

    # --- faults ------------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it (nothing happens when it is not running)."""
        process = self.members[i].process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        process.wait(timeout=10)
        self.members[i].process = None

    def stop(self, i: int) -> None:
        """SIGSTOP member ``i``: it keeps its sockets but answers nothing."""
        self._signal(i, signal.SIGSTOP)

    def cont(self, i: int) -> None:
        """SIGCONT member ``i`` after :meth:`stop`."""
        self._signal(i, signal.SIGCONT)

    def restart(self, i: int) -> None:
        """Kill member ``i`` if it runs, start it again on its ports and data, and return once
        it is healthy (blocking; in a trio test, :meth:`restart_async`)."""
        self.kill(i)
        self._spawn(i)
        self.wait_healthy([i])

    async def restart_async(self, i: int) -> None:
        """:meth:`restart` without blocking the trio run while the member comes up."""
        self.kill(i)
        self._spawn(i)
        await self.wait_healthy_async([i])

    def _signal(self, i: int, signum: signal.Signals) -> None:
        process = self.members[i].process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"etcd member {i} is not running")
        os.kill(process.pid, signum)

    # --- health ------------------------------------------------------------------------------

    def healthy(self, i: int) -> bool:
        """Whether member ``i`` answers ``/health`` with ``"true"`` (it has a leader)."""
        if not self.running(i):
            return False
        try:
            answer = _http(self.members[i].client_port, "GET", "/health", None, timeout=1.0)
        except (OSError, ValueError):
            return False
        return answer.get("health") == "true"

    def wait_healthy(self, members: list[int] | None = None) -> None:
        """Block until the given members (default: all) are healthy; RuntimeError with their
        logs after :data:`START_TIMEOUT` or when one exits."""
        indices = list(range(len(self.members))) if members is None else members
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self._check_alive(indices)
            if all(self.healthy(i) for i in indices):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure("is not healthy after", indices))
            time.sleep(0.02)

    async def wait_healthy_async(self, members: list[int] | None = None) -> None:
        """:meth:`wait_healthy` under trio: each probe in a worker thread, sleeps in trio."""
        indices = list(range(len(self.members))) if members is None else members
        deadline = trio.current_time() + START_TIMEOUT
        while True:
            self._check_alive(indices)
            states = [await trio.to_thread.run_sync(self.healthy, i) for i in indices]
            if all(states):
                return
            if trio.current_time() > deadline:
                raise RuntimeError(self._failure("is not healthy after", indices))
            await trio.sleep(0.02)

    def _check_alive(self, indices: list[int]) -> None:
        dead = [i for i in indices if not self.running(i)]
        if dead:
            raise RuntimeError(self._failure("exited during start of", dead))

    def _failure(self, what: str, indices: list[int]) -> str:
        lines = [f"etcd member(s) {indices} {what} {START_TIMEOUT} s:"]
        for i in indices:
            member = self.members[i]
            lines.append(f"--- {member.name} ({member.endpoint}), {member.log_path}:")
            lines.append(member.log_tail())
        return "\n".join(lines)

    def status(self, i: int) -> dict[str, Any]:
        """Member ``i``'s maintenance status as etcd's gateway gives it (int64s as strings)."""
        return _http(self.members[i].client_port, "POST", "/v3/maintenance/status", {}, 2.0)

    def leader(self) -> int:
        """The index of the member that is the Raft leader now (asked of a running member)."""
        for i in range(len(self.members)):
            if not self.running(i):
                continue
            try:
                status = self.status(i)
            except (OSError, ValueError):
                continue
            for j in range(len(self.members)):
                if not self.running(j):
                    continue
                try:
                    if self.status(j)["header"]["member_id"] == status["leader"]:
                        return j
                except (OSError, ValueError, KeyError):
                    continue
        raise RuntimeError("no running etcd member names a running leader")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for a failure message ("(no log)" if none)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports the kernel has just handed out (all bound at once, so
    none repeats; released before etcd binds them)."""
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]


def _http(
    port: int, method: str, path: str, body: dict[str, Any] | None, timeout: float
) -> dict[str, Any]:
    """One plain HTTP request to a member; its JSON answer."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        payload = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=payload)
        answer = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    if not isinstance(answer, dict):
        raise ValueError(f"not a JSON object: {answer!r}")
    return answer


def started(directory: Path, n_members: int) -> Generator[EtcdCluster, None, None]:
    """A started cluster for a fixture, terminated afterwards however the test ends."""
    cluster = EtcdCluster(directory)
    try:
        yield cluster.start(n_members)
    finally:
        cluster.terminate()


def wipe(cluster: EtcdCluster) -> None:
    """Delete every key of a running cluster (through its first running member)."""
    everything = {"key": "AA==", "range_end": "AA=="}  # b"\0" to the end: all keys
    for member in cluster.members:
        if member.process is not None:
            _http(member.client_port, "POST", "/v3/kv/deleterange", everything, 5.0)
            return
    raise RuntimeError("no etcd member is running")
