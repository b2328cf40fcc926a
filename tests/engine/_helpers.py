"""Shared helpers for the engine tests: an engine at a known start, a one-call transaction
runner and views of the stored entries. Time is always an explicit ``now``."""

from __future__ import annotations

from typing import Any

from lockserver.engine import Engine, EngineLimits
from lockserver.engine._store import entry_fields
from protocol import SessionSpec, Statement, Transaction, TransactionResult

START = 1000.0  # the engine's started_at; uptimes in results are relative to it
NS = "Clinical"


def make_engine(*, limits: EngineLimits | None = None, **kwargs: Any) -> Engine:
    """An engine started at START on host "test-host"."""
    return Engine(started_at=START, host="test-host", limits=limits, **kwargs)


def spec(session: str | SessionSpec) -> SessionSpec:
    """A SessionSpec for an id (default max age), or the spec itself."""
    return session if isinstance(session, SessionSpec) else SessionSpec(session)


def run(
    engine: Engine,
    session: str | SessionSpec,
    *statements: Statement,
    now: float = START,
    ns: str = NS,
    trust: float = 1.0,
    **tx_fields: Any,
) -> TransactionResult:
    """Execute one transaction built from ``statements`` in ``session`` at ``now``."""
    tx = Transaction(ns, statements, **tx_fields)
    return engine.execute(spec(session), tx, now=now, trust=trust)


def slot_entries(slot: Any) -> list[tuple[Any, ...]]:
    """The entries of a table's slot for one variable, each with all its fields
    (``entry_fields``: (owner, value, description, tx_id, set_at, expires_at, fence)): a lone
    entry is stored as the Entry tuple itself, two or more as a list; every stored entry is
    checked to be trimmed (no optional field at its default at the end)."""
    if type(slot) is tuple:
        stored = [slot]
    else:
        assert type(slot) is list and len(slot) >= 2, slot  # never a list of fewer than two
        stored = slot
    for e in stored:
        assert_trimmed(e)
    return [entry_fields(e) for e in stored]


#: The default of each optional field of a stored entry, by index (_store.py "Entry").
_DEFAULTS = {3: None, 4: "", 5: None, 6: None}


def assert_trimmed(e: tuple[Any, ...]) -> None:
    """A stored entry has 3..7 fields and never ends with an optional field at its default."""
    assert type(e) is tuple and 3 <= len(e) <= 7, e
    last = len(e) - 1
    assert last < 3 or e[last] != _DEFAULTS[last], e


def entries(engine: Engine, table: str, var: str, ns: str = NS) -> list[tuple[Any, ...]]:
    """The entries of one variable, all fields each (``slot_entries``; [] when none)."""
    slot = engine.namespaces.get(ns, {}).get(table, {}).get(var)
    return [] if slot is None else slot_entries(slot)


def holders(engine: Engine, table: str, var: str, ns: str = NS) -> list[tuple[str, Any]]:
    """(owner, value) of each stored entry of a variable, in order."""
    return [(e[0], e[1]) for e in entries(engine, table, var, ns)]


def dump(engine: Engine) -> dict[tuple[str, str, str], list[tuple[Any, ...]]]:
    """Every stored variable as (namespace, table, var) -> list of entry tuples."""
    return {
        (ns, table, var): slot_entries(slot)
        for ns, tables in engine.namespaces.items()
        for table, vars_ in tables.items()
        for var, slot in vars_.items()
    }


def session_keys(engine: Engine, session_id: str) -> set[tuple[str, str, str]]:
    """The (namespace, table, var) keys the engine records for a session (it keeps them
    grouped by (namespace, table), with no empty group, and counts them in ``held``)."""
    s = engine.sessions[session_id]
    keys = [(ns, table, var) for (ns, table), group in s.keys.items() for var in group]
    assert all(s.keys.values()), "an empty group was left behind"
    assert s.held == len(keys)
    return set(keys)
