"""benchmarks/group_latency (issue 29's measurement): one short round runs every system --
cload through a real group, etcd's put two ways, etcd's v3 lock -- against a real etcd, each
with transactions counted and latencies recorded, and the JSON holds every run. No timing
assertions; skipped without etcd or a C compiler."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from benchmarks import group_latency
from lockbench.etcd import ETCD, SKIP_REASON


@pytest.mark.skipif(ETCD is None, reason=SKIP_REASON)
@pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "gcc")) is None, reason="cload needs a C compiler (gcc)"
)
def test_one_short_round_measures_every_system(tmp_path: Path) -> None:
    """A round of half a second per run: the group's strict shape, etcd's put through
    http.client and raw, and etcd's lock each record transactions and a p50; cload's run
    was error-free (it raises otherwise)."""
    out = tmp_path / "runs.json"
    args = ["--rounds", "1", "--duration", "0.5", "--shapes", "strict", "--json", str(out)]
    assert group_latency.main(args) == 0
    runs = json.loads(out.read_text())
    systems = {r["system"] for r in runs}
    assert systems == {"group", "etcd put http.client", "etcd put raw", "etcd lock"}
    for r in runs:
        assert r["tx_per_s"] > 0
        assert r["p50_us"] > 0
    group = next(r for r in runs if r["system"] == "group")
    assert group["raw"]["errors"] == 0
    assert group["raw"]["connections"] == 1
    assert group["raw"]["depth"] == 1
