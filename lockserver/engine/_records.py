"""The engine's limits and statistics records: frozen attrs value classes.

They live apart from the modules that use them because those may be compiled with mypyc
(lockserver/_build.py), and a compiled class body cannot hold attrs fields with defaults and
validators; this module is never compiled, so they are the same classes in both builds.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import attrs

from protocol import SessionsPage

__all__ = [
    "CoreStatistics",
    "EngineLimits",
    "EngineStatistics",
    "SessionsListing",
    "VisibleCounts",
    "WaitLimits",
    "WaitStatistics",
]


def _at_least_one(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be an integer >= 1, got {value!r}")


@attrs.frozen
class EngineLimits:
    """Bounds that protect the server's memory; each refusal is an EngineError."""

    max_sessions: int = attrs.field(default=1_000_000, validator=_at_least_one)
    max_entries: int = attrs.field(default=10_000_000, validator=_at_least_one)
    max_entries_per_session: int = attrs.field(default=100_000, validator=_at_least_one)
    max_store_bytes: int = attrs.field(default=4 * 1024**3, validator=_at_least_one)


@attrs.frozen
class EngineStatistics:
    """A snapshot of the engine's figures."""

    uptime: float
    namespaces: int
    tables: int
    entries: int
    sessions: int
    fence: int
    transactions: int
    # "TransactionOK" / "TransactionError:Statement" ... -> count
    by_outcome: dict[str, int]
    sessions_expired: int
    entries_expired: int
    retries_answered: int  # executes answered from a session's retry memory (tx_id repeats)
    stored_bytes: int  # what the store budget counts now (max_store_bytes)

    def to_wire(self) -> dict[str, Any]:
        """As a plain map for the statistics reply."""
        return attrs.asdict(self)


@attrs.frozen
class WaitLimits:
    """Bounds on parked transactions; past one, the request is refused with TOO_MANY_WAITERS."""

    max_waiters: int = attrs.field(default=100_000, validator=_at_least_one)
    max_waiters_per_session: int = attrs.field(default=1_000, validator=_at_least_one)
    max_waiters_per_owner: int = attrs.field(default=10_000, validator=_at_least_one)
    # Weights (ops + RUN_WEIGHT per parked transaction), see the module docstring.
    max_waiting_ops_per_variable: int = attrs.field(default=200_000, validator=_at_least_one)
    max_waiting_ops_per_session: int = attrs.field(default=100_000, validator=_at_least_one)
    max_waiting_ops_per_principal: int = attrs.field(default=10_000_000, validator=_at_least_one)


@attrs.frozen
class WaitStatistics:
    """Figures of the wait queue."""

    waiters: int
    parked_total: int
    granted_total: int
    timed_out_total: int
    cancelled_total: int
    reevaluations_total: int
    # upper bound (s) as str ("0.001", ..., "+inf") -> count of finished waits
    wait_time_histogram: dict[str, int]

    def to_wire(self) -> dict[str, Any]:
        """As a plain map for the statistics reply."""
        return attrs.asdict(self)


@attrs.frozen
class SessionsListing:
    """A sessions page as the door answers it: ``owners[i]`` are the owners (connections)
    that used ``page.sessions[i]``, whose addresses the shell fills in as its ``clients``."""

    page: SessionsPage
    owners: tuple[tuple[Hashable, ...], ...]


@attrs.frozen
class VisibleCounts:
    """What one principal may see of the lock state, counted (``LockCore.visible_counts``):
    the namespaces it may use that hold entries, their tables and entries, the transactions
    parked in them, and the live sessions it owns."""

    namespaces: int
    tables: int
    entries: int
    sessions: int
    waiters: int


@attrs.frozen
class CoreStatistics:
    """What the door counts: the engine's and the wait queue's figures, and the sessions
    with at least one owner to tell of a loss (``sessions_routed``)."""

    engine: EngineStatistics
    waiting: WaitStatistics
    sessions_routed: int
