"""Small entries carry their ops stored, not deflated (issue 29, a lone client's acquire):
ops packing to less than ``STORED_BELOW`` bytes are one stored zlib block, larger ones are
deflated as before, the bound exact; either is a zlib stream that inflates completely to the
same ops (what every replica of format 3, this version or an older one, runs on it), so the
entry format is unchanged; a stored stream cut short or followed by bytes is refused; and a
group applies an entry with stored ops exactly as its deflated twin."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockserver.replication._group import (
    STORED_BELOW,
    GroupState,
    decode_ops,
    encode_entry,
    encode_ops,
)
from protocol import pack

from .test_group_state import GENESIS, acquire_op, release_op


def _block_type(stream: bytes) -> int:
    """BTYPE of the stream's first deflate block (0 stored, 1 fixed, 2 dynamic Huffman)."""
    return (stream[2] >> 1) & 0b11


def _ops_of_size(size: int) -> list[list[Any]]:
    """One op whose msgpack array is exactly ``size`` bytes."""
    text = "x" * 40
    base = len(pack([["t", text]]))
    ops = [["t", "x" * (40 + size - base)]]
    # msgpack's string header grows at 32 and 256 bytes: adjust to the exact size.
    while len(pack(ops)) > size:
        ops = [["t", ops[0][1][:-1]]]
    while len(pack(ops)) < size:
        ops = [["t", ops[0][1] + "x"]]
    assert len(pack(ops)) == size
    return ops


def test_a_lone_clients_entry_is_stored_and_inflates_as_any_zlib_stream() -> None:
    """One acquire's ops are a stored block: the bytes as packed, behind a 7-byte header;
    zlib (an older replica's decoder) and decode_ops give the ops back."""
    ops = [acquire_op(1, 7, "s1", "a", None)]
    raw = pack(ops)
    stream = encode_ops(ops)
    assert _block_type(stream) == 0
    assert stream[7 : 7 + len(raw)] == raw and len(stream) == len(raw) + 11
    assert zlib.decompress(stream) == raw
    assert decode_ops(stream) == ops


def test_the_bound_is_exact() -> None:
    """Ops of STORED_BELOW - 1 bytes are stored; of STORED_BELOW bytes, deflated."""
    below, at = _ops_of_size(STORED_BELOW - 1), _ops_of_size(STORED_BELOW)
    assert _block_type(encode_ops(below)) == 0
    assert _block_type(encode_ops(at)) != 0
    assert len(encode_ops(at)) < STORED_BELOW // 4  # repetitive: deflate pays here
    assert decode_ops(encode_ops(below)) == below
    assert decode_ops(encode_ops(at)) == at


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.integers(-(2**63), 2**64 - 1), st.text(max_size=60), st.binary(max_size=60)
            ),
            max_size=4,
        ),
        max_size=40,
    )
)
def test_any_ops_round_trip_on_either_side_of_the_bound(ops: list[list[Any]]) -> None:
    """Whatever the ops, stored or deflated, they inflate completely to what was encoded."""
    stream = encode_ops(ops)
    assert (_block_type(stream) == 0) == (len(pack(ops)) < STORED_BELOW)
    assert zlib.decompress(stream) == pack(ops)
    assert decode_ops(stream) == ops


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda s: s[:-1], "truncated"),
        (lambda s: s[:-6], "truncated"),
        (lambda s: s + b"\x00", "followed by"),
        (lambda s: s[:-4] + bytes(4), "do not inflate"),  # a wrong Adler-32
    ],
)
def test_a_damaged_stored_stream_is_refused(mangle: Any, message: str) -> None:
    """A stored stream cut short, followed by bytes or with a wrong checksum is refused as
    a deflated one is (every replica of the version meets it alike and skips it alike)."""
    stream = encode_ops([acquire_op(1, 7, "s1", "a", None)])
    with pytest.raises(ValueError, match=message):
        decode_ops(mangle(stream))


def test_stored_and_deflated_entries_apply_alike() -> None:
    """Two groups, one log: each entry with its ops stored in one, deflated in the other --
    the same outputs and the same state."""
    batches = [
        [acquire_op(1, 1, "s1", "a", None)],
        [acquire_op(2, 2, "s2", "a", 3.0)],
        [release_op(1, 3, "s1", "a"), acquire_op(1, 4, "s1", "b", None)],
        [["t"]],
    ]
    states = [GroupState(GENESIS), GroupState(GENESIS)]
    outputs: list[list[Any]] = [[], []]
    for side, state in enumerate(states):
        outputs[side].extend(state.apply_registered("r1", "r1:7400", 2))
    for i, ops in enumerate(batches):
        stored = encode_ops(ops)
        assert _block_type(stored) == 0
        deflated = zlib.compress(pack(ops), 1)
        stamp = GENESIS.started_at + i
        for side, packed in enumerate((stored, deflated)):
            entry = encode_entry("r1", i + 1, stamp, 1.0, packed, registration=2, base=i + 2)
            outputs[side].extend(states[side].apply_entry(entry, i + 3))
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) >= 3
    assert states[0].fingerprint() == states[1].fingerprint()
