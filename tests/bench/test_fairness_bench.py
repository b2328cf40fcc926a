"""benchmarks/fairness (issue 30's attacks from the outside), scaled down: every attack runs
against a real spawned server, each reports another client's pings while it ran, the idle
probe's status and the fan-out's transactions and warm-up. No timing assertions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import fairness


def test_every_attack_runs_small_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each attack at a small size (200 pipelined HTTP requests, 200 stats, 4 x 64 never-read
    subscriptions, 20 measured transactions): one result per attack in the JSON, each with
    the pinger's summary; every HTTP and stats reply was read (the attack returned); this
    server answers the probe at the connection cap with 200; the fan-out warmed up until
    every subscription's events were dropped and counted."""
    for attack in fairness.HTTP_ATTACKS:
        monkeypatch.setitem(fairness.HTTP_ATTACKS, attack, (fairness.HTTP_ATTACKS[attack][0], 200))
    monkeypatch.setattr(fairness, "STATS_COUNT", 200)
    monkeypatch.setattr(fairness, "FAN_CONNECTIONS", 4)
    monkeypatch.setattr(fairness, "FAN_MEASURED", 20)
    out = tmp_path / "runs.json"
    assert fairness.main(["--json", str(out)]) == 0
    runs = {r["attack"]: r for r in json.loads(out.read_text())}
    assert set(runs) == set(fairness.ATTACKS)
    for r in runs.values():
        assert r["layout"] == "unpinned"
        assert "count" in r["ping_ms"]
    for attack in fairness.HTTP_ATTACKS:
        assert runs[attack]["received_bytes"] > 0
    assert runs["idle"]["probe_status"] == 200
    fan = runs["fanout"]
    assert fan["subscriptions"] == 4 * 64
    assert fan["all_dropping"] is True
    assert fan["dropped_per_transaction"] == 4 * 64
    assert fan["transaction_ms"]["count"] == 20


def test_the_summary_sets_before_beside_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--summarize: one row per attack and layout, each side's runs from the files whose
    names say before and after, the probe's status and the fan-out's transaction p50."""
    ping = {"count": 3, "p50": 1.0, "p99": 2.0, "worst": 3.0}
    before = [
        {"attack": "healthz", "layout": "pinned", "ping_ms": {**ping, "worst": 2000.0}},
        {"attack": "idle", "layout": "pinned", "probe_status": 503, "ping_ms": {"count": 0}},
    ]
    after = [
        {"attack": "healthz", "layout": "pinned", "ping_ms": ping},
        {"attack": "idle", "layout": "pinned", "probe_status": 200, "ping_ms": {"count": 0}},
        {"attack": "fanout", "layout": "pinned", "ping_ms": ping, "transaction_ms": ping},
    ]
    (tmp_path / "x-before.json").write_text(json.dumps(before))
    (tmp_path / "x-after.json").write_text(json.dumps(after))
    files = [str(tmp_path / "x-before.json"), str(tmp_path / "x-after.json")]
    assert fairness.main(["--summarize", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "before: ping p99 / worst ms | after: ping p99 / worst ms" in lines[0]
    assert lines[2] == "| healthz | pinned | 2.0 / 2000.0 | 2.0 / 3.0 |  |"
    assert lines[3] == "| idle | pinned | - / - | - / - | before: probe 503; after: probe 200 |"
    assert lines[4] == "| fanout | pinned |  | 2.0 / 3.0 | after: tx p50 1.0 ms |"


def test_an_unknown_attack_is_refused() -> None:
    """--only with a name that is not an attack: exit 2 naming it."""
    with pytest.raises(SystemExit) as exc:
        fairness.main(["--only", "healthz,flood"])
    assert exc.value.code == 2
