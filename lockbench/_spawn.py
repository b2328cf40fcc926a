"""Private servers for a run: start a lockserver or redis-server on a free loopback port, stop it
afterwards; and find the process of a server that is already running, by its port.

Why: a benchmark must know the server's process to charge it CPU seconds and memory, and a
``--spawn`` run must leave nothing behind. :func:`spawned` is a context manager that always
stops what it started (SIGTERM, then SIGKILL after a grace period), even when the run fails.

lockserver: ``python -m lockserver --port 0`` prints one line ``lockserver listening on
HOST:PORT`` on stdout; we read it (with a deadline), then keep draining stdout in a daemon
thread so a chatty server can never block on a full pipe. stderr goes to a temporary file whose
tail is shown if the server fails to start.

``spawned_shards(N)`` runs ``python -m lockserver --port 0 --processes N`` (the shards'
supervisor, see docs/configuration.md) and reads its N listening lines the same way; stopping
the supervisor stops every shard.

``args`` are extra options of the spawned server (the bigtable phase raises the per-session
entry limit: ``--max-entries-per-session``). ``cpus`` binds it to those CPUs from its first
instruction (the ``pinned`` layout, :mod:`._layout`): it is started from a thread bound to
them, whose mask the child inherits, so no ``taskset`` is needed.

redis-server: ``--port 0`` means "no TCP listener" to Redis, so we pick a free port ourselves
(bind port 0, read it back, close; the tiny race is acceptable on a private machine) and start it
with persistence off (``--save '' --appendonly no``), bound to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]

from ._layout import thread_on
from ._targets import Backend

__all__ = [
    "ServerProcess",
    "SpawnError",
    "find_pid_by_port",
    "free_port",
    "redis_server_path",
    "server_root",
    "spawned",
    "spawned_shards",
]

#: The directory holding this package and, beside it, ``lockserver`` (the repository, or
#: site-packages): put first on a spawned server's PYTHONPATH so it runs the same code.
PACKAGES_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT = 20.0
STOP_GRACE = 5.0
_LISTENING = re.compile(r"lockserver listening on (\S+):(\d+)")


class SpawnError(RuntimeError):
    """A private server could not be started."""


@attrs.frozen
class ServerProcess:
    """A server's process (spawned or found) and where it listens."""

    host: str
    port: int
    pid: int | None
    spawned: bool

    def process(self) -> psutil.Process | None:
        """A psutil handle, or None when the pid is unknown or gone."""
        if self.pid is None:
            return None
        try:
            return psutil.Process(self.pid)
        except psutil.Error:
            return None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def redis_server_path() -> str | None:
    """The redis-server executable, or None when it is not installed."""
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.path.exists(p)),
        None,
    )


def find_pid_by_port(port: int) -> int | None:
    """The pid of the process listening on TCP ``port`` on this machine, or None."""
    conns = []
    for _ in range(3):  # processes coming and going while psutil walks /proc can upset it
        try:
            conns = psutil.net_connections(kind="tcp")
            break
        except Exception:
            time.sleep(0.05)
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return int(c.pid)
    return None


@contextlib.contextmanager
def spawned(
    backend: Backend,
    *,
    host: str = "127.0.0.1",
    args: Sequence[str] = (),
    cpus: frozenset[int] | None = None,
) -> Iterator[ServerProcess]:
    """Start a private server of ``backend`` on a free loopback port, with the extra options
    ``args`` and bound to ``cpus`` (None: not bound); stop it on exit."""
    with tempfile.TemporaryFile(prefix=f"lockbench-{backend}-", suffix=".log") as log:
        if backend is Backend.LOCKSERVER:
            proc, [(bound_host, port)] = _start_lockserver(log, args=args, cpus=cpus)
        else:
            proc, bound_host, port = _start_redis(host, log, args, cpus)
        try:
            yield ServerProcess(bound_host, port, proc.pid, spawned=True)
        finally:
            _stop(proc)


@contextlib.contextmanager
def spawned_shards(shards: int, args: Sequence[str] = ()) -> Iterator[tuple[ServerProcess, ...]]:
    """Start ``lockserver --processes SHARDS --port 0`` (each shard on a free loopback port),
    one ServerProcess per shard in shard order (pids found by port); stop them all on exit."""
    with tempfile.TemporaryFile(prefix="lockbench-shards-", suffix=".log") as log:
        proc, addresses = _start_lockserver(log, shards, args)
        try:
            yield tuple(
                ServerProcess(host, port, find_pid_by_port(port), spawned=True)
                for host, port in addresses
            )
        finally:
            _stop(proc)


#: Names another checkout whose ``lockserver`` a spawned server runs instead of this one's,
#: so a before/after sitting measures two commits with the same load generator.
SERVER_ROOT_VARIABLE = "LOCKBENCH_SERVER_ROOT"


def server_root() -> Path:
    """The directory a spawned ``lockserver`` is imported from: ``$LOCKBENCH_SERVER_ROOT``
    when set (it must hold a ``lockserver`` package), else this package's own root.

    Raises:
        SpawnError: the variable names a directory without a ``lockserver`` package.
    """
    named = os.environ.get(SERVER_ROOT_VARIABLE, "").strip()
    if not named:
        return PACKAGES_ROOT
    root = Path(named).expanduser().resolve()
    if not (root / "lockserver" / "__main__.py").is_file():
        raise SpawnError(
            f"{SERVER_ROOT_VARIABLE}={named}: no lockserver package there "
            f"(expected {root / 'lockserver' / '__main__.py'})"
        )
    return root


def spawn_env() -> dict[str, str]:
    """This process's environment with :func:`server_root` first on ``PYTHONPATH``: the
    environment a spawned ``lockserver`` runs in."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(server_root()) + (os.pathsep + path if path else "")
    return env


def _tail(log: IO[bytes], limit: int = 2000) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    return text[-limit:].strip() or "(no output)"


def _start_lockserver(
    log: IO[bytes],
    shards: int = 1,
    args: Sequence[str] = (),
    cpus: frozenset[int] | None = None,
) -> tuple[subprocess.Popen[bytes], list[tuple[str, int]]]:
    # -P: server_root() (on PYTHONPATH), not a checkout in the working directory, is the code.
    cmd = [sys.executable, "-P", "-m", "lockserver", "--port", "0", *args]
    if shards > 1:
        cmd += ["--processes", str(shards)]
    with thread_on(cpus):
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=spawn_env()
        )
    assert proc.stdout is not None
    lines: list[str] = []
    listening: list[re.Match[str]] = []
    got_lines = threading.Event()

    def drain(stream: IO[bytes]) -> None:
        for raw in stream:
            if not got_lines.is_set():
                lines.append(raw.decode("utf-8", "replace"))
                match = _LISTENING.search(lines[-1])
                if match is not None:
                    listening.append(match)
                if len(listening) == shards:
                    got_lines.set()

    threading.Thread(target=drain, args=(proc.stdout,), daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT
    while not got_lines.wait(0.05):
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise SpawnError(
                f"lockserver did not start ({' '.join(cmd)}; exit code {proc.returncode}):\n"
                f"stdout: {''.join(lines).strip() or '(nothing)'}\nstderr: {_tail(log)}"
            )
    addresses = []
    for match in listening:
        host = match.group(1).strip("[]")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        addresses.append((host, int(match.group(2))))
    return proc, addresses


def _start_redis(
    host: str, log: IO[bytes], args: Sequence[str] = (), cpus: frozenset[int] | None = None
) -> tuple[subprocess.Popen[bytes], str, int]:
    exe = redis_server_path()
    if exe is None:
        raise SpawnError("redis-server not installed: apt-get install redis-server")
    port = free_port(host)
    cmd = [
        exe,
        "--port",
        str(port),
        "--bind",
        host,
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        *args,
    ]
    with thread_on(cpus):
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise SpawnError(
                f"redis-server did not start on {host}:{port} (exit code {proc.returncode}):\n"
                f"{_tail(log)}"
            )
        if _redis_answers(host, port):
            return proc, host, port
        time.sleep(0.05)


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
