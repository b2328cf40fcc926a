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


def entries(engine: Engine, table: str, var: str, ns: str = NS) -> list[tuple[Any, ...]]:
    """The stored entry tuples of one variable (a copy; [] when none)."""
    return list(engine.namespaces.get(ns, {}).get(table, {}).get(var, []))


def holders(engine: Engine, table: str, var: str, ns: str = NS) -> list[tuple[str, Any]]:
    """(owner, value) of each stored entry of a variable, in order."""
    return [(e[0], e[1]) for e in entries(engine, table, var, ns)]


def dump(engine: Engine) -> dict[tuple[str, str, str], list[tuple[Any, ...]]]:
    """Every stored variable as (namespace, table, var) -> list of entry tuples."""
    return {
        (ns, table, var): list(es)
        for ns, tables in engine.namespaces.items()
        for table, vars_ in tables.items()
        for var, es in vars_.items()
    }


def session_keys(engine: Engine, session_id: str) -> set[tuple[str, str, str]]:
    """The (namespace, table, var) keys the engine records for a session."""
    return set(engine.sessions[session_id].keys)
