"""The sitting's summary: tables and the issue's targets judged from result files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from lockbench._results import ResultDocument, read_document, write_document
from lockbench._summary import E2E_SHAPES, write_summary

from .test_bench_results import make_result


def _e2e(backend: str, shape: str, ops: float, repeat: int = 0) -> Any:
    return make_result(
        backend=backend,
        ops_per_s=ops,
        extra={"shape": shape, "repeat": repeat, "machine_cpu_pct": 150.0}
        | {"client_cpu_pct": 80.0, "server_cpu_pct": 60.0, "other_cpu_pct": 10.0},
    )


def _blast(name: str, tx: float, p99: float, bpe: float) -> Any:
    r = make_result(name=name, kind="blast", client="raw", requests_per_s=tx, ops_per_s=tx)
    return attrs.evolve(
        r,
        latency_us={**r.latency_us, "p99": p99},
        extra={"bytes_per_entry": bpe, "prefill_entries": 1_000_000, "prefill_seconds": 9.0}
        | {"rss_before_bytes": 30 * 2**20, "rss_after_prefill_bytes": 330 * 2**20},
    )


def test_summary_judges_the_targets(tmp_path: Path) -> None:
    """Ratios and thresholds become met / not met, with the figures quoted; repeated pairs
    are judged by their median ratio."""
    ratios = {"async-64tasks-64conn": 1.4, "pipelined-1conn-p64": 1.0}
    e2e = []
    for shape in E2E_SHAPES:
        e2e.append(_e2e("redis", shape.key, 1000.0))
        e2e.append(_e2e("lockserver", shape.key, 1000.0 * ratios.get(shape.key, 2.0)))
    e2e = [r for r in e2e if r.extra["shape"] != "sync-1conn"]
    for rep, (ours, theirs) in enumerate([(900.0, 1000.0), (1200.0, 1000.0), (1100.0, 1000.0)]):
        e2e.append(_e2e("lockserver", "sync-1conn", ours, rep))
        e2e.append(_e2e("redis", "sync-1conn", theirs, rep))
    write_document(tmp_path / "e2e.json", ResultDocument(tuple(e2e), {"nproc": 2}))
    write_document(
        tmp_path / "workloads.json",
        ResultDocument((make_result(), make_result(backend="redis", ops_per_s=2500.0))),
    )
    blasts = (
        _blast("capacity-1conn-pipelined", 250_000, 900, 300.0),
        _blast("capacity-64conn", 30_000, 5000, 300.0),
        _blast("strict-rr-1conn", 15_000, 120, 300.0),
        _blast("paced-64conn-half", 15_000, 1200, 300.0),
    )
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(blasts))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    verdicts = {
        line.split("|")[1].strip(): line.split("|")[3].strip()
        for line in text.splitlines()
        if line.startswith(("| E2E", "| Blast", "| Memory"))
    }
    assert verdicts == {
        "E2E one sync connection >= 1.0x Redis": "**met**",
        "E2E 64 async tasks >= 1.5x Redis (64 connections each)": "**not met**",
        "E2E pipelined (64 in flight, 1 connection) >= 1.0x Redis": "**met**",
        "Blast: 1 pipelined connection >= 200,000 tx/s (1M held)": "**met**",
        "Blast: 64 unpipelined connections >= 40,000 tx/s (1M held)": "**not met**",
        "Blast: 1 connection strict request/response >= 14,000 tx/s, p99 <= 150 µs": "**met**",
        "Blast: p99 <= 1 ms at half of capacity, 64 connections": "**not met**",
        "Memory <= 400 bytes per held entry at 1,000,000": "**met**",
        # issue 19: 50 µs/tx in both phases, 300 bytes per entry
        "Blast: server CPU <= 13 µs/tx, 64 unpipelined connections (issue 19)": "**not met**",
        "Blast: server CPU <= 7 µs/tx, 1 pipelined connection (issue 19)": "**not met**",
        "Memory <= 200 bytes per held entry at 1,000,000 (issue 19)": "**not met**",
    }
    assert "1.10x (0.90 to 1.20, n=3); medians 1,100 vs 1,000 pairs/s" in text
    assert "2.00x; medians 2,000 vs 1,000 pairs/s | **met**" in text
    assert "| mutex-uncontended | 5,000 | 2,500 | 2.00x |" in text
    assert "60, 80, 10 / 60, 80, 10" in text
    assert "**300 bytes per entry**" in text
    assert (tmp_path / "e2e.png").exists() and (tmp_path / "blast.png").exists()


def test_summary_of_an_empty_directory(tmp_path: Path) -> None:
    """No result files: a summary that says n/a rather than a crash."""
    write_summary(tmp_path)
    assert (
        "| Memory <= 400 bytes per held entry at 1,000,000 | - | n/a |"
        in (tmp_path / "summary.md").read_text()
    )


def _repeat(r: Any, rep: int) -> Any:
    return attrs.evolve(r, extra={**r.extra, "repeat": rep})


def test_repeated_blast_suites_are_judged_by_their_median_run(tmp_path: Path) -> None:
    """Three suites: each phase's row and verdict come from its median run (by tx/s; by p99
    for the paced phase), every run's figure is listed, and one bad run does not decide."""
    runs = [  # (pipelined tx/s, 64-conn tx/s, paced p99 µs) per run
        (90_000, 45_000, 600.0),
        (85_000, 47_000, 900.0),
        (95_000, 39_000, 40_000.0),  # a stall: the paced p99 of the last run is 40 ms
    ]
    results = []
    for rep, (pipelined, conns, p99) in enumerate(runs):
        results += [
            _repeat(_blast("capacity-1conn-pipelined", pipelined, 900, 300.0), rep),
            _repeat(_blast("capacity-64conn", conns, 5000, 300.0), rep),
            _repeat(_blast("strict-rr-1conn", 15_000, 120, 300.0), rep),
            _repeat(_blast("paced-64conn-half", conns / 2, p99, 300.0), rep),
        ]
    paced = results[7]  # the median run's paced phase: the server reported a gen-1 pass
    results[7] = attrs.evolve(
        paced,
        extra={
            **paced.extra,
            "server_gc": {"collections": [2, 1, 0], "pause_total_ms": [3.2, 34.4, 0.0]},
        },
    )
    results[1] = attrs.evolve(
        results[1],
        extra={
            **results[1].extra,
            "server_gc": {"collections": [0, 0, 0], "pause_total_ms": [0, 0, 0]},
        },
    )
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(tuple(results)))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| capacity-1conn-pipelined")]
    assert len(rows) == 1 and "| 90,000 |" in rows[0]
    assert rows[0].endswith("| 90,000 / 85,000 / 95,000 |")
    assert "p99 600 / p99 900 / p99 40,000" in text
    assert "| Blast: p99 <= 1 ms at half of capacity, 64 connections | p99 900 µs at" in text
    assert "| Blast: 64 unpipelined connections >= 40,000 tx/s (1M held) | 45,000 tx/s |" in text
    assert "3 runs of the suite" in text
    assert "| p99.9 µs | max µs |" in text
    # GC passes per phase as the server reported them: none, some, or not reported ("-").
    assert "| GC passes (ms) |" in text
    rows = {
        line.split("|")[1].split(" (")[0].strip(): line
        for line in text.splitlines()
        if line.startswith("| ")
    }
    assert "| none |" in rows["capacity-64conn"]
    assert "| gen0 2 (3 ms), gen1 1 (34 ms) |" in rows["paced-64conn-half"]
    assert "| - |" in rows["strict-rr-1conn"]


def test_summary_names_each_parts_commit_when_they_differ(tmp_path: Path) -> None:
    """A part rerun later (``--parts blast``) is measured on another commit: the summary says
    which part ran on which, and says nothing when all agree."""
    e2e = (_e2e("lockserver", "sync-1conn", 1000.0), _e2e("redis", "sync-1conn", 900.0))
    blast = (_blast("capacity-64conn", 45_000, 900, 300.0),)
    write_document(tmp_path / "e2e.json", ResultDocument(e2e, {"commit": "aaa1111"}))
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(blast, {"commit": "aaa1111"}))
    write_summary(tmp_path)
    assert "different commits" not in (tmp_path / "summary.md").read_text()
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(blast, {"commit": "bbb2222"}))
    write_summary(tmp_path)
    assert (
        "Parts measured on different commits: end to end aaa1111, blast lockserver bbb2222."
        in (tmp_path / "summary.md").read_text()
    )


def test_shards_rows_sit_next_to_one_server(tmp_path: Path) -> None:
    """A "2 shards" suite beside the one-server suite: its own section with both figures per
    phase, the ratio, each shard's tx/s and both CPU splits, and the issue's 1.6x verdict for
    the pipelined phase, judged on the medians."""
    one = (
        _blast("capacity-1conn-pipelined", 100_000, 900, 300.0),
        _blast("capacity-64conn", 40_000, 5000, 300.0),
    )
    shards = []
    for rep, pipelined in enumerate([150_000, 170_000, 190_000]):
        for name, tx in (("capacity-1conn-pipelined", pipelined), ("capacity-64conn", 50_000.0)):
            r = _repeat(_blast(name, tx, 1500, 300.0), rep)
            servers = [
                {"server": "127.0.0.1:1", "connections": 1, "tx_per_s": tx * 0.6},
                {"server": "127.0.0.1:2", "connections": 1, "tx_per_s": tx * 0.4},
            ]
            shards.append(attrs.evolve(r, extra={**r.extra, "servers": servers}))
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(one))
    write_document(tmp_path / "blast-lockserver-2shards.json", ResultDocument(tuple(shards)))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "## Blast: 2 shards next to 1 server" in text
    assert "## Blast (lockserver, 2 shards)" in text
    rows = [line for line in text.splitlines() if line.startswith("| capacity-1conn-pipelined")]
    row = next(line for line in rows if "| 1.70x |" in line)
    assert "| 100,000 | 170,000 | 1.70x | 102,000 / 68,000 |" in row
    assert "| 900 / 1,500 |" in row
    verdict = next(line for line in text.splitlines() if line.startswith("| Blast: 2 shards"))
    assert verdict.endswith("| 1.70x: 170,000 vs 100,000 tx/s | **met** |")
    slower = attrs.evolve(one[0], requests_per_s=120_000.0)
    write_document(tmp_path / "blast-lockserver.json", ResultDocument((slower,)))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    verdict = next(line for line in text.splitlines() if line.startswith("| Blast: 2 shards"))
    assert verdict.endswith("| 1.42x: 170,000 vs 120,000 tx/s | **not met** |")


def _laid(r: Any, layout: str, **extra: Any) -> Any:
    cpus = {"server": [0], "load": [1]} if layout == "pinned" else {"server": [0, 1]}
    cpus.setdefault("load", [0, 1])
    return attrs.evolve(
        r,
        params={**r.params, "layout": layout},
        extra={**r.extra, "cpus": cpus, **extra},
    )


def _big(
    layout: str, tx: float, worst_us: float, gap_us: float, rep: int, rate: float | None = None
) -> Any:
    r = _blast("bigtable" if rate is None else "paced-bigtable", tx, 900, 280.0)
    r = attrs.evolve(
        r,
        latency_us={**r.latency_us, "max": worst_us},
        params={
            **r.params,
            "prefill": 1_000_000,
            "connections": 64,
            "bigtable": True,
            "rate": rate,
        },
    )
    return _laid(
        r,
        layout,
        repeat=rep,
        reply_gap_max_us=gap_us,
        reply_gap_at_s=2.6,
        prefill_sessions=16,
        prefill_batch=250,
        entries_held=1_000_000,
        entries_held_after=1_400_000,
        phase="1,000,000 held in one table",
    )


def test_both_layouts_side_by_side(tmp_path: Path) -> None:
    """Results of two layouts: one side-by-side table (each shape's median run in each
    layout), then each layout's own tables and targets; the bigtable section per layout,
    and issue 19's stall verdict judged on the worst run of each layout."""
    e2e = []
    for layout, ours in (("pinned", 900.0), ("unpinned", 1200.0)):
        e2e.append(_laid(_e2e("lockserver", "sync-1conn", ours), layout))
        e2e.append(_laid(_e2e("redis", "sync-1conn", 1000.0), layout))
    write_document(tmp_path / "e2e.json", ResultDocument(tuple(e2e)))
    blast = (
        _laid(_blast("capacity-64conn", 38_000, 2000, 300.0), "pinned"),
        _laid(_blast("capacity-64conn", 50_000, 1900, 300.0), "unpinned"),
    )
    write_document(tmp_path / "blast-lockserver.json", ResultDocument(blast))
    big = (
        _big("pinned", 30_000, 3_100.0, 2_900.0, 0),
        _big("unpinned", 40_000, 2_000.0, 1_500.0, 0),
        _big("unpinned", 41_000, 2_200.0, 1_700.0, 1),
        attrs.evolve(  # one stall: the pinned verdict; the server's passes say it was its own
            _big("pinned", 31_000, 46_000.0, 45_500.0, 1),
            extra={
                **_big("pinned", 31_000, 46_000.0, 45_500.0, 1).extra,
                "server_passes": {"passes": 9000, "over_ms": {"2.5": 3, "5": 1, "10": 1}},
                "arrival_latency_us": {"count": 9000, "max": 45_900.0},
            },
        ),
        _big("pinned", 29_000, 2_500.0, 2_400.0, 2),
        _big("unpinned", 39_000, 4_900.0, 4_000.0, 2),
        # paced at half: a stall beyond the target unpinned, none pinned
        _big("pinned", 15_000, 2_100.0, 1_900.0, 0, rate=15_000.0),
        _big("unpinned", 20_000, 9_800.0, 8_700.0, 0, rate=20_000.0),
    )
    write_document(tmp_path / "bigtable-lockserver.json", ResultDocument(big))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "**pinned** (server on CPU 0, load on CPU 1); **unpinned** (server on CPU 0,1" in text
    assert "## Both layouts side by side" in text
    assert (
        "| shape | server | ops/s pinned | ops/s unpinned | p99 µs pinned | p99 µs unpinned |"
        " max µs pinned | max µs unpinned | server CPU µs/op pinned | server CPU µs/op unpinned |"
    ) in text
    rows = {
        " | ".join(line.split(" | ")[:2]): line
        for line in text.splitlines()
        if line.count(" | ") >= 2
    }
    assert "| 38,000 | 50,000 | 2,000 | 1,900 |" in rows["| blast capacity-64conn | lockserver"]
    # The bigtable row: each layout's median run by tx/s (30,000 pinned, 40,000 unpinned).
    assert (
        "| 30,000 | 40,000 | 900 | 900 | 3,100 | 2,000 |" in rows["| blast bigtable | lockserver"]
    )
    assert (
        "| 900 | 1,200 |" in rows["| end to end: one sync connection (sync clients) | lockserver"]
    )
    for layout in ("pinned", "unpinned"):
        assert f"## End to end (Python client + server), mutex-uncontended, {layout}" in text
        assert f"## Blast (lockserver), {layout}: server capacity" in text
        assert f"## Big table (issue 19's stall shape), {layout}" in text
        assert f"## The issues' targets, {layout}" in text
    closed = [
        line
        for line in text.splitlines()
        if line.startswith("| Big table, closed loop: worst latency")
    ]
    assert len(closed) == 2
    pinned, unpinned = closed  # the pinned layout's tables come first
    assert pinned.endswith("| **not met** |") and "worst 46.0 ms over 3 run(s)" in pinned
    assert "max 46.0 ms (at arrival 45.9 ms), gap 45.5 ms, passes > 5 ms 1" in pinned
    assert unpinned.endswith("| **met** |") and "worst 4.9 ms over 3 run(s)" in unpinned
    paced = [line for line in text.splitlines() if line.startswith("| Big table, paced:")]
    assert len(paced) == 2
    assert paced[0].endswith("| **met** |") and "worst 2.1 ms over 1 run(s)" in paced[0]
    assert paced[1].endswith("| **not met** |") and "worst 9.8 ms over 1 run(s)" in paced[1]
    bigrows = [line for line in text.splitlines() if line.startswith("| closed loop | 30,000 |")]
    assert len(bigrows) == 1
    assert "| 2.9 ms (2.6) |" in bigrows[0] and "| 1,000,000 -> 1,400,000 |" in bigrows[0]
    assert any(line.startswith("| paced at 15,000/s | 15,000 |") for line in text.splitlines())
    assert (tmp_path / "blast.png").exists()


def test_results_from_before_layouts_count_as_unpinned(tmp_path: Path) -> None:
    """Files written before layouts were recorded: their results are unpinned (the sitting
    never pinned then) and sit in the unpinned column next to new ones."""
    old = _blast("capacity-64conn", 48_000, 2000, 300.0)
    new = _laid(_blast("capacity-64conn", 37_000, 2000, 300.0), "pinned")
    write_document(tmp_path / "blast-lockserver.json", ResultDocument((old, new)))
    write_summary(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    row = next(t for t in text.splitlines() if t.startswith("| blast capacity-64conn |"))
    assert "| 37,000 | 48,000 |" in row


def test_a_small_sitting_runs_the_bigtable_in_each_layout(tmp_path: Path) -> None:
    """`lockbench sitting --parts bigtable` scaled down (500 entries, 0.5 s windows, one
    run per layout): one result per layout in bigtable-lockserver.json, and the summary
    has them side by side (pinned only where the machine has 2 CPUs)."""
    import io
    import os

    from rich.console import Console

    from lockbench._sitting import Sitting, run_sitting

    layouts = ("pinned", "unpinned") if len(os.sched_getaffinity(0)) > 1 else ("unpinned",)
    sitting = Sitting(
        tmp_path,
        duration=0.5,
        warmup=0.0,
        prefill=500,
        parts=("bigtable",),
        blast_repeats=1,
        layouts=layouts,
    )
    run_sitting(sitting, Console(file=io.StringIO(), width=200))
    doc = read_document(tmp_path / "bigtable-lockserver.json")
    # Per layout the closed loop, then the same shape paced at half of what it served.
    assert [(r.params["layout"], r.name) for r in doc.results] == [
        (layout, name) for layout in layouts for name in ("bigtable", "paced-bigtable")
    ]
    assert all(r.errors == 0 and r.acquired > 0 for r in doc.results)
    for closed, paced in zip(doc.results[::2], doc.results[1::2], strict=True):
        assert closed.params["rate"] is None
        assert paced.params["rate"] == max(100.0, closed.requests_per_s // 200 * 100)
    text = (tmp_path / "summary.md").read_text()
    for layout in layouts:
        assert f"## Big table (issue 19's stall shape), {layout}" in text
    if len(layouts) == 2:
        assert "## Both layouts side by side" in text
        assert any(line.startswith("| blast bigtable | lockserver |") for line in text.splitlines())
