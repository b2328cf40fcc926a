"""A session's held variables in one table (``SessionRecord.keys``): past SHARD_AT of them the
group moves into a ``StableKeys`` (so adding one never rebuilds a dict of all of them at once),
whose order does not depend on the process's hash seed (the order a session's entries are
released in when it ends shows in its lock-lost notice, alike on every replica)."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver.engine import Engine, _sharded, _store
from lockserver.engine._sharded import StableKeys, stable_hash
from protocol import Abort, AnywayContinueAfter, Assert, DeleteVar, SessionSpec, SetVar

from ._helpers import NS, START, make_engine, run, session_keys

KEYS = st.sampled_from(["a", "b", "k1", "k2", "k3", "lock/é", "x" * 40, "", "ŧ☃"])
OPS = st.lists(st.tuples(st.sampled_from(["add", "del"]), KEYS), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_stable_keys_is_a_key_set_in_shard_then_insertion_order(ops: list[tuple[str, str]]) -> None:
    """Against a dict used as an ordered set: the same keys, length and membership after every
    step; iteration shard by shard (``stable_hash & mask``), insertion order within a shard (a
    key added again keeps its place; removed and added again, it goes last)."""
    keys = StableKeys()
    model: dict[str, None] = {}
    for op, key in ops:
        if op == "add":
            keys[key] = None
            model[key] = None
        elif key in model:
            del keys[key]
            del model[key]
        assert len(keys) == len(model) and bool(keys) == bool(model)
        assert all(k in keys for k in model) and "absent" not in keys and 1 not in keys
    assert list(keys) == sorted(model, key=lambda k: stable_hash(k) & keys.mask)
    assert list(StableKeys(model)) == list(keys)  # built in one go from the model's order


def test_stable_keys_built_from_a_group_keeps_its_order_within_each_shard() -> None:
    """A group moved in one go (``StableKeys(group)``) holds what adding its keys one by one in
    the group's order holds, in the same order."""
    group = dict.fromkeys(f"v{i}" for i in range(3000, 0, -7))
    one_by_one = StableKeys()
    for key in group:
        one_by_one[key] = None
    moved = StableKeys(group)
    assert list(moved) == list(one_by_one) and len(moved) == len(group)
    assert sorted(moved) == sorted(group)


def test_stable_hash_is_crc32_of_utf8_in_every_process() -> None:
    """The placement is part of the snapshot format (a replica loads another's shards and
    keeps adding to them): CRC-32 of the UTF-8 form, these exact values, whatever the hash
    seed."""
    samples = ["", "a", "lock/é", "ŧ☃", "k" * 100]
    assert [stable_hash(k) for k in samples] == [zlib.crc32(k.encode()) for k in samples]
    assert stable_hash("a") == 0xE8B7BE43
    assert stable_hash("\ud800") == zlib.crc32(b"\xed\xa0\x80")  # a lone surrogate: no error
    code = (
        "from lockserver.engine._sharded import stable_hash\n"
        f"print([stable_hash(k) for k in {samples!r}], hash('lock/é'))\n"
    )
    outs = []
    for seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            timeout=60,
        )
        outs.append(done.stdout.split("] "))
    assert outs[0][0] == outs[1][0] == str([stable_hash(k) for k in samples])[:-1]
    assert outs[0][1] != outs[1][1]  # the seeds do change str hashes: the test can fail


def _fill(engine: Engine, session: str | SessionSpec, table: str, start: int, stop: int) -> None:
    for lo in range(start, stop, 500):
        statements = [Assert(SetVar(table, f"v{i}", None)) for i in range(lo, min(lo + 500, stop))]
        assert run(engine, session, *statements).ok


def test_a_session_group_moves_into_stable_keys_at_shard_at() -> None:
    """One short of SHARD_AT the group is a dict; the SetVar that reaches it moves the group
    (a rollback keeps the moved form and takes the variable out again); releases and the
    session's end work on it as on a dict, and an emptied group is dropped."""
    engine = make_engine()
    n = _store.SHARD_AT
    _fill(engine, "a", "T", 0, n - 1)
    s = engine.sessions["a"]
    assert type(s.keys[NS, "T"]) is dict
    assert not run(engine, "a", Assert(SetVar("T", "last", None)), Abort()).ok
    group = s.keys[NS, "T"]
    assert type(group) is StableKeys and len(group) == n - 1 and "last" not in group
    assert s.held == n - 1 == engine.entry_count
    assert run(engine, "a", Assert(SetVar("T", "last", None))).ok
    assert "last" in group and len(group) == n == s.held
    assert session_keys(engine, "a") == {(NS, "T", f"v{i}") for i in range(n - 1)} | {
        (NS, "T", "last")
    }
    assert max(len(shard) for shard in group.shards) < 4 * n // len(group.shards)
    # A second table's group is its own (a dict again).
    assert run(engine, "a", Assert(SetVar("U", "u", None))).ok
    assert type(s.keys[NS, "U"]) is dict
    # Releases from the moved group; all of them drop it.
    for i in range(n - 1):
        assert run(engine, "a", AnywayContinueAfter(DeleteVar("T", f"v{i}"))).ok
    assert list(s.keys[NS, "T"]) == ["last"] and s.held == 2
    assert run(engine, "a", AnywayContinueAfter(DeleteVar("T", "last"))).ok
    assert (NS, "T") not in s.keys and s.held == 1 == engine.entry_count


def test_a_big_group_is_released_in_its_order_when_the_session_ends() -> None:
    """A session of SHARD_AT + 300 variables in one table expires: its lock-lost notice lists
    every one, in the group's order (shard by shard), and the store is empty after."""
    engine = make_engine()
    n = _store.SHARD_AT + 300
    _fill(engine, SessionSpec("a", 10.0), "T", 0, n)
    order = list(engine.sessions["a"].keys[NS, "T"])
    assert engine.sweep(START + 11.0) == n  # the entries it removed
    (notice,) = engine.drain_lost()
    assert [var for _, _, var, _ in notice.entries] == order
    assert order == sorted(order, key=lambda v: stable_hash(v) & (_sharded.SHARDS - 1))
    assert engine.entry_count == 0 and engine.namespaces == {}


def test_the_release_order_is_the_same_whatever_the_hash_seed() -> None:
    """Two processes with different PYTHONHASHSEED (as two replicas) fill and expire the same
    big session: the same lock-lost notice, in the same order."""
    tests_dir = Path(__file__).resolve().parent.parent
    code = "from engine.test_stable_keys import lost_order\nprint(lost_order())\n"
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=tests_dir,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
            check=True,
            timeout=120,
        ).stdout
        for seed in ("1", "2")
    ]
    assert outs[0] == outs[1] == f"{lost_order()}\n"


def lost_order() -> list[str]:
    """The variables of a SHARD_AT + 50 session's lock-lost notice, in order (added in a
    scrambled order, some released and added again)."""
    engine = make_engine()
    n = _store.SHARD_AT + 50
    order = [(i * 7919) % n for i in range(n)]
    for lo in range(0, n, 500):
        statements = [Assert(SetVar("T", f"v{i}", None)) for i in order[lo : lo + 500]]
        assert run(engine, SessionSpec("a", 10.0), *statements).ok
    for i in range(0, n, 97):
        assert run(engine, SessionSpec("a", 10.0), AnywayContinueAfter(DeleteVar("T", f"v{i}"))).ok
        assert run(engine, SessionSpec("a", 10.0), Assert(SetVar("T", f"v{i}", None))).ok
    engine.sweep(START + 11.0)
    (notice,) = engine.drain_lost()
    return [var for _, _, var, _ in notice.entries]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 60), max_size=60, unique=True),
    st.integers(0, 70),
    st.integers(0, 80),
)
def test_a_big_group_resumes_a_listing_at_its_key_or_its_old_place(
    present: list[int], var: int, hint: int
) -> None:
    """The listings walk a StableKeys group shard by shard (``_walk_keys``): from a
    cursor's (shard, index, var) they yield, when the var is still there at that index or
    before it (a key that stays only moves towards the front), exactly the rest of the group
    in its order; when it is gone (or further on: it went and came back), the rest of its
    shard from the old index and every later shard. Each key comes with its place (shard,
    index in it) and the key before it in its shard (None: the first); a dict group is one
    shard, resumed by ``_start``'s rule."""
    from lockserver.engine._inspect import _start, _walk_keys

    group = StableKeys(f"v{i}" for i in present)
    as_list = list(group)
    key = f"v{var}"
    home = stable_hash(key) & group.mask
    walked = list(_walk_keys(group, home, hint, key))
    for shard, index, k, before, d in walked:
        assert d is group.shards[shard] and list(d)[index] == k
        assert before == (list(d)[index - 1] if index else None)
    keys = [k for _, _, k, _, _ in walked]
    in_shard = list(group.shards[home])
    if key in in_shard and in_shard.index(key) <= hint:
        assert keys == as_list[as_list.index(key) :]
    else:
        later = [k for d in group.shards[home + 1 :] for k in d]
        assert keys == in_shard[min(hint, len(in_shard)) :] + later
    small = dict.fromkeys(as_list)
    walked_small = [k for _, _, k, _, _ in _walk_keys(small, 0, hint, key)]
    assert walked_small == as_list[_start(as_list, key, hint) :]
