"""Which member a connection goes to (client/_failover.py, socket-free): the order of a round
(from the last member that worked; after a loss from the one after it; round robin), the
members learned from a welcome's ``replicas`` (groups only, capped, configured ones never
dropped), the failover counter, and what a round in which every member failed raises."""

from __future__ import annotations

import logging

import pytest

from client import ErrorCode, ServerError, ServerUnavailable
from client._core import ClientCore
from client._failover import Members
from client._placement import MAX_SERVERS, ServerAddress, parse_groups
from protocol import Welcome


def members(spec: object) -> Members:
    return Members(parse_groups(spec)[0])  # type: ignore[arg-type]


def welcome(*replicas: str, instance: str = "G") -> Welcome:
    return Welcome(1, "lockserver", "h", {}, instance, None, "g" if replicas else "", replicas)


def ids(addresses: list[ServerAddress] | tuple[ServerAddress, ...]) -> list[str]:
    return [a.id for a in addresses]


def test_the_first_round_is_the_configured_order() -> None:
    m = members([["c:1", "a:1", "b:1"]])
    assert ids(m.round(after_loss=False)) == ["c:1", "a:1", "b:1"]
    assert m.current.id == "c:1" and not m.connected_once


def test_after_a_loss_the_round_starts_at_the_next_member_and_wraps() -> None:
    """Losing member i starts the round at i + 1, then round robin, the lost one last; a
    round that is not after a loss starts at the last member that worked."""
    m = members([["a:1", "b:1", "c:1"]])
    a, _, c = m.members
    m.connected(a, welcome())
    assert ids(m.round(after_loss=True)) == ["b:1", "c:1", "a:1"]
    m.connected(c, welcome())  # b was down: the round went on to c
    assert ids(m.round(after_loss=True)) == ["a:1", "b:1", "c:1"]
    assert ids(m.round(after_loss=False)) == ["c:1", "a:1", "b:1"]
    assert m.failovers == 1 and m.current == c


def test_a_single_server_round_is_itself() -> None:
    m = members("h:7400")
    assert ids(m.round(after_loss=True)) == ["h:7400"] == ids(m.round(after_loss=False))


def test_failovers_count_connections_to_another_member() -> None:
    """The first connection is no failover; a reconnect to the same member neither."""
    m = members([["a:1", "b:1"]])
    a, b = m.members
    m.connected(a, welcome())
    m.connected(a, welcome())
    assert m.failovers == 0
    m.connected(b, welcome())
    m.connected(a, welcome())
    assert m.failovers == 2


def test_a_group_learns_the_replicas_of_the_welcome_after_its_configured_members() -> None:
    """Replicas the client was not given are added after the configured members, in the
    welcome's order, canonical; known ones (in any spelling) are not added twice; a later
    welcome's list replaces what an earlier one taught, a welcome without replicas keeps
    it, and configured members are never dropped."""
    m = members([["b:1", "a:1"]])
    b, _ = m.members
    m.connected(b, welcome("a:1", "B:1", "C:1", "[::1]:2"))
    assert ids(m.members) == ["b:1", "a:1", "c:1", "[::1]:2"]
    assert ids(m.learned) == ["c:1", "[::1]:2"]
    m.connected(b, welcome())
    assert ids(m.members) == ["b:1", "a:1", "c:1", "[::1]:2"]
    m.connected(b, welcome("d:1"))
    assert ids(m.members) == ["b:1", "a:1", "d:1"]
    assert m.group.id == "a:1,b:1"  # learning never changes the placement id


def test_a_lost_learned_member_that_is_no_longer_listed_restarts_the_round_at_the_top() -> None:
    m = members([["a:1"]])
    m.connected(m.members[0], welcome("a:1", "b:1", "c:1"))
    b = m.members[1]
    m.connected(b, welcome("a:1", "c:1"))  # b's welcome no longer lists b
    assert ids(m.round(after_loss=True)) == ["a:1", "c:1"]
    assert ids(m.round(after_loss=False)) == ["a:1", "c:1"]


def test_a_plain_server_learns_nothing() -> None:
    m = members("a:1")
    m.connected(m.members[0], welcome("a:1", "b:1"))
    assert ids(m.members) == ["a:1"]


def test_malformed_replicas_are_skipped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    m = members([["a:1"]])
    with caplog.at_level(logging.WARNING, logger="client"):
        m.connected(m.members[0], welcome("nope", "b:1-2", "c:1"))
    assert ids(m.members) == ["a:1", "c:1"]
    assert "'nope' of the welcome" in caplog.text
    assert "'b:1-2' of the welcome: not one server" in caplog.text


def test_learning_stops_at_max_servers(caplog: pytest.LogCaptureFixture) -> None:
    m = members([["a:1", "a:2"]])
    many = [f"h:{p}" for p in range(1, MAX_SERVERS + 10)]
    with caplog.at_level(logging.WARNING, logger="client"):
        m.connected(m.members[0], welcome(*many))
    assert len(m.members) == MAX_SERVERS
    assert ids(m.members)[:3] == ["a:1", "a:2", "h:1"]
    assert "the rest are ignored" in caplog.text


def test_failure_of_one_member_is_its_own_error() -> None:
    m = members("a:1")
    exc = ServerUnavailable("cannot connect to a:1: refused")
    assert m.failure([(m.members[0], exc)]) is exc


def test_failure_prefers_a_refusal_then_names_every_member() -> None:
    """A ServerError (e.g. a bad token) says more than an unreachable member; without one,
    ServerUnavailable names every member and its error, the last as the cause."""
    m = members([["a:1", "b:1"]])
    a, b = m.members
    down_a = ServerUnavailable("cannot connect to a:1: refused")
    down_b = ServerUnavailable("cannot connect to b:1: refused")
    refused = ServerError(ErrorCode.UNAUTHORIZED, "bad token", None)
    assert m.failure([(a, down_a), (b, refused)]) is refused
    err = m.failure([(a, down_a), (b, down_b)])
    assert type(err) is ServerUnavailable
    assert str(err) == (
        "no member of group a:1,b:1 could be reached (a:1: cannot connect to a:1: refused; "
        "b:1: cannot connect to b:1: refused)"
    )
    assert err.__cause__ is down_b


def test_a_group_replica_with_the_same_instance_is_not_a_restart() -> None:
    """The core's restart rule needs nothing new for groups: a welcome from another replica
    naming the group's instance is not a restart (no RESTARTED, no restart counted); one
    naming another instance is."""
    core = ClientCore("t", members=members([["a:1", "b:1"]]))
    core.handshake_done(welcome("a:1", "b:1", instance="group-1"))
    core.reconnected(0.0)
    core.handshake_done(welcome("a:1", "b:1", instance="group-1"))
    core.reconnected(0.0)
    assert core.restarts == 0
    core.handshake_done(welcome(instance="standalone"))
    assert core.restarts == 1


def test_statistics_name_the_current_member_once_connected() -> None:
    m = members([["a:1", "b:1"]])
    core = ClientCore("t", members=m)
    assert (core.statistics(0).server, core.statistics(0).failovers) == ("", 0)
    m.connected(m.members[0], welcome())
    m.connected(m.members[1], welcome())
    assert (core.statistics(0).server, core.statistics(0).failovers) == ("b:1", 1)
    assert ClientCore("t").statistics(0).server == ""
