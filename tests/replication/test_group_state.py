"""The group's state machine (``lockserver.replication._group``) without etcd: one log replayed into
fresh replicas gives the same outputs and the same full state (issue 18, "Determinism"), also in
another process with another hash seed and across a snapshot taken midway; entries of
replicas that are not registered, and batches applied already, change nothing; a departed
replica's connections are dropped (their waiters go, the waiters behind them run); fences
name the log position; a snapshot cannot name arbitrary objects."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockserver.engine._sharded import StableKeys
from lockserver.engine._store import SHARD_AT
from lockserver.replication._group import (
    FENCES_PER_REVISION,
    Barrier,
    Genesis,
    GroupState,
    SnapshotError,
    decode_entry,
    encode_entry,
    wire,
)
from protocol import (
    AnywayContinueAfter,
    Assert,
    Cancel,
    DeleteVar,
    EndSession,
    Execute,
    FeedEvent,
    LockLost,
    SessionSpec,
    SetVar,
    Subscribe,
    Subscribed,
    Transaction,
    TransactionResult,
    pack,
    request_from_wire,
    unpack,
)

LIMITS = {
    "max_sessions": 1000,
    "max_entries": 10_000,
    "max_entries_per_session": 1000,
    "max_store_bytes": 10_000_000,
}
WAIT_LIMITS = {
    "max_waiters": 1000,
    "max_waiters_per_session": 100,
    "max_waiters_per_owner": 100,
    "max_waiting_ops_per_variable": 100_000,
    "max_waiting_ops_per_session": 100_000,
    "max_waiting_ops_per_principal": 1_000_000,
}
GENESIS = Genesis(1_700_000_000.0, "group-instance", False, LIMITS, WAIT_LIMITS)

# An event of the log: ("entry", bytes) | ("reg", replica) | ("gone", replica); its revision is
# its position + 2 (the genesis took revision 1).
Event = tuple[str, Any]


def acquire_op(conn: int, rid: int, session: str, var: str, wait: float | None) -> list[Any]:
    tx = Transaction("ns", (Assert(SetVar("L", var, session)),))
    return ["x", conn, "", wire(Execute(rid, SessionSpec(session, 5.0), tx, wait))]


def release_op(conn: int, rid: int, session: str, var: str) -> list[Any]:
    tx = Transaction("ns", (AnywayContinueAfter(DeleteVar("L", var)),))
    return ["x", conn, "", wire(Execute(rid, SessionSpec(session, 5.0), tx, None))]


def as_proposed(data: bytes) -> list[Any]:
    """The requests of an entry's ops as their proposer held them: each execute's request
    decoded from the frame its client sent (the wire map through msgpack), with the
    protocol's default limits, as a replica's shell decodes it."""
    ops = decode_entry(data).ops
    return [request_from_wire(unpack(pack(op[3]))) if op[0] == "x" else None for op in ops]


def replay(
    events: list[Event], state: GroupState | None = None, start: int = 0, *, held: bool = False
) -> tuple[GroupState, list[Any]]:
    """Apply ``events`` (from position ``start``) to ``state`` (a fresh one by default);
    returns the state and every output in order. ``held``: every entry is applied as its
    proposer applies it (with the requests it held)."""
    state = GroupState(GENESIS) if state is None else state
    outs: list[Any] = []
    for i, (kind, what) in enumerate(events[start:], start):
        revision = i + 2
        if kind == "entry":
            requests = as_proposed(what) if held else None
            outs += state.apply_entry(
                what, revision, (lambda r, b, q=requests: q) if held else None
            )
        elif kind == "reg":
            outs += state.apply_registered(what, f"{what}:7400", revision)
        else:
            outs += state.apply_departed(what, revision)
    return state, outs


ops = st.one_of(
    st.builds(
        acquire_op,
        st.integers(1, 3),
        st.integers(1, 40),
        st.sampled_from(["s1", "s2", "s3"]),
        st.sampled_from(["a", "a", "b"]),
        st.sampled_from([None, 0.5, 3.0]),
    ),
    st.builds(
        release_op,
        st.integers(1, 3),
        st.integers(41, 80),
        st.sampled_from(["s1", "s2", "s3"]),
        st.sampled_from(["a", "b"]),
    ),
    st.builds(
        lambda c, r, s: ["e", c, "", False, wire(EndSession(r, s))],
        st.integers(1, 3),
        st.integers(81, 90),
        st.sampled_from(["s1", "s2", "s3"]),
    ),
    st.builds(
        lambda c, r, t: ["c", c, wire(Cancel(r, t))],
        st.integers(1, 3),
        st.integers(91, 99),
        st.integers(1, 40),
    ),
    st.builds(lambda c: ["g", c], st.integers(1, 3)),
    st.just(["t"]),
)


@st.composite
def logs(draw: st.DrawFn) -> list[Event]:
    """A log of two or three replicas: registrations, entries with stamps that mostly move
    forward (sometimes back: another machine's clock), a retried batch, an unregistered
    replica's entry, a departure and a return."""
    events: list[Event] = [("reg", "r1"), ("reg", "r2")]
    stamp = GENESIS.started_at
    batches = {"r1": 0, "r2": 0, "r3": 0}
    for _ in range(draw(st.integers(1, 30))):
        choice = draw(st.integers(0, 19))
        if choice == 0:
            events.append(("gone", draw(st.sampled_from(["r1", "r2"]))))
            continue
        if choice == 1:
            events.append(("reg", draw(st.sampled_from(["r1", "r2", "r3"]))))
            continue
        replica = draw(st.sampled_from(["r1", "r2", "r3"]))
        stamp += draw(st.sampled_from([0.0, 0.1, 1.0, 4.0, 10.0, -2.0]))
        if choice == 2 and batches[replica]:
            batch = batches[replica]  # a retried proposal that had committed
        else:
            batches[replica] += 1
            batch = batches[replica]
        body = draw(st.lists(ops, min_size=1, max_size=4))
        events.append(("entry", encode_entry(replica, batch, stamp, 1.0, body)))
    return events


def comparable(outs: list[Any]) -> list[Any]:
    return [(address, repr(payload)) for address, payload in outs]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.data())
def test_one_log_two_replicas_same_state(events: list[Event], data: st.DataObject) -> None:
    """Two fresh replicas applying one log: equal outputs and equal full state; a third that
    loads a snapshot taken midway and applies the rest ends equal too; and so does one that
    applies each entry as its proposer does (with the requests it held, not decoded again
    from the entry)."""
    a, outs_a = replay(events)
    b, outs_b = replay(events)
    assert comparable(outs_a) == comparable(outs_b)
    assert a.fingerprint() == b.fingerprint()
    d, outs_d = replay(events, held=True)
    assert comparable(outs_d) == comparable(outs_a)
    assert d.fingerprint() == a.fingerprint()
    cut = data.draw(st.integers(0, len(events)))
    first, _ = replay(events[:cut])
    restored = GroupState.restore(first.snapshot())
    c, _ = replay(events, restored, cut)
    assert c.fingerprint() == a.fingerprint()


def _script_log() -> list[Event]:
    """A fixed contended log: three connections on two replicas want "a", the second waits;
    r1 departs while its connection waits."""
    t = GENESIS.started_at
    return [
        ("reg", "r1"),
        ("reg", "r2"),
        ("entry", encode_entry("r2", 1, t + 1, 1.0, [acquire_op(1, 1, "s1", "a", None)])),
        ("entry", encode_entry("r1", 1, t + 2, 1.0, [acquire_op(1, 2, "s2", "a", 30.0)])),
        ("entry", encode_entry("r2", 2, t + 3, 1.0, [acquire_op(2, 3, "s3", "a", 30.0)])),
        ("gone", "r1"),
        ("entry", encode_entry("r2", 3, t + 4, 1.0, [release_op(1, 4, "s1", "a")])),
    ]


def test_replay_in_another_process_with_another_hash_seed() -> None:
    """The same log replayed in a process with another PYTHONHASHSEED gives the same full
    state (a snapshot written by one replica loads in another)."""
    events = _script_log()
    here, _ = replay(events)
    code = (
        "import pickle, sys\n"
        "sys.path.insert(0, 'tests/replication')\n"
        "from test_group_state import replay\n"
        "events = pickle.loads(sys.stdin.buffer.read())\n"
        "state, _ = replay(events)\n"
        "sys.stdout.buffer.write(state.fingerprint())\n"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run(
            [sys.executable, "-c", code],
            input=pickle.dumps(events),
            capture_output=True,
            env=env,
            check=True,
            timeout=60,
        )
        assert proc.stdout == here.fingerprint()
        # and its snapshot loads here
        code_snap = code.replace("state.fingerprint()", "state.snapshot()")
        snap = subprocess.run(
            [sys.executable, "-c", code_snap],
            input=pickle.dumps(events),
            capture_output=True,
            env=env,
            check=True,
            timeout=60,
        ).stdout
        assert GroupState.restore(snap).fingerprint() == here.fingerprint()


# Big enough for one session to hold a group past SHARD_AT (a StableKeys).
BIG_GENESIS = Genesis(
    GENESIS.started_at,
    "group-instance",
    False,
    {**LIMITS, "max_entries": 20_000, "max_entries_per_session": 20_000},
    WAIT_LIMITS,
)


def big_group_log() -> list[Event]:
    """s1 acquires SHARD_AT + 100 variables in a scrambled order (its group in table L moves
    into a StableKeys), releases every 41st, and expires at a tick: its lock-lost notice
    lists the rest in the group's order."""
    t = BIG_GENESIS.started_at
    n = SHARD_AT + 100
    order = [(i * 7919) % n for i in range(n)]
    events: list[Event] = [("reg", "r1")]
    for batch, lo in enumerate(range(0, n, 250), start=1):
        ops = [acquire_op(1, 100 + i, "s1", f"v{i}", None) for i in order[lo : lo + 250]]
        events.append(("entry", encode_entry("r1", batch, t + 1, 1.0, ops)))
    releases = [release_op(1, 99, "s1", f"v{i}") for i in range(0, n, 41)]
    events.append(("entry", encode_entry("r1", len(events), t + 2, 1.0, releases)))
    # past s1's max age: a jump (what the witness proposes, anchored after s1's last use: a
    # jump expires only what was idle since the anchor), as a stamp moves a window only
    jump = [["k", 7, 86_400, t + 3], ["j", t + 20]]
    events.append(("entry", encode_entry("r1", len(events), t + 3, 1.0, jump)))
    return events


def test_a_big_session_group_replays_and_restores_alike_across_hash_seeds() -> None:
    """The snapshot of a state holding a StableKeys group, taken in processes with other hash
    seeds, restores here to the same state, and the rest of the log (releases, the session's
    expiry) gives the same outputs: the lock-lost notice in the same order."""
    events = big_group_log()
    cut = len(events) - 2  # after the acquires
    first, _ = replay(events[:cut], GroupState(BIG_GENESIS))
    group = first.core.engine.sessions["s1"].keys["ns", "L"]
    assert type(group) is StableKeys and len(group) == SHARD_AT + 100
    whole, tail = replay(events, first, cut)
    (notice,) = [p for _, p in tail if isinstance(p, LockLost)]
    assert len(notice.entries) == SHARD_AT + 100 - len(range(0, SHARD_AT + 100, 41))
    code = (
        "import pickle, sys\n"
        "sys.path.insert(0, 'tests/replication')\n"
        "from test_group_state import BIG_GENESIS, replay\n"
        "from lockserver.replication._group import GroupState\n"
        "events = pickle.loads(sys.stdin.buffer.read())\n"
        "state, _ = replay(events, GroupState(BIG_GENESIS))\n"
        "sys.stdout.buffer.write(state.snapshot())\n"
    )
    for seed in ("1", "2"):
        snap = subprocess.run(
            [sys.executable, "-c", code],
            input=pickle.dumps(events[:cut]),
            capture_output=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            timeout=120,
        ).stdout
        restored = GroupState.restore(snap)
        assert type(restored.core.engine.sessions["s1"].keys["ns", "L"]) is StableKeys
        again, tail_again = replay(events, restored, cut)
        assert comparable(tail_again) == comparable(tail)
        assert again.fingerprint() == whole.fingerprint()


def test_departed_replica_waiter_dropped_and_next_served() -> None:
    """r1's connection waits for "a" when r1 departs: its wait is dropped unanswered; when
    s1 releases, the waiter behind it on r2 gets the lock, at a fence of that entry's
    revision."""
    events = _script_log()
    state, outs = replay(events)
    answered = {(addr[0], addr[1]): p for addr, p in outs}
    assert ((("r1", 1), 2)) not in answered  # dropped with its replica
    granted = answered[(("r2", 2), 3)]
    assert isinstance(granted, TransactionResult) and granted.ok
    revision = len(events) - 1 + 2
    # the release committed first (index 1 of the entry), the waiter's grant next (index 2)
    assert granted.fence == GENESIS.fence_base + revision * FENCES_PER_REVISION + 2
    assert "r1" not in state.replicas and "r1" not in state.owners


def test_unregistered_replica_and_retried_batch_change_nothing() -> None:
    """An entry of a replica that never registered (or departed) and a batch number applied
    already are skipped: the state does not change."""
    t = GENESIS.started_at
    events: list[Event] = [
        ("reg", "r1"),
        ("entry", encode_entry("r1", 1, t + 1, 1.0, [acquire_op(1, 1, "s1", "a", None)])),
    ]
    state, _ = replay(events)
    before = state.fingerprint()
    for data in (
        encode_entry("r1", 1, t + 2, 1.0, [acquire_op(1, 2, "s2", "b", None)]),  # retried
        encode_entry("rx", 1, t + 2, 1.0, [acquire_op(1, 2, "s2", "b", None)]),  # unknown
    ):
        assert state.apply_entry(data, 10) == []
    assert state.skipped == 2
    # the revision and the skip count are all an ignored entry moves
    state.revision, state.skipped = 3, 0
    assert state.fingerprint() == before


def test_time_is_monotone_in_the_log() -> None:
    """An entry stamped earlier than the group's time (another replica's estimate behind)
    runs at the group's time: a session does not get younger."""
    t = GENESIS.started_at
    state, _ = replay(
        [
            ("reg", "r1"),
            ("reg", "r2"),
            ("entry", encode_entry("r1", 1, t + 0.9, 1.0, [["t"]])),
            ("entry", encode_entry("r2", 1, t + 0.3, 1.0, [acquire_op(1, 1, "s1", "a", None)])),
        ]
    )
    assert state.now == t + 0.9


def test_session_expires_through_the_log_and_its_owners_hear_it() -> None:
    """Expiry happens when an entry (a jump) brings the time past the session's max age; the
    connection that used it, on its replica, gets LockLost."""
    t = GENESIS.started_at
    state, outs = replay(
        [
            ("reg", "r1"),
            ("entry", encode_entry("r1", 1, t + 1, 1.0, [acquire_op(1, 1, "s1", "a", None)])),
            # the witness anchored after the session's use: the jump may expire it
            ("entry", encode_entry("r1", 2, t + 1.5, 1.0, [["k", 7, 86_400, t + 1.5]])),
            ("entry", encode_entry("r1", 3, t + 1.5, 1.0, [["j", t + 20]])),
        ]
    )
    lost = [(a, p) for a, p in outs if isinstance(p, LockLost)]
    assert [a for a, _ in lost] == [(("r1", 1), None)]
    assert state.core.engine.statistics(state.now).sessions == 0


def test_barrier_is_answered_in_log_order() -> None:
    """A read barrier comes back to its connection after the ops before it were applied."""
    t = GENESIS.started_at
    _, outs = replay(
        [
            ("reg", "r1"),
            (
                "entry",
                encode_entry("r1", 1, t + 1, 1.0, [acquire_op(1, 1, "s1", "a", None), ["b", 1, 2]]),
            ),
        ]
    )
    assert [type(p) for _, p in outs] == [TransactionResult, Barrier]


def test_snapshot_refuses_foreign_objects() -> None:
    """A snapshot naming anything outside the engine's and protocol's types is refused
    (SnapshotError), not run; garbage is SnapshotError too."""

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("true",))

    with pytest.raises(SnapshotError, match="forbidden"):
        GroupState.restore(pickle.dumps(Evil()))
    with pytest.raises(SnapshotError):
        GroupState.restore(b"not a pickle")
    with pytest.raises(SnapshotError, match="not a GroupState"):
        GroupState.restore(pickle.dumps({"a": 1}))


# A snapshot written by the version before the feed's index by table and the subscription
# caps (commit 9028b58), by this script run with that version's code on PYTHONPATH:
#
#     genesis = Genesis(1_700_000_000.0, "old", True, <LIMITS>, <WAIT_LIMITS>)
#     state = GroupState(genesis)
#     state.apply_registered("r1", "127.0.0.1:1", 2)
#     tx = Transaction("ns", (Assert(SetVar("L", "held", "x")),))
#     ops = [
#         ["s", 1, wire(Subscribe(7, "ns", None))],
#         ["s", 1, wire(Subscribe(8, "ns", "L"))],
#         ["s", 2, wire(Subscribe(9, "ns", "M"))],
#         ["x", 3, "alice", wire(Execute(1, SessionSpec("s1", 60.0), tx, None))],
#     ]
#     state.apply_entry(encode_entry("r1", 1, 1_700_000_001.0, 1.0, ops), 3)
#     sys.stdout.buffer.write(state.snapshot())
OLD_SNAPSHOT = Path(__file__).parent / "data" / "snapshot-before-feed-index.bin"


def test_a_snapshot_of_the_version_before_the_feed_index_serves_alike() -> None:
    """The older version's snapshot (its namespace index held every subscription with its
    table; no counts per namespace or owner) restores: its subscriptions hear what they did
    (the namespace's, then the table's), one connection's going gives its subscriptions
    back, the caps are the defaults (its genesis has none), and the counts per namespace
    and owner are the state's."""
    state = GroupState.restore(OLD_SNAPSHOT.read_bytes())
    core = state.core
    assert core.subscription_counts("") == (3, 3)
    assert core.engine.entries_by_namespace == {"ns": 1}
    assert core.engine.sessions_by_tag == {"alice": 1}
    assert core.waits.by_namespace == {}
    ops = [
        [
            "x",
            3,
            "alice",
            wire(
                Execute(
                    2,
                    SessionSpec("s1", 60.0),
                    Transaction("ns", (Assert(SetVar("L", "more")), Assert(SetVar("M", "m")))),
                    None,
                )
            ),
        ]
    ]
    outs = state.apply_entry(encode_entry("r1", 2, 1_700_000_002.0, 1.0, ops), 4)
    heard = [(address, p.table, p.var) for address, p in outs if isinstance(p, FeedEvent)]
    assert heard == [
        ((("r1", 1), 7), "L", "more"),
        ((("r1", 1), 8), "L", "more"),
        ((("r1", 1), 7), "M", "m"),
        ((("r1", 2), 9), "M", "m"),
    ]
    assert core.engine.entries_by_namespace == {"ns": 3}
    state.apply_entry(encode_entry("r1", 3, 1_700_000_003.0, 1.0, [["g", 1]]), 5)
    assert core.subscription_counts("") == (1, 1)
    sub = ["s", 4, wire(Subscribe(1, "other", None)), "bob"]
    (answer,) = state.apply_entry(encode_entry("r1", 4, 1_700_000_004.0, 1.0, [sub]), 6)
    assert answer == ((("r1", 4), 1), Subscribed(1))
    assert core.subscription_counts("bob") == (1, 2)
