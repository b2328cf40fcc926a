"""The lock kinds: which entries each recipe writes, and the one transaction that takes them.

Why: every recipe is acquired and released **atomically in one transaction** — the server
checks and takes (or gives back) everything in one serializable step, so there is no
client-side read-modify-write and no window between "is it free?" and "take it". This module
builds those transactions; it is shared, unchanged, by the sync and the async face.

Tables (in the caller's namespace; the variable is the lock's name):

| table | entries |
|---|---|
| ``recipes.mutex`` | one, exclusive; value = the holder's ticket |
| ``recipes.rw.read``, ``recipes.rw.write`` | one per holding session; value = ticket (stamp) |
| ``recipes.permits.read``, ``recipes.permits.write`` | the configured permit count, one entry |
| ``recipes.semaphore`` | one per holding session; value = ticket |
| ``recipes.window`` | one, exclusive, expiring at the end of its period window |
| ``recipes.task.claim`` | one, exclusive: the worker's claim (``in_progress``) |
| ``recipes.task.state`` | one per session that finished the task; value = final state |

Rules of the data model the recipes live with (SEMANTICS.md): a session holds at most one
entry per variable, so one session holds at most one read entry (or one semaphore permit) of
a given lock. A guard ``If(DeleteVar(table, var), Abort())`` — "abort if I already have an
entry here" (the delete is rolled back with the abort) — makes a second holder in the same
session wait instead of silently sharing the first one's entry.

Read/write locks (``ReadLock``, ``WriteLock``, ``LockSet``) share their tables, so a
``ReadWriteLock`` and a ``MultiLock`` set of the same name exclude each other, and permits
apply to both. **Writer preference**: a transaction that only reads also asserts
``Not(Waiting(write_table, name))`` — it gives way to a writer parked on the server. A set
that writes anything does not give way on its reads: if two parked sets each waited for the
other's writes, neither would ever run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from client._result import Result
from protocol import (
    Abort,
    Assert,
    CountBelow,
    DeleteVar,
    Exists,
    If,
    Not,
    SelectVarValue,
    SetVar,
    Statement,
    Waiting,
)

from ._base import OnLost, RecipeCore, S, check_name, seconds

__all__ = [
    "CLAIM_TABLE",
    "DONE",
    "FAILED",
    "FINAL_STATES",
    "IN_PROGRESS",
    "MUTEX_TABLE",
    "PERMITS_TABLES",
    "READ",
    "READ_TABLE",
    "SEMAPHORE_TABLE",
    "STATE_TABLE",
    "UNLIMITED",
    "WINDOW_TABLE",
    "WRITE",
    "WRITE_TABLE",
    "LockSetKind",
    "MutexKind",
    "ReadKind",
    "SemaphoreKind",
    "WriteKind",
    "clear_permits_statements",
    "get_permits_statements",
    "lock_modes",
    "set_permits_statements",
]

MUTEX_TABLE = "recipes.mutex"
READ_TABLE = "recipes.rw.read"
WRITE_TABLE = "recipes.rw.write"
SEMAPHORE_TABLE = "recipes.semaphore"
WINDOW_TABLE = "recipes.window"
CLAIM_TABLE = "recipes.task.claim"
STATE_TABLE = "recipes.task.state"

READ = "r"
WRITE = "w"
_MODE_TABLE = {READ: READ_TABLE, WRITE: WRITE_TABLE}
PERMITS_TABLES = {READ: "recipes.permits.read", WRITE: "recipes.permits.write"}
#: "No limit" for CountBelow (the largest limit the wire carries).
UNLIMITED = 2**64 - 1
#: Default permits per mode: one writer, any number of readers (while no writer holds).
DEFAULT_PERMITS = {READ: UNLIMITED, WRITE: 1}

DONE = "done"
FAILED = "failed"
IN_PROGRESS = "in_progress"
FINAL_STATES = frozenset({DONE, FAILED})


def _not_mine(table: str, var: str) -> Statement:
    """Abort when this session already has an entry of ``table``/``var`` (the DeleteVar that
    detects it is rolled back with the abort)."""
    return If(DeleteVar(table, var), Abort())


def lock_modes(locks: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Validate ``{name: "r" | "w"}`` and return it as sorted (name, mode) pairs."""
    items = list(locks.items()) if isinstance(locks, Mapping) else list(locks)
    if not items:
        raise ValueError("a lock set needs at least one lock")
    seen: dict[str, str] = {}
    for name, mode in items:
        check_name("lock name", name)
        if mode not in (READ, WRITE):
            raise ValueError(f"lock {name!r}: mode must be 'r' or 'w', got {mode!r}")
        if name in seen:
            raise ValueError(f"lock {name!r} appears twice")
        seen[name] = mode
    return tuple(sorted(seen.items()))


def _rw_statements(
    modes: Sequence[tuple[str, str]], stamp: str, description: str | None
) -> list[Statement]:
    """Take every (name, mode) of a set at once, or nothing (see the module docstring)."""
    only_reads = all(mode == READ for _, mode in modes)
    out: list[Statement] = []
    for name, mode in modes:
        if mode == WRITE:
            out += [
                _not_mine(WRITE_TABLE, name),
                Assert(Not(Exists(READ_TABLE, name, ignore_this_session=False))),
                Assert(
                    CountBelow(
                        WRITE_TABLE,
                        name,
                        DEFAULT_PERMITS[WRITE],
                        limit_table=PERMITS_TABLES[WRITE],
                        limit_var=name,
                    )
                ),
                Assert(
                    SetVar(WRITE_TABLE, name, stamp, description=description, allow_duplicates=True)
                ),
            ]
        else:
            out += [
                _not_mine(READ_TABLE, name),
                Assert(Not(Exists(WRITE_TABLE, name, ignore_this_session=False))),
            ]
            if only_reads:
                out.append(Assert(Not(Waiting(WRITE_TABLE, name))))
            out += [
                Assert(
                    CountBelow(
                        READ_TABLE,
                        name,
                        DEFAULT_PERMITS[READ],
                        limit_table=PERMITS_TABLES[READ],
                        limit_var=name,
                    )
                ),
                Assert(
                    SetVar(READ_TABLE, name, stamp, description=description, allow_duplicates=True)
                ),
            ]
    return out


class _KindInit(RecipeCore[S]):
    """The common constructor arguments, spelled out once for the kinds."""

    def _init(
        self,
        session: S,
        namespace: str,
        name: str,
        on_lost: OnLost | None,
        min_uptime: float,
        min_trust: float,
        description: str,
    ) -> None:
        RecipeCore.__init__(
            self,
            session,
            namespace,
            name,
            on_lost=on_lost,
            min_uptime=min_uptime,
            min_trust=min_trust,
            description=description,
        )

    @property
    def _desc(self) -> str | None:
        return self.description or None


class MutexKind(_KindInit[S]):
    """An exclusive lock with the holder's ticket as its value, an optional time to live, and
    ``acquired_at`` / ``expires_at`` (wall-clock times of the grant and its TTL's end)."""

    KIND = "mutex"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        ttl: float | None = None,
        ticket: str | None = None,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self.ttl = None if ttl is None else seconds("ttl", ttl, positive=True)
        if ticket is not None:
            check_name("ticket", ticket)
        self._fixed_ticket = ticket
        self._acquired_at: float | None = None
        self._expires_at: float | None = None

    @property
    def acquired_at(self) -> float | None:
        """When the current grant was made: wall-clock Unix seconds (UTC), the server's clock
        (its wall clock at start plus its uptime then). None when not held, or when the
        server does not send its start time. For safety arithmetic use ``valid_for()``,
        which compares no clocks."""
        return self._wall_clock(self._acquired_at)

    @property
    def expires_at(self) -> float | None:
        """When the grant's TTL ends, wall-clock Unix seconds (UTC) like ``acquired_at``
        (None without a TTL)."""
        return self._wall_clock(self._expires_at)

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((MUTEX_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return [
            Assert(SetVar(MUTEX_TABLE, self.name, ticket, description=self._desc, ttl=self.ttl)),
            SelectVarValue("grant", MUTEX_TABLE, self.name, ignore_this_session=False),
        ]

    def _on_grant(self, result: Result) -> float | None:
        record = result.get("grant")
        if not isinstance(record, dict):  # pragma: no cover - the grant selects its entry
            return None
        self._acquired_at = record.get("set_at")
        self._expires_at = record.get("expires_at")
        return self._expires_at

    def _on_release(self) -> None:
        self._acquired_at = None
        self._expires_at = None


class ReadKind(_KindInit[S]):
    """The shared side of a read/write lock: many readers while no writer holds **or waits**
    (writer preference), at most the configured read permits."""

    KIND = "read lock"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((READ_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return _rw_statements(((self.name, READ),), ticket, self._desc)


class WriteKind(_KindInit[S]):
    """The exclusive side of a read/write lock: no readers, fewer writers than the write
    permits (default 1)."""

    KIND = "write lock"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((WRITE_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return _rw_statements(((self.name, WRITE),), ticket, self._desc)


class LockSetKind(_KindInit[S]):
    """A set of read/write locks taken all or nothing; the stamp is the entries' value."""

    KIND = "lock set"

    def __init__(
        self,
        session: S,
        namespace: str,
        locks: Mapping[str, str] | Iterable[tuple[str, str]],
        *,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        self.modes = lock_modes(locks)
        name = ",".join(f"{n}:{m}" for n, m in self.modes)
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self._vars = tuple((_MODE_TABLE[m], n) for n, m in self.modes)

    @property
    def locks(self) -> dict[str, str]:
        """The set as ``{name: "r" | "w"}``."""
        return dict(self.modes)

    @property
    def stamp(self) -> str | None:
        """The stamp of the current grant (the value of all its entries), None when not
        held."""
        return self.ticket

    def _variables(self) -> Sequence[tuple[str, str]]:
        return self._vars

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        return _rw_statements(self.modes, ticket, self._desc)


class SemaphoreKind(_KindInit[S]):
    """At most ``permits`` holders at once (one permit per session)."""

    KIND = "semaphore"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        permits: int,
        on_lost: OnLost | None = None,
        min_uptime: float = 0.0,
        min_trust: float = 0.0,
        description: str = "",
    ) -> None:
        if type(permits) is not int or not 1 <= permits < UNLIMITED:
            raise ValueError(f"permits must be an integer >= 1, got {permits!r}")
        self._init(session, namespace, name, on_lost, min_uptime, min_trust, description)
        self.permits = permits

    def _variables(self) -> Sequence[tuple[str, str]]:
        return ((SEMAPHORE_TABLE, self.name),)

    def _acquire_statements(self, ticket: str) -> list[Statement]:
        name = self.name
        return [
            _not_mine(SEMAPHORE_TABLE, name),
            Assert(CountBelow(SEMAPHORE_TABLE, name, self.permits)),
            Assert(
                SetVar(SEMAPHORE_TABLE, name, ticket, description=self._desc, allow_duplicates=True)
            ),
        ]


def _check_mode(mode: object) -> str:
    if mode not in (READ, WRITE):
        raise ValueError(f"mode must be 'r' or 'w', got {mode!r}")
    return str(mode)


def set_permits_statements(lock: str, mode: str, permits: int) -> list[Statement]:
    """Configure how many may hold ``lock`` in ``mode`` at once. Refused (Statement) when
    another session has configured it; this session's own setting is replaced."""
    check_name("lock", lock)
    table = PERMITS_TABLES[_check_mode(mode)]
    if type(permits) is not int or not 0 <= permits < UNLIMITED:
        raise ValueError(f"permits must be an integer >= 0, got {permits!r}")
    return [
        Assert(Not(Exists(table, lock))),
        Assert(SetVar(table, lock, permits, allow_duplicates=True)),
    ]


def clear_permits_statements(lock: str, mode: str) -> list[Statement]:
    """Remove this session's permits setting of ``lock``/``mode`` (back to the default)."""
    check_name("lock", lock)
    return [Assert(DeleteVar(PERMITS_TABLES[_check_mode(mode)], lock))]


def get_permits_statements(lock: str, mode: str) -> list[Statement]:
    """Read the configured permits of ``lock``/``mode`` (selected as ``"permits"``)."""
    check_name("lock", lock)
    return [
        SelectVarValue(
            "permits", PERMITS_TABLES[_check_mode(mode)], lock, ignore_this_session=False
        )
    ]


def permits_value(result: Result) -> int | None:
    """The configured permit count from a ``get_permits_statements`` reply."""
    record = result.get("permits")
    if isinstance(record, dict):
        value = record.get("value")
        if type(value) is int and value >= 0:
            return value
    return None
