"""ShardedDict (lockserver/engine/_sharded.py) behaves like a dict, checked against one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockserver.engine import ShardedDict

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
