"""``lockctl lock NAMESPACE NAME [options] -- COMMAND ARGS...``: run a command while holding a
mutex, as ``flock(1)`` or ``etcdctl lock`` do, with the fence for the command to pass on.

Rules kept (docs/operations.md#lockctl-lock-for-cron-jobs):
- The command starts only once the lock is granted; it gets ``LOCKSERVER_FENCE`` (the grant's
  fence), ``LOCKSERVER_LOCK`` (``namespace/name``) and ``LOCKSERVER_SESSION`` in its
  environment. Its exit status is lockctl's (killed by a signal: 128 + the signal).
- Not granted within ``--timeout``: the command never runs; exit 75 (NOT_OBTAINED).
- Lost while the command runs (the session was ended or expired, the entry's ``--ttl`` ran
  out, or the server stopped confirming it until the guarantee ran out): the command gets
  SIGTERM, then SIGKILL after ``--grace`` seconds, and lockctl exits 76 (LOST). A loss found
  only when releasing, after the command ended, is reported the same way: the command may
  have run without the lock for a while.
- The lock is watched every 0.2 s (events from the server) and confirmed every max_age / 3
  (a refresh, which also moves the local guarantee forward).
- SIGTERM and SIGHUP sent to lockctl are passed to the command (and lockctl waits for it);
  SIGINT from a terminal reaches the command directly (same process group), so lockctl
  ignores it and waits for the command.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from client import LockClient, LockClientError, LockLostError, Mutex

from ._common import Exit, Failure, failure_of, positive

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
    try:
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        _release_quietly(lock)
        status = int(Exit.ERROR)
        if isinstance(exc, FileNotFoundError):
            status = 127  # as a shell says "command not found"
        elif isinstance(exc, PermissionError):
            status = 126  # as a shell says "cannot execute"
        raise Failure(status, f"cannot run {command[0]!r}: {exc.strerror or exc}") from None
    previous = _pass_signals_to(child)
    try:
        why = _watch(lock, child, args.max_age / 3)
        if why is not None:
            _terminate(child, args.grace)
            _release_quietly(lock)
            raise Failure(Exit.LOST, f"lock {what} lost ({why}); the command was terminated")
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
    code = child.returncode
    return 128 - code if code < 0 else code


def _watch(lock: Mutex, child: subprocess.Popen[bytes], refresh_every: float) -> str | None:
    """Wait for ``child`` while watching the lock; None when the child ended with the lock
    held, else why the lock is lost (the child still runs)."""
    next_refresh = time.monotonic() + refresh_every
    while True:
        try:
            child.wait(timeout=WATCH_INTERVAL)
            return None
        except subprocess.TimeoutExpired:
            pass
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


def _terminate(child: subprocess.Popen[bytes], grace: float) -> None:
    if child.poll() is not None:
        return
    child.terminate()
    try:
        child.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def _release_quietly(lock: Mutex) -> None:
    # Lost already, or unreachable: the session's end (or expiry) removes it.
    with contextlib.suppress(LockClientError):
        lock.release()


def _pass_signals_to(child: subprocess.Popen[bytes]) -> dict[int, Any]:
    """Pass SIGTERM and SIGHUP to ``child``; ignore SIGINT (a terminal sends it to the child
    too). The previous handlers, to restore."""

    def forward(signum: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    previous: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, forward)
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    return previous
