"""The lab's report and ``lockbench faults check``: a one-screen summary, a timeline picture and
the verdict as JSON lines, one history or two side by side; the command's exit status says
valid (0), violation or undecided (1), unreadable (2)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from lab_histories import lab_history

from lockbench.faults import (
    History,
    HistoryWriter,
    Meta,
    Op,
    check,
    check_main,
    write_report,
)
from lockbench.faults._report import summary

SCREEN_LINES = 45
SCREEN_COLUMNS = 100


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def distinct_colours(path: Path) -> int:
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    return len({tuple(p) for p in pixels.reshape(-1, pixels.shape[-1])[::37]})


def save(path: Path, history_kwargs: dict[str, object] | None = None, system: str = "") -> Path:
    """Write a simulated run as a history file, the way the lab writes one."""
    h = lab_history(**(history_kwargs or {}))  # type: ignore[arg-type]
    meta = h.meta
    assert meta is not None
    if system:
        meta = Meta(system, meta.nodes, meta.seed, meta.origin_monotonic + 1, meta.origin_wall)
    with HistoryWriter(path) as w:
        w.write(meta)
        for record in [*h.faults, *h.ops, *h.holds, *h.writes]:
            w.write(record)
    return path


# --- the summary and the files ----------------------------------------------------------------


def test_one_history_gives_a_one_screen_summary_a_picture_and_json_lines(tmp_path: Path) -> None:
    """summary.txt fits a screen and says the verdict, what was checked, the faults, the
    availability and recovery per kind; timeline.png is a real picture; verdict.jsonl holds
    the verdict's lines."""
    h = lab_history()
    verdict = check(h)
    files = write_report(h, verdict, tmp_path / "report")
    text = files.summary.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES and max(map(len, lines)) <= SCREEN_COLUMNS
    assert lines[0].split() == ["fault", "lab", "lockserver"]
    for needle in ["VERDICT", "VALID", "register ops / keys", "lock grants / holds"]:
        assert needle in text
    for kind in ["isolate", "kill-replica", "clock-step"]:
        assert sum(kind in line for line in lines) == 3  # injected, availability, recovery
    assert "no fault" in text and "violations" in text
    width, height = png_size(files.timeline)
    assert width > 600 and height > 600
    assert distinct_colours(files.timeline) > 20  # not a blank canvas
    jsonl = [json.loads(line) for line in files.verdict.read_text().splitlines()]
    assert jsonl[0]["type"] == "verdict" and jsonl[0]["status"] == "valid"
    assert {line["system"] for line in jsonl} == {"lockserver"}


def test_two_histories_side_by_side(tmp_path: Path) -> None:
    """Our group beside etcd's lock: one column each in the summary (violations by kind with
    each side's count, the first example of each kind), one column each in a wider picture,
    both verdicts in verdict.jsonl."""
    ours, theirs = lab_history(), lab_history("etcd", double_grant=True, stale_read=True)
    verdicts = [check(ours), check(theirs)]
    files = write_report([ours, theirs], verdicts, tmp_path)
    text = files.summary.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES and max(map(len, lines)) <= SCREEN_COLUMNS
    assert lines[0].split() == ["fault", "lab", "lockserver", "etcd"]
    verdict_line = next(line for line in lines if line.startswith("VERDICT"))
    assert verdict_line.split()[1:3] == ["VALID", "INVALID"]
    overlap = next(line for line in lines if line.strip().startswith("exclusive-overlap"))
    assert overlap.split()[1:] == ["0", str(verdicts[1].counts["exclusive-overlap"])]
    examples = text.split("first violation of each kind")[1]
    for kind in ["granted-during-guarantee", "exclusive-overlap", "nonlinearizable"]:
        assert "etcd " in examples and kind in examples
    one = write_report(ours, verdicts[0], tmp_path / "one")
    assert png_size(files.timeline)[0] > png_size(one.timeline)[0]
    systems = [json.loads(line)["system"] for line in files.verdict.read_text().splitlines()]
    assert set(systems) == {"lockserver", "etcd"}


def test_two_runs_of_one_system_get_numbered_columns() -> None:
    """Columns stay apart when both histories come from the same system."""
    h = lab_history(duration=5.0)
    v = check(h)
    assert summary([h, h], [v, v]).splitlines()[0].split() == [
        "fault",
        "lab",
        "lockserver",
        "#1",
        "lockserver",
        "#2",
    ]


def test_an_unknown_verdict_says_why(tmp_path: Path) -> None:
    """The reasons close the summary."""
    h = lab_history(duration=5.0)
    text = summary([h], [check(h, max_states=3)])
    assert "why unknown" in text and "search bound hit: 3 states explored" in text
    assert "UNKNOWN" in text


def test_summary_and_report_refuse_mismatched_inputs(tmp_path: Path) -> None:
    """One verdict per history, at least one."""
    h = lab_history(duration=5.0)
    with pytest.raises(ValueError, match="one verdict per history"):
        summary([h, h], [check(h)])
    with pytest.raises(ValueError, match="one verdict per history"):
        write_report([], [], tmp_path)


# --- the command ------------------------------------------------------------------------------


def test_check_of_a_valid_run_exits_0_and_writes_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --out the report goes to the history's directory; the summary is printed."""
    path = save(tmp_path / "history.jsonl", {"duration": 20.0})
    assert check_main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "VALID" in out and "report:" in out
    assert (tmp_path / "summary.txt").exists() and (tmp_path / "timeline.png").exists()
    assert (tmp_path / "verdict.jsonl").exists()


def test_check_of_a_violation_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A double grant: the summary says INVALID, the status is 1."""
    path = save(tmp_path / "h.jsonl", {"duration": 40.0, "double_grant": True})
    assert check_main([str(path), "--out", str(tmp_path / "r")]) == 1
    assert "INVALID" in capsys.readouterr().out
    assert (tmp_path / "r" / "summary.txt").exists()


def test_check_of_an_undecided_run_exits_1(tmp_path: Path) -> None:
    """A search bound hit is not a pass."""
    path = save(tmp_path / "h.jsonl", {"duration": 10.0})
    assert check_main([str(path), "--max-states", "2", "--out", str(tmp_path / "r")]) == 1


def test_two_runs_are_reported_side_by_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files of two runs (different lab clocks) are two histories, judged each alone."""
    ours = save(tmp_path / "ours.jsonl", {"duration": 40.0})
    theirs = save(tmp_path / "etcd.jsonl", {"duration": 40.0, "double_grant": True}, "etcd")
    assert check_main([str(ours), str(theirs), "--out", str(tmp_path / "r")]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split() == ["fault", "lab", "lockserver", "etcd"]


def test_the_files_of_one_run_make_one_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A meta record in one file, the operations split across others without one."""
    h = lab_history(duration=10.0)
    assert h.meta is not None
    with HistoryWriter(tmp_path / "meta.jsonl") as w:
        w.write(h.meta)
    half = len(h.ops) // 2
    for name, part in [("a.jsonl", h.ops[:half]), ("b.jsonl", h.ops[half:])]:
        with HistoryWriter(tmp_path / name) as w:
            for op in part:
                w.write(op)
    paths = [str(tmp_path / n) for n in ("meta.jsonl", "a.jsonl", "b.jsonl")]
    assert check_main([*paths, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    whole = check(h)  # the same run, read whole (its holds and writes were not written here)
    assert f"{whole.linearizability.ops:,} / 3" in out
    assert f"{whole.locks.grants:,} / 0" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"type":"op","process":"p"}\n', "h.jsonl:1"),
        ("not json\n", "h.jsonl:1"),
        (b"\xff\xfe\n", "codec can't decode"),
        (
            '{"type":"op","process":"p","workload":"register","f":"cas","key":"k","value":3,'
            '"invoke":0,"complete":1,"outcome":"ok"}\n',
            "a cas needs value",
        ),
    ],
)
def test_unreadable_input_exits_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | bytes, message: str
) -> None:
    """A malformed record, bytes that are not UTF-8, a register op the model cannot read:
    one line on stderr, status 2, no report."""
    path = tmp_path / "h.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    assert check_main([str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lockbench faults check: error:") and message in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The OS error, in one line."""
    assert check_main([str(tmp_path / "nope.jsonl")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_a_file_without_meta_among_two_runs_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With two runs given, a file without a meta record belongs to neither for sure."""
    ours = save(tmp_path / "ours.jsonl", {"duration": 5.0})
    theirs = save(tmp_path / "etcd.jsonl", {"duration": 5.0}, "etcd")
    loose = tmp_path / "loose.jsonl"
    with HistoryWriter(loose) as w:
        w.write(Op("p", "register", "read", "k", None, 0, 1, "ok"))
    assert check_main([str(ours), str(theirs), str(loose)]) == 2
    assert "loose.jsonl has no meta record" in capsys.readouterr().err


def test_a_torn_last_line_is_skipped_only_when_asked(tmp_path: Path) -> None:
    """A lab killed mid-write leaves half a line: refused by default, skipped on request."""
    path = save(tmp_path / "h.jsonl", {"duration": 10.0})
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"type":"op","proc')
    assert check_main([str(path), "--out", str(tmp_path / "r")]) == 2
    assert check_main([str(path), "--tolerate-torn-tail", "--out", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("option", [["--max-states", "0"], ["--time-limit", "-1"]])
def test_bad_bounds_are_usage_errors(tmp_path: Path, option: list[str]) -> None:
    """argparse's own exit status 2."""
    with pytest.raises(SystemExit) as exc:
        check_main([str(tmp_path / "h.jsonl"), *option])
    assert exc.value.code == 2


def test_an_unwritable_report_directory_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out naming a file: the report cannot be written, said in one line."""
    path = save(tmp_path / "h.jsonl", {"duration": 5.0})
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert check_main([str(path), "--out", str(blocker)]) == 2
    assert "cannot write the report" in capsys.readouterr().err


def test_a_history_with_nothing_but_faults_still_gets_a_report(tmp_path: Path) -> None:
    """Nothing to check is "unknown", and the report says so without failing to draw."""
    h = History(None, (), (), (), lab_history(duration=1.0).faults)
    verdict = check(h)
    files = write_report(h, verdict, tmp_path)
    assert "UNKNOWN" in files.summary.read_text() and png_size(files.timeline)[0] > 600


@pytest.mark.parametrize("n", [1, 2])
def test_a_tiny_history_draws_without_warnings(tmp_path: Path, n: int) -> None:
    """One operation (a single instant of lab time) or two with the same latency: the
    picture's limits come from the data, never a singular range (warnings are errors here)."""
    ops = tuple(Op(f"p{i}", "register", "write", "k", i, 1.0 + i, 1.1 + i, "ok") for i in range(n))
    h = History(None, ops, (), (), ())
    files = write_report(h, check(h), tmp_path)
    assert png_size(files.timeline)[0] > 600
