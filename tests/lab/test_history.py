"""The fault lab's history file: every record kind survives a write and a read, a torn last
line is tolerated only when asked, and a malformed record is an error naming its line."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockbench.faults import Fault, HistoryWriter, Meta, Op, ResourceWrite, read_history
from lockbench.safety import Interval

times = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
names = st.sampled_from(["c1", "c2", "n1", "L", "k", "é", ""])
fences = st.none() | st.integers(min_value=0, max_value=2**63 - 1)
values = st.none() | st.integers() | names | st.lists(st.integers(), max_size=2)


@st.composite
def ops(draw: st.DrawFn) -> Op:
    invoke = draw(times)
    outcome = draw(st.sampled_from(["ok", "fail", "unknown"]))
    complete = invoke + draw(times)
    if outcome == "unknown" and draw(st.booleans()):
        complete = None
    return Op(
        process=draw(names),
        workload=draw(names),
        f=draw(st.sampled_from(["read", "write", "cas", "acquire", "release"])),
        key=draw(names),
        value=draw(values),
        invoke=invoke,
        complete=complete,
        outcome=outcome,
        fence=draw(fences),
        node=draw(names),
        error=draw(names),
    )


@given(st.lists(ops(), max_size=20), st.lists(fences, max_size=5))
def test_records_round_trip(
    tmp_path_factory: pytest.TempPathFactory, op_list: list[Op], fs: list[int | None]
) -> None:
    """What a writer wrote, a reader reads back equal and in order, each kind to its list."""
    path = tmp_path_factory.mktemp("h") / "history.jsonl"
    meta = Meta("lockserver", ("n1", "n2"), 7, 12.5, 1.7e9, {"replicas": 3})
    holds = [Interval("L", "w", 1.0, 2.0, f, "c1") for f in fs]
    writes = [ResourceWrite("L", "c1", f, 3.0, True, None) for f in fs]
    fault = Fault("isolate", ("n1",), 4.0, 9.5, "n1 | n2 n3")
    with HistoryWriter(path) as w:
        w.write(meta)
        for record in [*op_list, *holds, *writes, fault]:
            w.write(record)
    got = read_history(path)
    assert got.meta == meta
    assert list(got.ops) == op_list
    assert list(got.holds) == holds
    assert list(got.writes) == writes
    assert got.faults == (fault,)


def test_torn_tail(tmp_path: Path) -> None:
    """A torn last line fails the read unless the caller tolerates it; earlier lines stay."""
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        w.write(Fault("kill-replica", ("n2",), 1.0, 2.0))
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type": "op", "proc')
    with pytest.raises(ValueError, match=r"h\.jsonl:2"):
        read_history(path)
    assert len(read_history(path, tolerate_torn_tail=True).faults) == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"type": "nope"}', "unknown record type"),
        ("[1, 2]", "must be a JSON object"),
        (
            '{"type": "op", "process": "p", "workload": "w", "f": "read", "key": "k",'
            ' "invoke": 2, "complete": 1, "outcome": "ok"}',
            "before invoke",
        ),
        (
            '{"type": "op", "process": "p", "workload": "w", "f": "read", "key": "k",'
            ' "invoke": 1, "complete": null, "outcome": "ok"}',
            "needs its complete time",
        ),
        (
            '{"type": "op", "process": "p", "workload": "w", "f": "read", "key": "k",'
            ' "invoke": 1, "complete": 2, "outcome": "maybe"}',
            "outcome must be",
        ),
        ('{"type": "fault", "kind": "k", "targets": [], "start": 5, "end": 1}', "before start"),
        (
            '{"type": "write", "lock": "L", "holder": "h", "fence": 1.5, "time": 1,'
            ' "accepted": true}',
            "fence must be",
        ),
    ],
)
def test_malformed_record(tmp_path: Path, line: str, reason: str) -> None:
    """A malformed record is a ValueError naming the file, the line and what is wrong."""
    path = tmp_path / "h.jsonl"
    path.write_text("\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=reason) as info:
        read_history(path)
    assert "h.jsonl:2" in str(info.value)


def test_closed_writer_refuses(tmp_path: Path) -> None:
    """Writing after close is an error, not a silent loss."""
    w = HistoryWriter(tmp_path / "h.jsonl")
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write(Fault("pause", ("n1",), 0.0))
