"""lockctl's inspection and action commands over the server's listings: ``holders``,
``waiters``, ``sessions``, ``session ID``, ``release``, ``watch`` and ``top``.

Rules kept:
- A listing pages through the server (pages of 100 records, each a small, bounded piece of
  server work) and stops after ``--max`` records (1,000 by default; 0: all), saying so on
  stderr when more were left.
- Human output: aligned tables, times UTC (``HH:MM:SS`` today, else the date too; exact ISO
  8601 in ``--json``), a session id shortened to 12 characters (``--json`` has it whole).
- ``watch`` prints one line per feed event until Ctrl-C (exit 0). After a reconnect (the
  client subscribes again by itself) it says on stderr that events in between were not seen;
  events the server had to drop are reported the same way.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from client import LockClient, LockClientError, iso_utc, record_json

from ._common import Exit, Failure, failure_of, positive, status_record
from ._format import table

__all__ = ["COMMANDS", "add_parsers"]

Connect = Callable[[argparse.Namespace], LockClient]

# Records asked per page: the server's default page. A page is one piece of server work that
# other clients wait behind; at 1M held, measured: pages of 100 stall another client's ping by
# at most ~5 ms, pages of 1,000 (the protocol's maximum) by ~10-15 ms (benchmarks/README.md).
PAGE = 100
TOP_SCAN = 5000  # holders and waiters ``top`` looks at per refresh


def add_parsers(commands: Any) -> None:
    def listing(name: str, help_text: str) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text)
        parser.add_argument(
            "--max",
            type=int,
            default=1000,
            metavar="N",
            help="print at most N records (default 1000; 0: all)",
        )
        return parser

    holders = listing("holders", "the entries held (who holds what, since when)")
    holders.add_argument("namespace", metavar="NAMESPACE")
    holders.add_argument("table", metavar="TABLE", nargs="?", help="a table name prefix")
    holders.add_argument("var", metavar="VAR", nargs="?", help="a variable name prefix")
    holders.add_argument("--session", metavar="ID", help="only this session's entries")
    waiters = listing("waiters", "the parked transactions and their places in the queues")
    waiters.add_argument("namespace", metavar="NAMESPACE", nargs="?")
    sessions = listing("sessions", "the sessions")
    sessions.add_argument("--match", metavar="TEXT", help="a substring of the description")
    session = commands.add_parser("session", help="one session: its record, entries, waiters")
    session.add_argument("session_id", metavar="ID")
    release = commands.add_parser(
        "release", help="force-release a variable (admin): its holders lose it, waiters run"
    )
    release.add_argument("namespace", metavar="NAMESPACE")
    release.add_argument("table", metavar="TABLE")
    release.add_argument("var", metavar="VAR")
    release.add_argument("--session", metavar="ID", help="only this session's entry")
    watch = commands.add_parser("watch", help="one line per change in a namespace, live")
    watch.add_argument("namespace", metavar="NAMESPACE")
    watch.add_argument("table", metavar="TABLE", nargs="?")
    top = commands.add_parser("top", help="a live view: load, trust, busiest tables, waits")
    top.add_argument("--interval", type=positive, default=2.0, metavar="S")
    top.add_argument("--once", action="store_true", help="print one view and exit")


# --- helpers --------------------------------------------------------------------------------------


def _when(seconds: float | None) -> str:
    if seconds is None:
        return ""
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    if moment.date() == datetime.datetime.now(datetime.UTC).date():
        return moment.strftime("%H:%M:%S")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _short(session_id: str) -> str:
    return session_id if len(session_id) <= 12 else session_id[:11] + "\u2026"


def _records(fetch: Callable[[str | None], Any], field: str, most: int) -> tuple[list[Any], bool]:
    """Up to ``most`` records (0: all) over the pages ``fetch(cursor)`` returns; whether
    more were left."""
    out: list[Any] = []
    cursor: str | None = None
    while True:
        page = fetch(cursor)
        out.extend(getattr(page, field))
        cursor = page.cursor
        if most and len(out) > most:
            return out[:most], True
        if cursor is None:
            return out, False
        if most and len(out) == most:
            return out, True  # a page may follow (or be empty): say so


def _listing(
    args: argparse.Namespace, records: list[Any], more: bool, columns: list[tuple[str, str]],
    row: Callable[[Any], dict[str, Any]],
) -> int:  # fmt: skip
    if args.json:
        print(json.dumps([record_json(r) for r in records], indent=2, ensure_ascii=False))
    else:
        print(table([row(r) for r in records], columns))
    if more:
        print(f"lockctl: more records left (printed {len(records)}; --max 0 for all)",
              file=sys.stderr)  # fmt: skip
    return Exit.OK


def _call(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except LockClientError as exc:
        raise failure_of(exc) from None
    except ValueError as exc:
        raise Failure(Exit.USAGE, str(exc)) from None


HOLDER_COLUMNS = [
    ("namespace", "NAMESPACE"), ("table", "TABLE"), ("var", "VAR"), ("session", "SESSION"),
    ("who", "DESCRIPTION"), ("since", "SINCE"), ("expires", "EXPIRES"), ("fence", "FENCE"),
]  # fmt: skip


def _holder_row(h: Any) -> dict[str, Any]:
    return {
        "namespace": h.namespace, "table": h.table, "var": h.var, "session": _short(h.session),
        "who": h.session_description, "since": _when(h.acquired_at),
        "expires": _when(h.expires_at), "fence": h.fence,
    }  # fmt: skip


WAITER_COLUMNS = [
    ("session", "SESSION"), ("namespace", "NAMESPACE"), ("waits", "WAITS FOR (#PLACE)"),
    ("since", "SINCE"), ("deadline", "DEADLINE"), ("description", "DESCRIPTION"),
]  # fmt: skip


def _waiter_row(w: Any) -> dict[str, Any]:
    waits = ", ".join(f"{t}/{v}#{pos + 1}" for t, v, pos in w.variables)  # #1: first in line
    return {
        "session": _short(w.session), "namespace": w.namespace, "waits": waits,
        "since": _when(w.since), "deadline": _when(w.deadline), "description": w.description,
    }  # fmt: skip


SESSION_COLUMNS = [
    ("session", "SESSION"), ("description", "DESCRIPTION"), ("principal", "PRINCIPAL"),
    ("clients", "CLIENTS"), ("created", "CREATED"), ("last_touch", "LAST TOUCH"),
    ("valid_until", "VALID UNTIL"), ("entries", "ENTRIES"), ("waiters", "WAITERS"),
]  # fmt: skip


def _session_row(s: Any) -> dict[str, Any]:
    return {
        "session": _short(s.session), "description": s.description, "principal": s.principal,
        "clients": ",".join(s.clients), "created": _when(s.created),
        "last_touch": _when(s.last_touch), "valid_until": _when(s.valid_until),
        "entries": s.entries, "waiters": s.waiters,
    }  # fmt: skip


# --- commands -------------------------------------------------------------------------------------


def holders(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args) as client:
        records, more = _call(
            lambda: _records(
                lambda c: client.holders(
                    args.namespace, args.table, args.var, session=args.session, cursor=c,
                    limit=PAGE,
                ),
                "holders",
                args.max,
            )
        )  # fmt: skip
    return _listing(args, records, more, HOLDER_COLUMNS, _holder_row)


def waiters(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args) as client:
        records, more = _call(
            lambda: _records(
                lambda c: client.waiters(args.namespace, cursor=c, limit=PAGE), "waiters", args.max
            )
        )
    return _listing(args, records, more, WAITER_COLUMNS, _waiter_row)


def sessions(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args) as client:
        records, more = _call(
            lambda: _records(
                lambda c: client.sessions(match=args.match, cursor=c, limit=PAGE),
                "sessions",
                args.max,
            )
        )
    return _listing(args, records, more, SESSION_COLUMNS, _session_row)


def session(args: argparse.Namespace, connect: Connect) -> int:
    sid = args.session_id
    with connect(args) as client:
        found, _ = _call(
            lambda: _records(lambda c: client.sessions(session=sid, cursor=c), "sessions", 0)
        )
        if not found:
            raise Failure(Exit.NOT_FOUND, f"session {sid} not found")
        held, _ = _call(
            lambda: _records(lambda c: client.holders(session=sid, cursor=c, limit=PAGE),
                             "holders", 0)
        )  # fmt: skip
        parked, _ = _call(
            lambda: _records(lambda c: client.waiters(session=sid, cursor=c, limit=PAGE),
                             "waiters", 0)
        )  # fmt: skip
    if args.json:
        out = {
            "sessions": [record_json(s) for s in found],  # one per server it lives on
            "holders": [record_json(h) for h in held],
            "waiters": [record_json(w) for w in parked],
        }
        print(json.dumps(out, indent=2, ensure_ascii=False))
        return Exit.OK
    print(table([_session_row(s) for s in found], SESSION_COLUMNS))
    print(f"\nentries ({len(held)}):")
    print(table([_holder_row(h) for h in held], HOLDER_COLUMNS))
    print(f"\nwaiting ({len(parked)}):")
    print(table([_waiter_row(w) for w in parked], WAITER_COLUMNS))
    return Exit.OK


def release(args: argparse.Namespace, connect: Connect) -> int:
    what = f"{args.namespace}/{args.table}/{args.var}"
    with connect(args) as client:
        done = _call(
            lambda: client.release(args.namespace, args.table, args.var, session=args.session)
        )
    if done.entries == 0:
        whose = f" of session {args.session}" if args.session else ""
        raise Failure(Exit.NOT_FOUND, f"no entry{whose} holds {what}")
    out = {"released": what, "entries": done.entries, "fence": done.fence}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"released {what}: {done.entries} entr{'y' if done.entries == 1 else 'ies'}, "
              f"fence {done.fence}")  # fmt: skip
    return Exit.OK


def _event_line(event: Any) -> str:
    reason = f" ({event.reason})" if event.reason else ""
    return (
        f"{iso_utc(event.at)} {event.kind}{reason} {event.namespace}/{event.table}/{event.var} "
        f"session {_short(event.session)} fence {event.fence}"
    )


def watch(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args) as client:
        _call(lambda: client.subscribe(args.namespace, args.table))
        connections = client.local_statistics().connections
        try:
            while True:
                _call(lambda: client.process_events(0.5))
                now_connections = client.local_statistics().connections
                if now_connections != connections:
                    connections = now_connections
                    print("lockctl: reconnected; events in between were not seen",
                          file=sys.stderr, flush=True)  # fmt: skip
                for event in client.feed_events():
                    if event.dropped:
                        print(f"lockctl: the server dropped {event.dropped} event(s) here",
                              file=sys.stderr)  # fmt: skip
                    line = json.dumps(record_json(event)) if args.json else _event_line(event)
                    print(line, flush=True)
                _call(client.ping)  # notices a lost connection (and reconnects) while quiet
        except KeyboardInterrupt:
            return Exit.OK


def top(args: argparse.Namespace, connect: Connect) -> int:
    with connect(args) as client:
        while True:
            stats = [status_record(s, _call(client.shard(s).statistics)) for s in client.servers]
            scanned, _ = _call(
                lambda: _records(lambda c: client.holders(cursor=c, limit=PAGE), "holders",
                                 TOP_SCAN)
            )  # fmt: skip
            parked, _ = _call(
                lambda: _records(lambda c: client.waiters(cursor=c, limit=PAGE), "waiters",
                                 TOP_SCAN)
            )  # fmt: skip
            view = _top_view(stats, scanned, parked)
            if args.once:
                print(view)
                return Exit.OK
            print("\x1b[2J\x1b[H" + view, flush=True)
            time.sleep(args.interval)


def _top_view(stats: list[dict[str, Any]], scanned: list[Any], parked: list[Any]) -> str:
    now = time.time()
    lines = [f"lockctl top  {iso_utc(now)}", ""]
    lines.append(table(
        [{**r, "trust": f"{r['trust']:.3f}", "norm": f"{r['norm']:.3f}",
          "rate": f"{r['transactions_per_second']:.1f}"} for r in stats],
        [("server", "SERVER"), ("rate", "TX/S"), ("trust", "TRUST"), ("norm", "NORM"),
         ("connections", "CONNS"), ("sessions", "SESSIONS"), ("entries", "ENTRIES"),
         ("waiters", "WAITERS")],
    ))  # fmt: skip
    busiest = Counter((h.namespace, h.table) for h in scanned).most_common(10)
    lines += ["", f"busiest tables (entries, among the first {len(scanned)} held):"]
    lines.append(table([{"table": f"{ns}/{t}", "entries": n} for (ns, t), n in busiest],
                       [("table", "TABLE"), ("entries", "ENTRIES")]))  # fmt: skip
    longest = sorted(parked, key=lambda w: w.since)[:10]
    lines += ["", "longest waits:"]
    lines.append(table(
        [{"waited": f"{now - w.since:.1f}s", **_waiter_row(w)} for w in longest],
        [("waited", "WAITED"), *WAITER_COLUMNS[:3]],
    ))  # fmt: skip
    return "\n".join(lines)


COMMANDS: dict[str, Callable[[argparse.Namespace, Connect], int]] = {
    "holders": holders,
    "waiters": waiters,
    "sessions": sessions,
    "session": session,
    "release": release,
    "watch": watch,
    "top": top,
}
