"""examples/coordination.py runs end to end: it starts a server and shows an election failover
with a larger term, a group watch with the reasons members left, a barrier whose parties all
loaded before any computed, a latch that opened and a reentrant mutex held twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_coordination_example_runs() -> None:
    """The demo's own lines say what each recipe did."""
    done = subprocess.run(
        [sys.executable, "examples/coordination.py", "--once", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "lockserver listening on 127.0.0.1:" in out
    assert "observe: None" in out
    assert "node-b leads, term" in out and ": True" in out.split("node-b leads, term")[1]
    assert "observe: leader {'addr': '10.0.0.2'}" in out
    assert "left: [('y', 'left')]" in out and "left: [('x', 'ended')]" in out
    assert "latch open: True" in out
    assert "reentrant mutex held 2 times, fence True" in out
    assert "barrier: all loaded before any computed: True" in out
