"""``lockctl leader NAMESPACE NAME``: who leads an election (client.recipes.Election).

Read from the server's listings, like ``holders`` (no session is made, nothing is written):
the election's grant (table ``recipes.election``, the variable = the election's name; its
fence is the leader's term) and the value the leader proclaimed (``recipes.election.value``,
the leader session's entry). The same entries are in ``lockctl holders NAMESPACE
recipes.election``. Nobody leads: exit 3 (NOT_FOUND), so a script can branch on it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from client import LockClient, LockClientError, iso_utc
from client.recipes import ELECTION_TABLE, ELECTION_VALUE_TABLE

from ._common import Exit, Failure, failure_of

__all__ = ["add_leader_parser", "run_leader"]

Connect = Callable[[argparse.Namespace], LockClient]


def add_leader_parser(commands: Any) -> None:
    leader = commands.add_parser("leader", help="who leads an election: session, term, value")
    leader.add_argument("namespace", metavar="NAMESPACE")
    leader.add_argument("name", metavar="NAME", help="the election's name")


def _exact(page: Any, name: str) -> list[Any]:
    """The holders of exactly ``name`` (a listing's ``var`` is a prefix)."""
    return [h for h in page.holders if h.var == name]


def run_leader(args: argparse.Namespace, connect: Connect) -> int:
    name = args.name
    with connect(args) as client:
        try:
            grants = _exact(client.holders(args.namespace, ELECTION_TABLE, name), name)
            leader = grants[0] if grants else None
            value = None
            if leader is not None:
                values = client.holders(
                    args.namespace, ELECTION_VALUE_TABLE, name, session=leader.session
                )
                found = _exact(values, name)
                value = found[0].value if found else None
        except LockClientError as exc:
            raise failure_of(exc) from None
        except ValueError as exc:
            raise Failure(Exit.USAGE, str(exc)) from None
    where = f"{args.namespace}/{name}"
    if leader is None:
        if args.json:
            print(json.dumps({"namespace": args.namespace, "election": name, "leader": None}))
        raise Failure(Exit.NOT_FOUND, f"nobody leads {where}")
    record = {
        "namespace": args.namespace,
        "election": name,
        "leader": {
            "session": leader.session,
            "description": leader.session_description or leader.description,
            "term": leader.fence,
            "since": None if leader.acquired_at is None else iso_utc(leader.acquired_at),
            "value": value,
        },
    }
    if args.json:
        print(json.dumps(record, indent=2, ensure_ascii=False, default=repr), flush=True)
    else:
        who = record["leader"]
        print(
            f"{where}: led by session {who['session']}"
            + (f" ({who['description']!r})" if who["description"] else "")
            + f", term {who['term']}"
            + (f", since {who['since']}" if who["since"] else "")
            + f", value {value!r}",
            flush=True,
        )
    return Exit.OK
