"""Placement over several servers (client/_placement.py, PROTOCOL.md §12): the server list's
syntax and errors, the test vectors printed in PROTOCOL.md, balance, and how little moves
when a server is added or removed; replicated groups as entries of the list (their syntax,
errors, ids and vector)."""

from __future__ import annotations

import collections
import pathlib
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from client._placement import (
    MAX_SERVERS,
    ServerAddress,
    ServerGroup,
    parse_groups,
    parse_servers,
    place,
    weight,
)
from client._sharding import Router

PROTOCOL_MD = pathlib.Path(__file__).resolve().parents[2] / "PROTOCOL.md"


def _section_12() -> str:
    text = PROTOCOL_MD.read_text()
    return text[text.index("## 12. Placement") :]


def _table_vectors() -> list[tuple[str, list[int], str]]:
    rows = []
    for line in _section_12().splitlines():
        m = re.match(r"\| `([^`]*)`(?: \(empty\))? \| (.*) \| `([^`]+)` \|$", line)
        if m is None:
            continue
        namespace = "" if m.group(1) == '""' else m.group(1)
        weights = [int(w.strip().strip("`"), 16) for w in m.group(2).split("|")]
        rows.append((namespace, weights, m.group(3)))
    return rows


def test_protocol_md_vectors_four_local_servers() -> None:
    servers = parse_servers("127.0.0.1:7400-7403")
    rows = _table_vectors()
    assert len(rows) == 5  # the table was read, not skipped
    lives_on = collections.Counter(where for _, _, where in rows)
    assert len(lives_on) == 4  # the vectors cover every server
    for namespace, weights, where in rows:
        assert [weight(s.id, namespace) for s in servers] == weights, namespace
        assert place(namespace, servers).id == where, namespace


def test_protocol_md_vectors_named_and_ipv6_servers() -> None:
    servers = parse_servers("lock-1.example:7400,lock-2.example:7400,[::1]:7400")
    text = _section_12()
    for namespace, where in (("orders", "lock-2.example:7400"), ("billing", "lock-1.example:7400")):
        pattern = rf"`{namespace}` weighs `(\w+)`, `(\w+)`, `(\w+)` and lives on `([^`]+)`"
        m = re.search(pattern.replace(" ", r"\s+"), text)
        assert m is not None, namespace
        assert [weight(s.id, namespace) for s in servers] == [int(g, 16) for g in m.groups()[:3]]
        assert m.group(4) == where == place(namespace, servers).id


def test_weight_is_blake2b_of_id_nul_namespace() -> None:
    # Written out independently of the module, as a client in another language would.
    import hashlib

    digest = hashlib.blake2b(b"127.0.0.1:7400\x00orders", digest_size=8).digest()
    assert weight("127.0.0.1:7400", "orders") == int.from_bytes(digest, "big")
    assert weight("127.0.0.1:7400", "orders") != weight("127.0.0.1:7400", "orders2")


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("127.0.0.1:7400", ["127.0.0.1:7400"]),
        ("Lock-1.Example:7400", ["lock-1.example:7400"]),
        ("[::1]:7400", ["[::1]:7400"]),
        ("[FE80::1]:9", ["[fe80::1]:9"]),
        ("h:7400-7402", ["h:7400", "h:7401", "h:7402"]),
        (" a:1 , b:2 ", ["a:1", "b:2"]),
        ("h:0007400", ["h:7400"]),
    ],
)
def test_parse_servers_canonical_ids(text: str, ids: list[str]) -> None:
    assert [s.id for s in parse_servers(text)] == ids


def test_parse_servers_list_and_order_kept() -> None:
    parsed = parse_servers(["b:2", "a:1-2"])
    assert parsed == (ServerAddress("b", 2), ServerAddress("a", 1), ServerAddress("a", 2))


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ("", "empty"),
        ([], "empty"),
        ("host", "expected host:port"),
        (":7400", "expected host:port"),
        ("h:", "must be a number"),
        ("h:x", "must be a number"),
        ("h:0", "1..65535"),
        ("h:65536", "1..65535"),
        ("h:7403-7400", "runs backwards"),
        ("h:1-2000", "more than 1024 servers in one range"),
        ("::1:7400", "IPv6"),
        ("[::1]7400", "IPv6"),
        ("a:1,A:1", "named twice"),
        ("h:7400-7401,h:7401", "named twice"),
        ("a b:1", "spaces"),
        ("h:٣", "must be a number"),
    ],
)
def test_parse_servers_errors_are_precise(servers: str | list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_servers(servers)


def test_parse_servers_bound() -> None:
    assert len(parse_servers(f"h:1-{MAX_SERVERS}")) == MAX_SERVERS
    with pytest.raises(ValueError, match="more than 1024 servers"):
        parse_servers([f"h:1-{MAX_SERVERS}", "g:1"])


def test_parse_servers_type_error() -> None:
    with pytest.raises(TypeError, match="host:port"):
        parse_servers([("h", 1)])  # type: ignore[list-item]


def test_balance_1000_namespaces_over_4_servers() -> None:
    servers = parse_servers("127.0.0.1:7400-7403")
    counts = collections.Counter(place(f"ns-{i}", servers).id for i in range(1000))
    assert len(counts) == 4
    for server, n in counts.items():
        assert 200 <= n <= 300, (server, counts)


def test_adding_a_server_moves_only_what_lands_on_it() -> None:
    old = parse_servers("127.0.0.1:7400-7403")
    new = parse_servers("127.0.0.1:7400-7404")
    names = [f"tenant/{i}" for i in range(1000)]
    moved = [n for n in names if place(n, old) != place(n, new)]
    assert all(place(n, new).id == "127.0.0.1:7404" for n in moved)  # none between survivors
    assert 0.13 <= len(moved) / len(names) <= 0.27  # ~1/5


def test_removing_a_server_moves_only_its_own() -> None:
    old = parse_servers("127.0.0.1:7400-7403")
    new = tuple(s for s in old if s.port != 7402)
    names = [f"job-{i}" for i in range(1000)]
    for n in names:
        before, after = place(n, old), place(n, new)
        if before.port != 7402:
            assert after == before, n
    moved = sum(place(n, old).port == 7402 for n in names)
    assert 0.18 <= moved / len(names) <= 0.32  # ~1/4


@given(
    st.lists(st.integers(1, 65535), min_size=1, max_size=8, unique=True),
    st.text(max_size=40),
)
def test_place_ignores_list_order_and_picks_the_heaviest(ports: list[int], namespace: str) -> None:
    servers = tuple(ServerAddress("10.0.0.1", p) for p in ports)
    chosen = place(namespace, servers)
    assert place(namespace, tuple(reversed(servers))) == chosen
    assert weight(chosen.id, namespace) == max(weight(s.id, namespace) for s in servers)


# --- replicated groups (PROTOCOL.md §12 item 4) ---------------------------------------------


def test_protocol_md_vectors_groups_beside_a_server() -> None:
    """The vector of §12 item 4: two groups (members listed out of order) and a server; the
    group ids are the sorted member ids joined by ",", and weight and choice use them."""
    entries = parse_groups(
        [
            ["127.0.0.1:7401", "127.0.0.1:7400"],
            ["127.0.0.1:7403", "127.0.0.1:7402"],
            "127.0.0.1:7404",
        ]
    )
    text = _section_12()
    assert [e.id for e in entries] == [
        "127.0.0.1:7400,127.0.0.1:7401",
        "127.0.0.1:7402,127.0.0.1:7403",
        "127.0.0.1:7404",
    ]
    flowing = " ".join(text.split())
    for e in entries[:2]:
        assert f"(id `{e.id}`)" in flowing
    found = 0
    for namespace in ("locks", "ns-2", "ns-1"):
        pattern = rf"`{namespace}` weighs `(\w+)`, `(\w+)`, `(\w+)` and lives on `([^`]+)`"
        for m in re.finditer(pattern.replace(" ", r"\s+"), text):
            if m.group(4) not in {e.id for e in entries}:
                continue  # another example's vector
            assert [weight(e.id, namespace) for e in entries] == [
                int(g, 16) for g in m.groups()[:3]
            ]
            assert m.group(4) == place(namespace, entries).id
            found += 1
    assert found == 3  # the three vectors were read, not skipped
    assert {place(n, entries).id for n in ("locks", "ns-2", "ns-1")} == {e.id for e in entries}


def test_group_id_is_the_sorted_member_ids_whatever_the_order() -> None:
    """Every client given the same members, in any order and spelling, gets the same id
    (and so the same placement); a group of one has its member's id and places as the
    server given alone."""
    one = parse_groups([["B:2", "a:1", "[::1]:3"]])[0]
    other = parse_groups([("[::1]:3", "a:1", "b:2")])[0]
    assert one.id == other.id == "[::1]:3,a:1,b:2"
    assert one.members != other.members  # the configured order is kept (failover order)
    assert one.replicated and other.replicated
    single = parse_groups([["h:7400"]])[0]
    assert single.id == "h:7400" == parse_groups("h:7400")[0].id
    assert single.replicated and not parse_groups("h:7400")[0].replicated
    names = [f"n{i}" for i in range(200)]
    servers = parse_groups(["h:7400", "g:7400"])
    grouped = parse_groups([["h:7400"], ["g:7400"]])
    assert [place(n, servers).id for n in names] == [place(n, grouped).id for n in names]


def test_parse_groups_plain_strings_are_the_servers_of_parse_servers() -> None:
    """Strings (one, a list of them, ranges, comma lists) give one plain entry per server,
    exactly the servers and ids of parse_servers: the single-server forms are unchanged."""
    for spec in ("127.0.0.1:7400-7403", ["b:2", "a:1-2"], " a:1 , b:2 "):
        entries = parse_groups(spec)
        assert [e.members for e in entries] == [(s,) for s in parse_servers(spec)]
        assert [e.id for e in entries] == [s.id for s in parse_servers(spec)]
        assert not any(e.replicated for e in entries)


def test_parse_groups_groups_beside_servers() -> None:
    """A list or tuple item is one group (its strings may be ranges or comma lists of
    members); strings beside it are servers of their own; order is kept."""
    entries = parse_groups([["a1:7400", "a2:7400"], "s:1", ("b:7400-7402",), "t:1,u:1"])
    assert [e.id for e in entries] == [
        "a1:7400,a2:7400",
        "s:1",
        "b:7400,b:7401,b:7402",
        "t:1",
        "u:1",
    ]
    assert [e.replicated for e in entries] == [True, False, True, False, False]
    assert entries[0].members == (ServerAddress("a1", 7400), ServerAddress("a2", 7400))


@pytest.mark.parametrize(
    ("servers", "error", "message"),
    [
        ([], ValueError, "the server list is empty"),
        ([[]], ValueError, r"servers\[0\]: the group is empty"),
        ([["a:1"], ()], ValueError, r"servers\[1\]: the group is empty"),
        ([["a:1", "A:1"]], ValueError, r"servers\[0\] \(a group\): server a:1 is named twice"),
        ([["a:1", "b:1"], ["b:1", "c:1"]], ValueError, "server b:1 is in two groups"),
        ([["a:1", "b:1"], "b:1"], ValueError, r"b:1 is in two groups \(a:1,b:1 and b:1\)"),
        (["b:1", ["a:1", "b:1"]], ValueError, "server b:1 is in two groups"),
        (["a:1", "a:1"], ValueError, "server a:1 is named twice"),
        ([["a:1", "nope"]], ValueError, r"servers\[0\] \(a group\): .*expected host:port"),
        ([["a:1", 7]], TypeError, r"servers\[0\] \(a group\): servers must be"),
        ([["a:1", ["b:1"]]], TypeError, r"servers\[0\] \(a group\): servers must be"),
        ([7], TypeError, "strings or groups"),
        ([{"a:1"}], TypeError, "strings or groups"),
    ],
)
def test_parse_groups_errors_are_precise(
    servers: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        parse_groups(servers)


def test_parse_groups_bound_counts_every_member() -> None:
    """MAX_SERVERS counts the members of groups as well as plain servers."""
    half = MAX_SERVERS // 2
    assert sum(len(e.members) for e in parse_groups([[f"h:1-{half}"], f"g:1-{half}"])) == (
        MAX_SERVERS
    )
    with pytest.raises(ValueError, match="more than 1024 servers"):
        parse_groups([[f"h:1-{half}"], [f"g:1-{half}"], "k:1"])
    with pytest.raises(ValueError, match="more than 1024 servers"):
        parse_groups([[f"h:1-{MAX_SERVERS}", "g:1"]])


def test_router_member_names_a_group_by_its_id_or_any_member() -> None:
    """``client.shard(...)`` takes a group's id (members in any order) or one of its
    configured members; a server of no entry, or a mix of entries, is a ValueError."""
    router = Router([["a:1", "b:1"], "c:1"])
    group, plain = router.servers
    assert router.member("a:1,b:1") is group
    assert router.member("B:1, a:1") is group
    assert router.member("b:1") is group
    assert router.member("c:1") is plain
    with pytest.raises(ValueError, match="not one of this client's servers"):
        router.member("d:1")
    with pytest.raises(ValueError, match="name one server or group, got 2"):
        router.member("a:1,c:1")
    with pytest.raises(ValueError, match="name one server or group, got 3"):
        router.member("a:1,b:1,d:1")


def test_a_server_group_needs_a_member() -> None:
    with pytest.raises(ValueError, match="no member"):
        ServerGroup(())
