"""Replicated lockserver groups on this machine, for the fault tests, the replication soak, the
benchmark and the demo: :class:`ReplicaGroup` starts N ``lockserver --replicate`` processes of
one group against an etcd cluster (``lockbench.etcd.EtcdCluster``) on loopback ports, and
injects the faults the issue names (SIGKILL, SIGSTOP/SIGCONT, restart).

Rules kept: loopback only; every start is bounded (``START_TIMEOUT``) and fails with the
replica's log; :meth:`ReplicaGroup.terminate` (also on ``__exit__`` and at exit) leaves no
process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

__all__ = ["START_TIMEOUT", "ReplicaGroup", "ReplicaProcess"]

#: Seconds a replica may take to join its group and listen.
START_TIMEOUT: Final = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReplicaProcess:
    """One ``lockserver --replicate`` process: its port, log file and process (None when it
    is not running)."""

    def __init__(self, index: int, port: int, directory: Path) -> None:
        self.index = index
        self.port = port
        self.log_path = directory / f"replica{index}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped = False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class ReplicaGroup:
    """``n`` replicas of group ``group`` on the etcd ``endpoints``; faults by replica index."""

    def __init__(
        self,
        endpoints: list[str],
        directory: Path,
        *,
        n: int = 3,
        group: str = "test",
        lease_ttl: int = 2,
        snapshot_every: int = 50_000,
        max_session_age: float | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.endpoints = list(endpoints)
        self.directory = directory
        self.group = group
        self.lease_ttl = lease_ttl
        self.snapshot_every = snapshot_every
        self.extra = extra
        self.max_session_age = max_session_age
        directory.mkdir(parents=True, exist_ok=True)
        self.replicas = [ReplicaProcess(i, _free_port(), directory) for i in range(n)]
        atexit.register(self.terminate)

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()

    @property
    def addresses(self) -> list[str]:
        """``127.0.0.1:PORT`` of every replica, in index order."""
        return [r.address for r in self.replicas]

    def command(self, replica: ReplicaProcess) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "lockserver",
            "--port",
            str(replica.port),
            "--replicate",
            "etcd://" + ",".join(self.endpoints),
            "--group",
            self.group,
            "--replica-lease-ttl",
            str(self.lease_ttl),
            "--replica-snapshot-every",
            str(self.snapshot_every),
            *self.extra,
        ]
        if self.max_session_age is not None:
            cmd += ["--max-session-age", str(self.max_session_age)]
        return cmd

    def start(self, indices: list[int] | None = None) -> ReplicaGroup:
        """Start the replicas (all by default) and wait until each listens."""
        chosen = range(len(self.replicas)) if indices is None else indices
        for i in chosen:
            self._spawn(self.replicas[i])
        for i in chosen:
            self._wait_listening(self.replicas[i])
        return self

    def _spawn(self, r: ReplicaProcess) -> None:
        log = open(r.log_path, "ab")  # noqa: SIM115 -- handed to the child, closed below
        try:
            r.process = subprocess.Popen(
                self.command(r),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        r.stopped = False

    def _wait_listening(self, r: ReplicaProcess) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert r.process is not None
            if r.process.poll() is not None:
                raise RuntimeError(
                    f"replica {r.index} exited with {r.process.returncode}:\n{r.log_tail()}"
                )
            with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", r.port), timeout=0.5
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(f"replica {r.index} did not listen in {START_TIMEOUT} s:\n{r.log_tail()}")

    def running(self, i: int) -> bool:
        p = self.replicas[i].process
        return p is not None and p.poll() is None

    def kill(self, i: int) -> None:
        """SIGKILL replica ``i`` (its lease lapses after ``lease_ttl``)."""
        r = self.replicas[i]
        if r.process is not None:
            if r.stopped:
                r.process.send_signal(signal.SIGCONT)
            r.process.kill()
            r.process.wait(timeout=10)
            r.process = None

    def stop(self, i: int) -> None:
        """SIGSTOP replica ``i``."""
        r = self.replicas[i]
        if r.process is not None:
            r.process.send_signal(signal.SIGSTOP)
            r.stopped = True

    def cont(self, i: int) -> None:
        """SIGCONT replica ``i``."""
        r = self.replicas[i]
        if r.process is not None:
            r.process.send_signal(signal.SIGCONT)
            r.stopped = False

    def restart(self, i: int) -> None:
        """Kill replica ``i`` (if running) and start it again on its port."""
        self.kill(i)
        self.start([i])

    def terminate(self) -> None:
        """Kill every replica; idempotent."""
        for i in range(len(self.replicas)):
            with contextlib.suppress(Exception):
                self.kill(i)
