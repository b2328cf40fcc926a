"""benchmarks/step_trace.py: a traced server serves, stops on SIGTERM and writes its report."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from client import Assert, LockClient, SetVar


def test_a_traced_server_reports_its_steps_holes_and_collector(tmp_path: Path) -> None:
    out = tmp_path / "trace.json"
    command = [sys.executable, "-m", "benchmarks.step_trace", "--out", str(out)]
    command += ["--threshold-ms", "0", "--", "--port", "0", "--log-level", "warning"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # "lockserver listening on 127.0.0.1:PORT"
            assert "listening on" in line, line
            port = int(line.rsplit(":", 1)[1])
            with LockClient(port=port, timeout=10) as client, client.session() as session:
                for i in range(5):
                    assert session.execute("ns", [Assert(SetVar("t", str(i)))]).ok
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
    report = json.loads(out.read_text())
    assert report["threshold_ms"] == 0
    # Threshold 0: every step is there, the poller's among them, each with wall >= CPU >= 0.
    tasks = {s["task"] for s in report["steps"]}
    assert any(t.endswith("poll_loop") for t in tasks), tasks
    assert all(s["ms"] >= 0 and s["cpu_ms"] >= 0 for s in report["steps"])
    # Between the poller's steps: the gaps, each with what ran in it.
    assert report["holes"] and all(h["other_steps"] >= 0 for h in report["holes"])
    assert isinstance(report["gc"], dict)
    assert report["nivcsw"] >= 0 and report["nvcsw"] > 0
