"""Shared helpers for the engine tests: an engine at a known start, a one-call transaction
runner and views of the stored entries. Time is always an explicit ``now``."""

from __future__ import annotations

from typing import Any

from lockserver.engine import Engine, EngineLimits
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
    """The entries of a table's slot for one variable: a lone entry is stored as the Entry
    tuple itself, two or more as a list (a copy either way)."""
    if type(slot) is tuple:
        return [slot]
    assert type(slot) is list and len(slot) >= 2, slot  # never a list of fewer than two
    return list(slot)


def entries(engine: Engine, table: str, var: str, ns: str = NS) -> list[tuple[Any, ...]]:
    """The stored entry tuples of one variable (a copy; [] when none)."""
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
