"""ShardedDict (lockserver/engine/_sharded.py) behaves like a dict, checked against one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockserver.engine import ShardedDict
from lockserver.engine._sharded import StableMap, pair_hash, sharded

KEYS = st.text(min_size=0, max_size=6)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), KEYS, st.integers()),
        st.tuples(st.just("del"), KEYS, st.just(0)),
        st.tuples(st.just("pop"), KEYS, st.just(0)),
    ),
    max_size=200,
)


@given(OPS)
def test_same_as_a_dict(ops: list[tuple[str, str, int]]) -> None:
    """Any sequence of sets, deletes and pops leaves the same contents, answers and errors
    as a dict's; reads agree for keys present and absent."""
    model: dict[str, int] = {}
    sharded: ShardedDict[int] = ShardedDict()
    for op, key, value in ops:
        if op == "set":
            model[key] = value
            sharded[key] = value
        elif op == "del":
            if key in model:
                del model[key]
                del sharded[key]
            else:
                with pytest.raises(KeyError):
                    del sharded[key]
        else:
            assert sharded.pop(key, None) == model.pop(key, None)
        assert len(sharded) == len(model)
        assert (key in sharded) == (key in model)
        assert sharded.get(key) == model.get(key)
        assert sharded.get(key, -1) == model.get(key, -1)
    assert sorted(sharded) == sorted(model)
    assert dict(sharded.items()) == model
    assert sharded == model
    for key, value in model.items():
        assert sharded[key] == value


def test_missing_key_raises_and_repr() -> None:
    """A missing key is a KeyError naming it; repr shows the contents."""
    d: ShardedDict[int] = ShardedDict()
    d["a"] = 1
    with pytest.raises(KeyError, match="'b'"):
        d["b"]
    assert repr(d) == "ShardedDict({'a': 1})"
    assert not ShardedDict()


@given(st.dictionaries(KEYS, st.integers(), max_size=50))
def test_sharded_holds_a_dicts_items(items: dict[str, int]) -> None:
    """``sharded(d)`` (how a namespace's tables move over) holds exactly ``d``'s items, each
    in its hash's shard, and counts them."""
    big = sharded(items)
    assert dict(big.items()) == items and len(big) == len(items)
    assert all(key in big.shards[hash(key) & big.mask] for key in items)


PAIRS = st.tuples(st.sampled_from(["n", "m", "é"]), KEYS)
MAP_OPS = st.lists(
    st.tuples(st.sampled_from(["set", "set", "del", "clear"]), PAIRS, st.integers()),
    max_size=120,
)


@given(MAP_OPS)
def test_stable_map_is_a_dict_in_shard_then_insertion_order(
    ops: list[tuple[str, tuple[str, str], int]],
) -> None:
    """A StableMap (a session's groups past SHARD_AT tables) answers like a dict after any
    sets, deletes and clears; it iterates shard by shard (``pair_hash & mask``), insertion
    order within a shard (a key set again keeps its place), the same in every process."""
    model: dict[tuple[str, str], int] = {}
    m: StableMap[int] = StableMap()
    for op, key, value in ops:
        if op == "set":
            model[key] = value
            m[key] = value
        elif op == "del":
            if key in model:
                del model[key]
                del m[key]
            else:
                assert key not in m
                with pytest.raises(KeyError):
                    del m[key]
        else:
            model.clear()
            m.clear()
        assert len(m) == len(model) and m.get(key) == model.get(key)
    order = sorted(model, key=lambda k: pair_hash(k) & m.mask)  # (a stable sort)
    assert list(m) == order and list(m.items()) == [(k, model[k]) for k in order]
    assert list(m.values()) == [model[k] for k in order]
    assert list(StableMap(model)) == order  # built in one go from a dict
    assert ("only one",) not in m and None not in m  # type: ignore[comparison-overlap]


def test_pair_hash_is_the_crc32_of_both_names_in_utf8() -> None:
    """A pair's place does not depend on the process: the CRC-32 of the table's UTF-8 bytes,
    continued from the namespace's."""
    import zlib

    assert pair_hash(("ns", "tbl")) == zlib.crc32(b"tbl", zlib.crc32(b"ns"))
    assert pair_hash(("é", "\udc80")) == zlib.crc32(
        "\udc80".encode("utf-8", "surrogatepass"), zlib.crc32("é".encode())
    )
