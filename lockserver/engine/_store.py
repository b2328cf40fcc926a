"""The lock data as it is stored: entries, slots, tables, session records, the store's counts.

Why a module of its own: the evaluator (``_eval.py``) changes the data and the engine
(``_engine.py``) decides when (expiry, fences, retries, limits); both need the layout, neither
should need the other. ``Store`` holds everything a running transaction touches (the
namespaces, the counts, the bounds, the parked setters the ``Waiting`` operator looks at, the
clock origin), so the evaluator gets a store and never the engine.

Layout: namespace -> table -> variable -> *slot*: the one ``Entry`` tuple when one entry holds
the variable, a list of 2+ entries in order otherwise. ``SessionRecord`` indexes what a session
holds as (namespace, table) -> {var: None} plus a count, so ending it costs O(its entries);
a table of SHARD_AT+ variables is a ``BigTable``, a namespace of SHARD_AT+ tables a
``ShardedDict`` of them (``Tables``), the namespaces themselves one past SHARD_AT namespaces
(``Namespaces``), and a session's group of SHARD_AT+ variables a ``StableKeys`` (``Group``):
so that no single insert rebuilds a dict of all of them, and a listing resumes in one shard
of each (``_inspect.py``), never in a copy of all of them.

Memory notes (measured by ``benchmarks.engine_micro --prefill``): a table maps each variable to
its *slot*: the Entry tuple itself when one entry holds it (a lock: by far the common case),
a list of 2+ entries in order otherwise (readers, ``allow_duplicates``); a list never holds
fewer than two. ``type(slot) is tuple`` tells the forms apart. The single form saves the list
object (~96 bytes per held lock) and keeps a million held locks out of the cyclic collector's
walks (the first collection that sees an Entry of scalars untracks it; a list stays tracked).
Sessions index what they hold as (namespace, table) -> {var: None} plus a count (``held``): one
dict slot per entry, the var str shared with the table's key, no per-entry key tuple; a dict of
strs is never tracked. Together: 437 -> 282 bytes per held lock in the blast-prefill shape
(521 -> 297 in the server, ``lockbench blast --prefill``), and a full collection with 1M held
from ~180-230 ms to ~35 ms (the table stays tracked, see ``Vars``; its entries do not).

An entry keeps only the fields it has (see ``Entry``): a 3-tuple for a plain lock, and one
tuple per transaction for all its plain locks. Server RSS growth per entry with 1,000,000
held (issue 19): 235 -> 140 bytes in the ``lockbench blast --bigtable`` shape (no values, 250
SetVars per execute), 291 -> 274 with ``--prefill`` (a short value each, 400 per execute).
What is left per entry in the big-table shape is the variable's name (~61), its table slot
(~27) and the session's index slot (~31); an entry set alone in its transaction also holds
its own tuple (64), set_at float and fence int (32 each).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Final, cast

from mypy_extensions import mypyc_attr

from protocol import ErrorCode, SessionSpec, value_size

from ._sharded import ShardedDict, StableKeys, StableMap

if TYPE_CHECKING:
    from protocol import Transaction, TransactionResult

__all__ = [
    "ENTRY_BASE",
    "S_FENCE",
    "S_OWNER",
    "S_SET_AT",
    "SESSION_BASE",
    "SHARD_AT",
    "BigTable",
    "EngineError",
    "Entry",
    "Group",
    "Held",
    "Namespaces",
    "SessionRecord",
    "Slot",
    "Store",
    "Table",
    "TableMap",
    "Tables",
    "Vars",
    "add_var",
    "as_entries",
    "drop_var",
    "entry_cost",
    "entry_desc",
    "entry_expires",
    "entry_fields",
    "entry_tx",
    "entry_value",
    "find_slot",
    "make_entry",
    "shard_of",
    "tables_shard",
    "store_full",
    "text_len",
    "with_expires",
]

# An entry is a plain tuple (STYLE.md habit 7: GC-untracked once its value is a scalar, 3x
# cheaper than an attrs instance), its optional fields trimmed off the end:
#     (session_id, set_at, fence[, value[, tx_id[, expires_at[, description]]]])
# A field is present when it or a field after it is not its default (value None, tx_id "",
# expires_at None, description None): a lock without them is a 3-tuple. Tuples are allocated
# in 16-byte steps (3 fields: 64 B, 4-5: 80, 6-7: 96; 7 before the trimming), so the order
# puts what is most often set first. And an entry without the optional fields holds nothing
# but its transaction's (session, now, fence[, None, tx_id]): the evaluator makes that tuple
# once per transaction and stores the same one for every such entry it sets (its *stamp*:
# an execute of 250 SetVars holds one tuple, not 250). Entries are immutable and never
# compared by identity, so the sharing cannot be seen. Read the optional fields with the
# ``entry_*`` helpers (the hot paths inline them as ``len`` tests).
Entry = tuple[Any, ...]
# What a table stores per variable: the one entry, or a list of 2+ entries in order.
Slot = Entry | list[Entry]
S_OWNER: Final = 0
S_SET_AT: Final = 1
S_FENCE: Final = 2
# The optional fields, at these indexes when present (the entry_* helpers read them).
_VALUE: Final = 3
_TX: Final = 4
_EXPIRES: Final = 5
_DESC: Final = 6


def make_entry(
    sid: str,
    set_at: float,
    fence: int,
    value: Any,
    tx_id: str,
    expires: float | None,
    desc: str | None,
) -> Entry:
    """The entry of these fields, trimmed (off the hot path: the evaluator inlines it)."""
    if desc is not None:
        return (sid, set_at, fence, value, tx_id, expires, desc)
    if expires is not None:
        return (sid, set_at, fence, value, tx_id, expires)
    if tx_id:
        return (sid, set_at, fence, value, tx_id)
    if value is not None:
        return (sid, set_at, fence, value)
    return (sid, set_at, fence)


def entry_value(e: Entry) -> Any:
    """The entry's value (None: none)."""
    return e[_VALUE] if len(e) > _VALUE else None


def entry_tx(e: Entry) -> str:
    """The id of the transaction that set the entry ("" when it had none)."""
    return e[_TX] if len(e) > _TX else ""


def entry_expires(e: Entry) -> float | None:
    """When the entry expires (engine time; None: no TTL)."""
    return e[_EXPIRES] if len(e) > _EXPIRES else None


def with_expires(e: Entry, expires: float) -> Entry:
    """``e`` with its expiry (it has one) set to ``expires``, every other field kept."""
    return (*e[:_EXPIRES], expires, *e[_EXPIRES + 1 :])


def entry_desc(e: Entry) -> str | None:
    """The entry's description (None: none)."""
    return e[_DESC] if len(e) > _DESC else None


def entry_fields(
    e: Entry,
) -> tuple[str, Any, str | None, str, float, float | None, int]:
    """All fields of an entry, defaults filled in, in the order records show them:
    (session_id, value, description, tx_id, set_at, expires_at, fence)."""
    n = len(e)
    return (
        e[S_OWNER],
        e[_VALUE] if n > _VALUE else None,
        e[_DESC] if n > _DESC else None,
        e[_TX] if n > _TX else "",
        e[S_SET_AT],
        e[_EXPIRES] if n > _EXPIRES else None,
        e[S_FENCE],
    )


#: What an entry counts in the server's store budget (``max_store_bytes``) beside its names,
#: value and description: about what one held lock costs in the server's memory at most (the
#: entry tuple, its time and fence, its table slot, the session's index slot, the expiry
#: bookkeeping; measured 140-274 bytes per entry with 1,000,000 held, names and values
#: included: see the module docstring).
ENTRY_BASE: Final = 256


def entry_cost(table: str, var: str, value: Any, description: str | None) -> int:
    """What an entry counts in the store budget (documented in docs/configuration.md): the
    base, its table and variable names, its value's size and its description. (The
    evaluator's hot paths inline it.)"""
    cost = ENTRY_BASE + len(table) + len(var)
    if value is not None:
        cost += value_size(value)
    if description is not None:
        cost += len(description)
    return cost


def text_len(s: str) -> int:
    """The UTF-8 length of ``s`` (its length when ASCII, the common case, at no cost)."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class Vars(dict[str, Slot]):
    """A small table's variables (or one shard of a ``BigTable``): var -> slot. A dict
    subclass for the cyclic collector only (measured with 1M held locks in one table): the
    collector untracks an exact dict whose values are all untracked (a table of lone
    entries, after a full collection) and the next insertion re-tracks it into the youngest
    generation, so the next young collections walk every entry of it again (~17 ms each per
    1M entries). A subclass instance stays tracked in the oldest generation, where only full
    collections walk it."""

    __slots__ = ()


# A table moves its variables into a ShardedDict of Vars once it holds SHARD_AT of them, so a
# dict rebuild never copies them all at once (_sharded.py says why: with 1,000,000 held locks
# in one table an acquire took 41 ms every ~400,000 acquires; the max latency of every
# pipelined blast run with 1M held was 41-43 ms, now ~5). A small table pays nothing. Why
# 4,096: the move itself is one synchronous copy of the table, 0.7 ms of pure Python at 4,096
# variables where it was 14 ms at 65,536 (the C load client saw a 16-34 ms stall in 7 of 8
# runs that started from an empty table, just when it crossed 65,536; benchmarks/cload.py);
# at 4,096 the table's containers take 121 KB sharded against 101 KB in one dict (the same
# at 16,384, less sharded past it), and the evaluator's hot paths reach a shard without a
# method call. A module global on purpose: tests shrink it to put the sharded form under
# the model tests.
SHARD_AT = 1 << 12


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class BigTable(ShardedDict[Slot]):
    """A table of SHARD_AT+ variables over Vars shards (Vars, not dict, for the collector's
    sake, see there). Stays sharded until it is empty (then the table is dropped).

    ``BigTable.made`` counts the tables made big in this process, for the server's collector
    policy (``lockserver._gcstats``): the shards are born young, and the first collection of
    generation 1 after a table grew big walks every entry of it at once (measured 47-50 ms at
    1M held, issue 19), unless the server freezes them first. It decides nothing here."""

    __slots__ = ()
    made: ClassVar[int] = 0

    def __init__(self, small: Vars) -> None:
        BigTable.made += 1
        super().__init__(Vars)
        shards, mask = self.shards, self.mask
        for var, slot in small.items():
            shards[hash(var) & mask][var] = slot
        self.n = len(small)


Table = Vars | BigTable

# A namespace's tables: a dict, moved into a ShardedDict once it holds SHARD_AT tables (the
# evaluator's SetVar does it; it stays one until the namespace is empty and dropped), and the
# namespaces the same way once there are SHARD_AT of them. Why: the rebuild a BigTable avoids
# (a namespace of a million one-variable tables is a dict of a million), and the listings:
# a page resumes in one shard (O(tables / 256)), where it copied the namespace's table names
# (13-15 ms a page with 300,000 tables, issue 30). The hot paths reach a shard themselves
# (``shards[hash(table) & mask]``, then ``n`` kept right); other code goes through the
# mapping's methods, which a ShardedDict has too. Its order depends on the process's hash
# seed: only the listings walk it (a session's release order comes from its own keys).
TableMap = dict[str, Table]  # a namespace's tables as a dict, or one shard of them
Tables = TableMap | ShardedDict[Table]
Namespaces = dict[str, Tables] | ShardedDict[Tables]

# A session's held vars in one table (``SessionRecord.keys``): a dict used as an ordered set,
# moved into a StableKeys once it holds SHARD_AT vars (the evaluator's SetVar does it; it
# stays one until the group is empty and dropped). Why: the same rebuild as a table's (a
# session of 349,525 vars in one table took ~15 ms for one acquire, pipelined from the C
# load client, compiled or not), and not a ShardedDict, whose order depends on the process's
# hash seed: a session's vars are released in this order when it ends, which shows in its
# lock-lost notice and the change feed, alike on every replica.
Group = dict[str, None] | StableKeys

# A session's groups (``SessionRecord.keys``): (namespace, table) -> Group, a dict moved into a
# StableMap once the session holds in SHARD_AT tables (the evaluator's SetVar does it; it
# stays one until the session ends). Why: a listing by session resumes in one shard of them
# (a session of 100,000 one-variable tables copied 100,000 pairs a page, issue 30), and no
# insert rebuilds a dict of all of them; a StableMap, not a ShardedDict, because the order
# they are released in when the session ends shows (see Group).
Held = dict[tuple[str, str], Group] | StableMap[Group]


def shard_of(table: Table, var: str) -> Vars:
    """The dict that holds (or would hold) ``var`` of ``table``."""
    if type(table) is BigTable:
        return table.shards[hash(var) & table.mask]  # type: ignore[return-value]
    return table  # type: ignore[return-value]


def tables_shard(tables: Tables, table: str) -> TableMap:
    """The dict that holds (or would hold) ``table`` of a namespace's ``tables``."""
    if type(tables) is ShardedDict:
        return tables.shards[hash(table) & tables.mask]
    return tables  # type: ignore[return-value]


def find_slot(tables: Tables | None, table: str, var: str) -> Slot | None:
    """The slot of ``table``/``var`` in a namespace's ``tables``, or None."""
    if tables is None:
        return None
    t = tables_shard(tables, table).get(table)
    if t is None:
        return None
    return shard_of(t, var).get(var)


def add_var(tables: Tables, table: str, var: str, slot: Slot) -> bool:
    """Store ``slot`` under ``var``, absent until now; create the table when missing (then
    True)."""
    t = tables.get(table)
    created = t is None
    if t is None:
        tables[table] = t = Vars()
    t[var] = slot
    if type(t) is Vars and len(t) >= SHARD_AT:
        tables[table] = BigTable(t)
    return created


def drop_var(tables: Tables, table: str, var: str) -> bool:
    """Remove ``var`` (present) from ``table``; drop the table once empty (then True)."""
    t = tables[table]
    del t[var]
    if t:
        return False
    del tables[table]
    return True


def as_entries(slot: Slot) -> list[Entry] | tuple[Entry]:
    """A slot's entries in order (off the hot path: it builds a 1-tuple for a single entry)."""
    return (slot,) if type(slot) is tuple else cast("list[Entry]", slot)


class EngineError(Exception):
    """A request the engine refuses as a whole (a limit): nothing was changed.

    ``code`` is the protocol ErrorCode the shell replies with.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def store_full(stored: int, limit: int) -> EngineError:
    """The refusal of a change that would pass the store budget."""
    return EngineError(
        ErrorCode.STORE_FULL,
        f"the server's stored data would pass its budget (max_store_bytes={limit}, "
        f"{stored} counted now); nothing was changed",
    )


#: What a session counts in the store budget beside its id and description (its object, its
#: index and deadline bookkeeping: measured ~400 bytes per session with 1,000,000 live).
SESSION_BASE = 512


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class SessionRecord:
    """A client session as the store keeps it: its spec, its index of held entries, its
    deadline bookkeeping and retry memory (engine-internal)."""

    __slots__ = (
        "cost",
        "created",
        "description",
        "ended",
        "held",
        "keys",
        "last_touch",
        "max_age",
        "queued",
        "retry_bytes",
        "retry_memory",
        "session_id",
        "tag",
    )

    def __init__(self, spec: SessionSpec, now: float) -> None:
        self.session_id = spec.session_id
        self.tag: str | None = None  # the shell's label (its owner's name), see tag_session
        self.description = spec.description
        self.max_age = spec.max_age
        self.last_touch = now
        self.created = now
        self.queued = now + spec.max_age  # the deadline it is queued at (moves lazily)
        # what it counts in the store budget, its retry memory's data apart
        self.cost = SESSION_BASE + text_len(spec.session_id) + text_len(spec.description)
        self.retry_bytes = 0  # data_size of the results in retry_memory
        self.ended = False
        # (namespace, table) -> {var: None}: the vars it holds, grouped by table (no empty
        # group); the var str is the one the table is keyed by (one dict slot per entry).
        # A group of SHARD_AT vars moves into a StableKeys (see Group), SHARD_AT groups into
        # a StableMap (see Held).
        self.keys: Held = {}
        self.held = 0  # how many entries it holds (the size of all groups together)
        # transaction id -> (the Transaction that ran, its result, the data_size it counts;
        # -1: remembered without its data); None until first needed
        self.retry_memory: dict[str, tuple[Transaction, TransactionResult, int]] | None = None

    @property
    def deadline(self) -> float:
        """When the session expires unless touched again (engine clock)."""
        return self.last_touch + self.max_age


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class Store:
    """The data every transaction reads and changes, and the counts kept with it.

    ``namespaces``: namespace -> table name -> ``Table`` (``Namespaces``, ``Tables``).
    ``entry_count``, ``table_count`` and ``stored`` (what the store budget counts,
    ``entry_cost``) are kept incrementally by whoever changes the data. ``max_*``: the
    bounds a new entry is checked against.
    ``pending_sets``: (namespace, table, var) -> {session id: parked transactions of that
    session holding a SetVar on it}, read by ``Waiting``. With ``track_changes`` on,
    ``note_change`` collects the variables changed and the engine appends the id of every
    session that ends to ``ended`` (both for the waiters: only those sessions' waiters are
    looked at, never every session that has one). The wait queue changes none of these
    itself: it asks the engine (``Engine.reserve_bytes``, ``add_pending_setter``,
    ``watch_changes``, ``drain_ended``... under "for the wait queue"), which keeps them.
    """

    def __init__(
        self,
        *,
        started_at: float,
        wall_at_start: float,
        max_entries: int,
        max_entries_per_session: int,
        max_store_bytes: int,
    ) -> None:
        self.started_at = started_at
        # Unix time (s) at started_at: period windows (SetVar period=) align on the wall
        # clock, like the seed's floor(now/period).
        self.wall_at_start = wall_at_start
        # Engine time + wall_offset = wall-clock seconds (what records show people).
        self.wall_offset = wall_at_start - started_at
        self.namespaces: Namespaces = {}
        self.entry_count = 0
        self.table_count = 0
        self.stored = 0
        self.max_entries = max_entries
        self.max_entries_per_session = max_entries_per_session
        self.max_store_bytes = max_store_bytes
        self.pending_sets: dict[tuple[str, str, str], dict[str, int]] = {}
        self.track_changes = False
        self.changed: set[tuple[str, str, str]] = set()
        self.ended: list[str] = []

    def window_end(self, now: float, period: float) -> float:
        """Engine time at which the current ``period`` window of the wall clock ends."""
        wall = self.wall_at_start + (now - self.started_at)
        end = (math.floor(wall / period) + 1) * period
        return now + (end - wall)

    def note_change(self, key: tuple[str, str, str]) -> None:
        """Record a change of ``key`` for waiters (when changes are tracked)."""
        if self.track_changes:
            self.changed.add(key)
