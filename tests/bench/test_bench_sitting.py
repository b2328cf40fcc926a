"""The sitting's summary: tables and the issue's targets judged from result files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from lockbench._results import ResultDocument, write_document
from lockbench._sitting import E2E_SHAPES, write_summary

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
