"""What every lockctl command shares: the exit statuses, the one-line failure, the parser
that reports usage errors as such, and how a client error becomes a failure."""

from __future__ import annotations

import argparse
import enum
import time
from typing import Any, NoReturn

from client import AccessDenied, ErrorCode, LockClientError, ServerUnavailable, iso_utc

__all__ = ["Exit", "Failure", "Parser", "failure_of", "positive", "status_record"]


class Exit(enum.IntEnum):
    """lockctl's exit statuses (``lockctl lock`` passes its child's status through instead of
    OK, and uses NOT_OBTAINED and LOST for its own outcomes)."""

    OK = 0
    ERROR = 1  # the server refused the request, or anything not listed below
    USAGE = 2  # a bad command line
    NOT_FOUND = 3  # the session (or lock) named does not exist
    UNAVAILABLE = 69  # the server cannot be reached (sysexits EX_UNAVAILABLE)
    NOT_OBTAINED = 75  # lock: not obtained within --timeout (sysexits EX_TEMPFAIL)
    LOST = 76  # lock: lost while the command ran (the command was terminated)
    DENIED = 77  # unauthorized or forbidden (sysexits EX_NOPERM)


class Failure(Exception):
    """A failure to report as one line, with its exit status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Parser(argparse.ArgumentParser):
    """argparse that raises a usage Failure instead of printing the usage block."""

    def error(self, message: str) -> NoReturn:
        raise Failure(Exit.USAGE, message)


def positive(text: str) -> float:
    """A finite number of seconds > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def failure_of(exc: LockClientError) -> Failure:
    """The one-line failure of a client error: unreachable, denied, or refused."""
    if isinstance(exc, ServerUnavailable):
        return Failure(Exit.UNAVAILABLE, f"server unreachable: {exc}")
    if isinstance(exc, AccessDenied):
        what = "unauthorized" if exc.code is ErrorCode.UNAUTHORIZED else "forbidden"
        return Failure(Exit.DENIED, f"{what}: {exc.message}")
    return Failure(Exit.ERROR, str(exc))


def status_record(server: str, stats: dict[str, Any]) -> dict[str, Any]:
    """One server's status from its statistics (PROTOCOL.md ``stats``)."""
    engine, trust = stats["engine"], stats["trust"]
    uptime = float(stats["server"]["uptime"])
    return {
        "server": server,
        "version": stats["server"]["version"],
        "host": stats["server"]["host"],
        "uptime_seconds": round(uptime, 3),
        "started_at": iso_utc(time.time() - uptime),
        "trust": trust["trust"],
        "norm": trust["norm"],
        "connections": stats["server"]["connections"],
        "sessions": engine["sessions"],
        "entries": engine["entries"],
        "tables": engine["tables"],
        "waiters": stats["waiting"]["waiters"],
        "transactions_per_second": trust["rate"],
        "transactions_total": engine["transactions"],
        **_replication(stats),
    }


def _replication(stats: dict[str, Any]) -> dict[str, Any]:
    """A replica's place in its group (statistics ``replication``): nothing for a server
    that is not a replica."""
    repl = stats.get("replication")
    if not isinstance(repl, dict):
        return {}
    return {
        "replication": {
            "group": repl["group"],
            "replica": repl["replica"],
            "replicas": sorted(set(repl["replicas"].values())),
            "revision": repl["revision"],
            # issue 29 (older servers say nothing of it: None)
            "authenticated": repl.get("authenticated"),
            "halted": repl.get("halted"),
            "rejected_entries": repl.get("rejected_entries"),
            "clamped_stamps": repl.get("clamped_stamps"),
        }
    }
