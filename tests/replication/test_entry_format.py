"""The log entry's encoding (``lockserver.replication._group``, format 3): ops are deflated and come
back equal; the entry is much smaller than its plain ops; format-1 (ops inline) and format-2 (no
registration, no base) entries are still applied in a group without a secret, the same as
their format-3 twins; an entry of another format, ops that do not inflate completely, inflate
past the bound or are not an array are refused with a clear ValueError; a skipped entry is
not inflated; a proposer's batch is split so every entry fits an etcd value, each run
carrying its own encoded ops."""

from __future__ import annotations

import os
import zlib
from typing import Any

import pytest

from lockserver.replication import _group
from lockserver.replication._group import (
    ENTRY_FORMAT,
    EntryFormatError,
    GroupState,
    decode_entry,
    decode_header,
    decode_ops,
    encode_entry,
    encode_ops,
    wire,
)
from lockserver.replication._replica import VALUE_LIMIT, _fit
from protocol import Assert, Execute, SessionSpec, SetVar, Transaction, pack

from .test_group_state import GENESIS, acquire_op, release_op


def lockbench_like_ops(n: int) -> list[list[Any]]:
    """``n`` execute ops as one pipelined connection sends them (one session, a ring of
    keys)."""
    session = SessionSpec("blast-0123456789-3")
    return [
        [
            "x",
            3,
            "",
            wire(
                Execute(
                    i + 1,
                    session,
                    Transaction("lockbench", (Assert(SetVar("Mutex", f"b3:{i}", f"t3.{i}")),)),
                    None,
                )
            ),
        ]
        for i in range(n)
    ]


def test_ops_round_trip_and_the_entry_is_deflated() -> None:
    """An entry's fields and ops decode to what was encoded; 64 ops of one connection take far
    less than their plain msgpack (measured 7.9 kB -> 0.7 kB)."""
    ops = lockbench_like_ops(64)
    data = encode_entry("r1", 7, 1.5, 0.9, ops, registration=12, base=40)
    assert decode_entry(data) == ("r1", 12, 7, 1.5, 40, 0.9, ops)
    assert decode_ops(encode_ops(ops)) == ops
    assert encode_entry("r1", 7, 1.5, 0.9, encode_ops(ops), registration=12, base=40) == data
    assert len(data) * 4 < len(pack(ops))
    assert decode_header(data)[:6] == ("r1", 12, 7, 1.5, 40, 0.9)


def test_formats_1_and_2_are_still_applied_like_format_3() -> None:
    """A log written by the previous versions (format 1: ops inline; format 2: deflated, no
    registration or base) gives the same outputs and state as the same log in format 3."""
    t = GENESIS.started_at
    bodies = [[acquire_op(1, 1, "s1", "a", None)], [release_op(1, 2, "s1", "a")]]
    results = []
    for fmt in (1, 2, 3):
        state = GroupState(GENESIS)
        state.apply_registered("r1", "r1:7400", 2)
        outs: list[Any] = []
        for i, body in enumerate(bodies, 1):
            if fmt == 1:
                data = pack([1, "r1", i, t + i * 0.1, 1.0, body])
            elif fmt == 2:
                data = pack([2, "r1", i, t + i * 0.1, 1.0, encode_ops(body)])
            else:
                data = encode_entry("r1", i, t + i * 0.1, 1.0, body)
            outs += state.apply_entry(data, 2 + i)
        results.append(([(a, repr(p)) for a, p in outs], state.fingerprint()))
    assert results[0] == results[1] == results[2]
    assert len(results[0][0]) == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (pack([4, "r1", 0, 1, 1.0, 0, 1.0, b""]), r"format 4, which this version cannot apply"),
        (pack([3, "r1", 0, 1, 1.0, 0, 1.0, []]), r"format 3 \(or 2, or 1\) \(its format: 3\)"),
        (pack([3, "r1", 1, 1.0, 1.0, b""]), r"its format: 3"),
        (pack([2, "r1", 1, 1.0, 1.0, []]), r"its format: 2"),
        (pack([1, "r1", 1, 1.0, 1.0, b""]), r"its format: 1"),
        (pack({"not": "a list"}), r"its format: None"),
        (pack([3, "r1", 0, 1, 1.0, 0, 1.0, b"not deflated"]), "do not inflate"),
        (pack([3, "r1", 0, 1, 1.0, 0, 1.0, zlib.compress(pack([["t"]]))[:-3]]), "truncated"),
        (pack([3, "r1", 0, 1, 1.0, 0, 1.0, zlib.compress(pack([["t"]])) + b"x"]), "followed by"),
        (pack([2, "r1", 1, 1.0, 1.0, zlib.compress(pack({"t": 1}))]), "a dict, not an array"),
    ],
)
def test_decoding_is_strict(data: bytes, message: str) -> None:
    """Anything but an entry of format 3 (or 2, or 1) with ops that inflate completely to an
    array is a ValueError naming what is wrong; only an entry of another format number (a
    newer replica's) is an EntryFormatError, which stops a replica instead of being
    skipped."""
    with pytest.raises(ValueError, match=message) as info:
        decode_entry(data)
    assert isinstance(info.value, EntryFormatError) == ("cannot apply" in message)


def test_legacy_formats_are_no_entries_of_a_sealed_log() -> None:
    """In a group with a secret (``legacy=False``) only format 3 is an entry: a format-2 body,
    even one that opened, is refused as malformed (skipped), never applied."""
    data = pack([2, "r1", 1, 1.0, 1.0, encode_ops([["t"]])])
    assert decode_header(data).batch == 1
    with pytest.raises(ValueError, match=r"not a log entry of format 3 \(its format: 2\)") as info:
        decode_header(data, legacy=False)
    assert not isinstance(info.value, EntryFormatError)


def test_ops_inflating_past_the_bound_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A corrupt entry cannot make a replica inflate without bound."""
    monkeypatch.setattr(_group, "MAX_OPS_BYTES", 1000)
    bomb = zlib.compress(pack([["t"] * 2000]))
    assert len(bomb) < 1000
    with pytest.raises(ValueError, match="inflate past 1000 bytes"):
        decode_ops(bomb)


def test_a_skipped_entry_is_not_inflated() -> None:
    """An entry of a replica that is not registered is skipped on its header: its ops are
    not even inflated (a corrupt body raises nothing), and nothing changes."""
    state = GroupState(GENESIS)
    before = state.fingerprint()
    data = pack([ENTRY_FORMAT, "rx", 0, 1, 1.0, 0, 1.0, b"not deflated"])
    assert state.apply_entry(data, 5) == []
    assert state.skipped == 1
    state.revision, state.skipped = 0, 0
    assert state.fingerprint() == before


def test_a_corrupt_entry_of_a_registered_replica_changes_nothing() -> None:
    """Ops that do not inflate raise before anything is applied: the batch is not marked
    applied (its retry would still count) and the state is as before."""
    state = GroupState(GENESIS)
    state.apply_registered("r1", "r1:7400", 2)
    before = state.fingerprint()
    with pytest.raises(ValueError, match="do not inflate"):
        state.apply_entry(pack([ENTRY_FORMAT, "r1", 2, 1, 1.0, 0, 1.0, b"garbage"]), 3)
    assert state.batches == {}
    state.revision = 2
    assert state.fingerprint() == before


def test_a_large_batch_is_split_so_each_entry_fits_a_value() -> None:
    """Ops whose encoding passes VALUE_LIMIT (incompressible here) are split into runs, in
    order, each carried with its own encoded ops, each within the limit."""
    ops = [["x", 1, "", {"blob": os.urandom(4096).hex()}] for i in range(400)]
    runs = _fit(ops)
    assert len(runs) > 1
    assert [op for run, _ in runs for op in run] == ops
    for run, packed in runs:
        assert len(packed) <= VALUE_LIMIT
        assert decode_ops(packed) == run
    small = lockbench_like_ops(1024)
    assert [run for run, _ in _fit(small)] == [small]  # a full batch (batch_ops) is one entry
