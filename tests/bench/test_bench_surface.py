"""lockbench's public surface: the command and the two oracle modules are contracts (users
check their own lock usage with ``lockbench.safety``, docs/recipes.md), so they are pinned here.
Everything else in the package is private (``_name`` modules)."""

from __future__ import annotations

import inspect
import json
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest

import lockbench
import lockbench.fuzz
import lockbench.safety
from lockbench.safety import EXCLUSIVE, READ, SLOT, Interval, Recorder, Report, Violation

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_exports_the_command_only() -> None:
    """``lockbench`` re-exports ``main`` (the console script's target) and nothing else."""
    assert lockbench.__all__ == ["main"]
    assert callable(lockbench.main)


def test_the_public_modules_are_safety_fuzz_etcd_replicas_and_faults() -> None:
    """Every module of the package is private except ``safety``, ``fuzz``, ``etcd`` and
    ``replicas`` (the harness of replicated groups: real etcd and replica processes for the
    tests, the soak, the benchmark and the demo), ``faults`` (the fault lab) and
    ``__main__`` for ``python -m lockbench``."""
    public = {
        m.name
        for m in pkgutil.iter_modules(lockbench.__path__)
        if not m.name.startswith("_") or m.name == "__main__"
    }
    assert public == {"safety", "fuzz", "etcd", "replicas", "faults", "__main__"}


SAFETY = {
    "EXCLUSIVE",
    "READ",
    "SLOT",
    "Attempt",
    "check_barrier",
    "check_latch",
    "check_leaders",
    "check_reentrant",
    "Interval",
    "Recorder",
    "Report",
    "Violation",
    "check",
    "load",
    "main",
}


def _surface(module: types.ModuleType, names: list[str]) -> None:
    assert len(names) == len(set(names)), "a name listed twice"
    for name in names:
        value = getattr(module, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module.__name__, f"{name} is defined elsewhere"


def test_safety_all_is_exactly_the_public_surface() -> None:
    """``lockbench.safety.__all__`` lists exactly the documented names, each defined there."""
    assert set(lockbench.safety.__all__) == SAFETY
    _surface(lockbench.safety, lockbench.safety.__all__)


def test_safety_modes_are_the_recording_format() -> None:
    """The mode letters are written into recording files: never change them. The long names
    and ``x`` are accepted on the way in."""
    assert (EXCLUSIVE, READ, SLOT) == ("w", "r", "s")
    for given, mode in [("write", "w"), ("x", "w"), ("read", "r"), ("slot", "s")]:
        assert Interval("a", given, 0.0, 1.0).mode == mode


def test_safety_recording_line_format(tmp_path: Path) -> None:
    """One recorded interval is one JSON line with exactly these keys; :func:`load` reads it
    back equal (files from an older checker stay readable)."""
    path = tmp_path / "rec.jsonl"
    with Recorder(path) as rec:
        got = rec.record("a", "r", 1.0, 2.0, 7, "h", 3)
    line = json.loads(path.read_text())
    assert line == {
        "lock": "a",
        "mode": "r",
        "start": 1.0,
        "end": 2.0,
        "fence": 7,
        "holder": "h",
        "capacity": 3,
    }
    assert lockbench.safety.load([path]) == [got]


def test_safety_value_classes() -> None:
    """Interval, Violation and Report are frozen attrs records with these fields."""
    examples: list[tuple[object, tuple[str, ...]]] = [
        (
            Interval("a", "w", 0.0, 1.0),
            ("lock", "mode", "start", "end", "fence", "holder", "capacity"),
        ),
        (Violation("fence-order", "a", "d", ()), ("kind", "lock", "detail", "intervals")),
        (
            Report(0, 0, (), {}, {}, {}),
            ("intervals", "locks", "violations", "counts", "holders", "max_holders"),
        ),
    ]
    for value, names in examples:
        assert tuple(f.name for f in attrs.fields(type(value))) == names
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            value.lock = "b"  # type: ignore[attr-defined]


def test_safety_recorder_and_report_methods() -> None:
    """The Recorder records (``record``, ``hold``, ``now``), hands back what it holds
    (``intervals``, ``check``) and closes (``close``, a context manager); a Report says
    ``ok``, ``summary()`` and ``assert_ok()``."""
    public = {n for n in vars(Recorder) if not n.startswith("_")}
    assert public == {"now", "record", "hold", "intervals", "check", "close"}
    assert hasattr(Recorder, "__enter__") and hasattr(Recorder, "__exit__")
    assert {"ok", "summary", "assert_ok"} <= set(vars(Report))
    report = Recorder().check()
    assert report.ok and "0 critical sections" in report.summary()
    report.assert_ok()


def test_safety_command_runs_as_a_module(tmp_path: Path) -> None:
    """``python -m lockbench.safety FILE`` checks a recording (exit 0 when clean)."""
    path = tmp_path / "rec.jsonl"
    with Recorder(path) as rec:
        rec.record("a", "w", 0.0, 1.0, 1)
    done = subprocess.run(
        [sys.executable, "-m", "lockbench.safety", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "1 critical sections, 1 locks, 1 holders: OK" in done.stdout


FUZZ = {
    "MAX_FRAME",
    "REQUEST_CODES",
    "CLOSING",
    "Case",
    "make_case",
    "base_message",
    "frame",
    "encode",
    "Conversation",
    "check_replies",
}


def test_fuzz_all_is_exactly_the_public_surface() -> None:
    """``lockbench.fuzz.__all__`` lists exactly the generator's and the conversation's names,
    each defined there."""
    assert set(lockbench.fuzz.__all__) == FUZZ
    _surface(lockbench.fuzz, lockbench.fuzz.__all__)


def test_fuzz_frames() -> None:
    """``frame`` puts a 4-byte big-endian length before the payload; ``encode`` frames any
    msgpack value unchecked."""
    assert lockbench.fuzz.frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert lockbench.fuzz.encode({"type": "ping"}) == lockbench.fuzz.frame(b"\x81\xa4type\xa4ping")
