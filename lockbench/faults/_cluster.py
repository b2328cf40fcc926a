"""The systems under test on the lab's nodes: one etcd member per node and, for our system,
one ``lockserver --replicate`` replica per node, with the process faults the nemesis needs
(SIGKILL and restart, SIGSTOP/SIGCONT) and each replica's clock.

Why not ``lockbench.etcd.EtcdCluster`` / ``lockbench.replicas.ReplicaGroup``: they bind
loopback on free ports for tests on one network; here each process runs inside its node's
namespace on the node's address (``ip netns exec``), so the partitions between nodes are
real. The etcd settings (Raft timing) follow theirs, a little slower for a busier machine.

Clocks: every replica runs under libfaketime (Debian ``faketime``) reading its offset from a
file of its own (``FAKETIME_TIMESTAMP_FILE``, re-read at every call: ``FAKETIME_NO_CACHE``),
``+0`` until a clock fault writes another. Only the wall clock is faked
(``FAKETIME_DONT_FAKE_MONOTONIC``): that is the clock NTP steps and the one the group's time
comes from; trio's own clock stays true. etcd (Go) reads the clock without libc, so its
members' clocks cannot be faked this way.

Each replica runs as a uid of its own (:data:`REPLICA_UID_BASE` + node number) with only the
file capabilities of root: the firewall's *etcd cut* matches that uid (``_netns.Rules``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Final

from ._etcdgw import wait_healthy
from ._netns import Host, Lab

__all__ = ["ETCD_CLIENT_PORT", "REPLICA_PORT", "Cluster", "Proc", "faketime_library"]

ETCD_CLIENT_PORT: Final = 2379
ETCD_PEER_PORT: Final = 2380
REPLICA_PORT: Final = 7400
REPLICA_UID_BASE: Final = 64000
#: Raft timing in the lab (ms): a leader within ~2 s, also on a loaded 2-core machine.
HEARTBEAT_MS: Final = 100
ELECTION_MS: Final = 1000
#: Seconds a member or replica may take to come up.
START_TIMEOUT: Final = 30.0


def faketime_library() -> str | None:
    """The path of libfaketime (Debian package ``faketime``), or None when not installed."""
    for pattern in (
        "/usr/lib/*/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
        "/usr/local/lib/faketime/libfaketime.so.1",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


class Proc:
    """One process of the lab (an etcd member or a replica) on a node: how to start it, and
    its state (``process`` None while it is down; ``stopped`` while SIGSTOPped)."""

    def __init__(
        self,
        lab: Lab,
        kind: str,
        node: Host,
        argv: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        uid: int | None = None,
    ) -> None:
        self.lab = lab
        self.kind = kind
        self.node = node
        self.argv = argv
        self.log_path = log_path
        self.env = env
        self.uid = uid
        self.process: subprocess.Popen[bytes] | None = None
        self.stopped = False
        self.starts = 0

    def start(self) -> None:
        """Start it (nothing when it runs)."""
        if self.running:
            return
        log: IO[bytes] = open(self.log_path, "ab")  # noqa: SIM115 -- the child keeps a copy
        try:
            log.write(f"=== start {self.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            self.process = self.lab.popen(self.node, self.argv, env=self.env, log=log, uid=self.uid)
        finally:
            log.close()
        self.stopped = False
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL it and reap it (SIGCONT first if stopped)."""
        p = self.process
        if p is None:
            return
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                p.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)
        self.process = None
        self.stopped = False

    def stop(self) -> None:
        """SIGSTOP it: it keeps its sockets and answers nothing."""
        if self.running:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGSTOP)
            self.stopped = True

    def cont(self) -> None:
        """SIGCONT it after :meth:`stop`."""
        if self.running and self.stopped:
            assert self.process is not None
            os.kill(self.process.pid, signal.SIGCONT)
        self.stopped = False

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """etcd members (and, for ``system="lockserver"``, replicas) on every node of ``lab``.
    ``data_dir`` holds etcd's data (removed by :meth:`terminate`), ``log_dir`` every log."""

    def __init__(
        self,
        lab: Lab,
        system: str,
        data_dir: Path,
        log_dir: Path,
        *,
        lease_ttl: int = 2,
        group: str = "lab",
        replica_args: tuple[str, ...] = (),
    ) -> None:
        if system not in ("lockserver", "etcd"):
            raise ValueError(f"system must be lockserver or etcd, not {system!r}")
        self.lab = lab
        self.system = system
        self.data_dir = data_dir
        self.log_dir = log_dir
        self.lease_ttl = lease_ttl
        self.group = group
        data_dir.mkdir(parents=True, exist_ok=True)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.etcd = {n.name: self._etcd_proc(n) for n in lab.nodes}
        self.replicas: dict[str, Proc] = {}
        self.clock_files: dict[str, Path] = {}
        if system == "lockserver":
            library = faketime_library()
            for n in lab.nodes:
                clock = data_dir / f"clock-{n.name}"
                clock.write_text("+0\n")
                self.clock_files[n.name] = clock
                self.replicas[n.name] = self._replica_proc(n, clock, library, replica_args)

    # --- what runs where ---------------------------------------------------------------------

    @property
    def etcd_endpoints(self) -> list[str]:
        """Every member's client address (``host:port``), in node order."""
        return [f"{n.address}:{ETCD_CLIENT_PORT}" for n in self.lab.nodes]

    @property
    def replica_addresses(self) -> list[str]:
        """Every replica's address, in node order."""
        return [f"{n.address}:{REPLICA_PORT}" for n in self.lab.nodes]

    def replica_uid(self, node: Host) -> int:
        """The uid node ``node``'s replica runs as."""
        return REPLICA_UID_BASE + self.lab.nodes.index(node) + 1

    def _etcd_proc(self, node: Host) -> Proc:
        peers = ",".join(f"{n.name}=http://{n.address}:{ETCD_PEER_PORT}" for n in self.lab.nodes)
        client = f"http://{node.address}:{ETCD_CLIENT_PORT}"
        peer = f"http://{node.address}:{ETCD_PEER_PORT}"
        argv = [
            "etcd",
            "--name",
            node.name,
            "--data-dir",
            str(self.data_dir / f"{node.name}.etcd"),
            "--listen-client-urls",
            client,
            "--advertise-client-urls",
            client,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            peers,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"{self.lab.prefix}{self.lab.run_id}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
            "--log-level",
            "warn",
        ]
        return Proc(self.lab, "etcd", node, argv, self.log_dir / f"etcd-{node.name}.log")

    def _replica_proc(
        self, node: Host, clock: Path, library: str | None, extra: tuple[str, ...]
    ) -> Proc:
        argv = [
            sys.executable,
            "-P",  # server_root() (on PYTHONPATH), not the working directory, is the code
            "-m",
            "lockserver",
            "--host",
            node.address,
            "--port",
            str(REPLICA_PORT),
            "--replicate",
            "etcd://" + ",".join(self.etcd_endpoints),
            "--group",
            self.group,
            "--replica-lease-ttl",
            str(self.lease_ttl),
            *extra,
        ]
        from lockbench._spawn import spawn_env  # here: it needs the bench extra (psutil)

        env = {**spawn_env(), "PYTHONUNBUFFERED": "1"}
        if library is not None:
            env.update(
                LD_PRELOAD=library,
                FAKETIME_TIMESTAMP_FILE=str(clock),
                FAKETIME_NO_CACHE="1",
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        return Proc(
            self.lab,
            "replica",
            node,
            argv,
            self.log_dir / f"replica-{node.name}.log",
            env=env,
            uid=self.replica_uid(node),
        )

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start every member, wait until each is healthy; then every replica, and wait until
        each answers a ping. RuntimeError with the logs when one does not come up."""
        for proc in self.etcd.values():
            proc.start()
        for proc in self.etcd.values():
            self.wait_etcd(proc)
        for proc in self.replicas.values():
            proc.start()
        for proc in self.replicas.values():
            self.wait_replica(proc)

    def wait_etcd(self, proc: Proc, timeout: float = START_TIMEOUT) -> None:
        """Until member ``proc`` answers ``/health`` (RuntimeError after ``timeout``)."""
        address = f"{proc.node.address}:{ETCD_CLIENT_PORT}"
        deadline = time.monotonic() + timeout
        while not wait_healthy(address):
            self._check(proc, deadline)
            time.sleep(0.1)

    def wait_replica(self, proc: Proc, timeout: float = START_TIMEOUT) -> None:
        """Until replica ``proc`` answers a ping (RuntimeError after ``timeout``)."""
        from client import LockClient, LockClientError

        deadline = time.monotonic() + timeout
        while True:
            try:
                with LockClient(proc.node.address, REPLICA_PORT, timeout=2, connect_timeout=1) as c:
                    c.ping()
                return
            except (LockClientError, OSError):
                self._check(proc, deadline)
                time.sleep(0.2)

    def watched_member(self) -> str | None:
        """The node whose etcd member most running replicas watch the log on now (each
        replica's ``stats``: ``replication.watching``; a tie goes to the first in node
        order), or None when no replica says (down, or a version without the figure)."""
        from client import LockClient, LockClientError

        by_address = {n.address: n.name for n in self.lab.nodes}
        counts: dict[str, int] = {}
        for name, proc in self.replicas.items():
            if not proc.running:
                continue
            try:
                with LockClient(
                    self.lab.host(name).address, REPLICA_PORT, timeout=2, connect_timeout=1
                ) as c:
                    url = c.statistics().get("replication", {}).get("watching")
            except (LockClientError, OSError):
                continue
            if not isinstance(url, str):
                continue
            node = by_address.get(url.split("://", 1)[-1].rpartition(":")[0])
            if node is not None:
                counts[node] = counts.get(node, 0) + 1
        order = [n.name for n in self.lab.nodes]
        return max(counts, key=lambda n: (counts[n], -order.index(n))) if counts else None

    def _check(self, proc: Proc, deadline: float) -> None:
        if not proc.running:
            raise RuntimeError(f"{proc.kind} on {proc.node.name} exited:\n{proc.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{proc.kind} on {proc.node.name} not up within its bound:\n{proc.log_tail()}"
            )

    def terminate(self) -> None:
        """Kill everything and remove etcd's data; idempotent."""
        for proc in [*self.replicas.values(), *self.etcd.values()]:
            proc.kill()
        import shutil

        shutil.rmtree(self.data_dir, ignore_errors=True)

    # --- clocks -----------------------------------------------------------------------------

    def set_clock(self, node: Host, offset: float) -> None:
        """Set node ``node``'s replica's wall-clock offset (seconds, read at its next clock
        call)."""
        path = self.clock_files[node.name]
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{offset:+.0f}\n")
        tmp.replace(path)  # whole or nothing: the replica never reads half a line
