"""The safety checker (lockbench.safety): every rule on hand-made histories, recording
from threads and to per-process files, the command line, and a deliberately broken lock (a
client-side check-then-set in two round trips) that it must catch against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import trio
from recipes_support import NS

from client import (
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    Exists,
    Not,
    SelectOperatorValue,
    SetVar,
    open_lock_client,
)
from lockbench.safety import Interval, Recorder, check, load, main
from lockserver import RunningServer

ROOT = Path(__file__).resolve().parents[2]
FREE = Not(Exists("bad", "k"))
SHARE = SetVar("bad", "k", allow_duplicates=True)


def iv(
    lock: str,
    mode: str,
    start: float,
    end: float,
    fence: int | None,
    holder: str = "h",
    capacity: int | None = None,
) -> Interval:
    return Interval(lock, mode, start, end, fence, holder, capacity)


def test_a_clean_history_is_ok() -> None:
    """Writers one after another with growing fences, readers together between them, two
    locks independent: no violation; max_holders and holders are counted."""
    report = check(
        [
            iv("a", "w", 0, 1, 10, "x"),
            iv("a", "r", 2, 4, 11, "y"),
            iv("a", "r", 3, 5, 12, "z"),
            iv("a", "w", 6, 7, 13, "x"),
            iv("b", "w", 0, 10, 5, "y"),  # another lock: overlapping a's is fine
            iv("a", "w", 7, 8, 14, "y"),  # touching the previous writer is not an overlap
        ]
    )
    assert report.ok and report.counts == {}
    assert report.intervals == 6 and report.locks == 2
    assert report.holders == {"x": 2, "y": 3, "z": 1}
    assert report.max_holders == {"a": {"w": 1, "r": 2}, "b": {"w": 1}}
    report.assert_ok()
    assert "OK" in report.summary()


@pytest.mark.parametrize(
    ("history", "kind"),
    [
        ([iv("a", "w", 0, 2, 1), iv("a", "w", 1, 3, 2)], "exclusive-overlap"),
        ([iv("a", "x", 0, 2, 1), iv("a", "write", 1, 3, 2)], "exclusive-overlap"),
        ([iv("a", "r", 0, 2, 1), iv("a", "w", 1, 3, 2)], "reader-writer-overlap"),
        ([iv("a", "w", 0, 2, 1), iv("a", "r", 1, 3, 2)], "reader-writer-overlap"),
        (
            [iv("a", "s", 0, 3, 1, capacity=2), iv("a", "s", 1, 3, 2), iv("a", "s", 2, 3, 3)],
            "over-capacity",
        ),
        ([iv("a", "r", 0, 3, 1, capacity=1), iv("a", "r", 1, 3, 2)], "over-capacity"),
        ([iv("a", "w", 0, 1, 5), iv("a", "w", 2, 3, 4)], "fence-order"),
        ([iv("a", "w", 0, 1, 5), iv("a", "r", 2, 3, 5)], "duplicate-fence"),
        ([iv("a", "r", 0, 1, 7), iv("a", "w", 2, 3, 6)], "fence-order"),
        ([iv("a", "w", 0, 1, 7), iv("a", "r", 2, 3, 6)], "fence-order"),
        ([iv("a", "w", 2, 1, 7)], "bad-interval"),
    ],
)
def test_each_rule_is_caught(history: list[Interval], kind: str) -> None:
    """Each broken rule is reported under its kind, with the intervals involved."""
    report = check(history)
    assert not report.ok and kind in report.counts
    example = next(v for v in report.violations if v.kind == kind)
    assert example.lock == "a" and example.intervals
    with pytest.raises(AssertionError, match=kind):
        report.assert_ok()


def test_capacity_overrides_and_write_permits() -> None:
    """Capacities come from the records, else the defaults, and the caller can override
    them; with write capacity 2 overlapping writers are fine and their mutual fence order is
    not checked (they are not exclusive), but readers still exclude them."""
    two_writers = [iv("a", "w", 0, 2, 2, capacity=2), iv("a", "w", 1, 3, 1, capacity=2)]
    assert check(two_writers).ok
    assert not check(two_writers, capacities={"a": {"w": 1}}).ok
    assert not check([*two_writers, iv("a", "r", 1.5, 4, 3)]).ok
    slots = [iv("a", "s", 0, 2, 1), iv("a", "s", 1, 3, 2), iv("a", "s", 1, 3, 3)]
    assert check(slots).ok  # no capacity given for slots: unlimited
    assert check(slots, capacities={"a": {"s": 2}}).counts == {"over-capacity": 1}


def test_examples_are_bounded_counts_are_not() -> None:
    """A history with many violations keeps a few examples per lock and kind, but counts
    them all."""
    history = [iv("a", "w", i, i + 10, i + 1) for i in range(100)]
    report = check(history)
    assert report.counts["exclusive-overlap"] == 99
    assert len([v for v in report.violations if v.kind == "exclusive-overlap"]) == 20


def test_interval_validation_and_json_round_trip() -> None:
    """Modes and capacities are validated; intervals survive JSON."""
    with pytest.raises(ValueError):
        iv("a", "q", 0, 1, 1)
    with pytest.raises(ValueError):
        iv("a", "w", 0, 1, 1, capacity=0)
    one = iv("a", "read", 0.5, 1.25, 3, "t1", 4)
    assert one.mode == "r"
    assert Interval.from_json(json.loads(json.dumps(one.to_json()))) == one
    with pytest.raises(ValueError):
        Interval.from_json({"lock": "a", "mode": "w", "start": 0, "end": 1, "fence": "9"})
    with pytest.raises(ValueError):
        Interval.from_json({"lock": "a", "mode": "w", "start": float("nan"), "end": 1})


def test_recorder_threads_and_files(tmp_path: Path) -> None:
    """A Recorder is safe to share between threads; with a path it appends one JSON line per
    interval; ``load`` reads several such files (one per process) back."""
    path_a, path_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    lock = threading.Lock()
    with Recorder(path_a) as rec_a, Recorder(path_b) as rec_b:

        def worker(rec: Recorder, i: int) -> None:
            for j in range(50):
                with lock:  # a real exclusive section: the history must be clean
                    fence = i * 1000 + j
                    with rec.hold("shared", "w", None if j == 0 else fence, f"t{i}"):
                        pass

        threads = [
            threading.Thread(target=worker, args=(rec_a if i % 2 else rec_b, i)) for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert len(rec_a.intervals) + len(rec_b.intervals) == 400
    loaded = load([path_a, path_b])
    assert len(loaded) == 400
    report = check(loaded, capacities=None)
    assert report.counts.get("exclusive-overlap", 0) == 0
    assert len(report.holders) == 8
    rec_a.record("after-close", "w", 0, 1, 1)  # kept in memory only
    assert len(load([path_a])) == 200


def test_load_names_a_bad_line(tmp_path: Path) -> None:
    """A malformed line is reported with its file and line number; blank lines are fine."""
    path = tmp_path / "bad.jsonl"
    path.write_text('\n{"lock": "a", "mode": "w", "start": 0, "end": 1}\n{"lock": "a"}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:3"):
        load([path])


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m lockbench.safety FILE...`` prints the summary; exit 1 on a violation."""
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    with Recorder(good) as rec:
        rec.record("a", "w", 0, 1, 1, "x")
        rec.record("a", "w", 2, 3, 2, "y")
    with Recorder(bad) as rec:
        rec.record("a", "w", 0.5, 1.5, 3, "z")
    assert main([str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    assert main([str(good), str(bad)]) == 1
    assert "exclusive-overlap" in capsys.readouterr().out
    done = subprocess.run(
        [sys.executable, "-m", "lockbench.safety", str(good)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and "2 critical sections" in done.stdout


async def test_it_catches_a_broken_lock(server: RunningServer) -> None:
    """A lock built the wrong way — check "free?" in one round trip, then take it in a
    second (a client-side read-modify-write) — lets two holders in under contention, and the
    checker says so. The same contention through one atomic transaction is clean."""
    with trio.fail_after(20):
        async with open_lock_client(port=server.port) as c:
            broken, atomic = Recorder(), Recorder()

            async def racer(i: int) -> None:
                async with c.session() as s:
                    for _ in range(20):
                        # broken: "is it free?" and "take it" in two round trips
                        r = await s.execute(NS, [SelectOperatorValue("free", FREE)])
                        if r["free"]:
                            r = await s.execute(NS, [Assert(SHARE)])
                            with broken.hold("bad", "w", r.fence, f"t{i}"):
                                await trio.sleep(0.001)
                            await s.execute(NS, [AnywayContinueAfter(DeleteVar("bad", "k"))])
                        # right: one atomic transaction, parked on the server while busy
                        r = await s.execute(NS, [Assert(SetVar("good", "k"))], wait=5)
                        assert r.ok
                        with atomic.hold("good", "w", r.fence, f"t{i}"):
                            await trio.sleep(0.001)
                        await s.execute(NS, [AnywayContinueAfter(DeleteVar("good", "k"))])

            async with trio.open_nursery() as nursery:
                for i in range(8):
                    nursery.start_soon(racer, i)
    assert broken.check().counts.get("exclusive-overlap", 0) > 0
    atomic.check().assert_ok()
