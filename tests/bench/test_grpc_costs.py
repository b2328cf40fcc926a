"""benchmarks/grpc_costs (issue 29): h2's share of a put measured without a socket, and the
PING ACK rule against ACKs at once through the real transport against a real etcd member,
every way once. No timing assertions; the etcd part is skipped without etcd."""

from __future__ import annotations

import pytest

from benchmarks import grpc_costs
from lockbench.etcd import ETCD, SKIP_REASON


def test_h2_costs_measure_each_part() -> None:
    """Each of h2's parts is measured (a put built, its answer parsed, etcd's PING taken)."""
    for validate in (True, False):
        costs = grpc_costs.h2_costs(50, validate)
        assert set(costs) == {"build_us", "parse_us", "ping_us"}
        assert all(v > 0 for v in costs.values())


@pytest.mark.skipif(ETCD is None, reason=SKIP_REASON)
def test_one_round_runs_every_way(capsys: pytest.CaptureFixture[str]) -> None:
    """One round of 20 puts per way: the four ways (ACK at once or with the next request,
    the caller sleeping or polling) each report a p50 and the CPU per put."""
    assert grpc_costs.main(["--rounds", "1", "--puts", "20", "--calls", "20"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "p50" not in line]
    assert [row.split("|")[1:3] for row in rows] == [
        [" at once ", " sleeps "],
        [" at once ", " polls "],
        [" next request ", " sleeps "],
        [" next request ", " polls "],
    ]
