"""``lockctl lock NAMESPACE NAME [options] -- COMMAND ARGS...``: run a command while holding a
mutex, as ``flock(1)`` or ``etcdctl lock`` do, with the fence for the command to pass on.

Rules kept (docs/operations.md#lockctl-lock-for-cron-jobs):
- The command starts only once the lock is granted; it gets ``LOCKSERVER_FENCE`` (the grant's
  fence), ``LOCKSERVER_LOCK`` (``namespace/name``) and ``LOCKSERVER_SESSION`` in its
  environment. Its exit status is lockctl's (killed by a signal: 128 + the signal).
- The command runs in a process group of its own, which lockctl owns as a whole
  (``_group.py``): every signal below goes to the group, and nothing of it outlives the lock.
- Not granted within ``--timeout``: the command never runs; exit 75 (NOT_OBTAINED).
- Lost while the command runs (the session was ended or expired, the entry's ``--ttl`` ran
  out, or the server stopped confirming it until the guarantee ran out): the group gets
  SIGTERM, then SIGKILL after ``--grace`` seconds, and lockctl exits 76 (LOST) once it is
  gone. A loss found only when releasing, after the command ended, is reported the same way:
  the command may have run without the lock for a while.
- The command ended with processes of its group still running (a background job): they get
  SIGTERM (a warning says so), SIGKILL after ``--grace``, and only then is the lock released.
- The lock is watched every 0.2 s (events from the server) and confirmed every max_age / 3
  (a refresh, which also moves the local guarantee forward).
- SIGTERM, SIGHUP and SIGINT sent to lockctl are passed to the group; lockctl keeps the lock
  while the group ends, SIGKILLs what is left after ``--grace``, then releases. Ctrl-C in a
  terminal reaches the group directly (it has the terminal while it runs).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from client import LockClient, LockClientError, LockLostError, Mutex

from ._common import Exit, Failure, failure_of, positive
from ._group import CommandGroup

__all__ = ["add_lock_parser", "run_lock"]

#: How often the lock is looked at while the command runs (events, the local guarantee).
WATCH_INTERVAL = 0.2
#: Room for a description in the session (the server's limit is larger).
DESCRIPTION_CHARS = 200


def add_lock_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "lock",
        help="run a command while holding a mutex (like flock(1))",
        description="Run COMMAND while holding the mutex NAME of NAMESPACE. Exit status: the "
        "command's; 75 when not obtained in time; 76 when the lock was lost.",
    )
    parser.add_argument("namespace", metavar="NAMESPACE")
    parser.add_argument("name", metavar="NAME")
    parser.add_argument(
        "--timeout",
        type=positive,
        default=None,
        metavar="S",
        help="give up when not granted within S seconds (exit 75); default: wait",
    )
    parser.add_argument(
        "--ttl",
        type=positive,
        default=None,
        metavar="S",
        help="the lock expires S seconds after it is granted, whatever happens (the command "
        "is then terminated)",
    )
    parser.add_argument(
        "--max-age",
        type=positive,
        default=30.0,
        metavar="S",
        help="the session's max age: how long the lock outlives a lockctl that dies (30 s)",
    )
    parser.add_argument(
        "--grace",
        type=positive,
        default=10.0,
        metavar="S",
        help="after SIGTERM to a command whose lock was lost, seconds before SIGKILL (10 s)",
    )
    # The command after "--" is split off before argparse sees the line (lockctl's main), so
    # that options may come in any order before it and nothing after it is taken as one.


def run_lock(args: argparse.Namespace, connect: Callable[[argparse.Namespace], LockClient]) -> int:
    command = list(args.argv)
    if not command:
        raise Failure(Exit.USAGE, "lock: give the command to run after --")
    what = f"{args.namespace}/{args.name}"
    description = f"lockctl lock on {socket.gethostname()} pid {os.getpid()}: "
    description = (description + shlex.join(command))[:DESCRIPTION_CHARS]
    with connect(args) as client:
        try:
            session = client.session(max_age=args.max_age, description=description)
            lock = Mutex(session, args.namespace, args.name, ttl=args.ttl)
        except ValueError as exc:
            raise Failure(Exit.USAGE, f"lock: {exc}") from None
        try:
            try:
                granted = lock.acquire(blocking=True, timeout=args.timeout)
            except LockClientError as exc:
                raise failure_of(exc) from None
            if not granted:
                raise Failure(
                    Exit.NOT_OBTAINED, f"lock {what} not obtained within {args.timeout:g} s"
                )
            return _run_holding(args, lock, session.id, command, what)
        finally:
            # On failure the session expires after max_age; the outcome was reported already.
            with contextlib.suppress(LockClientError):
                session.end()


def _run_holding(
    args: argparse.Namespace, lock: Mutex, session_id: str, command: list[str], what: str
) -> int:
    env = dict(
        os.environ,
        LOCKSERVER_FENCE=str(lock.fence),
        LOCKSERVER_LOCK=what,
        LOCKSERVER_SESSION=session_id,
    )
    told = _Told(args.grace)
    previous = told.install()  # before the command starts: no signal may miss its group
    group: CommandGroup | None = None
    try:
        try:
            group = told.group = CommandGroup(command, env)
        except OSError as exc:
            _release_quietly(lock)
            status = int(Exit.ERROR)
            if isinstance(exc, FileNotFoundError):
                status = 127  # as a shell says "command not found"
            elif isinstance(exc, PermissionError):
                status = 126  # as a shell says "cannot execute"
            raise Failure(status, f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
        if told.pending is not None:
            told.forward(told.pending, None)
        why = _watch(lock, group, args.max_age / 3, told, args.grace)
        if why is not None:
            group.stop(signal.SIGTERM, args.grace)
            _release_quietly(lock)
            raise Failure(Exit.LOST, f"lock {what} lost ({why}); the command was terminated")
        if group.alive():  # the command ended; what it started must not outlive the lock
            if told.kill_at is None:
                print(
                    "lockctl: warning: the command left processes running in its process "
                    "group; terminating them before releasing the lock",
                    file=sys.stderr,
                )
                group.stop(signal.SIGTERM, args.grace)
            else:
                group.settle(told.kill_at)
        try:
            lock.release()
        except LockLostError as exc:
            raise Failure(
                Exit.LOST,
                f"lock {what} was found lost when releasing it ({exc}); the command ran "
                "without it for a while",
            ) from None
        except LockClientError as exc:
            print(f"lockctl: warning: releasing {what} failed: {exc}", file=sys.stderr)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if group is not None:
            group.close()
    code = group.returncode
    assert code is not None
    return 128 - code if code < 0 else code


class _Told:
    """Signals sent to lockctl while it runs the command: each is passed to the command's
    whole group (``group``; one that came before the group existed is ``pending``), and the
    first starts the grace, which ends at ``kill_at``."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.group: CommandGroup | None = None
        self.pending: int | None = None
        self.kill_at: float | None = None

    def install(self) -> dict[int, Any]:
        """Handle SIGTERM, SIGHUP and SIGINT (Ctrl-C in a terminal reaches the group
        directly: it has the terminal); the previous handlers, to restore."""
        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            previous[signum] = signal.signal(signum, self.forward)
        return previous

    def forward(self, signum: int, frame: FrameType | None) -> None:
        if self.group is None:
            self.pending = signum
            return
        self.group.signal(signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace


def _watch(
    lock: Mutex, group: CommandGroup, refresh_every: float, told: _Told, grace: float
) -> str | None:
    """Wait for the command while watching the lock (and, once lockctl was told to stop,
    SIGKILL the group when the grace is over); None when the command ended with the lock
    held, else why the lock is lost (the command still runs)."""
    next_refresh = time.monotonic() + refresh_every
    while True:
        if told.kill_at is not None and time.monotonic() >= told.kill_at:
            group.signal(signal.SIGKILL)
        if group.wait(WATCH_INTERVAL):
            return None
        group.follow_stops()
        try:
            lock.check()  # reads the server's events first
            if time.monotonic() >= next_refresh:
                try:
                    lock.refresh()
                    next_refresh = time.monotonic() + refresh_every
                except LockLostError:
                    raise
                except LockClientError:
                    next_refresh = time.monotonic() + 1.0  # unreachable: try again soon
        except LockLostError as exc:
            return str(exc)
        if lock.valid_for() <= 0.0:
            return "its guarantee ran out: the server did not confirm it in time"


def _release_quietly(lock: Mutex) -> None:
    # Lost already, or unreachable: the session's end (or expiry) removes it.
    with contextlib.suppress(LockClientError):
        lock.release()
