"""The command ``lockctl lock`` runs, as a whole: a process group of its own, the terminal
while it runs, signals and termination for everything in it.

Why (issue 30): signalling only the command's process let whatever it started run on. A
``sh -c`` script's background job that ignores SIGTERM kept running after the lock was lost
and lockctl had exited 76, while another host held the lock: mutual exclusion broken by any
wrapper script. What the command starts stays in its process group unless it moves itself
out (``setsid``, ``setpgid``: a daemon's choice, which lockctl cannot see), so the group is
what lockctl owns, as ``timeout(1)`` and a shell's job control do.

Rules kept (docs/operations.md, "lockctl lock for cron jobs"):
- The command starts in a new process group (``pgid`` = its pid). lockctl becomes a child
  subreaper (Linux ``prctl``), so what the command started and left behind is reparented
  to lockctl and reaped by it: the group is gone when its last process is, even where PID 1
  reaps nothing (a container's).
- **Terminal.** When lockctl's group is the foreground of its controlling terminal, the
  command's group becomes it while the command runs (so it can read the terminal, and
  Ctrl-C and Ctrl-\\ reach everything in it), and lockctl takes it back afterwards. When the
  command is stopped (Ctrl-Z), lockctl takes the terminal back and stops itself the same
  way, so the shell gets control; continued (``fg`` / ``bg``), it gives the terminal back
  when it is in the foreground and continues the command.
- **Stopping** (:meth:`CommandGroup.stop`): the signal to every process of the group, then
  up to ``grace`` seconds for all of them to end, then SIGKILL to what is left. Nothing of
  the group outlives it, the command's own children included.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

__all__ = ["CommandGroup"]

#: How often the group is looked at while it is being stopped.
POLL = 0.02
#: How long the group may take to go after SIGKILL (reaped, or the kernel's exit of a huge
#: process); past it lockctl goes on rather than wait forever.
KILL_WAIT = 5.0
_PR_SET_CHILD_SUBREAPER = 36


def _become_subreaper() -> None:
    """Make orphans of this process's descendants its own children (Linux; elsewhere a
    no-op: their zombies then wait for init, and a stop may wait its grace for them)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _terminal() -> int | None:
    """The controlling terminal, open, when this process's group is its foreground."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _foreground(fd: int, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground group (from the background too: a shell
    ignores SIGTTOU for this)."""
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(fd, pgid)
    finally:
        signal.signal(signal.SIGTTOU, previous)


class CommandGroup:
    """``command`` running in a process group of its own (see the module docstring).
    Raises OSError when it cannot be started."""

    def __init__(self, command: list[str], env: Mapping[str, str]) -> None:
        _become_subreaper()
        self.child = subprocess.Popen(command, env=env, process_group=0)
        self.pgid = self.child.pid
        self._tty = _terminal()
        if self._tty is not None:
            self._give_terminal()

    @property
    def returncode(self) -> int | None:
        """The command's exit status (negative: killed by that signal), None while it runs."""
        return self.child.returncode

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the command to end; whether it did."""
        try:
            self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def signal(self, signum: int) -> None:
        """Send ``signum`` to every process of the group."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    def alive(self) -> bool:
        """Whether any process of the group is left (those ended are reaped first)."""
        self._reap()
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # one of them changed its user: it is there
            return True
        return True

    def stop(self, signum: int | None, grace: float) -> None:
        """Send ``signum`` to the group (None: it was sent already), wait up to ``grace``
        seconds for the group to end, then SIGKILL what is left and reap it."""
        if signum is not None:
            self.signal(signum)
        self.settle(time.monotonic() + grace)

    def settle(self, kill_at: float) -> None:
        """Wait for the group to end, SIGKILL what is left of it at ``kill_at`` (monotonic
        seconds), and reap it."""
        while self.alive():
            if time.monotonic() >= kill_at:
                self.signal(signal.SIGKILL)
                give_up = time.monotonic() + KILL_WAIT
                while self.alive() and time.monotonic() < give_up:
                    time.sleep(POLL)
                return
            time.sleep(POLL)

    def close(self) -> None:
        """Take the terminal back (when the command had it)."""
        if self._tty is not None:
            _foreground(self._tty, os.getpgrp())
            os.close(self._tty)
            self._tty = None

    def follow_stops(self) -> None:
        """When the command was stopped (Ctrl-Z, or it read the terminal from the
        background) and lockctl has the terminal: take it back, stop lockctl the same way so
        the shell gets control, and once continued, give the terminal back (in the
        foreground) and continue the command. Without a terminal there is no job control:
        nothing is done."""
        if self._tty is None or not hasattr(os, "waitid"):
            return
        try:
            info = os.waitid(os.P_PID, self.child.pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_code != os.CLD_STOPPED:
            return
        with contextlib.suppress(ChildProcessError):  # consume the stop report
            os.waitid(os.P_PID, self.child.pid, os.WSTOPPED | os.WNOHANG)
        _foreground(self._tty, os.getpgrp())
        os.kill(os.getpid(), signal.SIGTSTP)  # returns once continued (fg / bg)
        with contextlib.suppress(OSError):
            if os.tcgetpgrp(self._tty) == os.getpgrp():
                self._give_terminal()
                return
        self.signal(signal.SIGCONT)

    def _give_terminal(self) -> None:
        assert self._tty is not None
        _foreground(self._tty, self.pgid)
        self.signal(signal.SIGCONT)  # in case it read the terminal before it was its own

    def _reap(self) -> None:
        """Reap the command (through Popen: its status is lockctl's) and what it left
        behind that was reparented to lockctl."""
        self.child.poll()
        if not hasattr(os, "waitid"):
            return
        while True:
            try:
                info = os.waitid(os.P_PGID, self.pgid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == self.child.pid:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)
