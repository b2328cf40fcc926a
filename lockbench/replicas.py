"""Replicated lockserver groups on this machine, for the fault tests, the replication soak, the
benchmark and the demo: :class:`ReplicaGroup` starts N ``lockserver --replicate`` processes of
one group against an etcd cluster (``lockbench.etcd.EtcdCluster``) on loopback ports, and
injects the faults the issue names (SIGKILL, SIGSTOP/SIGCONT, restart).

The replicas run the ``lockserver`` of ``$LOCKBENCH_SERVER_ROOT`` when it is set (another
checkout: the "before" side of a before/after sitting), as lockbench's spawned servers do.

Rules kept: loopback only; every start is bounded (``START_TIMEOUT``) and fails with the
replica's log; :meth:`ReplicaGroup.terminate` (also on ``__exit__`` and at exit) leaves no
process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

from ._spawn import spawn_env
from .etcd import free_ports, log_tail

__all__ = ["START_TIMEOUT", "Contention", "ReplicaGroup", "ReplicaProcess"]

#: Seconds a replica may take to join its group and listen.
START_TIMEOUT: Final = 20.0


def _replicate(endpoints: list[str]) -> str:
    """``--replicate`` for ``HOST:PORT`` endpoints (plain HTTP) or for URLs (``https://``:
    ``EtcdCluster.urls`` of a TLS cluster, its flags in ``extra``)."""
    if any("://" in e for e in endpoints):
        return ",".join(endpoints)
    return "etcd://" + ",".join(endpoints)


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
        return log_tail(self.log_path, lines)


class ReplicaGroup:
    """``n`` replicas of group ``group`` on the etcd ``endpoints`` (``HOST:PORT``, or URLs:
    ``EtcdCluster.urls``, with ``EtcdCluster.replica_flags()`` in ``extra`` for a TLS or auth
    cluster); faults by replica index."""

    def __init__(
        self,
        endpoints: list[str],
        directory: Path,
        *,
        n: int = 3,
        group: str = "test",
        lease_ttl: int = 2,
        snapshot_every: int = 10_000,
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
        self.replicas = [ReplicaProcess(i, port, directory) for i, port in enumerate(free_ports(n))]
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
            "-P",  # server_root() (on PYTHONPATH), not the working directory, is the code
            "-m",
            "lockserver",
            "--port",
            str(replica.port),
            "--replicate",
            _replicate(self.endpoints),
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
                env={**spawn_env(), "PYTHONUNBUFFERED": "1"},
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
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", r.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError(
            f"replica {r.index} did not listen in {START_TIMEOUT} s:\n{r.log_tail()}"
        )

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


class Contention:
    """``threads`` clients contending for ``locks`` mutexes of namespace ``namespace`` through
    a group (``servers=[addresses]``), each thread with its own client and session, every
    critical section recorded in ``recorder`` (``lockbench.safety``). Errors of the transport
    (a replica killed or stopped under a thread) are counted and the thread goes on: what is
    checked is that no lock was ever held twice, and that grants keep coming.

    ``start()``, then ``stop()`` (joins; bounded by ``join_timeout``); ``grants`` counts the
    recorded critical sections, ``errors`` the calls that failed."""

    def __init__(
        self,
        addresses: list[str],
        recorder: Any,
        *,
        threads: int = 4,
        locks: int = 2,
        namespace: str = "faults",
        max_age: float = 10.0,
        hold: float = 0.002,
        timeout: float = 3.0,
        seed: int = 1,
    ) -> None:
        self.addresses = list(addresses)
        self.recorder = recorder
        self.threads = threads
        self.locks = locks
        self.namespace = namespace
        self.max_age = max_age
        self.hold = hold
        self.timeout = timeout
        self.seed = seed
        self.grants = 0
        self.errors = 0
        self.error_kinds: dict[str, int] = {}
        self._mu = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def start(self) -> Contention:
        self._workers = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.threads)
        ]
        for w in self._workers:
            w.start()
        return self

    def stop(self, join_timeout: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + join_timeout
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))

    @property
    def alive(self) -> int:
        return sum(w.is_alive() for w in self._workers)

    def _count_error(self, exc: BaseException) -> None:
        with self._mu:
            self.errors += 1
            name = type(exc).__name__
            self.error_kinds[name] = self.error_kinds.get(name, 0) + 1

    def _run(self, index: int) -> None:
        from client import LockClient, LockClientError, Mutex

        rng = random.Random(self.seed * 1000 + index)
        holder = f"t{self.seed}-{index}"
        while not self._stop.is_set():
            try:
                with LockClient(servers=[self.addresses], timeout=self.timeout) as c:
                    session = c.session(max_age=self.max_age)
                    while not self._stop.is_set():
                        name = f"m{rng.randrange(self.locks)}"
                        lock = Mutex(session, self.namespace, name)
                        try:
                            if not lock.acquire(timeout=self.timeout):
                                continue
                        except LockClientError as exc:
                            self._count_error(exc)
                            continue
                        with self.recorder.hold(name, "w", lock.fence, holder):
                            if self.hold:
                                time.sleep(rng.random() * self.hold)
                        with self._mu:
                            self.grants += 1
                        try:
                            lock.release()
                        except LockClientError as exc:
                            self._count_error(exc)
            except LockClientError as exc:
                self._count_error(exc)
                time.sleep(0.1)
