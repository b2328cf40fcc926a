"""Listing pages cost O(page), however many tables, namespaces or waiters there are (issue 30):
past SHARD_AT tables a namespace keeps them in a ShardedDict, past SHARD_AT namespaces the
store keeps those in one, and a page resumes in the one shard its cursor names; the waiters
resume from the cursor's arrival number by bisection. Shown by counting what a page copies,
never by timing; and paging still lists every item that stays exactly once."""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver.engine import ShardedDict, _eval, _sharded, _store
from lockserver.engine._sharded import StableKeys, StableMap, pair_hash, stable_hash
from lockserver.engine._store import SHARD_AT, BigTable
from lockserver.engine._waiting import ARRIVAL_RUN, Arrivals
from protocol import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    HoldersPage,
    ListQuery,
    SetVar,
    Transaction,
    WaitersPage,
)

from ._door import NS, START, Door, acquire, granted, tx

_ids = itertools.count(1)


def n() -> int:
    return next(_ids)


def answer(outs: list[Any]) -> Any:
    return outs[-1][1]


def many_tables(d: Door, count: int, *, first: int = 0, session: str = "s") -> None:
    """``session`` takes one variable in each of the tables t<first>..t<count - 1> of NS."""
    for start in range(first, count, 400):
        statements = [
            Assert(SetVar(f"t{i:05}", "v", i)) for i in range(start, min(count, start + 400))
        ]
        outs = d.execute("w", n(), session, Transaction(NS, statements), now=START)
        assert granted(answer(outs))


def holders_pages(d: Door, **query: Any) -> list[list[tuple[str, str, str]]]:
    """Every page of the holders listing as (namespace, table, var), following cursors."""
    pages = []
    cursor = None
    for _ in range(100_000):
        page = answer(d.holders("op", n(), ListQuery(cursor=cursor, **query), now=START))
        assert isinstance(page, HoldersPage), page
        pages.append([(h.namespace, h.table, h.var) for h in page.holders])
        cursor = page.cursor
        if cursor is None:
            return pages
    raise AssertionError("the cursor never ended")


class CountingDict(dict[Any, Any]):
    """A dict that counts the keys walked over it (``list(d)`` walks every key)."""

    walked: ClassVar[int] = 0

    def __iter__(self) -> Any:
        CountingDict.walked += len(self)
        return super().__iter__()


def counted(sharded: ShardedDict[Any]) -> None:
    """Make every shard of ``sharded`` a CountingDict (same keys, same order)."""
    sharded.shards = [CountingDict(shard) for shard in sharded.shards]


def test_a_namespace_of_many_tables_is_sharded_and_lists_each_entry_once() -> None:
    """At SHARD_AT tables a namespace moves into a ShardedDict; paging its holders (pages of
    every size) lists each entry exactly once, and the namespace's other operations (a
    denial, a release, ending the session) work on the sharded form."""
    d = Door()
    count = SHARD_AT + 300
    many_tables(d, SHARD_AT - 1)
    assert type(d.core.engine.namespaces[NS]) is dict  # one short of the threshold
    many_tables(d, count, first=SHARD_AT - 1)
    tables = d.core.engine.namespaces[NS]
    assert type(tables) is ShardedDict and len(tables) == count
    expected = sorted((NS, f"t{i:05}", "v") for i in range(count))
    for limit in (1000, 97):
        pages = holders_pages(d, limit=limit)
        listed = [h for page in pages for h in page]
        assert sorted(listed) == expected and len(listed) == count
    taken = d.execute("w", n(), "other", tx(Assert(SetVar("t00007", "v"))), now=START)
    assert not granted(answer(taken))
    released = tx(AnywayContinueAfter(DeleteVar("t00007", "v")))
    assert granted(answer(d.execute("w", n(), "s", released, now=START)))
    assert "t00007" not in tables and len(tables) == count - 1
    assert d.core.engine.table_count == count - 1
    d.end_session("w", n(), "s", now=START)
    assert d.core.engine.namespaces == {} and d.core.engine.table_count == 0


def test_many_namespaces_are_sharded_and_list_each_entry_once() -> None:
    """At SHARD_AT namespaces the store keeps them in a ShardedDict; paging lists each entry
    of each once, and a namespace filter finds its own."""
    d = Door()
    count = SHARD_AT + 20
    for i in range(count):
        ns = f"n{i:05}"
        assert granted(
            answer(d.execute("w", n(), "s", Transaction(ns, [Assert(SetVar("L", "v"))]), now=START))
        )
    assert type(d.core.engine.namespaces) is ShardedDict and len(d.core.engine.namespaces) == count
    listed = [h for page in holders_pages(d, limit=1000) for h in page]
    assert sorted(listed) == sorted((f"n{i:05}", "L", "v") for i in range(count))
    assert holders_pages(d, namespace="n00042") == [[("n00042", "L", "v")]]
    d.end_session("w", n(), "s", now=START)
    assert len(d.core.engine.namespaces) == 0 and d.core.engine.entry_count == 0


def test_a_page_of_a_big_namespace_walks_one_shard_not_every_table() -> None:
    """Resuming from a cursor, a page of 10 holders in a namespace of SHARD_AT + 300 tables
    walks the names of the one shard the cursor is in (and at most the next), never the
    namespace's: counted over every shard's dict."""
    d = Door()
    count = SHARD_AT + 300
    many_tables(d, count)
    tables = d.core.engine.namespaces[NS]
    assert type(tables) is ShardedDict
    counted(tables)
    biggest = max(len(shard) for shard in tables.shards)
    cursor = None
    worst = 0
    listed = 0
    for _ in range(50):
        CountingDict.walked = 0
        page = answer(d.holders("op", n(), ListQuery(limit=10, cursor=cursor), now=START))
        worst = max(worst, CountingDict.walked)
        listed += len(page.holders)
        cursor = page.cursor
    assert listed == 500
    assert worst <= 2 * biggest < count // 20  # O(shard), not O(tables)


def test_a_page_over_many_namespaces_walks_one_shard_of_them() -> None:
    """The same one level up: with SHARD_AT + 50 namespaces, a resumed page walks the names
    of one shard of the namespaces (and at most the next), never all of them."""
    d = Door()
    count = SHARD_AT + 50
    for i in range(count):
        statements = [Assert(SetVar("L", "v"))]
        d.execute("w", n(), "s", Transaction(f"n{i:05}", statements), now=START)
    namespaces = d.core.engine.namespaces
    assert type(namespaces) is ShardedDict
    counted(namespaces)
    biggest = max(len(shard) for shard in namespaces.shards)
    cursor = None
    worst = 0
    for _ in range(30):
        CountingDict.walked = 0
        page = answer(d.holders("op", n(), ListQuery(limit=7, cursor=cursor), now=START))
        worst = max(worst, CountingDict.walked)
        cursor = page.cursor
    assert cursor is not None
    assert worst <= 2 * biggest < count // 20


def test_big_namespace_changes_between_pages_never_repeat_or_lose_what_stayed() -> None:
    """In a sharded namespace, tables dropped between pages (the one the cursor names
    among them) and tables added never make an entry that stayed be listed twice or not at
    all."""
    d = Door()
    count = SHARD_AT + 100
    many_tables(d, count)
    first = answer(d.holders("op", n(), ListQuery(limit=50), now=START))
    seen = [(h.table, h.var) for h in first.holders]
    named = first.cursor
    assert named is not None
    nxt = answer(d.holders("op", n(), ListQuery(limit=1, cursor=named), now=START))
    gone = {seen[3][0], seen[10][0], nxt.holders[0].table, "t00100", "t02000"}
    statements = [AnywayContinueAfter(DeleteVar(t, "v")) for t in sorted(gone)]
    assert granted(answer(d.execute("w", n(), "s", tx(*statements), now=START)))
    added = [Assert(SetVar(f"new{i}", "v")) for i in range(300)]
    assert granted(answer(d.execute("w", n(), "s2", tx(*added), now=START)))
    cursor = named
    while cursor is not None:
        page = answer(d.holders("op", n(), ListQuery(limit=50, cursor=cursor), now=START))
        seen += [(h.table, h.var) for h in page.holders]
        cursor = page.cursor
    stayed = {(f"t{i:05}", "v") for i in range(count)} - {(t, "v") for t in gone}
    listed = [item for item in seen if item in stayed]
    assert sorted(listed) == sorted(stayed)  # each once


def test_a_cursor_whose_table_is_gone_resumes_after_the_table_before_it() -> None:
    """The failing shard layout built on purpose, whatever the hash seed: the cursor names
    the third table of a shard of a sharded namespace; that table and the shard's first one
    are dropped before the next page. Paging resumes right after the second (named by the
    cursor as the table before), so the fourth is listed; at the old index it was skipped."""
    d = Door()
    many_tables(d, SHARD_AT + 100)
    tables = d.core.engine.namespaces[NS]
    assert type(tables) is ShardedDict
    home = next(i for i, shard in enumerate(tables.shards) if len(shard) >= 4)
    first, before, named, after = list(tables.shards[home])[:4]
    walked_before = sum(len(shard) for shard in tables.shards[:home]) + 2
    page = answer(d.holders("op", n(), ListQuery(limit=walked_before), now=START))
    assert page.holders[-1].table == before
    peek = answer(d.holders("op", n(), ListQuery(limit=1, cursor=page.cursor), now=START))
    assert peek.holders[0].table == named  # the cursor names it
    dropped = tx(
        AnywayContinueAfter(DeleteVar(first, "v")), AnywayContinueAfter(DeleteVar(named, "v"))
    )
    assert granted(answer(d.execute("w", n(), "s", dropped, now=START)))
    resumed = answer(d.holders("op", n(), ListQuery(limit=1, cursor=page.cursor), now=START))
    assert [h.table for h in resumed.holders] == [after]


Item = tuple[str, str, str, str]  # namespace, table, var, session


def _take(d: Door, item: Item) -> None:
    ns, table, var, sid = item
    statements = [Assert(SetVar(table, var, allow_duplicates=True))]
    assert granted(answer(d.execute("w", n(), sid, Transaction(ns, statements), now=START)))


def _drop(d: Door, item: Item) -> None:
    ns, table, var, sid = item
    statements = [Assert(DeleteVar(table, var))]  # the session's own entry only
    assert granted(answer(d.execute("w", n(), sid, Transaction(ns, statements), now=START)))


def _addition(d: Door, data: st.DataObject, present: list[Item], k: int) -> Item | None:
    """An entry to add between pages: one more of a held variable, a new variable, table or
    namespace (a namespace dropped may come back); None when that would move a container
    from its dict to its sharded form (every key of it placed anew, in hash order: a cursor
    into it may then skip or repeat, as when a server restarts; left out here)."""
    kind = data.draw(st.integers(0, 3))
    namespaces: Any = d.core.engine.namespaces
    if kind == 3:
        ns = f"n{data.draw(st.integers(0, 7))}"
        home = namespaces.get(ns, namespaces)  # its tables, or the map it would join
        return (ns, f"new{k}", "v", "s0") if type(home) is ShardedDict else None
    if not present:
        return None
    ns, table, var, _ = data.draw(st.sampled_from(present))
    if kind == 0:
        return ns, table, var, f"x{k}"
    if kind == 1:
        return (ns, table, f"new{k}", "s0") if type(namespaces[ns][table]) is BigTable else None
    return (ns, f"new{k}", "v", "s0") if type(namespaces[ns]) is ShardedDict else None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(0, 3), st.integers(0, 2)),
        min_size=4,
        max_size=60,
        unique=True,
    ),
    st.integers(1, 6),
    st.data(),
)
def test_entries_that_stay_are_listed_once_whatever_is_dropped_or_added_between_pages(
    layout: list[tuple[int, int, int, int]], limit: int, data: st.DataObject
) -> None:
    """With every container of 2 keys or more sharded (SHARD_AT 2; 2 shards each: the
    namespaces, a namespace's tables, a table's variables, the sessions), any entries dropped
    between pages (whole variables, tables and namespaces among them, the ones the cursor
    names too) and any added (``_addition``): every entry present for the whole paging is
    listed exactly once. Only the last entry listed stays (PROTOCOL.md: when the item a
    cursor names is gone, paging resumes right after the item before it; only when both are
    gone may it skip or repeat)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_eval, "SHARD_AT", 2)  # inlined by the evaluator
        mp.setattr(_store, "SHARD_AT", 2)  # used by add_var
        mp.setattr(_sharded, "SHARDS", 2)
        d = Door()
        present: list[Item] = [(f"n{a}", f"t{b}", f"v{c}", f"s{e}") for a, b, c, e in layout]
        for item in present:
            _take(d, item)
        stayed = set(present)
        listed: list[Item] = []
        cursor: str | None = None
        added = 0
        for _ in range(10 * len(present) + 100):  # a bound: each page lists at least one
            page = answer(d.holders("op", n(), ListQuery(limit=limit, cursor=cursor), now=START))
            assert isinstance(page, HoldersPage), page
            listed += [(h.namespace, h.table, h.var, h.session) for h in page.holders]
            cursor = page.cursor
            if cursor is None:
                break
            last = listed[-1]
            droppable = [item for item in present if item != last]
            # Any entries; and entries listed already (those before the cursor in its shard,
            # whose going moves its old index, are among them)
            seen = [item for item in droppable if item in listed]
            gone: set[Item] = set()
            for pool in (droppable, seen):
                if pool:
                    gone.update(data.draw(st.lists(st.sampled_from(pool), max_size=len(pool))))
            # Often the entry the cursor names goes too, with its variable, table or namespace
            # (the case a random pick rarely hits): that entry is the next page's first.
            peek = answer(d.holders("op", n(), ListQuery(limit=1, cursor=cursor), now=START))
            if peek.holders and data.draw(st.booleans()):
                h = peek.holders[0]
                named: Item = (h.namespace, h.table, h.var, h.session)
                width = data.draw(st.integers(1, 4))  # entry, var, table, namespace
                gone |= {i for i in droppable if i[: 5 - width] == named[: 5 - width]}
            for item in sorted(gone):
                _drop(d, item)
                present.remove(item)
                stayed.discard(item)
            for _ in range(data.draw(st.integers(0, 3))):
                item = _addition(d, data, present, added)
                added += 1
                if item is not None:
                    _take(d, item)
                    present.append(item)
        assert cursor is None
        kept = [item for item in listed if item in stayed]
        assert sorted(kept) == sorted(stayed)  # each once


# --- waiters ------------------------------------------------------------------------------------


class W:
    """A stand-in waiter: only its arrival number matters to Arrivals."""

    def __init__(self, seq: int) -> None:
        self.seq = seq

    def __repr__(self) -> str:
        return f"W({self.seq})"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "add", "remove"]), st.integers(0, 10_000)),
        max_size=1500,
    ),
    st.integers(0, 1600),
)
def test_arrivals_keep_arrival_order_and_start_anywhere(
    ops: list[tuple[str, int]], since: int
) -> None:
    """Against a list in arrival order: after adds (each newcomer last) and removals of any
    waiter, ``since(seq)`` yields exactly the waiters of number ``seq`` or later, oldest
    first; no run is empty or longer than ARRIVAL_RUN, and each run's first number is kept."""
    arrivals = Arrivals()
    model: list[W] = []
    seq = 0
    for op, pick in ops:
        if op == "add":
            seq += 1
            w = W(seq)
            arrivals.add(w)
            model.append(w)
        elif model:
            w = model.pop(pick % len(model))
            arrivals.remove(w)
    assert [w.seq for run in arrivals.runs for w in run] == [w.seq for w in model]
    assert all(0 < len(run) <= ARRIVAL_RUN for run in arrivals.runs)
    assert arrivals.firsts == [run[0].seq for run in arrivals.runs]
    assert list(arrivals.since(since)) == [w for w in model if w.seq >= since]


def test_waiters_page_in_arrival_order_with_waiters_leaving_between_pages() -> None:
    """1,000 parked waiters paged 100 at a time while some leave (the cursor's own among
    them): every waiter that stayed is listed once, oldest first, with its position in its
    variable's queue."""
    d = Door()
    d.execute("H", n(), "holder", acquire("a"), now=START)
    for i in range(1000):
        d.execute("W", n(), f"w{i:04}", acquire("a"), now=START, wait=100.0)
    first = answer(d.waiters("op", n(), ListQuery(limit=100), now=START))
    assert isinstance(first, WaitersPage)
    seen = [(w.session, w.variables) for w in first.waiters]
    assert seen[:3] == [
        ("w0000", (("L", "a", 0),)),
        ("w0001", (("L", "a", 1),)),
        ("w0002", (("L", "a", 2),)),
    ]
    leaving = ["w0005", "w0100", "w0101", "w0500", "w0999"]
    for sid in leaving:
        d.end_session("W", n(), sid, now=START)
    cursor = first.cursor
    while cursor is not None:
        page = answer(d.waiters("op", n(), ListQuery(limit=100, cursor=cursor), now=START))
        seen += [(w.session, w.variables) for w in page.waiters]
        cursor = page.cursor
    sessions = [sid for sid, _ in seen]
    stayed = [f"w{i:04}" for i in range(1000) if f"w{i:04}" not in leaving]
    assert [sid for sid in sessions if sid in stayed] == stayed
    later = [variables for sid, variables in seen[100:]]
    assert later[0] == (("L", "a", 99),)  # w0102, behind 99 others (w0005, w0100, w0101 left)


# --- one session's index, and the sessions listing ---------------------------------------------


@attrs.frozen
class View:
    """A principal's view: its own sessions, and the namespace ``allowed`` only."""

    name: str
    allowed: str = NS

    def allows(self, namespace: str) -> bool:
        return namespace == self.allowed


def test_a_session_in_many_tables_keeps_a_stable_map_and_pages_one_shard_of_it() -> None:
    """At SHARD_AT groups a session's index moves into a StableMap; its holders listing
    lists each entry once, resuming in one shard of the index (counted), and ending the
    session releases them all (and drops the namespace)."""
    d = Door()
    count = SHARD_AT + 300
    many_tables(d, SHARD_AT - 1)
    assert type(d.core.engine.sessions["s"].keys) is dict  # one short of the threshold
    many_tables(d, count, first=SHARD_AT - 1)
    keys = d.core.engine.sessions["s"].keys
    assert type(keys) is StableMap and len(keys) == count
    listed = [h for page in holders_pages(d, session="s", limit=1000) for h in page]
    assert sorted(listed) == sorted((NS, f"t{i:05}", "v") for i in range(count))
    keys.shards = [CountingDict(shard) for shard in keys.shards]
    biggest = max(len(shard) for shard in keys.shards)
    cursor = None
    worst = 0
    for _ in range(40):
        CountingDict.walked = 0
        query = ListQuery(session="s", limit=10, cursor=cursor)
        page = answer(d.holders("op", n(), query, now=START))
        worst = max(worst, CountingDict.walked)
        cursor = page.cursor
    assert worst <= 2 * biggest < count // 20
    d.end_session("w", n(), "s", now=START)
    assert d.core.engine.entry_count == 0 and d.core.engine.namespaces == {}


def test_a_session_seen_only_late_in_its_groups_is_found_across_pages() -> None:
    """Another principal's session holding 12,000 tables of a namespace the viewer may not
    use and then one it may: pages stop after PAGE_SCAN looks inside its groups (a cursor
    into them, never one walk of all) and a later page lists it once; without the visible
    table, paging ends without it."""
    d = Door(authenticated=True)
    hidden = 12_000
    for start in range(0, hidden, 400):
        statements = [Assert(SetVar(f"t{i:05}", "v")) for i in range(start, start + 400)]
        outs = d.execute(
            "B", n(), "theirs", Transaction("secret", statements), now=START, principal="p2"
        )
        assert granted(answer(outs))
    view = View("p1")

    def pages() -> list[list[str]]:
        out = []
        cursor = None
        for _ in range(100):
            query = ListQuery(cursor=cursor)
            listing = answer(d.sessions("op", n(), query, now=START, visible=view))
            out.append([r.session for r in listing.page.sessions])
            cursor = listing.page.cursor
            if cursor is None:
                return out
        raise AssertionError("the cursor never ended")

    assert pages() == [[], [], []]  # 12,001 looks: PAGE_SCAN, PAGE_SCAN, the rest
    keys = d.core.engine.sessions["theirs"].keys
    assert type(keys) is StableMap
    late = next(  # a table of NS that comes last in the session's order
        f"late{i}"
        for i in itertools.count()
        if pair_hash((NS, f"late{i}")) & keys.mask == keys.mask
    )
    outs = d.execute("B", n(), "theirs", tx(Assert(SetVar(late, "v"))), now=START, principal="p2")
    assert granted(answer(outs)) and list(keys)[-1] == (NS, late)
    assert pages() == [[], [], ["theirs"]]


def test_a_var_filter_over_a_big_group_goes_on_across_pages() -> None:
    """The sessions listing with a var filter looks at a big group's variables (a
    StableKeys of 12,001) PAGE_SCAN at a time, going on in the group from where a page
    stopped: the one variable that matches, in the group's last shard, is found, once."""
    d = Door()
    statements = [Assert(SetVar("L", f"v{i:05}")) for i in range(12_000)]
    for start in range(0, 12_000, 400):
        outs = d.execute("w", n(), "big", tx(*statements[start : start + 400]), now=START)
        assert granted(answer(outs))
    group = d.core.engine.sessions["big"].keys[NS, "L"]
    assert type(group) is StableKeys
    name = next(
        f"match-{i}"
        for i in itertools.count()
        if stable_hash(f"match-{i}") & group.mask == group.mask
    )
    assert granted(answer(d.execute("w", n(), "big", tx(Assert(SetVar("L", name))), now=START)))
    assert list(group)[-1] == name
    found = []
    cursor = None
    for _ in range(20):
        query = ListQuery(var="match", cursor=cursor)
        listing = answer(d.sessions("op", n(), query, now=START))
        found.append([r.session for r in listing.page.sessions])
        cursor = listing.page.cursor
        if cursor is None:
            break
    assert found == [[], [], ["big"]]  # 12,003 looks: PAGE_SCAN, PAGE_SCAN, the rest
