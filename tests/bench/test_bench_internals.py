"""Small pieces of the harness: load splitting, the timeline, the profile summary, the
transaction and script mapping of each op kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lockbench._blaster import lockserver_ring, resp
from lockbench._lockserver import (
    LockserverAsyncOps,
    LockserverSyncOps,
    acquire_statements,
    release_statements,
)
from lockbench._profile import format_summary, profile_report, summarize
from lockbench._redis import SCRIPTS, acquire_call, release_call
from lockbench._runner import split, timeline_from
from lockbench._sampler import Sample
from lockbench._workloads import Op, OpKind
from protocol import Connection, Execute, Role


def test_split() -> None:
    """Shares differ by at most one, larger first, and add up."""
    assert split(10, 3) == [4, 3, 3]
    assert split(2, 2) == [1, 1]
    assert split(5, 1) == [5]


def _s(at: float, ops: int, cpu: float | None = None) -> Sample:
    return Sample(at, ops, 2 * ops, cpu, 1000, 1.0, at)


def test_timeline_rates_and_window_restart() -> None:
    """Rates are deltas over time; the counter restart at the window's start is not a negative
    rate; a tick closer than min_dt (the final one) gets no rate."""
    points = timeline_from(
        [
            _s(9.5, 0, 1.0),
            _s(10.0, 500, 1.25),
            _s(10.5, 100, 1.5),
            _s(11.0, 600, 2.0),
            _s(11.05, 650, 2.0),
        ],
        measure_at=10.25,
    )
    assert [p["t"] for p in points] == [-0.75, -0.25, 0.25, 0.75, 0.8]
    assert [p["ops_per_s"] for p in points] == [None, 1000.0, 200.0, 1000.0, None]
    assert points[2]["requests_per_s"] == 400.0
    assert points[3]["server_cpu_pct"] == 100.0
    assert points[1]["trust"] == 1.0


def test_profile_summary(tmp_path: Path) -> None:
    """py-spy collapsed stacks: epoll waits are idle, the rest are shares of busy samples,
    by function and by file."""
    raw = tmp_path / "p.raw.txt"
    raw.write_text(
        "process 1;run (trio/_core/_run.py:1);EpollIOManager.get_events "
        "(trio/_core/_io_epoll.py:238) 50\n"
        "process 1;run (trio/_core/_run.py:1);decode (protocol/_codec.py:10) 30\n"
        "process 1;run (trio/_core/_run.py:1);decode (protocol/_codec.py:10);"
        "unpack (protocol/_codec.py:99) 10\n"
        "process 1;run (trio/_core/_run.py:1);execute (lockserver/engine/_engine.py:5) 10\n"
        "garbage line\n"
    )
    idle, functions = summarize(raw)
    assert idle == 50.0
    assert [(p.function.split(" ")[0], p.self_pct, p.total_pct) for p in functions] == [
        ("decode", 60.0, 80.0),
        ("unpack", 20.0, 20.0),
        ("execute", 20.0, 20.0),
    ]
    _, files = summarize(raw, by_file=True)
    assert [(p.function, p.self_pct) for p in files] == [
        ("protocol/_codec.py", 80.0),
        ("lockserver/engine/_engine.py", 20.0),
    ]
    report = profile_report(raw, "title")
    assert report.startswith("title\nshares of the busy samples (50.0% were waiting in epoll")
    assert "goes to the line that made it" in report
    assert "source file" in format_summary(files, "source file")


def test_profile_summary_of_nothing(tmp_path: Path) -> None:
    """An empty profile summarises to nothing, not an error."""
    raw = tmp_path / "empty.txt"
    raw.write_text("")
    assert summarize(raw) == (0.0, [])


LOCK_KINDS = [k for k in OpKind if k is not OpKind.PING]


def _op(kind: OpKind) -> Op:
    if kind is OpKind.MULTI:
        return Op(kind, ("ml:1", "ml:2", "ml:3", "ml:4"), "t0.1")
    if kind in (OpKind.MDS_ENTRY, OpKind.MDS_REVIEW):
        return Op(kind, ("F1", "P2"), "t0.1")
    return Op(kind, ("k",), "t0.1")


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_every_lock_kind_maps_to_both_backends(kind: OpKind) -> None:
    """Each op kind has an acquire and (except session churn, released by ending the session)
    a release transaction, and a Redis script call with a known script."""
    ns, statements = acquire_statements(_op(kind))
    assert statements
    assert ns == ("Clinical" if kind.value.startswith("mds") else "lockbench")
    if kind is not OpKind.SESSION:
        assert release_statements(_op(kind))[1]
    name, keys, args = acquire_call(_op(kind))
    assert name in SCRIPTS and keys and args[0] == "t0.1"
    name, keys, args = release_call(_op(kind))
    assert name in SCRIPTS and keys


def test_ping_takes_no_lock() -> None:
    """A ping op has no lock transaction or script."""
    for mapping in (acquire_statements, release_statements, acquire_call, release_call):
        with pytest.raises(ValueError, match="takes no lock"):
            mapping(Op(OpKind.PING, (), "t"))


class _Ok:
    ok = True


class _SessionLog:
    """Stands in for a client session: records which call each batch of ops became."""

    def __init__(self) -> None:
        self.log: list[tuple[str, int]] = []

    def execute(self, ns: str, statements: Any) -> _Ok:
        self.log.append(("execute", 1))
        return _Ok()

    def execute_many(self, calls: Any) -> list[_Ok]:
        calls = list(calls)
        assert all(type(c) is tuple and len(c) == 2 for c in calls)
        self.log.append(("execute_many", len(calls)))
        return [_Ok() for _ in calls]


class _AsyncSessionLog(_SessionLog):
    async def execute(self, ns: str, statements: Any) -> _Ok:  # type: ignore[override]
        return super().execute(ns, statements)

    async def execute_many(self, calls: Any) -> list[_Ok]:  # type: ignore[override]
        return super().execute_many(calls)


def test_sync_ops_send_a_batch_as_one_execute_many() -> None:
    """--pipeline D: D lock ops of the task's session go out as one execute_many (acquire and
    release); a single op stays one execute."""
    session = _SessionLog()
    ops = LockserverSyncOps(None, session)  # type: ignore[arg-type]
    batch = [Op(OpKind.MUTEX, (f"k{i}",), f"t{i}") for i in range(4)]
    assert ops.acquire(batch) == [True] * 4
    ops.release(batch)
    assert ops.acquire(batch[:1]) == [True]
    assert session.log == [("execute_many", 4), ("execute_many", 4), ("execute", 1)]


async def test_async_ops_send_a_batch_as_one_execute_many() -> None:
    """The trio ops: a batch of rwlock ops is one execute_many each way (no task per op)."""
    session = _AsyncSessionLog()
    ops = LockserverAsyncOps(None, session)  # type: ignore[arg-type]
    batch = [Op(OpKind.READ if i % 2 else OpKind.WRITE, (f"k{i}",), f"t{i}") for i in range(6)]
    assert await ops.acquire(batch) == [True] * 6
    await ops.release(batch)
    assert await ops.acquire(batch[:1]) == [True]
    assert session.log == [("execute_many", 6), ("execute_many", 6), ("execute", 1)]


def test_the_blast_ring_is_made_of_valid_requests() -> None:
    """Every pre-encoded blast frame decodes (server side) to an Execute with a distinct id,
    acquires on odd ids and releases on even ones."""
    frames = lockserver_ring(3, "run")
    server = Connection(Role.SERVER)
    server.receive_data(b"".join(frames[:6]))
    messages = [server.next_message() for _ in range(6)]
    assert all(isinstance(m, Execute) for m in messages)
    ids = [m.request_id for m in messages if isinstance(m, Execute)]
    assert ids == [1, 2, 3, 4, 5, 6]
    first = messages[0]
    assert isinstance(first, Execute)
    assert first.session.session_id == "blast-run-3"
    assert type(first.transaction.statements[0]).__name__ == "Assert"
    assert len(set(frames)) == len(frames)


def test_resp_encoding() -> None:
    """RESP arrays of bulk strings."""
    assert resp("SET", "k", b"v") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
