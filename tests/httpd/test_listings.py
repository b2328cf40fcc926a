"""The inspection listings over HTTP (issue 16 section 3): ``/v1/holders``, ``/v1/sessions``,
``/v1/waiters``.

Pinned down: each answers ``{"<kind>": [records], "cursor": ...}`` with exactly the
protocol's records for the same query (``protocol.record_to_json``: times ISO 8601 UTC);
every filter selects what the protocol's does; paging with the cursor reaches the end (a nil
cursor) listing each record once, and a cursor works across HTTP and the protocol; ``limit``
is checked at and past both bounds; an unknown, repeated or valueless parameter, bad
percent-encoding, a bad cursor and a field over its limit are 400 with a precise error; with
tokens the listings need a bearer token (401), a principal sees only its namespaces and
naming another is 403; what expires as a page is read is still told to its holder.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import quote

import pytest
import trio
from server._wire import WireClient

from lockserver import RunningServer
from lockserver._auth import TokenSpec
from protocol import (
    MAX_CURSOR,
    MAX_PAGE,
    Assert,
    Hello,
    HoldersPage,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    LockLost,
    SessionsPage,
    SessionSpec,
    SetVar,
    WaitersPage,
    record_to_json,
)

from ._client import Response, get
from .conftest import start_server

KINDS = ("holders", "sessions", "waiters")


def lock(table: str, var: str, description: str | None = None) -> Assert:
    return Assert(SetVar(table, var, "v", description=description))


def url(kind: str, **params: Any) -> str:
    """``/v1/<kind>?...`` with every value percent-encoded."""
    query = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in params.items())
    return f"/v1/{kind}" + (f"?{query}" if query else "")


async def listing(port: int, kind: str, **params: Any) -> Any:
    response = await get(port, url(kind, **params))
    assert response.status == 200, response.body
    return response.json()


async def populate(server: RunningServer, stack: AsyncExitStack) -> WireClient:
    """Sessions s1 ('worker one'), s2 ('worker two'), s3 in namespaces jobs and batch, and
    one waiter (w1, 'patient', parked on jobs/locks/a). Returns the connection."""
    c = await stack.enter_async_context(await WireClient.connect(server))
    msg = c.execute_message(
        "s1", [lock("locks", "a", "first"), lock("locks", "ab")], namespace="jobs"
    )
    await c.call(msg.__class__(msg.request_id, SessionSpec("s1", 60.0, "worker one"), *_rest(msg)))
    msg = c.execute_message("s2", [lock("locks", "b"), lock("queues", "a")], namespace="jobs")
    await c.call(msg.__class__(msg.request_id, SessionSpec("s2", 60.0, "worker two"), *_rest(msg)))
    await c.execute("s3", lock("locks", "z"), namespace="batch")
    waiter = c.execute_message("w1", [lock("locks", "a")], namespace="jobs", wait=30.0)
    waiter = waiter.__class__(waiter.request_id, SessionSpec("w1", 60.0, "patient"), *_rest(waiter))
    await c.send(waiter)
    for _ in range(100):
        if server.statistics()["waiting"]["waiters"] == 1:
            break
        await trio.sleep(0.01)
    return c


def _rest(msg: Any) -> tuple[Any, ...]:
    return (msg.transaction, msg.wait)


async def protocol_records(c: WireClient, kind: str, query: ListQuery) -> dict[str, Any]:
    """The protocol's page for ``query``, as the HTTP reply would render it."""
    request = {"holders": ListHolders, "sessions": ListSessions, "waiters": ListWaiters}[kind]
    page = await c.call(request(c.rid(), query))
    assert isinstance(page, HoldersPage | SessionsPage | WaitersPage)
    return {kind: [record_to_json(r) for r in getattr(page, kind)], "cursor": page.cursor}


async def test_each_listing_answers_the_protocols_records(nursery: trio.Nursery) -> None:
    """With no parameters, each endpoint's reply is the protocol's page for the empty query,
    record for record and field for field (times as ISO 8601 UTC, a session's clients)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            c = await populate(server, stack)
            for kind in KINDS:
                over_http = await listing(server.port, kind)
                assert over_http == await protocol_records(c, kind, ListQuery()), kind


async def test_holder_records_have_the_protocols_fields(nursery: trio.Nursery) -> None:
    """A holder record has the protocol's field names; its times are ISO 8601 UTC strings."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            await populate(server, stack)
            reply = await listing(server.port, "holders", session="s1", var="a", table="locks")
            sessions = await listing(server.port, "sessions", session="w1")
            waiters = await listing(server.port, "waiters")
    assert reply["cursor"] is None
    [first, second] = reply["holders"]
    assert set(first) == {
        "namespace",
        "table",
        "var",
        "session",
        "session_description",
        "value",
        "description",
        "acquired_at",
        "expires_at",
        "fence",
    }
    assert (first["var"], first["description"], first["session_description"]) == (
        "a",
        "first",
        "worker one",
    )
    assert second["var"] == "ab" and first["acquired_at"].endswith("Z")
    assert first["value"] == "v" and first["expires_at"] is None
    [w1] = sessions["sessions"]
    assert w1["description"] == "patient" and w1["waiters"] == 1 and len(w1["clients"]) == 1
    assert w1["valid_until"].endswith("Z") and w1["created"].endswith("Z")
    [waiter] = waiters["waiters"]
    assert waiter["variables"] == [["locks", "a", 0]] and waiter["deadline"].endswith("Z")


@pytest.mark.parametrize(
    ("kind", "params", "expected"),
    [
        ("holders", {"namespace": "batch"}, ["s3"]),
        ("holders", {"namespace": "jobs", "table": "que"}, ["s2"]),
        ("holders", {"table": "locks", "var": "a"}, ["s1", "s1"]),
        ("holders", {"table": ""}, ["s1", "s1", "s2", "s2", "s3"]),
        ("holders", {"session": "s2"}, ["s2", "s2"]),
        ("holders", {"match": "first"}, ["s1"]),
        ("holders", {"match": "worker two"}, ["s2", "s2"]),
        ("sessions", {"namespace": "batch"}, ["s3"]),
        ("sessions", {"table": "queues"}, ["s2"]),
        ("sessions", {"match": "worker"}, ["s1", "s2"]),
        ("sessions", {"session": "w1"}, ["w1"]),
        ("waiters", {"namespace": "jobs", "table": "locks", "var": "a"}, ["w1"]),
        ("waiters", {"namespace": "batch"}, []),
        ("waiters", {"var": "b"}, []),
        ("waiters", {"match": "patient"}, ["w1"]),
        ("waiters", {"session": "s1"}, []),
    ],
)
async def test_each_filter_selects_what_the_protocols_does(
    nursery: trio.Nursery, kind: str, params: dict[str, str], expected: list[str]
) -> None:
    """Each parameter filters like the protocol field of the same name (same records)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            c = await populate(server, stack)
            reply = await listing(server.port, kind, **params)
            assert reply == await protocol_records(c, kind, ListQuery(**params))
    assert sorted(r["session"] for r in reply[kind]) == expected


async def test_paging_with_the_cursor_reaches_the_end(nursery: trio.Nursery) -> None:
    """25 holders at limit=7 page as 7, 7, 7, 4, the last cursor null, each listed once; at
    limit=25 (exactly all) one page with a null cursor; an HTTP cursor continues in the
    protocol and a protocol cursor over HTTP."""
    server = await start_server(nursery)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server))
            await c.execute("s", *[lock("t", f"v{i:02}") for i in range(25)])
            sizes, seen, cursor = [], [], None
            while True:
                params: dict[str, Any] = {"limit": 7}
                if cursor is not None:
                    params["cursor"] = cursor
                page = await listing(server.port, "holders", **params)
                sizes.append(len(page["holders"]))
                seen += [h["var"] for h in page["holders"]]
                cursor = page["cursor"]
                if cursor is None:
                    break
            assert sizes == [7, 7, 7, 4]
            assert seen == [f"v{i:02}" for i in range(25)]
            whole = await listing(server.port, "holders", limit=25)
            assert len(whole["holders"]) == 25 and whole["cursor"] is None

            first = await listing(server.port, "holders", limit=10)
            rest = await c.call(ListHolders(c.rid(), ListQuery(cursor=first["cursor"])))
            assert isinstance(rest, HoldersPage)
            assert [h.var for h in rest.holders] == [f"v{i:02}" for i in range(10, 25)]
            start = await c.call(ListHolders(c.rid(), ListQuery(limit=20)))
            assert isinstance(start, HoldersPage) and start.cursor is not None
            end = await listing(server.port, "holders", cursor=start.cursor)
            assert [h["var"] for h in end["holders"]] == [f"v{i:02}" for i in range(20, 25)]


async def test_sessions_and_waiters_page_to_the_end(nursery: trio.Nursery) -> None:
    """5 sessions and 5 waiters at limit=2 page as 2, 2, 1 (waiters oldest first)."""
    server = await start_server(nursery)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server))
            await c.execute("holder", lock("t", "busy"))
            for i in range(4):
                await c.send(c.execute_message(f"w{i}", [lock("t", "busy")], wait=30.0))
            while server.statistics()["waiting"]["waiters"] < 4:
                await trio.sleep(0.01)
            for kind, count in (("sessions", 5), ("waiters", 4)):
                found, cursor, pages = [], None, 0
                while True:
                    params: dict[str, Any] = {"limit": 2}
                    if cursor is not None:
                        params["cursor"] = cursor
                    page = await listing(server.port, kind, **params)
                    found += [r["session"] for r in page[kind]]
                    pages += 1
                    cursor = page["cursor"]
                    if cursor is None:
                        break
                assert len(found) == len(set(found)) == count, (kind, found)
                assert pages == (count + 1) // 2
                if kind == "waiters":
                    assert found == ["w0", "w1", "w2", "w3"]


async def error(port: int, path: str, status: int = 400) -> str:
    response: Response = await get(port, path)
    assert response.status == status, (path, response.body)
    message: str = response.json()["error"]
    return message


async def test_limit_is_checked_at_and_past_its_bounds(nursery: trio.Nursery) -> None:
    """limit 1 and 1000 (also written 0001000) are served; 0, 1001, a huge number, a sign,
    a space, an underscore, a non-ASCII digit, letters and an empty value are 400 naming
    the range and what was given."""
    server = await start_server(nursery)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server))
            for start in range(0, MAX_PAGE + 1, 400):  # under max_ops per transaction
                end = min(start + 400, MAX_PAGE + 1)
                await c.execute(f"s{start}", *[lock("t", f"v{i:04}") for i in range(start, end)])
            for kind in KINDS:
                assert len((await listing(server.port, kind, limit=1))[kind]) <= 1
            assert len((await listing(server.port, "holders", limit=1))["holders"]) == 1
            page = await listing(server.port, "holders", limit=MAX_PAGE)
            assert len(page["holders"]) == MAX_PAGE and page["cursor"] is not None
            page = await get(server.port, "/v1/holders?limit=0001000")
            assert len(page.json()["holders"]) == MAX_PAGE
            for bad in (
                "0",
                "1001",
                "99999999999999999999999",
                "+5",
                "-1",
                " 5",
                "5_0",
                "\u0665",
                "ten",
                "",
            ):
                for kind in KINDS:
                    message = await error(server.port, url(kind, limit=bad))
                    assert message.startswith(f"{kind}: limit must be an integer in 1..1000"), (
                        message
                    )
                    assert repr(bad) in message or bad in message, message


async def test_bad_queries_are_400_with_a_precise_error(nursery: trio.Nursery) -> None:
    """Every malformed query gets 400 and an error naming what is wrong; the server goes on
    serving."""
    server = await start_server(nursery)
    cases = {
        "/v1/holders?nope=1": "unknown parameter 'nope' (known: namespace, table, var",
        "/v1/holders?id=1": "unknown parameter 'id'",
        "/v1/holders?type=waiters": "unknown parameter 'type'",
        "/v1/sessions?table=a&table=b": "parameter 'table' is given more than once",
        "/v1/waiters?limit=1&limit=1": "parameter 'limit' is given more than once",
        "/v1/holders?namespace": "parameter 'namespace' has no value (namespace=...)",
        "/v1/holders?table=a&&var=b": "an empty parameter in the query",
        "/v1/holders?table=a&": "an empty parameter in the query",
        "/v1/holders?table=%zz": "parameter 'table' is badly percent-encoded: '%zz'",
        "/v1/holders?table=a%4": "parameter 'table' is badly percent-encoded: '%4'",
        "/v1/holders?table=a%": "parameter 'table' is badly percent-encoded: '%'",
        "/v1/holders?na%2=x": "a parameter name is badly percent-encoded",
        "/v1/holders?match=%ff%fe": "parameter 'match' is not UTF-8 once percent-decoded",
        "/v1/holders?namespace=": "namespace must not be blank",
        "/v1/holders?session=+": "session must not be blank",
        "/v1/holders?cursor=bm90IG91cnM%3D": "holders: the cursor is not valid",
        "/v1/waiters?cursor=x": "waiters: the cursor is not valid",
    }
    with trio.fail_after(20):
        for path, expected in cases.items():
            message = await error(server.port, path)
            assert expected in message, (path, message)
        assert (await get(server.port, "/healthz")).status == 200


async def test_a_cursor_of_another_listing_or_filters_is_refused(nursery: trio.Nursery) -> None:
    """A holders cursor used for waiters, or with other filters, is 400 saying so."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server))
            await c.execute("s", *[lock("t", f"v{i}") for i in range(3)])
            cursor = (await listing(server.port, "holders", limit=1))["cursor"]
            message = await error(server.port, url("waiters", cursor=cursor))
            assert "a cursor of a 'holders' listing, not 'waiters'" in message, message
            message = await error(server.port, url("holders", cursor=cursor, table="t"))
            assert "the same filters" in message, message


async def test_names_and_texts_are_checked_at_and_past_their_limits(
    nursery: trio.Nursery,
) -> None:
    """A namespace, table, var or session of max_name characters is served, one more is 400
    naming max_name; match at max_text / past it the same; a cursor of MAX_CURSOR characters
    is judged by its content (not ours), one more is 400 naming MAX_CURSOR (a server whose
    http_max_header lets such a head in)."""
    server = await start_server(nursery, max_name=64, max_text=128, http_max_header=64 * 1024)
    with trio.fail_after(20):
        for field in ("namespace", "table", "var", "session"):
            assert (await listing(server.port, "holders", **{field: "n" * 64}))["holders"] == []
            message = await error(server.port, url("holders", **{field: "n" * 65}))
            assert f"field '{field}' is 65 characters long, the limit is 64 (max_name)" in message
        assert (await listing(server.port, "sessions", match="m" * 128))["sessions"] == []
        message = await error(server.port, url("sessions", match="m" * 129))
        assert "the limit is 128 (max_text)" in message
        message = await error(server.port, url("holders", cursor="c" * MAX_CURSOR))
        assert "the cursor is not valid" in message
        message = await error(server.port, url("holders", cursor="c" * (MAX_CURSOR + 1)))
        assert f"the limit is {MAX_CURSOR} (MAX_CURSOR)" in message


TOKENS = (
    TokenSpec("alice", "alice-secret", ["a-*"]),
    TokenSpec("bob", "bob-secret"),
)


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("Authorization", f"Bearer {token}"),)


async def test_tokens_scope_the_listings(nursery: trio.Nursery) -> None:
    """With tokens: no or a wrong token is 401; alice (a-*) sees only holders, sessions and
    waiters of a-* namespaces, naming b-jobs is 403; bob (every namespace) sees all."""
    server = await start_server(nursery, tokens=TOKENS)
    with trio.fail_after(20):
        async with AsyncExitStack() as stack:
            c = await stack.enter_async_context(await WireClient.connect(server, hello=False))
            await c.call(Hello(c.rid(), client_name="t", token="bob-secret"))
            await c.execute("in-a", lock("L", "x"), namespace="a-jobs")
            await c.execute("in-b", lock("L", "y"), namespace="b-jobs")
            await c.send(
                c.execute_message("waits-b", [lock("L", "y")], namespace="b-jobs", wait=30)
            )
            while server.statistics()["waiting"]["waiters"] < 1:
                await trio.sleep(0.01)
            for kind in KINDS:
                for headers in ((), bearer("wrong"), (("Authorization", "Basic Ym9i"),)):
                    response = await get(server.port, f"/v1/{kind}", headers)
                    assert response.status == 401
                    assert response.headers["www-authenticate"] == 'Bearer realm="lockserver"'
                alice = (await get(server.port, f"/v1/{kind}", bearer("alice-secret"))).json()
                bob = (await get(server.port, f"/v1/{kind}", bearer("bob-secret"))).json()
                assert {r["session"] for r in alice[kind]} == (
                    set() if kind == "waiters" else {"in-a"}
                ), kind
                assert {r["session"] for r in bob[kind]} == (
                    {"waits-b"}
                    if kind == "waiters"
                    else {"in-a", "in-b", "waits-b"}
                    if kind == "sessions"
                    else {"in-a", "in-b"}
                ), kind
                response = await get(
                    server.port, f"/v1/{kind}?namespace=b-jobs", bearer("alice-secret")
                )
                assert response.status == 403
                assert response.json() == {
                    "error": f"{kind}: token 'alice' may not use namespace 'b-jobs'"
                }


async def test_what_expires_as_a_page_is_read_is_told_to_its_holder(
    nursery: trio.Nursery, server_config: Any
) -> None:
    """A listing over HTTP at a time past a session's expiry does not show it, and the
    holder's connection still gets its lost event (the door's other outputs are delivered)."""
    server = await start_server(nursery)
    with trio.fail_after(10):
        async with await WireClient.connect(server) as holder:
            msg = holder.execute_message("short", [lock("t", "v")], max_age=5.0)
            assert (await holder.call(msg)).ok  # type: ignore[union-attr]
            endpoints = server._shell.endpoints  # type: ignore[attr-defined]
            route = endpoints.routes["/v1/holders"]
            from lockserver._auth import ANONYMOUS
            from lockserver.http._http import HttpRequest

            # Synchronously, later than the expiry, before the server's timer can run.
            answer = route.handler(
                HttpRequest("GET", "/v1/holders", "", {}), ANONYMOUS, trio.current_time() + 6
            )
            assert answer.status == 200 and b'"holders":[]' in answer.body
            event = await holder.event()
    assert isinstance(event, LockLost) and event.session_id == "short"
