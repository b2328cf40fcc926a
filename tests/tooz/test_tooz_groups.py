"""tooz groups over the lock server, through tooz's API only: creating, listing and deleting
groups (with tooz's errors), joining with capabilities, members and their capabilities,
updates, leaving; a group outlives its creator; join and leave watchers fired by
``run_watchers``, including for a member whose session an operator ends."""

from __future__ import annotations

import pytest
from tooz import coordination
from tooz_support import Make, member

from lockctl import main as lockctl


def test_create_list_delete(coordinators: Make) -> None:
    """A created group is listed (as bytes); creating it again is GroupAlreadyExist;
    deleting it removes it; deleting or joining a missing group is GroupNotCreated."""
    c = coordinators()
    c.create_group(b"g1").get()
    c.create_group("g2").get()  # type: ignore[arg-type]  # str ids work at run time
    assert {b"g1", b"g2"} <= set(c.get_groups().get())
    with pytest.raises(coordination.GroupAlreadyExist):
        c.create_group(b"g1").get()
    c.delete_group(b"g1").get()
    assert b"g1" not in c.get_groups().get()
    with pytest.raises(coordination.GroupNotCreated):
        c.delete_group(b"g1").get()
    with pytest.raises(coordination.GroupNotCreated):
        c.join_group(b"g1").get()
    with pytest.raises(coordination.GroupNotCreated):
        c.get_members(b"g1").get()


def test_a_group_outlives_its_creator(coordinators: Make) -> None:
    """tooz groups persist: the creator stops, the group is still there for the others."""
    creator, other = coordinators(), coordinators()
    creator.create_group(b"lasting").get()
    creator.stop()
    assert b"lasting" in other.get_groups().get()
    other.join_group(b"lasting").get()
    assert other.get_members(b"lasting").get() == {other._member_id}  # type: ignore[attr-defined]


def test_join_capabilities_update_leave(coordinators: Make) -> None:
    """Members join with capabilities, which every coordinator reads back (one member, all
    members); an update replaces them; a member leaves; a member that did not join cannot
    leave or update (MemberNotJoined); a group with members cannot be deleted."""
    a_id, b_id = member(), member()
    a, b = coordinators(a_id), coordinators(b_id)
    a.create_group(b"workers").get()
    a.join_group(b"workers", {"weight": 2, "zone": "eu"}).get()
    b.join_group(b"workers", {"weight": 1}).get()
    assert b.get_members(b"workers").get() == {a_id, b_id}
    assert b.get_member_capabilities(b"workers", a_id).get() == {"weight": 2, "zone": "eu"}
    assert a.get_members_with_capabilities(b"workers").get() == {
        a_id: {"weight": 2, "zone": "eu"},
        b_id: {"weight": 1},
    }
    info = b.get_member_info(b"workers", a_id).get()
    assert info["capabilities"] == {"weight": 2, "zone": "eu"}
    assert info["created_at"] is not None
    a.update_capabilities(b"workers", {"weight": 3}).get()
    assert b.get_member_capabilities(b"workers", a_id).get() == {"weight": 3}
    with pytest.raises(coordination.GroupNotEmpty):
        a.delete_group(b"workers").get()
    a.leave_group(b"workers").get()
    assert b.get_members(b"workers").get() == {b_id}
    with pytest.raises(coordination.MemberNotJoined):
        a.leave_group(b"workers").get()
    with pytest.raises(coordination.MemberNotJoined):
        a.update_capabilities(b"workers", {"weight": 1}).get()
    with pytest.raises(coordination.MemberNotJoined):
        a.get_member_capabilities(b"workers", a_id).get()
    b.leave_group(b"workers").get()
    a.delete_group(b"workers").get()


def test_one_member_id_joins_once(coordinators: Make) -> None:
    """A member id in a group twice is MemberAlreadyExist: the same coordinator joining
    again, or another coordinator with the same id."""
    same = member()
    a, b = coordinators(same), coordinators(same)
    a.join_group_create(b"once")
    with pytest.raises(coordination.MemberAlreadyExist):
        a.join_group(b"once").get()
    with pytest.raises(coordination.MemberAlreadyExist):
        b.join_group(b"once").get()


def test_capabilities_that_cannot_travel_are_a_serialization_error(coordinators: Make) -> None:
    """Capabilities that are not msgpack values (an object) are tooz's SerializationError,
    and nothing joined."""
    c = coordinators()
    c.create_group(b"ser").get()
    with pytest.raises(coordination.SerializationError):
        c.join_group(b"ser", {"bad": object()}).get()
    assert c.get_members(b"ser").get() == set()


def test_watchers_hear_joins_and_leaves(coordinators: Make) -> None:
    """``run_watchers`` calls the join hooks for members that joined and the leave hooks for
    members that left since the last run, with tooz's events, and returns the hooks'
    results; nothing changed, nothing is called."""
    watcher, worker = coordinators(), coordinators()
    watcher.create_group(b"w").get()
    events: list[coordination.Event] = []

    def hook(event: coordination.Event) -> str:
        events.append(event)
        return "seen"

    watcher.watch_join_group(b"w", hook)
    watcher.watch_leave_group(b"w", hook)
    assert watcher.run_watchers() == []
    worker.join_group(b"w").get()
    assert watcher.run_watchers() == ["seen"]
    joined = events.pop()
    assert isinstance(joined, coordination.MemberJoinedGroup)
    assert (joined.group_id, joined.member_id) == (b"w", worker._member_id)  # type: ignore[attr-defined]
    assert watcher.run_watchers() == []
    worker.leave_group(b"w").get()
    assert watcher.run_watchers() == ["seen"]
    left = events.pop()
    assert isinstance(left, coordination.MemberLeftGroup)
    assert left.member_id == worker._member_id  # type: ignore[attr-defined]


def test_a_member_whose_session_is_ended_leaves(coordinators: Make, url: str) -> None:
    """An operator ends a member's session (``lockctl kill``): it is no longer a member,
    and the leave watchers hear it at the next ``run_watchers``."""
    watcher, worker = coordinators(), coordinators()
    watcher.create_group(b"k").get()
    worker.join_group(b"k").get()
    left: list[coordination.Event] = []
    watcher.watch_leave_group(b"k", left.append)
    watcher.run_watchers()
    server = url.removeprefix("lockserver://")
    assert lockctl(["--server", server, "kill", worker.session_id]) == 0  # type: ignore[attr-defined]
    watcher.run_watchers()
    assert [e.member_id for e in left] == [worker._member_id]  # type: ignore[attr-defined]
    assert watcher.get_members(b"k").get() == set()


def test_watching_a_missing_group_is_group_not_created(coordinators: Make) -> None:
    """tooz's contract: a watch of a group that does not exist fails, and no hook stays."""
    c = coordinators()
    with pytest.raises(coordination.GroupNotCreated):
        c.watch_join_group(b"nowhere", lambda event: None)
    assert not c._hooks_join_group.get(b"nowhere")  # type: ignore[attr-defined]
