"""The transaction evaluator: statements and operators over the live tables, with undo.

Why / rules kept (SEMANTICS.md):
- And / Or / Xor never short-circuit: both sides run, left first (a side may be a change).
- Exclusive SetVar succeeds only when the variable has no entry at all (the caller's own
  included); ``allow_duplicates`` replaces the caller's entry in place or appends one.
- DeleteVar removes only the caller's own entry (value-filtered when a value is given).
- Exists / SelectVarValue ignore the caller's own entries unless told otherwise; Exists with a
  value matches only entries whose value is equal (strictly: 1, 1.0 and True differ).
- Only Assert, Abort and SelectVarValue(abort_if_not_found) abort.

Theory of operation: changes are applied to the live tables at once, so later reads in the
same transaction see them; before the first change to a variable its slot is snapshotted (a
single entry is immutable and kept as is, a list is copied). Abort or a limit error restores
the snapshots (O(changed variables)); commit just drops them. An abort unwinds as an
``_Aborted`` exception that each enclosing statement annotates with its path name, so the path
costs nothing unless a transaction fails (try blocks are free in CPython 3.11 when nothing is
raised).

Hot path notes: entries are plain tuples ``(session, set_at, fence[, value[, tx_id[,
expires_at[, description]]]])`` with the optional fields trimmed off the end (``_store.py``
says why) — GC-untracked when their value is a scalar, 3x cheaper than a frozen attrs instance
(STYLE.md habit 7, measured in benchmarks/engine_micro.py); the hot paths read the optional
fields by ``len`` tests, not the ``entry_*`` helpers (a call each). An entry without optional
fields is the transaction's shared *stamp* (``TxContext.stamp``). Dispatch is one dict lookup
on the node's type.

A transaction works on a ``Store`` (``_store.py``: the data, its counts and bounds), never on
the engine, which decides when transactions run and what happens to their results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, cast
from zlib import crc32

from protocol import (
    DEFAULT_MAX_FRAME,
    ELEMENT_SIZE,
    Abort,
    And,
    AnywayContinueAfter,
    ArrivedBelow,
    Assert,
    Block,
    CountBelow,
    DeleteVar,
    ErrorCode,
    Exists,
    FalseOp,
    If,
    Node,
    Not,
    Or,
    SelectConstantValue,
    SelectOperatorValue,
    SelectVarValue,
    SetVar,
    TrueOp,
    Waiting,
    Xor,
    value_size,
)

from ._sharded import ShardedDict, StableKeys, StableMap, sharded
from ._store import (
    ENTRY_BASE,
    S_OWNER,
    SHARD_AT,
    BigTable,
    EngineError,
    Entry,
    SessionRecord,
    Slot,
    Store,
    TableMap,
    Tables,
    Vars,
    add_var,
    as_entries,
    drop_var,
    entry_cost,
    entry_desc,
    entry_expires,
    entry_fields,
    entry_value,
    find_slot,
    shard_of,
    store_full,
    text_len,
)

__all__ = ["REPLY_DATA_LIMIT", "TxContext", "same_value"]

#: The most bytes of selected data one result may carry: a result frame must stay within the
#: 1 MiB every client accepts (PROTOCOL.md "Transport"), with room for its other fields.
REPLY_DATA_LIMIT: Final = DEFAULT_MAX_FRAME - 16 * 1024


class _Aborted(Exception):
    """Control-flow signal: a statement aborted; ``path`` collects node names inside-out."""

    __slots__ = ("path",)

    def __init__(self, name: str) -> None:
        self.path = [name]


def same_value(a: Any, b: Any) -> bool:
    """Wire-value equality: types must match (1, 1.0 and True are different values)."""
    if type(a) is not type(b):
        return False
    if type(a) is list or type(a) is tuple:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_value(v, b[k]) for k, v in a.items())
    return bool(a == b)


class TxContext:
    """State of one running transaction. Created by the engine, used once."""

    __slots__ = (
        "data",
        "data_bytes",
        "fence",
        "namespace",
        "now",
        "session",
        "sid",
        "snapshots",
        "stamp",
        "store",
        "stored",
        "tables",
        "ttl_ops",
        "tx_id",
    )

    def __init__(
        self,
        store: Store,
        session: SessionRecord,
        namespace: str,
        tx_id: str,
        now: float,
        fence: int,
    ) -> None:
        self.store = store
        self.session = session
        self.sid = session.session_id
        self.namespace = namespace
        self.tables: Tables | None = store.namespaces.get(namespace)
        self.tx_id = tx_id
        self.now = now
        self.fence = fence
        # The entry this transaction sets when a SetVar has no value, TTL or description:
        # made by the first such SetVar, shared by the rest (_store.py, "Entry").
        self.stamp: Entry | None = None
        self.data: list[tuple[str, Any]] = []
        # (table, var) -> the variable's slot before this transaction's first change (a copy
        # when a list; None when the variable did not exist).
        self.snapshots: dict[tuple[str, str], Slot | None] = {}
        # In order: (expires, table, var, fence) for an entry with a deadline this transaction
        # wrote, (expires, table, var, None) for one it removed or replaced; applied to the
        # engine's deadlines at commit only.
        self.ttl_ops: list[tuple[float, str, str, int | None]] = []
        self.stored = 0  # change of the store budget's count (entry_cost), applied at commit
        self.data_bytes = 0  # an upper bound of the encoded size of ``data``

    # --- running ------------------------------------------------------------------------------

    def run(self, statements: tuple[Node, ...]) -> str | None:
        """Execute top-level statements; return the failed path or None on success.
        Changes stay applied either way: the engine commits or rolls back."""
        for i, st in enumerate(statements):
            try:
                _STATEMENT[type(st)](self, st)
            except _Aborted as a:
                return f"{i}:/" + "".join(name + "/" for name in reversed(a.path))
        return None

    def rollback(self) -> None:
        """Restore every variable this transaction changed (O(changed variables))."""
        if not self.snapshots:
            return
        store = self.store
        ns = self.namespace
        session = self.session
        # A change made the namespace exist (SetVar) or found it (DeleteVar); only a commit or
        # a rollback drops it again, so it is still there.
        tables = store.namespaces[ns]
        sid = self.sid
        keys = session.keys
        for (table, var), before in self.snapshots.items():
            now_slot = find_slot(tables, table, var)
            if before is None:
                if now_slot is not None and drop_var(tables, table, var):
                    store.table_count -= 1
                had = False
            else:
                if now_slot is None:
                    if add_var(tables, table, var, before):
                        store.table_count += 1
                else:
                    shard_of(tables[table], var)[var] = before
                had = any(e[0] == sid for e in as_entries(before))
            group = keys.get((ns, table))
            if had:
                if group is None:
                    group = keys[ns, table] = {}
                if var not in group:
                    group[var] = None
                    session.held += 1
                    store.entry_count += 1
            elif group is not None and var in group:
                del group[var]
                if not group:
                    del keys[ns, table]
                session.held -= 1
                store.entry_count -= 1
        if not tables:
            del store.namespaces[ns]

    # --- helpers ------------------------------------------------------------------------------

    def _slot(self, table: str, var: str) -> Slot | None:
        return find_slot(self.tables, table, var)

    def _removed(self, table: str, var: str, e: Entry) -> None:
        """The caller's entry ``e`` of table/var is removed by this transaction."""
        self.stored -= entry_cost(table, var, entry_value(e), entry_desc(e))
        expires = entry_expires(e)
        if expires is not None:
            self.ttl_ops.append((expires, table, var, None))

    def _replace(self, table: str, var: str, e: Entry, cost: int) -> None:
        """The caller's entry ``e`` is replaced by one costing ``cost`` (store budget: only a
        replacement that costs more can be refused)."""
        old = entry_cost(table, var, entry_value(e), entry_desc(e))
        store = self.store
        limit = store.max_store_bytes
        if cost > old and store.stored + self.stored + cost - old > limit:
            raise store_full(store.stored, limit)
        self._removed(table, var, e)
        self.stored += cost

    def _snapshot(self, table: str, var: str, slot: Slot) -> None:
        key = (table, var)
        if key not in self.snapshots:
            self.snapshots[key] = slot[:]  # a list is copied, an Entry is immutable

    def _reserve(self, into: str, size: int) -> None:
        """Count a selected ``(into, value)`` whose value encodes in at most ``size`` bytes.
        Past REPLY_DATA_LIMIT the transaction fails whole (TOO_LARGE): its reply could not be
        sent."""
        self.data_bytes += size + 8 + text_len(into)
        if self.data_bytes > REPLY_DATA_LIMIT:
            raise EngineError(
                ErrorCode.TOO_LARGE,
                f"the transaction selects more than {REPLY_DATA_LIMIT} bytes of data, more "
                "than a reply may carry; nothing was changed (select fewer entries or values)",
            )

    def _record_size(self, e: Entry) -> int:
        """An upper bound of an entry record's encoded size (keys, numbers, texts, value)."""
        sid, value, desc, tx_id, _, _, _ = entry_fields(e)
        size = 128 + text_len(sid) + text_len(tx_id) + value_size(value)
        return size if desc is None else size + text_len(desc)

    def _record(self, e: Entry) -> dict[str, Any]:
        start = self.store.started_at
        sid, value, desc, tx_id, set_at, expires, fence = entry_fields(e)
        return {
            "session": sid,
            "value": value,
            "description": desc,
            "tx_id": tx_id,
            "set_at": set_at - start,
            "expires_at": None if expires is None else expires - start,
            "fence": fence,
        }


# --- operators --------------------------------------------------------------------------------


def _op_and(ctx: TxContext, node: Any) -> bool:
    left = _OPERATOR[type(node.left)](ctx, node.left)
    right = _OPERATOR[type(node.right)](ctx, node.right)
    return left and right


def _op_or(ctx: TxContext, node: Any) -> bool:
    left = _OPERATOR[type(node.left)](ctx, node.left)
    right = _OPERATOR[type(node.right)](ctx, node.right)
    return left or right


def _op_xor(ctx: TxContext, node: Any) -> bool:
    left = _OPERATOR[type(node.left)](ctx, node.left)
    right = _OPERATOR[type(node.right)](ctx, node.right)
    return left != right


def _op_not(ctx: TxContext, node: Any) -> bool:
    return not _OPERATOR[type(node.operand)](ctx, node.operand)


def _op_true(ctx: TxContext, node: Any) -> bool:
    return True


def _op_false(ctx: TxContext, node: Any) -> bool:
    return False


def _op_exists(ctx: TxContext, node: Any) -> bool:
    table = node.table
    nt = ctx.tables  # hot path: ctx._slot inlined (the namespace's tables, their shard)
    tables: TableMap | None = nt.shards[hash(table) & nt.mask] if type(nt) is ShardedDict else nt  # type: ignore[assignment]
    t = None if tables is None else tables.get(table)
    vars_: Vars | None = t.shards[hash(node.var) & t.mask] if type(t) is BigTable else t  # type: ignore[assignment]
    slot = None if vars_ is None else vars_.get(node.var)
    if slot is None:
        return False
    value = node.value
    sid = ctx.sid if node.ignore_this_session else None
    # (an entry's value is e[3] when it has one: _store.py "Entry")
    if type(slot) is tuple:
        return slot[0] != sid and (value is None or (len(slot) > 3 and same_value(slot[3], value)))
    for e in cast("list[Entry]", slot):
        if e[0] != sid and (value is None or (len(e) > 3 and same_value(e[3], value))):
            return True
    return False


def _op_setvar(ctx: TxContext, node: Any) -> bool:
    table = node.table
    var = node.var
    nt = ctx.tables  # hot path: ctx._slot inlined (the namespace's tables, their shard)
    tables: TableMap | None = nt.shards[hash(table) & nt.mask] if type(nt) is ShardedDict else nt  # type: ignore[assignment]
    t = None if tables is None else tables.get(table)
    # (no cast() on the hot path: it is a function call)
    vars_: Vars | None = t.shards[hash(var) & t.mask] if type(t) is BigTable else t  # type: ignore[assignment]
    slot = None if vars_ is None else vars_.get(var)
    if slot is not None and not node.allow_duplicates:
        return False
    sid = ctx.sid
    ttl = node.ttl
    now = ctx.now
    if ttl is not None:
        expires: float | None = now + ttl
    elif node.period is not None:
        expires = ctx.store.window_end(now, node.period)
    else:
        expires = None
    value = node.value
    desc = node.description
    # make_entry inlined; no optional field: the transaction's shared stamp
    if desc is not None:
        entry: Entry = (sid, now, ctx.fence, value, ctx.tx_id, expires, desc)
    elif expires is not None:
        entry = (sid, now, ctx.fence, value, ctx.tx_id, expires)
    elif value is not None:
        tx_id = ctx.tx_id
        entry = (sid, now, ctx.fence, value, tx_id) if tx_id else (sid, now, ctx.fence, value)
    else:
        stamp = ctx.stamp
        if stamp is None:
            tx_id = ctx.tx_id
            stamp = ctx.stamp = (
                (sid, now, ctx.fence, None, tx_id) if tx_id else (sid, now, ctx.fence)
            )
        entry = stamp
    store = ctx.store
    # entry_cost inlined (an ASCII str or no value is the common case)
    cost = ENTRY_BASE + len(table) + len(var)
    if value is not None:
        cost += (
            ELEMENT_SIZE + len(value)
            if type(value) is str and value.isascii()
            else value_size(value)
        )
    if desc is not None:
        cost += len(desc)
    if slot is not None:
        assert vars_ is not None  # (it holds slot)
        if type(slot) is tuple:
            if slot[0] == sid:
                ctx._replace(table, var, slot, cost)
                ctx._snapshot(table, var, slot)
                vars_[var] = entry
                if expires is not None:
                    ctx.ttl_ops.append((expires, table, var, ctx.fence))
                return True
        else:
            entries = cast("list[Entry]", slot)
            for i, e in enumerate(entries):
                if e[0] == sid:
                    ctx._replace(table, var, e, cost)
                    ctx._snapshot(table, var, entries)
                    entries[i] = entry
                    if expires is not None:
                        ctx.ttl_ops.append((expires, table, var, ctx.fence))
                    return True
    # A new entry for this session.
    session = ctx.session
    if session.held >= store.max_entries_per_session:
        raise EngineError(
            ErrorCode.TOO_MANY_ENTRIES,
            f"session {sid!r} already holds {session.held} entries, the limit "
            f"(max_entries_per_session={store.max_entries_per_session})",
        )
    if store.entry_count >= store.max_entries:
        raise EngineError(
            ErrorCode.TOO_MANY_ENTRIES,
            f"the server holds {store.entry_count} entries, the limit "
            f"(max_entries={store.max_entries})",
        )
    stored = ctx.stored + cost
    if store.stored + stored > store.max_store_bytes:
        raise store_full(store.stored, store.max_store_bytes)
    ctx.stored = stored
    if expires is not None:
        ctx.ttl_ops.append((expires, table, var, ctx.fence))
    snapshots = ctx.snapshots  # hot path: ctx._snapshot inlined
    if slot is None:
        if (table, var) not in snapshots:
            snapshots[table, var] = None
        if vars_ is not None:  # the table exists: add_var inlined
            vars_[var] = entry
            if vars_ is not t:
                t.n += 1  # type: ignore[union-attr]
            elif len(vars_) >= SHARD_AT:
                assert tables is not None  # (it holds t)
                tables[table] = BigTable(vars_)
        else:  # a new table (add_var inlined)
            if tables is None:
                nt = tables = ctx.tables = _new_namespace(store, ctx.namespace)
            made = Vars()
            made[var] = entry
            tables[table] = made
            store.table_count += 1
            if tables is not nt:
                nt.n += 1  # type: ignore[union-attr]
            elif len(tables) >= SHARD_AT:  # (_store.Tables says why)
                ctx.tables = store.namespaces[ctx.namespace] = sharded(tables)
    elif type(slot) is tuple:
        if (table, var) not in snapshots:
            snapshots[table, var] = slot
        assert vars_ is not None  # (it holds slot)
        vars_[var] = [slot, entry]
    else:
        if (table, var) not in snapshots:
            snapshots[table, var] = slot[:]
        cast("list[Entry]", slot).append(entry)
    keys = session.keys
    group = keys.get((ctx.namespace, table))
    if group is None:
        group = keys[ctx.namespace, table] = {}
        if type(keys) is dict and len(keys) >= SHARD_AT:
            keys = session.keys = StableMap(keys)  # (_store.Held says why)
    if type(group) is dict:
        group[var] = None
        if len(group) >= SHARD_AT:
            keys[ctx.namespace, table] = StableKeys(group)  # (_store.Group says why)
    else:
        # StableKeys.__setitem__ and stable_hash inlined: a session holding more than
        # SHARD_AT variables of one table (one pipelined connection acquiring) pays no call
        # for them (issue 32).
        stable: StableKeys = group  # type: ignore[assignment]
        shard = stable.shards[crc32(var.encode("utf-8", "surrogatepass")) & stable.mask]
        if var not in shard:
            stable.n += 1
            shard[var] = None
    session.held += 1
    store.entry_count += 1
    return True


def _op_deletevar(ctx: TxContext, node: Any) -> bool:
    table = node.table
    var = node.var
    nt = ctx.tables  # hot path: ctx._slot inlined
    if nt is None:
        return False
    tables: TableMap = nt.shards[hash(table) & nt.mask] if type(nt) is ShardedDict else nt  # type: ignore[assignment]
    t = tables.get(table)
    if t is None:
        return False
    vars_: Vars = t.shards[hash(var) & t.mask] if type(t) is BigTable else t  # type: ignore[assignment]
    slot = vars_.get(var)
    if slot is None:
        return False
    sid = ctx.sid
    value = node.value
    if type(slot) is tuple:
        n = len(slot)  # the optional fields (value, tx_id, expires, desc) present
        if slot[0] != sid or (value is not None and (n < 4 or not same_value(slot[3], value))):
            return False
        snapshots = ctx.snapshots  # hot path: ctx._snapshot inlined
        if (table, var) not in snapshots:
            snapshots[table, var] = slot
        # ctx._removed inlined (entry_cost with an ASCII str or no value, no description)
        old = slot[3] if n > 3 else None
        desc = slot[6] if n > 6 else None
        cost = ENTRY_BASE + len(table) + len(var)
        if old is not None:
            cost += (
                ELEMENT_SIZE + len(old) if type(old) is str and old.isascii() else value_size(old)
            )
        if desc is not None:
            cost += len(desc)
        ctx.stored -= cost
        if n > 5 and slot[5] is not None:
            ctx.ttl_ops.append((slot[5], table, var, None))
        del vars_[var]  # drop_var inlined
        if t is vars_:
            if not vars_:
                del tables[table]
                if tables is not nt:
                    nt.n -= 1  # type: ignore[union-attr]
                ctx.store.table_count -= 1
        else:
            t.n -= 1  # type: ignore[union-attr]
            if not t.n:  # type: ignore[union-attr]
                del tables[table]
                if tables is not nt:
                    nt.n -= 1  # type: ignore[union-attr]
                ctx.store.table_count -= 1
    else:
        entries = cast("list[Entry]", slot)
        for i, e in enumerate(entries):
            if e[0] == sid:
                if value is not None and not same_value(entry_value(e), value):
                    return False
                ctx._removed(table, var, e)
                ctx._snapshot(table, var, entries)
                if len(entries) == 2:
                    vars_[var] = entries[1 - i]  # the other one, alone again
                else:
                    del entries[i]
                break
        else:
            return False
    session = ctx.session
    keys = session.keys
    group = keys[ctx.namespace, table]
    del group[var]
    if not group:
        del keys[ctx.namespace, table]
    session.held -= 1
    ctx.store.entry_count -= 1
    return True


def _op_countbelow(ctx: TxContext, node: Any) -> bool:
    limit: int = node.limit
    if node.limit_table is not None:
        configured = ctx._slot(node.limit_table, node.limit_var)
        if configured is not None:
            value = entry_value(as_entries(configured)[0])
            if type(value) is int and value >= 0:
                limit = value
    slot = ctx._slot(node.table, node.var)
    if slot is None:
        return limit > 0
    entries = as_entries(slot)
    if node.ignore_this_session:
        sid = ctx.sid
        return sum(1 for e in entries if e[S_OWNER] != sid) < limit
    return len(entries) < limit


def _op_waiting(ctx: TxContext, node: Any) -> bool:
    setters = ctx.store.pending_sets.get((ctx.namespace, node.table, node.var))
    if not setters:
        return False
    sid = ctx.sid
    return any(owner != sid for owner in setters)


def _op_arrivedbelow(ctx: TxContext, node: Any) -> bool:
    limit: int = node.limit
    slot = ctx._slot(node.table, node.var)
    setters = ctx.store.pending_sets.get((ctx.namespace, node.table, node.var))
    if not setters:  # a session holds at most one entry per variable: entries are sessions
        return (0 if slot is None else len(as_entries(slot))) < limit
    arrived = set(setters)
    if slot is not None:
        arrived.update([e[S_OWNER] for e in as_entries(slot)])
    return len(arrived) < limit


_OPERATOR: dict[type, Callable[[TxContext, Any], bool]] = {
    And: _op_and,
    Or: _op_or,
    Xor: _op_xor,
    Not: _op_not,
    TrueOp: _op_true,
    FalseOp: _op_false,
    Exists: _op_exists,
    SetVar: _op_setvar,
    DeleteVar: _op_deletevar,
    CountBelow: _op_countbelow,
    Waiting: _op_waiting,
    ArrivedBelow: _op_arrivedbelow,
}


def _new_namespace(store: Store, namespace: str) -> TableMap:
    """The (empty) tables of a namespace made now; the namespaces move into a ShardedDict
    once there are SHARD_AT of them (``_store.Namespaces``)."""
    namespaces = store.namespaces
    tables: TableMap = {}
    namespaces[namespace] = tables
    if type(namespaces) is dict and len(namespaces) >= SHARD_AT:
        store.namespaces = sharded(namespaces)
    return tables


# --- statements -------------------------------------------------------------------------------


def _st_assert(ctx: TxContext, node: Any) -> None:
    cond = node.condition
    if not _OPERATOR[type(cond)](ctx, cond):
        raise _Aborted("AssertOp")


def _st_abort(ctx: TxContext, node: Any) -> None:
    raise _Aborted("AbortOp")


def _st_block(ctx: TxContext, node: Any) -> None:
    try:
        for st in node.statements:
            _STATEMENT[type(st)](ctx, st)
    except _Aborted as a:
        a.path.append("BlockOp")
        raise


def _st_if(ctx: TxContext, node: Any) -> None:
    try:
        cond = node.condition
        if _OPERATOR[type(cond)](ctx, cond):
            _STATEMENT[type(node.then)](ctx, node.then)
        elif node.else_ is not None:
            _STATEMENT[type(node.else_)](ctx, node.else_)
    except _Aborted as a:
        a.path.append("IfOp")
        raise


def _st_anyway(ctx: TxContext, node: Any) -> None:
    _OPERATOR[type(node.change)](ctx, node.change)


def _st_select_const(ctx: TxContext, node: Any) -> None:
    ctx._reserve(node.into, value_size(node.value, REPLY_DATA_LIMIT))
    ctx.data.append((node.into, node.value))


def _st_select_op(ctx: TxContext, node: Any) -> None:
    value = _OPERATOR[type(node.operator)](ctx, node.operator)
    ctx._reserve(node.into, ELEMENT_SIZE)
    ctx.data.append((node.into, value))


def _st_select_var(ctx: TxContext, node: Any) -> None:
    slot = ctx._slot(node.table, node.var)
    sid = ctx.sid if node.ignore_this_session else None
    found = [] if slot is None else [e for e in as_entries(slot) if e[0] != sid]
    if not found:
        if node.abort_if_not_found:
            raise _Aborted("SelectVarValueOp")
        ctx._reserve(node.into, ELEMENT_SIZE)
        ctx.data.append((node.into, None))
    elif node.select_many:
        size = ELEMENT_SIZE
        for e in found:
            size += ctx._record_size(e)
            if size > REPLY_DATA_LIMIT:
                break  # enough to be refused
        ctx._reserve(node.into, size)
        ctx.data.append((node.into, [ctx._record(e) for e in found]))
    else:
        ctx._reserve(node.into, ctx._record_size(found[0]))
        ctx.data.append((node.into, ctx._record(found[0])))


_STATEMENT: dict[type, Callable[[TxContext, Any], None]] = {
    Assert: _st_assert,
    Abort: _st_abort,
    Block: _st_block,
    If: _st_if,
    AnywayContinueAfter: _st_anyway,
    SelectConstantValue: _st_select_const,
    SelectOperatorValue: _st_select_op,
    SelectVarValue: _st_select_var,
}
