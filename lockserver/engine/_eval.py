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
same transaction see them; before the first change to a variable its entry list is
snapshotted. Abort or a limit error restores the snapshots (O(changed variables)); commit just
drops them. An abort unwinds as an ``_Aborted`` exception that each enclosing statement
annotates with its path name, so the path costs nothing unless a transaction fails (try blocks
are free in CPython 3.11 when nothing is raised).

Hot path notes: entries are plain tuples ``(session, value, description, tx_id, set_at,
expires_at, fence)`` — GC-untracked when their value is a scalar, 3x cheaper than a frozen
attrs instance (STYLE.md habit 7, measured in benchmarks/engine_micro.py); dispatch is one dict
lookup on the node's type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from protocol import (
    Abort,
    And,
    AnywayContinueAfter,
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
)

if TYPE_CHECKING:
    from ._engine import Engine, _Session

__all__ = ["Entry", "EngineError", "TxContext", "same_value"]

# (session_id, value, description, tx_id, set_at, expires_at, fence)
Entry = tuple[str, Any, str | None, str, float, float | None, int]
S_OWNER: Final = 0
S_VALUE: Final = 1
S_DESC: Final = 2
S_TX: Final = 3
S_SET_AT: Final = 4
S_EXPIRES: Final = 5
S_FENCE: Final = 6


class EngineError(Exception):
    """A request the engine refuses as a whole (a limit): nothing was changed.

    ``code`` is the protocol ErrorCode the shell replies with.
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
        "engine",
        "fence",
        "namespace",
        "now",
        "session",
        "sid",
        "snapshots",
        "tables",
        "ttl_pushes",
        "tx_id",
    )

    def __init__(
        self,
        engine: Engine,
        session: _Session,
        namespace: str,
        tx_id: str,
        now: float,
        fence: int,
    ) -> None:
        self.engine = engine
        self.session = session
        self.sid = session.session_id
        self.namespace = namespace
        self.tables: dict[str, dict[str, list[Entry]]] | None = engine.namespaces.get(namespace)
        self.tx_id = tx_id
        self.now = now
        self.fence = fence
        self.data: list[tuple[str, Any]] = []
        # (table, var) -> the variable's entry list before this transaction's first change
        # (None when the variable did not exist).
        self.snapshots: dict[tuple[str, str], list[Entry] | None] = {}
        self.ttl_pushes: list[tuple[float, str, str, int]] = []

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
        engine = self.engine
        ns = self.namespace
        session = self.session
        # A change made the namespace exist (SetVar) or found it (DeleteVar); only a commit or
        # a rollback drops it again, so it is still there.
        tables = engine.namespaces[ns]
        for (table, var), before in self.snapshots.items():
            if before is None:
                vars_ = tables.get(table)
                if vars_ is not None:
                    vars_.pop(var, None)
                    if not vars_:
                        del tables[table]
            else:
                tables.setdefault(table, {})[var] = before
            had = before is not None and any(e[0] == self.sid for e in before)
            key = (ns, table, var)
            if had:
                if key not in session.keys:
                    session.keys[key] = None
                    engine.entry_count += 1
            elif key in session.keys:
                del session.keys[key]
                engine.entry_count -= 1
        if not tables:
            del engine.namespaces[ns]

    # --- helpers ------------------------------------------------------------------------------

    def _entries(self, table: str, var: str) -> list[Entry] | None:
        tables = self.tables
        if tables is None:
            return None
        vars_ = tables.get(table)
        return None if vars_ is None else vars_.get(var)

    def _snapshot(self, table: str, var: str, entries: list[Entry] | None) -> None:
        key = (table, var)
        if key not in self.snapshots:
            self.snapshots[key] = None if entries is None else list(entries)

    def _record(self, e: Entry) -> dict[str, Any]:
        start = self.engine.started_at
        expires = e[S_EXPIRES]
        return {
            "session": e[S_OWNER],
            "value": e[S_VALUE],
            "description": e[S_DESC],
            "tx_id": e[S_TX],
            "set_at": e[S_SET_AT] - start,
            "expires_at": None if expires is None else expires - start,
            "fence": e[S_FENCE],
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
    tables = ctx.tables  # hot path: ctx._entries inlined
    vars_ = None if tables is None else tables.get(node.table)
    entries = None if vars_ is None else vars_.get(node.var)
    if not entries:
        return False
    value = node.value
    sid = ctx.sid if node.ignore_this_session else None
    for e in entries:
        if e[0] != sid and (value is None or same_value(e[1], value)):
            return True
    return False


def _op_setvar(ctx: TxContext, node: Any) -> bool:
    table = node.table
    var = node.var
    tables = ctx.tables  # hot path: ctx._entries inlined
    vars_ = None if tables is None else tables.get(table)
    entries = None if vars_ is None else vars_.get(var)
    if entries and not node.allow_duplicates:
        return False
    sid = ctx.sid
    ttl = node.ttl
    now = ctx.now
    if ttl is not None:
        expires: float | None = now + ttl
    elif node.period is not None:
        expires = ctx.engine.window_end(now, node.period)
    else:
        expires = None
    entry: Entry = (sid, node.value, node.description, ctx.tx_id, now, expires, ctx.fence)
    if expires is not None:
        ctx.ttl_pushes.append((expires, table, var, ctx.fence))
    if entries:
        for i, e in enumerate(entries):
            if e[0] == sid:
                ctx._snapshot(table, var, entries)
                entries[i] = entry
                return True
    # A new entry for this session.
    engine = ctx.engine
    session = ctx.session
    if len(session.keys) >= engine.limits.max_entries_per_session:
        raise EngineError(
            ErrorCode.TOO_MANY_ENTRIES,
            f"session {sid!r} already holds {len(session.keys)} entries, the limit "
            f"(max_entries_per_session={engine.limits.max_entries_per_session})",
        )
    if engine.entry_count >= engine.limits.max_entries:
        raise EngineError(
            ErrorCode.TOO_MANY_ENTRIES,
            f"the server holds {engine.entry_count} entries, the limit "
            f"(max_entries={engine.limits.max_entries})",
        )
    snapshots = ctx.snapshots  # hot path: ctx._snapshot inlined
    if entries is None:
        if (table, var) not in snapshots:
            snapshots[table, var] = None
        if vars_ is None:
            if tables is None:
                tables = ctx.tables = engine.namespaces.setdefault(ctx.namespace, {})
            vars_ = tables[table] = {}
        vars_[var] = [entry]
    else:
        if (table, var) not in snapshots:
            snapshots[table, var] = list(entries)
        entries.append(entry)
    session.keys[(ctx.namespace, table, var)] = None
    engine.entry_count += 1
    return True


def _op_deletevar(ctx: TxContext, node: Any) -> bool:
    table = node.table
    var = node.var
    entries = ctx._entries(table, var)
    if not entries:
        return False
    sid = ctx.sid
    value = node.value
    for i, e in enumerate(entries):
        if e[0] == sid:
            if value is not None and not same_value(e[1], value):
                return False
            ctx._snapshot(table, var, entries)
            del entries[i]
            if not entries:
                tables = ctx.tables
                assert tables is not None
                vars_ = tables[table]
                del vars_[var]
                if not vars_:
                    del tables[table]
            del ctx.session.keys[(ctx.namespace, table, var)]
            ctx.engine.entry_count -= 1
            return True
    return False


def _op_countbelow(ctx: TxContext, node: Any) -> bool:
    limit: int = node.limit
    if node.limit_table is not None:
        configured = ctx._entries(node.limit_table, node.limit_var)
        if configured:
            value = configured[0][S_VALUE]
            if type(value) is int and value >= 0:
                limit = value
    entries = ctx._entries(node.table, node.var)
    if not entries:
        return limit > 0
    if node.ignore_this_session:
        sid = ctx.sid
        return sum(1 for e in entries if e[S_OWNER] != sid) < limit
    return len(entries) < limit


def _op_waiting(ctx: TxContext, node: Any) -> bool:
    setters = ctx.engine.pending_sets.get((ctx.namespace, node.table, node.var))
    if not setters:
        return False
    sid = ctx.sid
    return any(owner != sid for owner in setters)


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
}


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
    ctx.data.append((node.into, node.value))


def _st_select_op(ctx: TxContext, node: Any) -> None:
    ctx.data.append((node.into, _OPERATOR[type(node.operator)](ctx, node.operator)))


def _st_select_var(ctx: TxContext, node: Any) -> None:
    entries = ctx._entries(node.table, node.var)
    sid = ctx.sid if node.ignore_this_session else None
    found = [e for e in entries if e[0] != sid] if entries else []
    if not found:
        if node.abort_if_not_found:
            raise _Aborted("SelectVarValueOp")
        ctx.data.append((node.into, None))
    elif node.select_many:
        ctx.data.append((node.into, [ctx._record(e) for e in found]))
    else:
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
