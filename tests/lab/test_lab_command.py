"""``lockbench faults``: the help says every nemesis and what the lab needs, bad options are
refused with exit 2 before anything starts, a machine that cannot run the lab is told why in
one line, and ``check`` judges history files (0 valid, 1 a violation, 2 unreadable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lockbench._cli import main as lockbench_main
from lockbench.faults import HistoryWriter, Meta, Op
from lockbench.faults import _command as command
from lockbench.faults._lab import LabConfig
from lockbench.faults._nemesis import KINDS
from lockbench.safety import Interval


def test_help_names_every_nemesis_and_the_needs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        lockbench_main(["faults", "run", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for kind in KINDS:
        assert kind in text
    for word in ("--system", "--nodes", "--duration", "--seed", "--out", "root", "faketime"):
        assert word in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nemesis", "isolat"], "unknown nemesis 'isolat'"),
        (["--nodes", "1"], "--nodes must be 2..9"),
        (["--duration", "10"], "leaves no time for faults"),
        (["--system", "etcd", "--workloads", "rw=2"], "etcd has no workload 'rw'"),
        (["--loss-percent", "0"], "--loss-percent must be 1..100"),
    ],
)
def test_bad_options_are_refused_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = lockbench_main(["faults", "run", "--out", str(tmp_path / "x"), *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_machine_that_cannot_run_the_lab_is_told_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "lab_refusal", lambda system: "the fault lab needs root")
    code = lockbench_main(["faults", "run", "--out", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "lockbench faults: cannot run here: the fault lab needs root"
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("text", "parsed"), [("3600", (3600.0, 0)), ("+60", (60.0, 1)), ("-3600", (3600.0, -1))]
)
def test_clock_offset_with_a_sign_fixes_the_direction(text: str, parsed: tuple[float, int]) -> None:
    assert command._offset(text) == parsed


def test_the_default_run_is_the_suites_shape() -> None:
    """Without options: our group, 3 nodes, 90 s, isolate + kill + clock-step."""
    config = LabConfig(out=Path("x"))
    assert (config.system, config.nodes, config.duration) == ("lockserver", 3, 90.0)
    assert config.nemesis == ("isolate", "kill", "clock-step")
    faults, left_out = config.plan(["n1", "n2", "n3"])
    assert sorted(f.kind for f in faults[:3]) == ["clock-step", "isolate", "kill"]
    assert left_out == []


def _history(path: Path, overlap: bool) -> Path:
    with HistoryWriter(path) as w:
        w.write(Meta("lockserver", ("n1", "n2", "n3"), 1, 100.0, 1.7e9))
        w.write(Op("c1-register0", "register", "write", "r0.0", 1, 1.0, 1.1, "ok"))
        w.write(Op("c2-register0", "register", "read", "r0.0", 1, 1.2, 1.3, "ok"))
        for holder, (start, end), fence in (("a", (2.0, 3.0), 10), ("b", (3.5, 4.0), 11)):
            w.write(
                Op(
                    f"c1-mutex{holder}",
                    "mutex",
                    "acquire",
                    "m0",
                    {"mode": "w", "valid_until": end + 5},
                    start - 0.1,
                    start,
                    "ok",
                    fence,
                )
            )
            w.write(Interval("m0", "w", start, end, fence, f"c1-mutex{holder}"))
        if overlap:
            w.write(Interval("m0", "w", 2.5, 2.7, 12, "intruder"))
    return path


def test_check_judges_history_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = _history(tmp_path / "good.jsonl", overlap=False)
    bad = _history(tmp_path / "bad.jsonl", overlap=True)
    assert lockbench_main(["faults", "check", str(good), "--out", str(tmp_path / "g")]) == 0
    assert lockbench_main(["faults", "check", str(bad), "--out", str(tmp_path / "b")]) == 1
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text('{"type": "op"}\n')
    assert lockbench_main(["faults", "check", str(garbage), "--out", str(tmp_path / "x")]) == 2
    assert (tmp_path / "b" / "summary.txt").exists()
    capsys.readouterr()
