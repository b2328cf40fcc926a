"""benchmarks/stalls.py runs each measurement on a small store (no timing assertions)."""

from __future__ import annotations

import pytest

from benchmarks import stalls


def test_each_measurement_times_every_call(capsys: pytest.CaptureFixture[str]) -> None:
    """One timing per cycle (and one for the sweep), all positive; main prints five rows, or
    those asked for."""
    assert len(stalls.table_churn(held=50, churn=30)) == 30
    assert len(stalls.growth(40)) == 40
    assert len(stalls.big_end(160)) == 8
    assert len(stalls.session_churn(held=20, churn=30)) == 30  # more cycles than live sessions
    (sweep,) = stalls.mass_expiry(25)
    assert sweep > 0
    stalls.main(["--held", "40", "--churn", "10", "--expire", "5", "--grow", "30"])
    rows = capsys.readouterr().out.splitlines()
    names = ["table churn", "session churn", "mass expiry", "big end", "growth"]
    assert [r.split(",")[0] for r in rows] == names
    assert all("max" in r for r in rows)
    assert rows[4].endswith(")") and "(acquire " in rows[4]
    stalls.main(["--only", "growth", "--only", "expiry", "--expire", "5", "--grow", "30"])
    rows = capsys.readouterr().out.splitlines()
    assert [r.split(",")[0] for r in rows] == ["mass expiry", "growth"]
