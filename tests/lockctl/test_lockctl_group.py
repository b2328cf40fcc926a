"""``lockctl lock`` owns the whole command (issue 30): the command runs in a process group of
its own, and a lost lock, a signal to lockctl, or the command ending with a background job
still running stop the whole group (SIGKILL after ``--grace``), so nothing the command
started outlives the lock. In a terminal, the command's group has the terminal. The real
lockctl in a subprocess against a real server on loopback; the processes are looked at in
/proc (a zombie is not alive)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ThreadedServer

from client import LockClient
from lockserver import RunningServer

BOUND = 30.0  # seconds: no lockctl run of these tests may take longer
GRACE = "1"  # --grace of these runs: the TERM-ignoring processes get SIGKILL after it

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/stat").exists(), reason="looks at processes in /proc (Linux)"
)


@pytest.fixture
def server() -> Iterator[ThreadedServer[RunningServer]]:
    s = ThreadedServer().start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def groups() -> Iterator[list[int]]:
    """Process groups a test started: whatever is left of them is killed at its end (so a
    failing test leaves no TERM-ignoring job behind)."""
    started: list[int] = []
    yield started
    for pgid in started:
        with contextlib.suppress(OSError):
            os.killpg(pgid, signal.SIGKILL)


def lockctl_argv(server: ThreadedServer[RunningServer], *args: str) -> list[str]:
    return [sys.executable, "-m", "lockctl", "--server", f"127.0.0.1:{server.port}", *args]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOCKSERVER_")}


def stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: only its exit status is left)."""
    st = stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = stat(int(entry))
            if st is not None and st[1] == pgid and st[0] not in ("Z", "X"):
                out.append(int(entry))
    return out


def wait_for(path: Path) -> str:
    """The content of ``path`` once a line was written to it."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def stubborn_script(tmp: Path) -> str:
    """A shell that writes its pid and its session, starts a background job that ignores
    SIGTERM (a loop of sleeps: it writes its own pid), and waits for it."""
    return (
        f"echo $$ > {tmp}/sh; echo $LOCKSERVER_SESSION >> {tmp}/sh; "
        f"sh -c 'trap \"\" TERM; echo $$ > {tmp}/job; while :; do sleep 0.05; done' & "
        "wait"
    )


def start(server: ThreadedServer[RunningServer], tmp: Path, script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        lockctl_argv(server, "lock", "jobs", "x", "--grace", GRACE, "--", "sh", "-c", script),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        start_new_session=True,  # no controlling terminal: never the one pytest runs in
    )


def assert_nothing_left(tmp: Path, pgid: int) -> None:
    job = int(wait_for(tmp / "job"))
    assert not alive(pgid) and not alive(job)
    assert group_members(pgid) == []


def entries(server: ThreadedServer[RunningServer]) -> int:
    with LockClient(port=server.port) as client:
        return int(client.statistics()["engine"]["entries"])


def test_a_lost_lock_ends_the_whole_group_even_a_job_that_ignores_sigterm(
    server: ThreadedServer[RunningServer], tmp_path: Path, groups: list[int]
) -> None:
    """The lock lost (an operator ends the session): the group gets SIGTERM, the shell dies,
    its background job ignores it and gets SIGKILL after the grace; lockctl exits 76 only
    then, with nothing of the group alive. The command ran in a group of its own."""
    proc = start(server, tmp_path, stubborn_script(tmp_path))
    try:
        sh, session = wait_for(tmp_path / "sh").split()
        pgid = int(sh)
        groups += [pgid, proc.pid]
        wait_for(tmp_path / "job")
        assert stat(pgid) is not None and stat(pgid)[1] == pgid  # type: ignore[index]
        assert stat(proc.pid)[1] != pgid  # type: ignore[index]  # lockctl is not in it
        with LockClient(port=server.port) as admin:
            assert admin.end_session(session)
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    assert proc.returncode == 76, stderr
    assert "the command was terminated" in stderr
    assert_nothing_left(tmp_path, pgid)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_lockctl_ends_the_whole_group_then_the_lock_is_released(
    server: ThreadedServer[RunningServer],
    tmp_path: Path,
    groups: list[int],
    signum: int,
    status: int,
) -> None:
    """SIGINT (Ctrl-C) or SIGTERM sent to lockctl goes to the command's whole group; the
    shell dies of it, the job that ignores it gets SIGKILL after the grace; lockctl exits
    with the command's status (128 + the signal) and releases the lock, nothing left."""
    proc = start(server, tmp_path, stubborn_script(tmp_path))
    try:
        pgid = int(wait_for(tmp_path / "sh").split()[0])
        groups += [pgid, proc.pid]
        wait_for(tmp_path / "job")
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=BOUND)
    finally:
        proc.kill()
    assert proc.returncode == status, stderr
    assert_nothing_left(tmp_path, pgid)
    assert entries(server) == 0


def test_a_background_job_left_running_is_ended_before_the_lock_is_released(
    server: ThreadedServer[RunningServer], tmp_path: Path, groups: list[int]
) -> None:
    """A command that exits 0 leaving a job running (ignoring SIGTERM): lockctl warns,
    ends the job (SIGKILL after the grace), then releases the lock; its status is the
    command's."""
    script = (
        f"echo $$ > {tmp_path}/sh; "
        f"sh -c 'trap \"\" TERM; echo $$ > {tmp_path}/job; while :; do sleep 0.05; done' & "
        f"while [ ! -s {tmp_path}/job ]; do sleep 0.02; done; exit 0"
    )
    proc = start(server, tmp_path, script)
    groups.append(proc.pid)
    groups.append(int(wait_for(tmp_path / "sh")))
    _, stderr = proc.communicate(timeout=BOUND)
    assert proc.returncode == 0, stderr
    assert "left processes running in its process group" in stderr
    assert_nothing_left(tmp_path, int(wait_for(tmp_path / "sh")))
    assert entries(server) == 0


# --- in a terminal ----------------------------------------------------------------------------


class Terminal:
    """lockctl run as the session leader of a new pseudo-terminal (its foreground group, as
    from a shell prompt); what it writes, read from the master side."""

    def __init__(self, argv: list[str]) -> None:
        pid, fd = pty.fork()
        if pid == 0:  # the child: lockctl on the terminal
            try:
                os.execve(argv[0], argv, clean_env())
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.output = b""

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def expect(self, text: bytes) -> None:
        """Read until ``text`` was written (bounded)."""
        deadline = time.monotonic() + BOUND
        while text not in self.output:
            assert time.monotonic() < deadline, self.output
            ready, _, _ = select.select([self.fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # EIO: the terminal's other side closed
                    chunk = b""
                assert chunk, f"the terminal closed before {text!r}: {self.output!r}"
                self.output += chunk

    def status(self) -> int:
        """lockctl's exit status (waited for, bounded)."""
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):  # drain, so that it never blocks writing
                while select.select([self.fd], [], [], 0)[0] and (chunk := os.read(self.fd, 4096)):
                    self.output += chunk
            pid, code = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(code)
            time.sleep(0.02)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"lockctl did not end: {self.output!r}")


def test_in_a_terminal_the_command_reads_it_and_ctrl_z_does_not_leave_it_stopped(
    server: ThreadedServer[RunningServer],
) -> None:
    """From a terminal, the command's group is the foreground while it runs: it reads what
    is typed (from the background it would be stopped), and a Ctrl-Z with no shell to take
    the job leaves it running (lockctl continues it), so it reads the next line too."""
    script = 'read a; echo "one:$a"; read b; echo "two:$b"'
    term = Terminal(lockctl_argv(server, "lock", "jobs", "tty", "--", "sh", "-c", script))
    term.write(b"alpha\n")
    term.expect(b"one:alpha")
    term.write(b"\x1a")  # Ctrl-Z
    time.sleep(0.5)  # (it is stopped and continued meanwhile, or never stopped)
    term.write(b"beta\n")
    term.expect(b"two:beta")
    assert term.status() == 0, term.output
    assert entries(server) == 0


def test_in_a_terminal_ctrl_c_reaches_the_group_and_nothing_is_left(
    server: ThreadedServer[RunningServer], tmp_path: Path, groups: list[int]
) -> None:
    """Ctrl-C in the terminal goes to the command's whole foreground group: the shell dies
    of it (lockctl exits 130); its background job (a non-interactive shell's ignores SIGINT,
    and this one SIGTERM too) is ended by lockctl before it releases the lock."""
    script = stubborn_script(tmp_path) + "; echo never"
    argv = lockctl_argv(server, "lock", "jobs", "tty", "--grace", GRACE, "--", "sh", "-c", script)
    term = Terminal(argv)
    groups.append(term.pid)
    pgid = int(wait_for(tmp_path / "sh").split()[0])
    groups.append(pgid)
    wait_for(tmp_path / "job")
    term.write(b"\x03")  # Ctrl-C
    assert term.status() == 130, term.output
    assert_nothing_left(tmp_path, pgid)
    assert entries(server) == 0


# A job-control shell in miniature, as the session leader of the terminal: it runs its
# command (lockctl) as a job in a process group of its own in the foreground, and when the
# job stops it takes the terminal back, says so, and puts the job back in the foreground.
MINI_SHELL = """
import os, signal, sys, time
for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
    signal.signal(s, signal.SIG_IGN)
argv = sys.argv[1:]
pid = os.fork()
if pid == 0:
    os.setpgid(0, 0)
    for s in (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP):
        signal.signal(s, signal.SIG_DFL)
    os.tcsetpgrp(0, os.getpid())
    os.execv(argv[0], argv)
try:
    os.setpgid(pid, pid)
except OSError:
    pass
os.tcsetpgrp(0, pid)
while True:
    _, status = os.waitpid(pid, os.WUNTRACED)
    if os.WIFSTOPPED(status):
        os.tcsetpgrp(0, os.getpgrp())
        print("[shell] stopped", flush=True)
        time.sleep(0.3)
        print("[shell] fg", flush=True)
        os.tcsetpgrp(0, pid)
        os.killpg(pid, signal.SIGCONT)
        continue
    os.tcsetpgrp(0, os.getpgrp())
    print("[shell] exit", os.waitstatus_to_exitcode(status), flush=True)
    sys.exit(0)
"""


def test_ctrl_z_stops_the_command_then_lockctl_and_fg_continues_both(
    server: ThreadedServer[RunningServer],
) -> None:
    """Under a job-control shell: Ctrl-Z stops the command (its group has the terminal),
    then lockctl, so the shell gets the terminal back; ``fg`` continues lockctl, which gives
    the terminal back to the command and continues it: it reads the next line."""
    script = 'read a; echo "one:$a"; read b; echo "two:$b"'
    lockctl = lockctl_argv(server, "lock", "jobs", "tty", "--", "sh", "-c", script)
    term = Terminal([sys.executable, "-c", MINI_SHELL, *lockctl])
    term.write(b"alpha\n")
    term.expect(b"one:alpha")
    term.write(b"\x1a")  # Ctrl-Z
    term.expect(b"[shell] stopped")
    term.expect(b"[shell] fg")
    term.write(b"beta\n")
    term.expect(b"two:beta")
    term.expect(b"[shell] exit 0")
    assert term.status() == 0, term.output
    assert entries(server) == 0
