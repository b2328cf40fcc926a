"""The door's operator calls (issue 16): listings with their filters, pages and cursors; the
holders a denial names; force-release; the change feed. Pure: a LockCore, explicit ``now``,
owners as strings. Times in records are wall clock: the core here starts at engine time 0
with a fence epoch of 1,000 s, so wall = engine time + 1,000."""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest

from lockserver.engine import EngineError, SessionsListing
from lockserver.engine._core import MAX_SUBSCRIPTIONS
from lockserver.engine._inspect import _encode_cursor
from protocol import (
    MAX_HOLDERS,
    PAGE_BYTES,
    PAGE_SCAN,
    AnywayContinueAfter,
    Assert,
    CountBelow,
    DeleteVar,
    ErrorCode,
    Exists,
    FeedEvent,
    FeedKind,
    HoldersPage,
    ListQuery,
    LostReason,
    Not,
    Released,
    SessionSpec,
    SetVar,
    Subscribed,
    Transaction,
    TransactionResult,
    Unsubscribed,
    WaitersPage,
)

from ._door import NS, START, Door, acquire, granted, lost, release, spec, tx

_ids = itertools.count(1)


def n() -> int:
    """A fresh request id (the Door checks that no request is answered twice)."""
    return next(_ids)


EPOCH = 1_000_000_000  # µs: the core's wall clock at start is 1,000 s
WALL = 1_000.0


def door(**kwargs: Any) -> Door:
    return Door(fence_epoch=EPOCH, **kwargs)


def answer(outs: list[Any]) -> Any:
    """The payload of the last output (the request's own answer)."""
    return outs[-1][1]


def holders(d: Door, now: float = START, **query: Any) -> HoldersPage:
    page = answer(d.holders("op", n(), ListQuery(**query), now=now))
    assert isinstance(page, HoldersPage), page
    return page


def in_ns(namespace: str, *statements: Any) -> Transaction:
    """A transaction in another namespace than NS."""
    return Transaction(namespace, statements)


def fill(d: Door, count: int, *, table: str = "L", session: str = "s", now: float = START) -> None:
    """``session`` takes ``count`` mutexes ``table``/v0000.. in one transaction."""
    statements = [Assert(SetVar(table, f"v{i:04}", i)) for i in range(count)]
    assert granted(answer(d.execute("w", n(), session, tx(*statements), now=now)))


# --- holders ------------------------------------------------------------------------------------


def test_a_holder_record_says_who_what_since_when_in_wall_clock_time() -> None:
    """A holder record carries namespace, table, var, session and its description, the
    entry's value and description, acquired_at / expires_at as wall-clock seconds (engine time
    + the start offset), and the fence."""
    d = door()
    session = SessionSpec("s1", 60.0, "worker-7 pid 4411")
    statement = Assert(SetVar("L", "k", "ticket", description="nightly", ttl=30))
    outs = d.execute("A", n(), session, tx(statement), now=START + 2.5)
    fence = answer(outs).fence
    [h] = holders(d, now=START + 3).holders
    assert attrs.astuple(h) == (
        NS,
        "L",
        "k",
        "s1",
        "worker-7 pid 4411",
        "ticket",
        "nightly",
        WALL + 2.5,
        WALL + 32.5,
        fence,
    )


def test_filters_namespace_table_var_prefixes_session_and_match() -> None:
    """Each filter narrows the listing alone: namespace exactly, table and var by prefix,
    session exactly, match as a substring of the session's or the entry's description."""
    d = door()
    d.execute(
        "A",
        n(),
        SessionSpec("a", 60.0, "alpha worker"),
        tx(Assert(SetVar("jobs", "x1"))),
        now=START,
    )
    d.execute(
        "A",
        n(),
        SessionSpec("b", 60.0, "beta"),
        tx(Assert(SetVar("jobs", "y1", description="nightly build"))),
        now=START,
    )
    d.execute("A", n(), "c", tx(Assert(SetVar("locks", "x2"))), now=START)
    d.execute("A", n(), "c", in_ns("other", Assert(SetVar("jobs", "x3"))), now=START)

    def keys(**query: Any) -> list[tuple[str, str, str, str]]:
        return [(h.namespace, h.table, h.var, h.session) for h in holders(d, **query).holders]

    assert len(keys()) == 4
    assert keys(namespace="other") == [("other", "jobs", "x3", "c")]
    assert keys(namespace="missing") == []
    assert keys(namespace=NS, table="jo") == [(NS, "jobs", "x1", "a"), (NS, "jobs", "y1", "b")]
    assert keys(var="x") == [
        (NS, "jobs", "x1", "a"),
        (NS, "locks", "x2", "c"),
        ("other", "jobs", "x3", "c"),
    ]
    assert keys(session="c") == [(NS, "locks", "x2", "c"), ("other", "jobs", "x3", "c")]
    assert keys(match="alpha") == [(NS, "jobs", "x1", "a")]  # the session's description
    assert keys(match="nightly") == [(NS, "jobs", "y1", "b")]  # the entry's description
    assert keys(namespace=NS, table="jobs", var="y", match="beta") == [(NS, "jobs", "y1", "b")]


def page_through(d: Door, call: str, now: float = START, **query: Any) -> list[list[Any]]:
    """Every page of a listing, following cursors (bounded: a loop would fail)."""
    pages: list[list[Any]] = []
    cursor = None
    for _ in range(10_000):
        outs = getattr(d, call)("op", n(), ListQuery(cursor=cursor, **query), now=now)
        page = answer(outs)
        if isinstance(page, SessionsListing):
            page = page.page
        records = (
            page.holders
            if call == "holders"
            else (page.sessions if call == "sessions" else page.waiters)
        )
        pages.append(list(records))
        cursor = page.cursor
        if cursor is None:
            return pages
    raise AssertionError("the cursor never ended")


def test_pagination_edges_empty_exactly_one_page_one_more_and_limits() -> None:
    """An empty listing is one empty page without cursor; exactly ``limit`` records are one
    page without cursor (no empty page after it); one more is a second page of one; the
    default page is 100; a page of the maximum (1,000) holds 1,000."""
    d = door()
    assert page_through(d, "holders") == [[]]
    fill(d, 5)
    assert [len(p) for p in page_through(d, "holders", limit=5)] == [5]
    assert [len(p) for p in page_through(d, "holders", limit=4)] == [4, 1]
    assert [len(p) for p in page_through(d, "holders", limit=1)] == [1] * 5
    d2 = door()
    fill(d2, 1000, session="big")
    fill(d2, 1, table="M", session="other")
    assert [len(p) for p in page_through(d2, "holders")] == [100] * 10 + [1]
    assert [len(p) for p in page_through(d2, "holders", limit=1000)] == [1000, 1]
    listed = [h.var for page in page_through(d2, "holders", limit=7) for h in page]
    assert listed == [f"v{i:04}" for i in range(1000)] + ["v0000"]


def test_a_page_past_the_maximum_size_cannot_even_be_asked_for() -> None:
    """``limit`` above MAX_PAGE (1,000) or below 1 is refused where the request is built (the
    codec turns that into INVALID_MESSAGE: tests/protocol)."""
    with pytest.raises(ValueError, match=r"limit must be an integer in 1\.\.1000"):
        ListQuery(limit=1001)
    with pytest.raises(ValueError, match="limit"):
        ListQuery(limit=0)


def test_changes_between_pages_never_repeat_or_lose_an_entry_that_stayed() -> None:
    """Entries that stay held the whole time are listed exactly once, whatever is added or
    removed between pages (including the entry the cursor names: then paging resumes at its
    old position)."""
    d = door()
    fill(d, 50)
    q = ListQuery(limit=10)
    first = answer(d.holders("op", n(), q, now=START))
    seen = [(h.table, h.var) for h in first.holders]
    # remove two listed entries and the one the cursor names (v0010), add new ones
    statements = [AnywayContinueAfter(DeleteVar("L", v)) for v in ("v0002", "v0005", "v0010")]
    d.execute("w", n(), "s", tx(*statements), now=START + 1)
    fill(d, 3, table="L2", session="new", now=START + 1)
    cursor = first.cursor
    while cursor is not None:
        page = answer(d.holders("op", n(), ListQuery(limit=10, cursor=cursor), now=START + 1))
        seen += [(h.table, h.var) for h in page.holders]
        cursor = page.cursor
    stayed = [f"v{i:04}" for i in range(50) if i not in (2, 5, 10)]
    assert [v for t, v in seen if t == "L" and v in stayed] == stayed  # once each, in order


def test_bad_cursors_are_refused_precisely() -> None:
    """A cursor that is not base64/JSON of ours, one of another listing, one made for other
    filters and one of another server run are each refused with INVALID_MESSAGE naming why;
    nothing else happens."""
    d = door()
    fill(d, 3)
    good = answer(d.holders("op", n(), ListQuery(limit=1), now=START)).cursor
    assert good is not None

    def refusal(call: str, **query: Any) -> str:
        payload = answer(getattr(d, call)("op", n(), ListQuery(**query), now=START))
        assert isinstance(payload, EngineError), payload
        assert payload.code is ErrorCode.INVALID_MESSAGE
        return payload.message

    assert "not a cursor of this server" in refusal("holders", cursor="garbage!")
    assert "not a cursor of this server" in refusal("holders", cursor="W10=")  # "[]"
    assert "a 'holders' listing, not 'waiters'" in refusal("waiters", limit=1, cursor=good)
    assert "other filters" in refusal("holders", limit=1, namespace=NS, cursor=good)
    position = [0, 0, NS, "", 0, 0, "L", "", 0, 1, "v0001", "v0000", 0, "s", ""]
    other_run = _encode_cursor("holders", EPOCH + 1, ListQuery(limit=1), position)
    assert "another run of the server" in refusal("holders", limit=1, cursor=other_run)
    negative = [0, 0, NS, "", 0, -1, "L", "", 0, 1, "v", "", 0, "s", ""]
    shape = _encode_cursor("holders", EPOCH, ListQuery(limit=1), negative)
    assert "not a cursor of this server" in refusal("holders", limit=1, cursor=shape)


def test_a_narrow_filter_over_a_big_table_costs_each_page_a_bounded_scan() -> None:
    """A filter that matches nothing in a table bigger than PAGE_SCAN still answers each page
    after PAGE_SCAN looks, with a cursor, until the end: never one walk of everything."""
    d = door()
    total = PAGE_SCAN + 500
    for start in range(0, total, 1000):
        statements = [
            Assert(SetVar("L", f"v{i:06}")) for i in range(start, min(total, start + 1000))
        ]
        d.execute("w", n(), f"s{start}", tx(*statements), now=START)
    pages = page_through(d, "holders", match="nobody")
    assert pages == [[], []]  # PAGE_SCAN looked at, then the rest


def test_listings_see_only_what_the_principal_may_use() -> None:
    """With a visibility (a principal's namespaces), holders and waiters outside them are not
    listed, and sessions are listed when they are the principal's own or hold entries in a
    namespace it may use."""

    @attrs.frozen
    class View:
        name: str

        def allows(self, namespace: str) -> bool:
            return namespace == NS

    d = door(authenticated=True)
    d.execute(
        "A", n(), "mine", in_ns("secret", Assert(SetVar("L", "x"))), now=START, principal="p1"
    )
    d.execute(
        "B", n(), "theirs", in_ns("secret", Assert(SetVar("L", "y"))), now=START, principal="p2"
    )
    d.execute("B", n(), "open", acquire(), now=START, principal="p2")
    view = View("p1")
    assert [
        h.session
        for h in answer(d.holders("op", n(), ListQuery(), now=START, visible=view)).holders
    ] == ["open"]
    listing = answer(d.sessions("op", n(), ListQuery(), now=START, visible=view))
    assert sorted(s.session for s in listing.page.sessions) == ["mine", "open"]
    assert len(answer(d.holders("op", n(), ListQuery(), now=START)).holders) == 3  # no view: all


# --- sessions and waiters -------------------------------------------------------------------------


def test_a_session_record_and_the_owners_that_used_it() -> None:
    """A session record: id, description, principal, created / last touch / valid until in
    wall clock, max age, entries held, waiters parked; the listing names the owners that used
    it (the shell turns them into addresses)."""
    d = door(authenticated=True)
    s = SessionSpec("s1", 30.0, "worker-7")
    d.execute("A", n(), s, acquire("a"), now=START + 1, principal="p")
    d.execute("B", n(), s, acquire("b"), now=START + 4, principal="p")
    d.execute("C", n(), "other", acquire("c"), now=START + 4, principal="p")
    d.execute("C", n(), "other", acquire("b"), now=START + 5, wait=10.0, principal="p")
    listing = answer(d.sessions("op", n(), ListQuery(session="s1"), now=START + 6))
    assert isinstance(listing, SessionsListing)
    [record] = listing.page.sessions
    assert attrs.astuple(record) == (
        "s1",
        "worker-7",
        "p",
        (),
        WALL + 1,
        WALL + 4,
        30.0,
        WALL + 34,
        2,
        0,
    )
    assert listing.owners == (("A", "B"),)
    other = answer(d.sessions("op", n(), ListQuery(session="other"), now=START + 6)).page.sessions
    assert (other[0].entries, other[0].waiters) == (1, 1)
    by_match = answer(d.sessions("op", n(), ListQuery(match="worker"), now=START + 6)).page.sessions
    assert [r.session for r in by_match] == ["s1"]
    by_var = answer(
        d.sessions("op", n(), ListQuery(namespace=NS, table="L", var="b"), now=START + 6)
    )
    assert [r.session for r in by_var.page.sessions] == ["s1"]


def test_sessions_page_through_all_of_them() -> None:
    """Paging sessions lists each live session once (they live in shards: hash order)."""
    d = door()
    for i in range(250):
        d.execute("A", n(), f"s{i}", acquire(f"v{i}"), now=START)
    listed = [r.session for page in page_through(d, "sessions", limit=33) for r in page]
    assert sorted(listed) == sorted(f"s{i}" for i in range(250))


def test_a_waiter_record_with_its_position_in_each_queue() -> None:
    """A waiter: session, namespace, the transaction's description, each variable it waits on
    with its position in that variable's queue (0: oldest), since and deadline in wall clock;
    waiters page in arrival order and filter like holders."""
    d = door()
    d.execute("H", n(), "holder", acquire("a"), now=START)
    d.execute("W", n(), "w1", acquire("a"), now=START + 1, wait=10.0)
    d.execute(
        "W",
        n(),
        "w2",
        tx(Assert(SetVar("L", "a")), Assert(SetVar("L", "b")), description="two"),
        now=START + 2,
        wait=20.0,
    )
    page = answer(d.waiters("op", n(), ListQuery(), now=START + 3))
    assert isinstance(page, WaitersPage)
    first, second = page.waiters
    assert attrs.astuple(first) == ("w1", NS, "", (("L", "a", 0),), WALL + 1, WALL + 11)
    assert attrs.astuple(second) == (
        "w2",
        NS,
        "two",
        (("L", "a", 1), ("L", "b", 0)),
        WALL + 2,
        WALL + 22,
    )
    assert list(page_through(d, "waiters", limit=1)) == [[first], [second]]
    assert answer(d.waiters("op", n(), ListQuery(var="b"), now=START + 3)).waiters == (second,)
    assert answer(d.waiters("op", n(), ListQuery(match="two"), now=START + 3)).waiters == (second,)
    assert answer(d.waiters("op", n(), ListQuery(session="w1"), now=START + 3)).waiters == (first,)
    assert answer(d.waiters("op", n(), ListQuery(namespace="x"), now=START + 3)).waiters == ()


def test_listings_expire_what_is_due_first() -> None:
    """A listing never shows an entry or session whose time has passed: the call expires
    them first (and its outputs carry the losses)."""
    d = door()
    d.execute("A", n(), spec("s", 5.0), acquire(), now=START)
    outs = d.holders("op", n(), ListQuery(), now=START + 6)
    assert outs[0] == (
        ("A", None),
        lost("s", LostReason.EXPIRED, (NS, "L", "k", outs[0][1].entries[0][3])),
    )
    assert answer(outs).holders == ()


# --- denial holders -----------------------------------------------------------------------------


def test_a_denied_acquire_names_the_holder() -> None:
    """An exclusive SetVar that fails names the entry in its way; a grant names nobody."""
    d = door()
    ok = answer(d.execute("A", n(), SessionSpec("s1", 60.0, "worker-7"), acquire(), now=START + 1))
    assert ok.ok and ok.holders == ()
    denied = answer(d.execute("B", n(), "s2", acquire(), now=START + 2))
    assert not denied.ok
    [h] = denied.holders
    assert (h.session, h.session_description, h.fence, h.acquired_at) == (
        "s1",
        "worker-7",
        ok.fence,
        WALL + 1,
    )


def test_denial_holders_follow_the_operator_that_failed() -> None:
    """Not(Exists(value)) names only the entries with that value, and not the caller's own
    (ignore_this_session); CountBelow names the entries it counted; a failing Exists (nothing
    there) and an Abort name nobody; at most MAX_HOLDERS are named."""
    d = door()
    d.execute("A", n(), "p1", tx(Assert(SetVar("T", "f", "P1", allow_duplicates=True))), now=START)
    d.execute("A", n(), "p2", tx(Assert(SetVar("T", "f", "P2", allow_duplicates=True))), now=START)
    d.execute("A", n(), "me", tx(Assert(SetVar("T", "f", "P1", allow_duplicates=True))), now=START)
    r = answer(d.execute("A", n(), "me", tx(Assert(Not(Exists("T", "f", "P1")))), now=START))
    assert [h.session for h in r.holders] == ["p1"]
    r = answer(d.execute("A", n(), "x", tx(Assert(CountBelow("T", "f", 2))), now=START))
    assert [h.session for h in r.holders] == ["p1", "p2", "me"]
    r = answer(d.execute("A", n(), "x", tx(Assert(Exists("T", "nothing"))), now=START))
    assert r.holders == ()
    for i in range(12):
        d.execute(
            "A", n(), f"m{i}", tx(Assert(SetVar("M", "many", allow_duplicates=True))), now=START
        )
    r = answer(d.execute("A", n(), "x", tx(Assert(SetVar("M", "many"))), now=START))
    assert len(r.holders) == MAX_HOLDERS


def test_denial_holders_leave_out_the_transactions_own_uncommitted_entries() -> None:
    """A transaction that sets a variable and then fails on it names no entry it made itself
    (rolled back: it never existed)."""
    d = door()
    r = answer(
        d.execute("A", n(), "s", tx(Assert(SetVar("L", "k")), Assert(SetVar("L", "k"))), now=START)
    )
    assert r.failed_statement == "1:/AssertOp/" and r.holders == ()


def test_a_timed_out_waiter_is_answered_with_the_holders_of_its_last_try() -> None:
    """A parked acquire whose wait runs out is answered with its last failure: it names who
    held the lock then."""
    d = door()
    d.execute("A", n(), SessionSpec("h", 60.0, "holder"), acquire(), now=START)
    assert d.execute("B", n(), "w", acquire(), now=START + 1, wait=2.0) == []
    [(_, result)] = d.advance(START + 3)
    assert isinstance(result, TransactionResult) and not result.ok
    assert [h.session_description for h in result.holders] == ["holder"]


# --- force-release ------------------------------------------------------------------------------


def test_force_release_wakes_the_waiter_and_tells_the_holder() -> None:
    """Force-releasing a held mutex: the holder's owners hear lost(released), the oldest
    waiter is granted, the operator gets Released(1, fence) with the new fence; the holder's
    session lives on (and keeps hearing of its other entries)."""
    d = door()
    fence = answer(d.execute("A", n(), "h", acquire(), now=START)).fence
    d.execute("A", n(), "h", acquire("other"), now=START)
    assert d.execute("B", n(), "w", acquire(), now=START + 1, wait=10.0) == []
    outs = d.release("op", n(), "L", "k", now=START + 2)
    assert [(a[0], a[1] is None) for a, _ in outs] == [("B", False), ("A", True), ("op", False)]
    assert granted(outs[0][1])
    assert outs[1][1] == lost("h", LostReason.RELEASED, (NS, "L", "k", fence))
    released = outs[2][1]
    assert isinstance(released, Released) and released.entries == 1
    assert released.fence > fence and outs[0][1].fence > released.fence
    assert "h" in d.core.engine.sessions
    assert d.release("op", n(), "L", "other", now=START + 3)[0][0] == ("A", None)


def test_force_release_of_one_session_leaves_the_others() -> None:
    """With a session, only that session's entry of the variable goes; unknown variables and
    sessions release nothing (Released(0) with the unchanged fence)."""
    d = door()
    for sid in ("r1", "r2"):
        d.execute("A", n(), sid, tx(Assert(SetVar("R", "doc", allow_duplicates=True))), now=START)
    fence = d.core.engine.fence
    outs = d.release("op", n(), "R", "doc", "r1", now=START)
    assert answer(outs).entries == 1
    assert [h.session for h in holders(d).holders] == ["r2"]
    assert answer(d.release("op", n(), "R", "doc", "nobody", now=START)) == Released(0, fence + 1)
    assert answer(d.release("op", n(), "R", "none", now=START)) == Released(0, fence + 1)


# --- the feed -----------------------------------------------------------------------------------


def feed(outs: list[Any]) -> list[tuple[Any, ...]]:
    """(owner, subscription id, kind, table, var, session, reason) of each feed event: a
    change's one FeedEvent is shared by its outputs, each addressed (owner, subscription)."""
    return [
        (address[0], address[1], e.kind, e.table, e.var, e.session, e.reason)
        for address, e in outs
        if isinstance(e, FeedEvent)
    ]


def test_the_feed_reports_grants_releases_expiries_losses_and_kills() -> None:
    """A subscriber of a namespace hears every change of its entries: a grant, its holder's
    release, a TTL and a session expiry, a force-release and an end, each with the entry, the
    session and the wall-clock time; a table subscription hears only that table."""
    d = door()
    assert d.subscribe("S", 7) == [(("S", 7), Subscribed(7))]
    d.subscribe("T", 8, NS, "M")
    out = d.execute("A", n(), "a", acquire(), now=START + 1)
    assert feed(out) == [("S", 7, FeedKind.GRANTED, "L", "k", "a", None)]
    event = out[-1][1]
    assert event.at == WALL + 1 and event.fence == answer(out[:1]).fence
    assert feed(d.execute("A", n(), "a", release(), now=START + 2)) == [
        ("S", 7, FeedKind.RELEASED, "L", "k", "a", None)
    ]
    d.execute("A", n(), "a", tx(Assert(SetVar("M", "t", ttl=1))), now=START + 3)
    assert feed(d.advance(START + 5)) == [
        ("S", 7, FeedKind.EXPIRED, "M", "t", "a", "ttl"),
        ("T", 8, FeedKind.EXPIRED, "M", "t", "a", "ttl"),
    ]
    d.execute("A", n(), spec("b", 3), acquire(), now=START + 5)
    assert feed(d.advance(START + 9)) == [("S", 7, FeedKind.EXPIRED, "L", "k", "b", "expired")]
    d.execute("A", n(), "c", acquire(), now=START + 10)
    assert feed(d.release("op", n(), "L", "k", now=START + 10)) == [
        ("S", 7, FeedKind.LOST, "L", "k", "c", "released")
    ]
    d.execute("A", n(), "c", acquire(), now=START + 11)
    assert feed(d.end_session("A", n(), "c", now=START + 12)) == [
        ("S", 7, FeedKind.KILLED, "L", "k", "c", "ended")
    ]


def test_unsubscribe_and_owner_gone_end_the_feed() -> None:
    """Unsubscribe ends a subscription (found or not); an owner that goes loses its
    subscriptions; with none left nothing is logged any more."""
    d = door()
    d.subscribe("S", 1)
    d.subscribe("S", 2, "other")
    assert d.unsubscribe("S", 3, 1) == [(("S", 3), Unsubscribed(True))]
    assert d.unsubscribe("S", 4, 1) == [(("S", 4), Unsubscribed(False))]
    assert feed(d.execute("A", n(), "a", acquire(), now=START)) == []
    d.owner_gone("S", now=START)
    assert d.core.engine.feed_log is None and d.core.engine.feed_namespaces == {}


def test_subscriptions_are_bounded_per_owner_and_ids_are_unique() -> None:
    """An owner may hold MAX_SUBSCRIPTIONS subscriptions; one more is TOO_LARGE, a live id
    again is DUPLICATE_REQUEST_ID."""
    d = door()
    for i in range(MAX_SUBSCRIPTIONS):
        assert answer(d.subscribe("S", i)) == Subscribed(i)
    assert answer(d.subscribe("S", 999)).code is ErrorCode.TOO_LARGE
    assert answer(d.subscribe("S2", 5)) == Subscribed(5)
    d.unsubscribe("S2", 6, 5)
    d.subscribe("S2", 7)
    assert answer(Door(fence_epoch=0).subscribe("X", 1)) == Subscribed(1)
    d3 = door()
    d3.subscribe("S", 1)
    assert answer(d3.core.subscribe("S", 1, NS, None)).code is ErrorCode.DUPLICATE_REQUEST_ID


def test_subscriptions_are_capped_in_all() -> None:
    """max_subscriptions = 5 over every owner: the 6th is TOO_LARGE naming the setting and
    changes nothing; an unsubscribe and an owner gone give theirs back."""
    d = Door(max_subscriptions=5)
    for i in range(3):
        assert answer(d.subscribe("A", i)) == Subscribed(i)
    for i in range(2):
        assert answer(d.subscribe("B", i, NS, "t")) == Subscribed(i)
    refused = answer(d.subscribe("C", 1))
    assert refused.code is ErrorCode.TOO_LARGE and "max_subscriptions=5" in refused.message
    assert d.core.subscription_counts("") == (5, 5)
    assert feed(d.execute("W", n(), "w", tx(Assert(SetVar("t", "x"))), now=START)) == [
        ("A", 0, FeedKind.GRANTED, "t", "x", "w", None),
        ("A", 1, FeedKind.GRANTED, "t", "x", "w", None),
        ("A", 2, FeedKind.GRANTED, "t", "x", "w", None),
        ("B", 0, FeedKind.GRANTED, "t", "x", "w", None),
        ("B", 1, FeedKind.GRANTED, "t", "x", "w", None),
    ]
    d.unsubscribe("A", 10, 0)
    assert answer(d.subscribe("C", 2)) == Subscribed(2)
    d.owner_gone("B", now=START)
    assert d.core.subscription_counts("") == (3, 3)
    assert answer(d.subscribe("C", 3)) == Subscribed(3)


def test_subscriptions_are_capped_per_principal_with_authentication() -> None:
    """Authenticated, max_subscriptions_per_principal = 2: each principal's owners together
    hold 2, one more is TOO_LARGE naming the principal and the setting; another principal is
    not held back. Without authentication the per-principal cap does not apply."""
    d = Door(authenticated=True, max_subscriptions_per_principal=2)
    core = d.core
    assert answer(core.subscribe("A1", 1, NS, None, "alice")) == Subscribed(1)
    assert answer(core.subscribe("A2", 1, NS, "t", "alice")) == Subscribed(1)
    refused = answer(core.subscribe("A2", 2, NS, None, "alice"))
    assert refused.code is ErrorCode.TOO_LARGE
    assert "'alice'" in refused.message and "max_subscriptions_per_principal=2" in refused.message
    assert answer(core.subscribe("B1", 1, NS, None, "bob")) == Subscribed(1)
    assert core.subscription_counts("alice") == (2, 3)
    core.owner_gone("A1", now=START, trust=1.0)
    assert answer(core.subscribe("A2", 3, NS, None, "alice")) == Subscribed(3)
    open_door = Door(max_subscriptions_per_principal=2).core
    for i in range(5):
        assert answer(open_door.subscribe("X", i, NS, None, "")) == Subscribed(i)


def test_a_change_is_one_event_shared_by_its_subscriptions() -> None:
    """One change heard by three subscriptions is three outputs of the SAME FeedEvent object
    (subscription 0), addressed (owner, subscription id): the namespace's first, then the
    table's, each in subscribe order; a subscription to another table hears nothing."""
    d = door()
    d.subscribe("T", 5, NS, "L")
    d.subscribe("S", 7)
    d.subscribe("U", 9, NS, "M")
    d.subscribe("S", 8)
    outs = d.execute("A", n(), "a", acquire(), now=START)
    outs = [o for o in outs if isinstance(o[1], FeedEvent)]
    assert [address for address, _ in outs] == [("S", 7), ("S", 8), ("T", 5)]
    events = {id(event) for _, event in outs}
    assert len(events) == 1 and outs[0][1].subscription == 0


def test_a_page_stops_at_its_byte_bound() -> None:
    """Records with big values end a page before ``limit`` once PAGE_BYTES is reached (the
    reply stays far below a frame's 1 MiB); the cursor carries on and every entry is listed
    once."""
    d = door()
    big = "x" * 60_000
    for i in range(20):
        d.execute("w", n(), f"s{i}", tx(Assert(SetVar("B", f"v{i:02}", big))), now=START)
    pages = page_through(d, "holders", limit=1000)
    assert len(pages) > 1
    for page in pages:
        assert sum(len(h.value) for h in page) <= PAGE_BYTES
    assert [h.var for page in pages for h in page] == [f"v{i:02}" for i in range(20)]


def test_a_session_filter_walks_only_that_sessions_entries() -> None:
    """With a session filter the listing walks the session's own index: its 2,500 entries
    page as 1,000 + 1,000 + 500 in the order it took them, while 20,000 entries of others
    cost those pages nothing (no page comes back empty after PAGE_SCAN looks); a cursor
    survives the session taking and dropping entries between pages; other filters still
    apply."""
    d = door()
    for i in range(0, 20_000, 1000):
        statements = [Assert(SetVar("Big", f"o{j:05}")) for j in range(i, i + 1000)]
        d.execute("w", n(), f"other{i}", tx(*statements), now=START)
    for table in ("T1", "T2", "T3"):
        statements = [
            Assert(SetVar(table, f"v{j:04}")) for j in range(834 if table != "T3" else 832)
        ]
        d.execute("w", n(), "me", tx(*statements), now=START)
    pages = page_through(d, "holders", session="me", limit=1000)
    assert [len(p) for p in pages] == [1000, 1000, 500]
    listed = [(h.table, h.var) for p in pages for h in p]
    assert listed[0] == ("T1", "v0000") and listed[-1] == ("T3", "v0831")
    assert len(set(listed)) == 2500 and {h.session for p in pages for h in p} == {"me"}
    first = answer(d.holders("op", n(), ListQuery(session="me", limit=10), now=START))
    d.execute("w", n(), "me", tx(AnywayContinueAfter(DeleteVar("T1", "v0003"))), now=START)
    rest = answer(
        d.holders("op", n(), ListQuery(session="me", limit=10, cursor=first.cursor), now=START)
    )
    assert [h.var for h in rest.holders][:2] == ["v0010", "v0011"]
    only_t2 = page_through(d, "holders", session="me", table="T2", var="v08", limit=1000)
    assert [h.var for p in only_t2 for h in p] == [f"v{j:04}" for j in range(800, 834)]
    assert page_through(d, "holders", session="nobody") == [[]]


def test_a_session_filter_pages_a_big_group_in_its_order() -> None:
    """A session holding SHARD_AT + 600 variables in one table (a StableKeys group) and a few
    in another: its listing pages them 1,000 at a time, each once, in the group's order; a
    cursor survives the variable it names and others being released between pages."""
    from lockserver.engine._sharded import StableKeys, stable_hash
    from lockserver.engine._store import SHARD_AT

    d = door()
    count = SHARD_AT + 600
    for i in range(0, count, 1000):
        statements = [Assert(SetVar("Big", f"v{j:05}")) for j in range(i, min(i + 1000, count))]
        assert answer(d.execute("w", n(), "me", tx(*statements), now=START)).ok
    assert answer(d.execute("w", n(), "me", tx(Assert(SetVar("Small", "s"))), now=START)).ok
    assert type(d.core.engine.sessions["me"].keys[NS, "Big"]) is StableKeys
    group = list(d.core.engine.sessions["me"].keys[NS, "Big"])
    pages = page_through(d, "holders", session="me", limit=1000)
    assert [len(p) for p in pages] == [1000] * (count // 1000) + [count % 1000 + 1]
    assert [h.var for p in pages for h in p] == [*group, "s"]
    first = answer(d.holders("op", n(), ListQuery(session="me", limit=1000), now=START))
    named, before = group[1000], group[10]  # the cursor's variable, and one listed already
    release_both = tx(*(AnywayContinueAfter(DeleteVar("Big", v)) for v in (named, before)))
    assert answer(d.execute("w", n(), "me", release_both, now=START)).ok
    rest = answer(
        d.holders("op", n(), ListQuery(session="me", limit=10, cursor=first.cursor), now=START)
    )
    # The named variable gone, the walk resumes at its old index in its shard of the group:
    # at the next one (the release before it, in an earlier shard, moved nothing there).
    mask = d.core.engine.sessions["me"].keys[NS, "Big"].mask
    assert stable_hash(before) & mask < stable_hash(named) & mask
    assert [h.var for h in rest.holders] == group[1001:1011]


def test_a_denial_never_makes_a_reply_bigger_than_a_client_accepts() -> None:
    """Holder records share the reply with the selected data: eight holders with values of
    60,000 characters all come along; when the data leaves no room, fewer (or none) do, and
    the reply's frame stays within the 1 MiB every client accepts."""
    from protocol import (
        DEFAULT_MAX_FRAME,
        HEADER_SIZE,
        Connection,
        Reply,
        Role,
        SelectConstantValue,
    )

    d = door()
    big = "x" * 60_000
    for i in range(8):
        d.execute(
            "A",
            n(),
            f"h{i}",
            tx(Assert(SetVar("M", "many", big, allow_duplicates=True))),
            now=START,
        )
    denied = answer(d.execute("B", n(), "b", tx(Assert(SetVar("M", "many"))), now=START))
    assert len(denied.holders) == MAX_HOLDERS
    padding = [SelectConstantValue(f"p{i}", "y" * 60_000) for i in range(16)]
    crowded = answer(d.execute("B", n(), "b", tx(*padding, Assert(SetVar("M", "many"))), now=START))
    assert crowded.failed_statement == "16:/AssertOp/" and len(crowded.holders) < 4
    for result in (denied, crowded):
        frame = Connection(Role.SERVER).send(Reply(1, result))
        assert len(frame) - HEADER_SIZE <= DEFAULT_MAX_FRAME
