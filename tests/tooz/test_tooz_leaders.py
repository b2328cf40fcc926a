"""tooz leader election over the lock server, through tooz's API only: the first candidate
to run its watchers leads and its elected hook runs once; ``get_leader`` names it; standing
down (or stopping, or being ended by an operator) hands the leadership to the next candidate
at its next ``run_watchers``."""

from __future__ import annotations

from tooz import coordination
from tooz_support import Make, member

from lockctl import main as lockctl


def _elected(into: list[bytes]) -> coordination.EventCallback[coordination.LeaderElected]:
    def hook(event: coordination.LeaderElected) -> None:
        assert event.group_id == b"lead"
        into.append(event.member_id)

    return hook


def test_one_leader_then_the_next_after_stand_down(coordinators: Make) -> None:
    """Two candidates: the first to run its watchers leads (its hook runs once, however
    often it runs them); the other does not; after a stand down the other leads."""
    a_id, b_id = member(), member()
    a, b = coordinators(a_id), coordinators(b_id)
    a.create_group(b"lead").get()
    assert a.get_leader(b"lead").get() is None
    won: list[bytes] = []
    a.watch_elected_as_leader(b"lead", _elected(won))
    b.watch_elected_as_leader(b"lead", _elected(won))
    a.run_watchers()
    b.run_watchers()
    a.run_watchers()
    assert won == [a_id]
    assert b.get_leader(b"lead").get() == a_id
    assert not b.stand_down_group_leader(b"lead")  # b does not lead
    assert a.stand_down_group_leader(b"lead")
    assert a.get_leader(b"lead").get() is None
    b.run_watchers()
    assert won == [a_id, b_id]
    assert a.get_leader(b"lead").get() == b_id


def test_the_leadership_goes_with_the_leaders_session(coordinators: Make, url: str) -> None:
    """A leader that stops, or whose session an operator ends (``lockctl kill``), leads no
    more: the next candidate is elected at its next ``run_watchers``."""
    a_id, b_id, c_id = member(), member(), member()
    a, b, c = coordinators(a_id), coordinators(b_id), coordinators(c_id)
    won: list[bytes] = []
    for x in (a, b, c):
        x.watch_elected_as_leader(b"lead", _elected(won))
        x.run_watchers()
    assert won == [a_id]
    a.stop()
    b.run_watchers()
    assert won == [a_id, b_id]
    server = url.removeprefix("lockserver://")
    assert lockctl(["--server", server, "kill", b.session_id]) == 0  # type: ignore[attr-defined]
    c.run_watchers()
    assert won == [a_id, b_id, c_id]
    assert c.get_leader(b"lead").get() == c_id
    b.run_watchers()  # b's hook runs again only if it wins again: c leads
    assert won == [a_id, b_id, c_id]
