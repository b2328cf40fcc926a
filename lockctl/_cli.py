"""The ``lockctl`` command line: global options, the commands, and the one way errors become
a single line on stderr and a documented exit status (docs/operations.md#lockctl).

Rules kept:
- Every failure prints ONE line, ``lockctl: error: ...``, never a usage block or a traceback,
  and exits with the status of :class:`Exit` that names its kind (scripts branch on it).
- ``--json`` prints machine-readable JSON on stdout: a list of objects for commands that
  report on servers or list things, an object for a single action. Times in JSON are UTC,
  ISO 8601; the human output says them the same way.
- ``--server`` takes what ``LockClient(servers=...)`` takes (``host:port``, a range, a comma
  list): with several servers, ``status`` reports each and ``kill`` asks each.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from client import LockClient, LockClientError

from ._common import Exit, Failure, Parser, failure_of, positive, status_record
from ._format import table
from ._inspect import COMMANDS as INSPECT_COMMANDS
from ._inspect import add_parsers as add_inspect_parsers
from ._leader import add_leader_parser, run_leader
from ._lock import add_lock_parser, run_lock

__all__ = ["main"]

DEFAULT_SERVER = "127.0.0.1:7400"


def build_parser() -> Parser:
    parser = Parser(
        prog="lockctl",
        description="Inspect and operate a lockserver (docs/operations.md#lockctl).",
    )
    parser.add_argument(
        "--server",
        default=os.environ.get("LOCKSERVER_ADDRESS") or DEFAULT_SERVER,
        help="HOST:PORT, a range HOST:7400-7403, or a comma list "
        "(default: $LOCKSERVER_ADDRESS, else 127.0.0.1:7400)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("LOCKSERVER_TOKEN") or None,
        help="the token the server asks for (default: $LOCKSERVER_TOKEN)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--call-timeout",
        type=positive,
        default=10.0,
        metavar="S",
        help="bound on each call to the server (default 10 s)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    commands.add_parser("status", help="uptime, trust, NORM, connections, sessions, entries")
    kill = commands.add_parser("kill", help="end a session: every entry it holds goes at once")
    kill.add_argument("session_id", metavar="SESSION_ID")
    add_inspect_parsers(commands)
    add_lock_parser(commands)
    add_leader_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``lockctl`` (``argv`` defaults to ``sys.argv[1:]``); the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    command_argv: list[str] = []
    if "--" in args_list:  # lockctl lock ... -- COMMAND ARGS: the command is taken as is
        split = args_list.index("--")
        args_list, command_argv = args_list[:split], args_list[split + 1 :]
    try:
        args = build_parser().parse_args(args_list)
        args.argv = command_argv
        if command_argv and args.command != "lock":
            raise Failure(Exit.USAGE, f"{args.command}: unexpected arguments after --")
        command: Callable[[argparse.Namespace], int] = COMMANDS[args.command]
        return command(args)
    except Failure as failure:
        return report(failure)
    except KeyboardInterrupt:
        print("lockctl: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line (LOCKCTL_DEBUG=1 shows the traceback)
        if os.environ.get("LOCKCTL_DEBUG"):
            raise
        return report(Failure(Exit.ERROR, f"internal error: {type(exc).__name__}: {exc}"))


def report(failure: Failure) -> int:
    print(f"lockctl: error: {failure}", file=sys.stderr)
    return int(failure.status)


def connect(args: argparse.Namespace) -> LockClient:
    """The client of ``--server`` (several servers: connected lazily)."""
    try:
        return LockClient(
            servers=args.server,
            token=args.token,
            timeout=args.call_timeout,
            connect_timeout=min(args.call_timeout, 5.0),
            client_name="lockctl",
        )
    except ValueError as exc:
        raise Failure(Exit.USAGE, f"--server: {exc}") from None
    except LockClientError as exc:
        raise failure_of(exc) from None


def emit(args: argparse.Namespace, data: Any, human: str) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else human, flush=True)


# --- commands -------------------------------------------------------------------------------------


def status(args: argparse.Namespace) -> int:
    with connect(args) as client:
        records = []
        for server in client.servers:
            try:
                stats = client.shard(server).statistics()
            except LockClientError as exc:
                raise failure_of(exc) from None
            records.append(status_record(server, stats))
    rows = [
        {
            **r,
            "uptime": _duration(r["uptime_seconds"]),
            "trust": f"{r['trust']:.3f}",
            "norm": f"{r['norm']:.3f}",
            "transactions_per_second": f"{r['transactions_per_second']:.1f}",
            "group": r["replication"]["group"] if "replication" in r else "-",
            "revision": r["replication"]["revision"] if "replication" in r else "-",
        }
        for r in records
    ]
    columns = [
        ("server", "SERVER"),
        ("uptime", "UPTIME"),
        ("trust", "TRUST"),
        ("norm", "NORM"),
        ("connections", "CONNS"),
        ("sessions", "SESSIONS"),
        ("entries", "ENTRIES"),
        ("waiters", "WAITERS"),
        ("transactions_per_second", "TX/S"),
    ]
    if any("replication" in r for r in records):  # replicas: their group and applied revision
        columns += [("group", "GROUP"), ("revision", "REVISION")]
    human = table(rows, columns)
    emit(args, records, human)
    return Exit.OK


def kill(args: argparse.Namespace) -> int:
    with connect(args) as client:
        try:
            existed = client.end_session(args.session_id)
        except LockClientError as exc:
            raise failure_of(exc) from None
    if not existed:
        raise Failure(Exit.NOT_FOUND, f"session {args.session_id} not found")
    emit(args, {"session": args.session_id, "ended": True}, f"session {args.session_id} ended")
    return Exit.OK


def _duration(seconds: float) -> str:
    """``3d04h`` / ``2h05m`` / ``4m07s`` / ``12.3s``."""
    s = int(seconds)
    if s >= 86_400:
        return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{seconds:.1f}s"


def _lock(args: argparse.Namespace) -> int:
    return run_lock(args, connect)


def _given_connect(
    run: Callable[[argparse.Namespace, Callable[[argparse.Namespace], LockClient]], int],
) -> Callable[[argparse.Namespace], int]:
    def command(args: argparse.Namespace) -> int:
        return run(args, connect)

    return command


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "status": status,
    "kill": kill,
    "lock": _lock,
    "leader": _given_connect(run_leader),
    **{name: _given_connect(run) for name, run in INSPECT_COMMANDS.items()},
}
