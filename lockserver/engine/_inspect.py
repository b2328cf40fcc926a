"""Reading the lock state for people: holder records, the listings and their cursors, the
holders that made a statement fail.

Why a module of its own: the engine and the wait queue keep the state laid out for speed;
this module walks that layout for an operator without changing it, and changes for the
operator's reasons (what a listing shows, how it pages).

Rules kept (PROTOCOL.md "Inspection"):
- **Pure**: every function reads the engine and the wait queue and returns values; times are
  engine times turned into wall-clock seconds by the store's ``wall_offset`` (the shell's one
  wall-clock reading at start, passed in when the engine was built). No clock is read here.
- **Bounded pages**: a page stops at ``limit`` records, at ``PAGE_BYTES`` of records, or after
  looking at ``PAGE_SCAN`` items, whichever comes first; its cursor then points at the next
  item to look at (nil: nothing is left). So a page costs O(page + PAGE_SCAN), never O(all).
- **Cursors resume by key**: a cursor names the next item (namespace, table, var, session for
  holders; session id for sessions; arrival number for waiters) and its position. Resuming
  copies the keys of the one container the position names at each level (a list made in C)
  and looks the key up at its index there, then by key. A container of SHARD_AT+ keys is
  sharded (the namespaces, a namespace's tables, a table's variables, the sessions: 256
  shards each), and then the container is the one shard the position names: a page costs
  O(page + PAGE_SCAN + keys / 256), however many tables or namespaces there are (copying a
  namespace's 300,000 table names cost 13-15 ms a page, issue 30). Waiters resume from the
  cursor's arrival number by bisection (``WaitQueue.since``). An item present for the
  whole paging and not changed is listed exactly once; an item added meanwhile may or may
  not be listed; when the item a cursor names is itself removed (or removed and added
  again), paging resumes right after the item before it (the cursor names that one too, at
  every level: ``_start``), and only when both are gone at the old position, which may then
  skip or repeat a few items of that container. A container moved from its dict into its
  sharded form between pages has every key placed anew: a cursor into it may then skip or
  repeat too. Storage order
  is insertion order within a container and hash order across a sharded one's shards (so
  two server processes may list the same state in different orders; a cursor is only valid
  on the run that made it).
- A cursor is refused (INVALID_MESSAGE, naming why) when it is not one of ours, is for
  another listing, was made with other filters, or by another run of the server.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import heapq
import itertools
import json
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Final, Protocol

import attrs

from protocol import (
    MAX_HOLDERS,
    PAGE_BYTES,
    PAGE_SCAN,
    ArrivedBelow,
    CountBelow,
    ErrorCode,
    Exists,
    HolderInfo,
    HoldersPage,
    ListQuery,
    Node,
    SessionInfo,
    SessionsPage,
    SetVar,
    WaiterInfo,
    WaitersPage,
    make_holder,
    value_size,
)

from ._eval import same_value
from ._sharded import ShardedDict, StableKeys, StableMap
from ._store import (
    S_FENCE,
    S_OWNER,
    S_SET_AT,
    BigTable,
    EngineError,
    Entry,
    SessionRecord,
    Store,
    Table,
    as_entries,
    entry_desc,
    entry_value,
    find_slot,
    text_len,
)

# The engine and the wait queue are passed in (they import this module): ``Engine`` and
# ``WaitQueue`` below name them for readers only.
Engine = Any
WaitQueue = Any

__all__ = [
    "BUSIEST_SCAN",
    "LISTINGS",
    "BusyTable",
    "busiest_tables",
    "Visibility",
    "denial_holders",
    "holders_size",
    "holder_info",
    "list_holders",
    "list_sessions",
    "list_waiters",
]


class Visibility(Protocol):
    """What a listing may show a principal: the namespaces it may use (the shell's
    ``Principal`` is one); its own sessions (``name``) are always visible."""

    @property
    def name(self) -> str: ...

    def allows(self, namespace: str) -> bool: ...


_HOLDER_BYTES: Final = 192  # a holder record's keys and numbers, encoded, about
_SESSION_BYTES: Final = 256
_WAITER_BYTES: Final = 160


# --- records ----------------------------------------------------------------------------------


def holder_info(store: Store, sessions: Any, ns: str, table: str, var: str, e: Entry) -> HolderInfo:
    """The record of entry ``e`` of ``ns``/``table``/``var``, times in wall-clock seconds."""
    offset = store.wall_offset
    # entry_fields inlined (the denial path: a failed acquire builds one of these per holder)
    n = len(e)
    sid = e[S_OWNER]
    expires = e[5] if n > 5 else None
    owner = sessions.get(sid)
    return make_holder(  # the engine's own values: no validators (the denial path)
        ns,
        table,
        var,
        sid,
        "" if owner is None else owner.description,
        e[3] if n > 3 else None,
        e[6] if n > 6 else None,
        e[S_SET_AT] + offset,
        None if expires is None else expires + offset,
        e[S_FENCE],
    )


def holders_size(holders: tuple[HolderInfo, ...]) -> int:
    """An upper bound of the encoded size of holder records (a remembered result counts it)."""
    size = 0
    for h in holders:
        size += _HOLDER_BYTES + 4 * (len(h.namespace) + len(h.table) + len(h.var) + len(h.session))
        size += 4 * len(h.session_description) + value_size(h.value)
        if h.description is not None:
            size += 4 * len(h.description)
    return size


def _holder_bytes(ns: str, table: str, var: str, e: Entry, sdesc: str) -> int:
    n = len(e)  # entry_desc and entry_value inlined (the denial path)
    desc = e[6] if n > 6 else None
    return (
        _HOLDER_BYTES
        + len(ns)
        + len(table)
        + len(var)
        + 2 * len(e[S_OWNER])
        + len(sdesc)
        + value_size(e[3] if n > 3 else None)
        + (0 if desc is None else len(desc))
    )


def denial_holders(
    engine: Engine, statement: Node, ns: str, sid: str, uncommitted: int, room: int
) -> tuple[HolderInfo, ...]:
    """The entries that made ``statement`` (a top-level statement that aborted) fail, as the
    evaluator saw them: for each ``Exists`` the entries it matched, for each exclusive
    ``SetVar`` every entry of its variable, for each ``CountBelow`` and ``ArrivedBelow`` the
    entries it counted;
    in the tree's order, each entry once, at most ``MAX_HOLDERS``, and only while their
    records fit in ``room`` bytes (what the reply has left beside its selected data: a
    result never passes the 1 MiB a client accepts). Entries of the running transaction
    itself (fence ``uncommitted``) are left out: they never existed."""
    store = engine.store
    tables = store.namespaces.get(ns)
    if tables is None:
        return ()
    out: list[HolderInfo] = []
    seen: set[tuple[str, str, str]] = set()
    stack: list[Any] = [statement]
    while stack and len(out) < MAX_HOLDERS:
        node = stack.pop()
        t = type(node)
        if t is Exists or t is SetVar or t is CountBelow or t is ArrivedBelow:
            if t is SetVar and node.allow_duplicates:
                continue
            slot = find_slot(tables, node.table, node.var)
            if slot is None:
                continue
            skip = sid if (t is Exists or t is CountBelow) and node.ignore_this_session else None
            value = node.value if t is Exists else None
            for e in as_entries(slot):
                if e[S_OWNER] == skip or e[S_FENCE] == uncommitted:
                    continue
                if value is not None and not same_value(entry_value(e), value):
                    continue
                key = (node.table, node.var, e[S_OWNER])
                if key in seen:
                    continue
                seen.add(key)
                room -= _holder_bytes(ns, node.table, node.var, e, "") + 2 * text_len(e[S_OWNER])
                if room < 0:
                    return tuple(out)
                out.append(holder_info(store, engine.sessions, ns, node.table, node.var, e))
                if len(out) == MAX_HOLDERS:
                    break
        else:
            stack.extend(reversed(_children(node)))
    return tuple(out)


# The fields of each node type that hold child nodes (a node or a tuple of them), learned once
# per type: the denial path walks a tree per failed transaction.
_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}
_CHILD_NAMES: Final = frozenset(
    {"condition", "then", "else_", "statements", "change", "operator", "left", "right", "operand"}
)


def _children(node: Any) -> list[Any]:
    """A statement's or operator's child nodes, in evaluation order."""
    t = type(node)
    names = _CHILD_FIELDS.get(t)
    if names is None:
        names = _CHILD_FIELDS[t] = tuple(f.name for f in attrs.fields(t) if f.name in _CHILD_NAMES)
    out: list[Any] = []
    for name in names:
        value = getattr(node, name)
        if type(value) is tuple:
            out.extend(value)
        elif value is not None:
            out.append(value)
    return out


# --- cursors ----------------------------------------------------------------------------------


def _filters_tag(q: ListQuery) -> int:
    return zlib.crc32(repr((q.namespace, q.table, q.var, q.session, q.match)).encode())


def _encode_cursor(kind: str, run: int, q: ListQuery, position: list[Any]) -> str:
    raw = json.dumps([kind, run, _filters_tag(q), *position], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode()


_KINDS: Final = ("holders", "sessions", "waiters")


def _decode_cursor(kind: str, run: int, q: ListQuery, shape: tuple[type, ...]) -> list[Any]:
    """The position a query's cursor names; EngineError (INVALID_MESSAGE) saying why not."""
    assert q.cursor is not None
    try:
        raw = json.loads(base64.urlsafe_b64decode(q.cursor.encode("ascii", "strict")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        # (RecursionError: JSON nested deeper than the interpreter's recursion limit, which
        # a cursor of ours never is: a peer's forgery, as any other shape here)
        raw = None
    if type(raw) is not list or len(raw) < 3 or raw[0] not in _KINDS:
        raise _bad_cursor(kind, "it is not a cursor of this server")
    if raw[0] != kind:
        raise _bad_cursor(kind, f"it is a cursor of a {raw[0]!r} listing, not {kind!r}")
    if raw[1] != run:
        raise _bad_cursor(kind, "it was made by another run of the server: list from the start")
    if raw[2] != _filters_tag(q):
        raise _bad_cursor(kind, "it was made for other filters: page with the same filters")
    position = raw[3:]
    if len(position) != len(shape):
        raise _bad_cursor(kind, "it is not a cursor of this server")
    for value, want in zip(position, shape, strict=True):
        if type(value) is not want or (type(value) is int and value < 0):
            raise _bad_cursor(kind, "it is not a cursor of this server")
    return position


def _bad_cursor(kind: str, why: str) -> EngineError:
    return EngineError(ErrorCode.INVALID_MESSAGE, f"{kind}: the cursor is not valid: {why}")


def _start(keys: list[Any], key: Any, hint: int, prev: Any = None) -> int:
    """Where to resume in ``keys`` at ``key``, last seen at index ``hint`` right after
    ``prev`` ("": ``key`` was the first; None: not known). The keys of an insertion-ordered
    container that stayed keep their order and only move towards the front (as keys before
    them go), and a key added, or removed and added again, goes after all of them: so
    resuming right after ``prev`` when it is there, at ``key`` when it is there, and at the
    start when ``key`` was the first is exact (when both are there, the nearer place: the
    other one was added again); only when neither is there (or both were added again) is it
    the old index, which may skip or repeat a few keys."""
    if (
        hint < len(keys)
        and keys[hint] == key
        and (not hint or prev is None or keys[hint - 1] == prev)
    ):
        return hint  # nothing before it went (the usual case: O(1))
    if prev == "":
        return 0
    at = len(keys) + 1
    try:
        found = keys.index(key)
        if found <= hint:  # further on: it went and came back, after what stayed
            at = found
    except ValueError:
        pass
    if prev is not None:
        try:
            found = keys.index(prev) + 1
            if found <= hint:
                at = min(at, found)
        except ValueError:
            pass
    return at if at <= len(keys) else min(hint, len(keys))


def _match(text: str | None, needle: str | None) -> bool:
    return needle is None or (text is not None and needle in text)


# --- holders ---------------------------------------------------------------------------------

# Where a walk is in a container of keys (the namespaces, a namespace's tables, a table's
# variables, a variable's entries): the shard (0 for a plain dict), the index in it, the key
# there, and the key before it in that shard ("" at a shard's start), to resume right after
# when the key itself is gone. A sharded container (ShardedDict, BigTable) is resumed in its
# one shard: O(keys / SHARDS).
# (ns: shard, index, name, name before; table: shard, index, name, name before; var: shard,
# index, name, name before; entry: index, session, session before. An empty name is a
# shard's start: names are never empty.)
_HOLDERS_SHAPE: Final = (int, int, str, str, int, int, str, str, int, int, str, str, int, str, str)


def _shards(container: Any) -> list[Any]:
    """The dicts a container keeps its keys in, in walking order."""
    t = type(container)
    if t is ShardedDict or t is BigTable or t is StableKeys or t is StableMap:
        return container.shards  # type: ignore[no-any-return]
    return [container]


def _walk_keys(
    container: Any, shard: int, index: int, key: Any, prev: Any = None
) -> Iterator[tuple[int, int, Any, Any, Any]]:
    """(shard, index, key, the key before it in its shard (None: it is the first), the
    shard's dict) of every key of ``container`` from the position
    (``shard``, ``index``, ``key``, the key ``prev`` before it) on (``key`` None: from that
    shard's start): ``_start``'s rule in that shard, then every later shard from its start.
    One shard's keys are copied at a time."""
    shards = _shards(container)
    for sh_i in range(min(shard, len(shards)), len(shards)):
        d = shards[sh_i]
        keys = list(d)
        i_from = 0
        if sh_i == shard and key is not None:
            i_from = _start(keys, key, index, prev)
        for i in range(i_from, len(keys)):
            yield sh_i, i, keys[i], keys[i - 1] if i else None, d


def _walk_holders(
    store: Store, q: ListQuery, at: list[Any] | None
) -> Iterator[tuple[tuple[Any, ...], Any, list[str], int, int]]:
    """Every container of variables from position ``at`` on (None: the start): (where: the
    position's first fields (ns shard, index, ns, ns before, table shard, index, table,
    table before, var shard), the var shard (a dict var -> slot), its vars, the var index to
    start at, the entry index to start at in that first var); a table a prefix filter passes
    over comes with no var shard (None: it costs a look). ``at`` steers only the first
    descent: once the walk leaves a container it names, every later one is walked from its
    start. (Per container, not per entry: a generator's yield per entry cost ~0.7 us.)"""
    namespaces: Any = store.namespaces
    if q.namespace is not None:
        tables = namespaces.get(q.namespace)
        namespaces = {} if tables is None else {q.namespace: tables}
    table_prefix = q.table
    ns_at = (0, 0, None, None) if at is None else (at[0], at[1], at[2] or None, at[3])
    for ns_sh, ns_i, ns, ns_prev, ns_dict in _walk_keys(namespaces, *ns_at):
        if at is not None and at[2] != ns:
            at = None
        t_at = (0, 0, None, None) if at is None else (at[4], at[5], at[6] or None, at[7])
        for t_sh, t_i, table, t_prev, t_dict in _walk_keys(ns_dict[ns], *t_at):
            if at is not None and at[6] != table:
                at = None
            here = (ns_sh, ns_i, ns, ns_prev or "", t_sh, t_i, table, t_prev or "")
            if table_prefix is not None and not table.startswith(table_prefix):
                yield (*here, 0), None, [], 0, 0
                continue
            t: Table = t_dict[table]
            shards: list[Any] = t.shards if type(t) is BigTable else [t]
            sh_from = 0 if at is None else min(at[8], len(shards))
            for sh_i in range(sh_from, len(shards)):
                shard = shards[sh_i]
                v_keys = list(shard)
                v_from = e_from = 0
                if at is not None and at[8] == sh_i:
                    v_from = _start(v_keys, at[10], at[9], at[11])
                    if v_from < len(v_keys) and v_keys[v_from] == at[10]:
                        owners = [e[S_OWNER] for e in as_entries(shard[at[10]])]
                        e_from = _start(owners, at[13], at[12], at[14])
                at = None
                yield (*here, sh_i), shard, v_keys, v_from, e_from


def _holders_at(
    where: tuple[Any, ...], v_keys: list[str], v_i: int, entries: Any, e_i: int
) -> list[Any]:
    """The holders position of entry ``e_i`` of ``entries`` (none: the var's start), the
    slot of var ``v_i`` of ``v_keys``, in the var shard ``where`` names (_HOLDERS_SHAPE)."""
    sid = entries[e_i][S_OWNER] if e_i < len(entries) else ""
    sid_before = entries[e_i - 1][S_OWNER] if e_i else ""
    var_before = v_keys[v_i - 1] if v_i else ""
    return [*where, v_i, v_keys[v_i], var_before, e_i, sid, sid_before]


def list_holders(
    engine: Engine, waits: WaitQueue, q: ListQuery, visible: Visibility | None, run: int
) -> HoldersPage:
    """A page of held entries matching ``q`` (see the module docstring for its bounds).
    The hot loop of a listing: one look per entry, the record built without validators.
    With a ``session`` filter, only that session's own index is walked."""
    if q.session is not None:
        return _session_holders(engine, q, visible, run)
    store = engine.store
    offset = store.wall_offset
    shards = engine.sessions.shards
    mask = engine.sessions.mask
    at = None if q.cursor is None else _decode_cursor("holders", run, q, _HOLDERS_SHAPE)
    limit = q.page_size
    match = q.match
    only = q.session
    var_prefix = q.var
    records: list[HolderInfo] = []
    size = scanned = 0
    walk = _walk_holders(store, q, at)
    for where, shard, v_keys, v_from, first_entry in walk:
        e_from = first_entry
        ns = where[2]
        table = where[6]
        if shard is None or (visible is not None and not visible.allows(ns)):
            if scanned >= PAGE_SCAN:
                pos = [*where, 0, "", "", 0, "", ""]
                return HoldersPage(records, _encode_cursor("holders", run, q, pos))
            scanned += 1
            continue
        for v_i in range(v_from, len(v_keys)):
            var = v_keys[v_i]
            if var_prefix is not None and not var.startswith(var_prefix):
                if scanned >= PAGE_SCAN:
                    pos = _holders_at(where, v_keys, v_i, (), 0)
                    return HoldersPage(records, _encode_cursor("holders", run, q, pos))
                scanned += 1
                continue
            slot = shard[var]
            entries = (slot,) if type(slot) is tuple else slot
            names = len(ns) + len(table) + len(var)
            for e_i in range(e_from, len(entries)):
                e = entries[e_i]
                sid = e[S_OWNER]
                if scanned >= PAGE_SCAN:
                    pos = _holders_at(where, v_keys, v_i, entries, e_i)
                    return HoldersPage(records, _encode_cursor("holders", run, q, pos))
                scanned += 1
                if only is not None and sid != only:
                    continue
                owner = shards[hash(sid) & mask].get(sid)
                sdesc = "" if owner is None else owner.description
                n = len(e)  # entry_fields inlined (a call per record)
                value = e[3] if n > 3 else None
                desc = e[6] if n > 6 else None
                expires = e[5] if n > 5 else None
                if match is not None and match not in sdesc and (desc is None or match not in desc):
                    continue
                cost = _HOLDER_BYTES + names + 2 * len(sid) + len(sdesc)
                cost += value_size(value) + (0 if desc is None else len(desc))
                if len(records) == limit or (records and size + cost > PAGE_BYTES):
                    pos = _holders_at(where, v_keys, v_i, entries, e_i)
                    return HoldersPage(records, _encode_cursor("holders", run, q, pos))
                size += cost
                records.append(
                    make_holder(
                        ns,
                        table,
                        var,
                        sid,
                        sdesc,
                        value,
                        desc,
                        e[S_SET_AT] + offset,
                        None if expires is None else expires + offset,
                        e[S_FENCE],
                    )
                )
            e_from = 0
    return HoldersPage(records, None)


# A position in one session's index: group shard, index, namespace, table; var shard, index,
# var (namespace or var "": that shard's start).
_SESSION_HOLDERS_SHAPE: Final = (int, int, str, str, int, int, str)


def _session_holders(
    engine: Engine, q: ListQuery, visible: Visibility | None, run: int
) -> HoldersPage:
    """The holders page of one session (``q.session``): its index of held entries, (ns,
    table) group by group in its order, walked from the cursor (in one shard of its groups
    and of the group: ``StableMap``, ``StableKeys``): O(page), however much the others or
    the session itself hold. The order differs from the full listing's (by session, not by
    table); a cursor of one is refused by the other (other filters)."""
    assert q.session is not None
    s: SessionRecord | None = engine.sessions.get(q.session)
    if s is None:
        return HoldersPage((), None)
    at = None
    if q.cursor is not None:
        at = _decode_cursor("holders", run, q, _SESSION_HOLDERS_SHAPE)
    store = engine.store
    namespaces = store.namespaces
    records: list[HolderInfo] = []
    size = scanned = 0
    g_at = (0, 0, None) if at is None else (at[0], at[1], (at[2], at[3]) if at[2] else None)
    for g_sh, g_i, key, _, groups in _walk_keys(s.keys, *g_at):
        ns, table = key
        v_at = (0, 0, None)
        if at is not None and (at[2], at[3]) == key:
            v_at = (at[4], at[5], at[6] or None)
        at = None
        if (
            (q.namespace is not None and ns != q.namespace)
            or (q.table is not None and not table.startswith(q.table))
            or (visible is not None and not visible.allows(ns))
        ):
            if scanned >= PAGE_SCAN:
                pos = [g_sh, g_i, ns, table, 0, 0, ""]
                return HoldersPage(records, _encode_cursor("holders", run, q, pos))
            scanned += 1
            continue
        tables = namespaces.get(ns)
        for v_sh, v_i, var, _, _ in _walk_keys(groups[key], *v_at):
            pos = [g_sh, g_i, ns, table, v_sh, v_i, var]
            if scanned >= PAGE_SCAN:
                return HoldersPage(records, _encode_cursor("holders", run, q, pos))
            scanned += 1
            if q.var is not None and not var.startswith(q.var):
                continue
            slot = find_slot(tables, table, var)
            e = next(e for e in as_entries(slot) if e[S_OWNER] == s.session_id)  # type: ignore[arg-type]
            if not (_match(s.description, q.match) or _match(entry_desc(e), q.match)):
                continue
            cost = _holder_bytes(ns, table, var, e, s.description)
            if len(records) == q.page_size or (records and size + cost > PAGE_BYTES):
                return HoldersPage(records, _encode_cursor("holders", run, q, pos))
            size += cost
            records.append(holder_info(store, engine.sessions, ns, table, var, e))
    return HoldersPage(records, None)


# --- sessions ---------------------------------------------------------------------------------

# shard, index, session id, the session id before (resume after it when the id is gone);
# then where the page's looks ran out inside that session's groups ("" namespace: not inside):
# group shard, index, namespace, table, var shard, index, var, and what was found in it
# before (placed, seen: 0 or 1).
_SESSIONS_SHAPE: Final = (int, int, str, str, int, int, str, str, int, int, str, int, int)
_NOT_INSIDE: Final = (0, 0, "", "", 0, 0, "", 0, 0)


def _session_scan(
    s: SessionRecord,
    q: ListQuery,
    visible: Visibility | None,
    budget: int,
    inside: list[Any] | None,
) -> tuple[bool | None, int, list[Any]]:
    """Whether ``s`` passes the filters and the principal's view, how many looks that took
    (one, and one per group and per variable looked at), and, when ``budget`` looks ran out
    first (then None: undecided), where in its groups to go on (``_SESSIONS_SHAPE``'s
    inside part). ``inside``: where an earlier page stopped in ``s`` (None: its start)."""
    if q.session is not None and s.session_id != q.session:
        return False, 1, []
    if not _match(s.description, q.match):
        return False, 1, []
    looked = 1
    if inside is None:
        placed = q.namespace is None and q.table is None and q.var is None
        seen = visible is None or s.tag == visible.name
        g_at: tuple[int, int, Any] = (0, 0, None)
    else:
        placed, seen = bool(inside[7]), bool(inside[8])
        g_at = (inside[0], inside[1], (inside[2], inside[3]))
    if placed and seen:
        return True, looked, []
    var_prefix = q.var
    for g_sh, g_i, key, _, groups in _walk_keys(s.keys, *g_at):
        ns, table = key
        v_at: tuple[int, int, Any] = (0, 0, None)
        if inside is not None and (inside[2], inside[3]) == key:
            v_at = (inside[4], inside[5], inside[6] or None)
        inside = None
        if looked >= budget:
            stop = [g_sh, g_i, ns, table, v_at[0], v_at[1], v_at[2] or ""]
            return None, looked, [*stop, int(placed), int(seen)]
        looked += 1
        if not seen and visible is not None and visible.allows(ns):
            seen = True
        if not placed and (
            (q.namespace is None or ns == q.namespace)
            and (q.table is None or table.startswith(q.table))
        ):
            if var_prefix is None:
                placed = True
            else:
                for v_sh, v_i, var, _, _ in _walk_keys(groups[key], *v_at):
                    if looked >= budget:
                        return None, looked, [g_sh, g_i, ns, table, v_sh, v_i, var, 0, int(seen)]
                    looked += 1
                    if var.startswith(var_prefix):
                        placed = True
                        break
        if placed and seen:
            return True, looked, []
    return False, looked, []


def _walk_sessions(
    shards: list[dict[str, SessionRecord]], at: list[Any] | None
) -> Iterator[tuple[list[Any], SessionRecord]]:
    """Every session from position ``at`` on (None: the start), with its position."""
    sh_from = 0 if at is None else min(at[0], len(shards))
    for sh_i in range(sh_from, len(shards)):
        shard = shards[sh_i]
        keys = list(shard)
        i_from = 0 if at is None or at[0] != sh_i else _start(keys, at[2], at[1], at[3])
        at = None
        for i in range(i_from, len(keys)):
            yield [sh_i, i, keys[i], keys[i - 1] if i else ""], shard[keys[i]]


def list_sessions(
    engine: Engine, waits: WaitQueue, q: ListQuery, visible: Visibility | None, run: int
) -> SessionsPage:
    """A page of live sessions matching ``q`` (``clients`` left empty: the door fills them
    from the owners that used each session)."""
    offset = engine.store.wall_offset
    at = None if q.cursor is None else _decode_cursor("sessions", run, q, _SESSIONS_SHAPE)
    limit = q.page_size
    records: list[SessionInfo] = []
    size = scanned = 0
    if q.session is not None:
        one = engine.sessions.get(q.session)
        shards: list[dict[str, SessionRecord]] = [] if one is None else [{q.session: one}]
    else:
        shards = engine.sessions.shards
    for pos, s in _walk_sessions(shards, at):
        inside = at[4:] if at is not None and at[6] and at[2] == pos[2] else None
        at = None
        if scanned >= PAGE_SCAN:
            return SessionsPage(records, _encode_cursor("sessions", run, q, [*pos, *_NOT_INSIDE]))
        ok, looked, stop = _session_scan(s, q, visible, PAGE_SCAN - scanned, inside)
        scanned += looked
        if ok is None:
            return SessionsPage(records, _encode_cursor("sessions", run, q, [*pos, *stop]))
        if not ok:
            continue
        cost = _SESSION_BYTES + 2 * len(s.session_id) + len(s.description)
        if len(records) == limit or (records and size + cost > PAGE_BYTES):
            return SessionsPage(records, _encode_cursor("sessions", run, q, [*pos, *_NOT_INSIDE]))
        size += cost
        records.append(
            SessionInfo(
                s.session_id,
                s.description,
                s.tag or "",
                (),
                s.created + offset,
                s.last_touch + offset,
                s.max_age,
                s.last_touch + s.max_age + offset,
                s.held,
                waits.parked_count(s.session_id),
            )
        )
    return SessionsPage(records, None)


# --- waiters ----------------------------------------------------------------------------------

_WAITERS_SHAPE: Final = (int,)


def _waiter_matches(w: Any, q: ListQuery, visible: Visibility | None) -> bool:
    ns = w.tx.namespace
    if q.namespace is not None and ns != q.namespace:
        return False
    if visible is not None and not visible.allows(ns):
        return False
    if q.session is not None and w.session.session_id != q.session:
        return False
    if not (_match(w.session.description, q.match) or _match(w.tx.description, q.match)):
        return False
    if q.table is None and q.var is None:
        return True
    return any(
        (q.table is None or t.startswith(q.table)) and (q.var is None or v.startswith(q.var))
        for _, t, v in w.keys
    )


def list_waiters(
    engine: Engine, waits: WaitQueue, q: ListQuery, visible: Visibility | None, run: int
) -> WaitersPage:
    """A page of parked transactions matching ``q``, oldest first: found from the cursor's
    arrival number in O(log waiters); each variable's queue (for the positions) is read once
    per page."""
    offset = engine.store.wall_offset
    at = None if q.cursor is None else _decode_cursor("waiters", run, q, _WAITERS_SHAPE)
    queues: dict[tuple[str, str, str], list[int]] = {}  # key -> its waiters' arrival numbers

    def position(w: Any, key: tuple[str, str, str]) -> int:
        seqs = queues.get(key)
        if seqs is None:
            seqs = queues[key] = waits.arrivals(key)
        return bisect.bisect_left(seqs, w.seq)

    limit = q.page_size
    records: list[WaiterInfo] = []
    size = 0
    for scanned, w in enumerate(waits.since(0 if at is None else at[0])):
        if scanned >= PAGE_SCAN:
            return WaitersPage(records, _encode_cursor("waiters", run, q, [w.seq]))
        if not _waiter_matches(w, q, visible):
            continue
        variables = tuple((t, v, position(w, (ns, t, v))) for ns, t, v in sorted(w.keys))
        cost = _WAITER_BYTES + len(w.session.session_id) + len(w.tx.description)
        cost += sum(24 + len(t) + len(v) for t, v, _ in variables)
        if len(records) == limit or (records and size + cost > PAGE_BYTES):
            return WaitersPage(records, _encode_cursor("waiters", run, q, [w.seq]))
        size += cost
        records.append(
            WaiterInfo(
                w.session.session_id,
                w.tx.namespace,
                w.tx.description,
                variables,
                w.parked_at + offset,
                w.deadline + offset,
            )
        )
    return WaitersPage(records, None)


#: Most tables :func:`busiest_tables` looks at per call. Each costs one ``len`` (a table keeps
#: its count): measured 1.4 ms for 10,000 tables and 133 ms for 1,000,000 (one entry each) on
#: the 2-core CI machine, so a store of more tables is ranked over the first ones only.
BUSIEST_SCAN: Final = 10_000


@attrs.frozen
class BusyTable:
    """A table and how many of its variables are held (by one entry or more)."""

    namespace: str
    table: str
    held: int


def busiest_tables(
    engine: Engine, n: int, visible: Visibility | None, scan: int = BUSIEST_SCAN
) -> tuple[list[BusyTable], int]:
    """The ``n`` tables holding the most variables, most first (ties: by namespace and
    table name), of the namespaces ``visible`` allows; and how many tables were looked at.
    Looks at ``scan`` tables at most, in storage order: O(min(tables, scan)), never
    O(entries). (A table's held variables are its entries when each variable has one
    holder, as with locks; readers sharing a variable count once.)"""
    looked = 0
    found: list[tuple[int, str, str]] = []
    for ns, tables in engine.store.namespaces.items():
        if visible is not None and not visible.allows(ns):
            continue
        left = scan - looked
        if left <= 0:
            break
        for name, table in itertools.islice(tables.items(), left):
            found.append((-len(table), ns, name))
        looked += min(left, len(tables))
    return [BusyTable(ns, name, -count) for count, ns, name in heapq.nsmallest(n, found)], looked


#: The listings by kind, each ``(engine, wait queue, query, visibility, run) -> page``.
LISTINGS: Final[dict[str, Callable[..., Any]]] = {
    "holders": list_holders,
    "sessions": list_sessions,
    "waiters": list_waiters,
}
