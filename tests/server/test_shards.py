"""``lockserver --processes N``: the real command in a subprocess, on loopback. N shards that
each answer a client, their addresses and the summary line, a stop on SIGTERM that leaves no
process behind, a killed shard stopping the set, a shard that cannot listen, N = 1 staying one
process, and the setting's bounds (flag, file, one-line errors)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from client import LockClient
from lockserver import ServerConfig, load_config
from lockserver._config import MAX_PROCESSES
from lockserver._shards import server_list

REPO = Path(__file__).resolve().parents[2]
BOUND = 20.0  # seconds: every wait below is bounded by this
_LISTENING = re.compile(r"^lockserver listening on 127\.0\.0\.1:(\d+)$")


@attrs.define
class Command:
    """A ``python -m lockserver`` process and the lines it printed on stdout so far."""

    proc: subprocess.Popen[str]
    lines: list[str] = attrs.Factory(list)

    def read_until(self, prefix: str) -> str:
        """Lines until one starts with ``prefix`` (that line), bounded in time."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise AssertionError(f"stdout closed; so far {self.lines}")
            self.lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                return line.rstrip("\n")
        raise AssertionError(f"no {prefix!r} line within {BOUND} s: {self.lines}")

    def ports(self) -> list[int]:
        return [int(m.group(1)) for m in map(_LISTENING.match, self.lines) if m]

    def children(self) -> list[int]:
        """The pids of the command's child processes (Linux /proc)."""
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()]

    def finish(self) -> tuple[int, str, str]:
        """Wait for the exit (bounded); (exit code, rest of stdout, stderr)."""
        out, err = self.proc.communicate(timeout=BOUND)
        return self.proc.returncode, out, err


@pytest.fixture
def launch() -> Iterator[list[Command]]:
    """Start commands; whatever a test leaves running is killed at the end."""
    started: list[Command] = []
    yield started
    for command in started:
        pids = []
        if command.proc.poll() is None:
            pids = command.children()
            command.proc.kill()
        for pid in pids:
            _kill_quietly(pid)
        command.proc.communicate(timeout=BOUND)


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _start(launch: list[Command], *args: str, cwd: Path | None = None) -> Command:
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "lockserver", "--host", "127.0.0.1", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=cwd,
    )
    command = Command(proc)
    launch.append(command)
    return command


def _gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs (reaped, or a zombie waiting for a dead parent's init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + BOUND
    while not all(_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if not _gone(p)]}"
        time.sleep(0.05)


def _free_ports(n: int) -> int:
    """A first port of ``n`` consecutive ports free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        first = random.randint(20_000, 30_000)  # below Linux's ephemeral range (32768-)
        sockets = []
        try:
            for port in range(first, first + n):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise AssertionError("no free run of ports")


def _ping_all(ports: list[int]) -> None:
    for port in ports:
        with LockClient("127.0.0.1", port, timeout=5.0) as client:
            assert client.ping().uptime >= 0


def test_three_shards_on_consecutive_ports_answer_and_stop_on_sigterm(
    launch: list[Command],
) -> None:
    """--processes 3 --port P: three listening lines for P, P+1, P+2 in that order, then the
    summary ``lockserver shards: 127.0.0.1:P-P+2``; each shard answers hello and ping; three
    child processes; SIGTERM stops them all and exits 0 within a few seconds."""
    first = _free_ports(3)
    command = _start(launch, "--port", str(first), "--processes", "3")
    summary = command.read_until("lockserver shards: ")
    assert summary == f"lockserver shards: 127.0.0.1:{first}-{first + 2}"
    assert command.ports() == [first, first + 1, first + 2]
    assert len(command.lines) == 4
    _ping_all(command.ports())
    pids = command.children()
    assert len(pids) == 3
    started = time.monotonic()
    command.proc.send_signal(signal.SIGTERM)
    code, out, _ = command.finish()
    assert code == 0
    assert out == ""
    assert time.monotonic() - started < 3.0
    _wait_gone(pids)


def test_port_0_gives_each_shard_a_free_port_and_sigint_stops_them(
    launch: list[Command],
) -> None:
    """--port 0 --processes 2: each shard on a port of its own choosing; the summary is the
    comma-separated list the client accepts; SIGINT stops both, exit 0."""
    command = _start(launch, "--port", "0", "--processes", "2")
    summary = command.read_until("lockserver shards: ")
    ports = command.ports()
    assert len(ports) == 2 and len(set(ports)) == 2
    assert summary == "lockserver shards: " + server_list([f"127.0.0.1:{p}" for p in ports])
    _ping_all(ports)
    pids = command.children()
    command.proc.send_signal(signal.SIGINT)
    code, _, _ = command.finish()
    assert code == 0
    _wait_gone(pids)


def test_a_killed_shard_stops_the_set_with_exit_1(launch: list[Command]) -> None:
    """SIGKILL to one shard: the supervisor logs which shard stopped and how, stops the
    others, and exits 1 (so a supervisor of its own restarts the set)."""
    command = _start(launch, "--port", "0", "--processes", "3")
    command.read_until("lockserver shards: ")
    pids = command.children()
    ports = command.ports()
    os.kill(pids[1], signal.SIGKILL)
    code, _, err = command.finish()
    assert code == 1
    assert f"shard 1 (127.0.0.1:{ports[1]}), pid {pids[1]} stopped (killed by SIGKILL)" in err
    _wait_gone(pids)


def test_a_shard_that_cannot_listen_stops_the_others(launch: list[Command]) -> None:
    """A port of the range taken by another socket: that shard prints its one-line error
    (exit 1); the supervisor stops the shards that did start and exits 1 too."""
    first = _free_ports(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 2))
        taken.listen()
        command = _start(launch, "--port", str(first), "--processes", "3")
        code, out, err = command.finish()
    assert code == 1
    assert "lockserver shards" not in out
    assert f"lockserver: error: cannot listen on 127.0.0.1:{first + 2}" in err
    assert "shard 2" in err and "could not start" in err


def test_shards_run_the_supervisors_code_whatever_the_working_directory(
    launch: list[Command], tmp_path: Path
) -> None:
    """Started from a directory holding another ``lockserver`` package (another checkout),
    the shards still run the supervisor's code, not that one."""
    impostor = tmp_path / "lockserver"
    impostor.mkdir()
    (impostor / "__init__.py").write_text("")
    (impostor / "__main__.py").write_text("import sys\nprint('impostor')\nsys.exit(3)\n")
    command = _start(launch, "--port", "0", "--processes", "2", cwd=tmp_path)
    command.read_until("lockserver shards: ")
    _ping_all(command.ports())
    command.proc.send_signal(signal.SIGTERM)
    code, out, _ = command.finish()
    assert (code, out) == (0, "")


def test_one_process_is_the_plain_server(launch: list[Command]) -> None:
    """--processes 1 (and the default): one process serving, no child, no summary line."""
    for args in (("--processes", "1"), ()):
        command = _start(launch, "--port", "0", *args)
        command.read_until("lockserver listening on ")
        assert command.children() == []
        _ping_all(command.ports())
        command.proc.send_signal(signal.SIGTERM)
        code, out, _ = command.finish()
        assert (code, out) == (0, "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--processes", "0"), "processes must be >= 1, got 0 (from --processes)"),
        (("--processes", "-1"), "processes must be >= 1, got -1 (from --processes)"),
        (
            ("--processes", str(MAX_PROCESSES + 1)),
            f"processes must be <= {MAX_PROCESSES}, got {MAX_PROCESSES + 1} (from --processes)",
        ),
        (("--processes", "four"), "processes must be an integer, got 'four' (from --processes)"),
        (("--processes", "2.5"), "processes must be an integer, got '2.5' (from --processes)"),
        (
            ("--port", "65535", "--processes", "2"),
            "processes must be <= 1 with port 65535 (the shards take consecutive ports, the "
            "last is 65535), got 2",
        ),
    ],
)
def test_bad_values_are_one_line_errors_with_exit_2(
    launch: list[Command], args: tuple[str, ...], message: str
) -> None:
    """Out of bounds, not a number, or past the last port: one line on stderr, exit 2,
    nothing started."""
    code, out, err = _start(launch, *args).finish()
    assert (code, out, err) == (2, "", f"lockserver: error: {message}\n")


def test_bounds_are_inclusive_and_checked_in_every_source(tmp_path: Path) -> None:
    """1 and MAX_PROCESSES are accepted, 0 and MAX_PROCESSES + 1 refused; the setting comes
    from the file (``processes = 4``) and the environment like every other, a flag winning;
    the last port may be 65535 exactly; port 0 takes any count."""
    assert ServerConfig().processes == 1
    assert ServerConfig(processes=1).processes == 1
    assert ServerConfig(processes=MAX_PROCESSES).processes == MAX_PROCESSES
    assert ServerConfig(port=0, processes=MAX_PROCESSES).processes == MAX_PROCESSES
    assert ServerConfig(port=65534, processes=2).processes == 2
    for bad in (0, MAX_PROCESSES + 1, 2.0, True):
        with pytest.raises(ValueError, match=r"^processes must be"):
            ServerConfig(processes=bad)
    with pytest.raises(ValueError, match=r"^processes must be <= 2 with port 65534"):
        ServerConfig(port=65534, processes=3)
    path = tmp_path / "lockserver.toml"
    path.write_text("processes = 4\n")
    assert load_config(["--config", str(path)], {}).processes == 4
    assert load_config([], {"LOCKSERVER_PROCESSES": "3"}).processes == 3
    assert load_config(["--processes", "2"], {"LOCKSERVER_PROCESSES": "3"}).processes == 2
    path.write_text("processes = 0\n")
    with pytest.raises(ValueError, match=f"processes must be >= 1, got 0 \\(from {path}\\)"):
        load_config(["--config", str(path)], {})


def test_server_list_is_the_clients_syntax() -> None:
    """Consecutive ports of one host: a range; anything else: a comma list."""
    assert server_list(["127.0.0.1:7400", "127.0.0.1:7401"]) == "127.0.0.1:7400-7401"
    assert server_list(["[::1]:7400", "[::1]:7401"]) == "[::1]:7400-7401"
    assert server_list(["127.0.0.1:7401", "127.0.0.1:7400"]) == "127.0.0.1:7401,127.0.0.1:7400"
    assert server_list(["127.0.0.1:9", "127.0.0.1:7"]) == "127.0.0.1:9,127.0.0.1:7"
    assert server_list(["127.0.0.1:7400"]) == "127.0.0.1:7400"
