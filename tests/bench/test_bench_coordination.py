"""The coordination workloads (lockbench._coordination, issue 33) run end to end, small: a
clean-resign failover and a kill -9 failover against a spawned lockserver, the same two
against a real one-member etcd through its JSON gateway, and a few barrier rounds of two
processes. Speed is measured by ``benchmarks/coordination.py``, not here; the one bound
asserted is the issue's (a failover after kill -9 is bounded by the session's max age: the
dead leader's session must expire first, and nothing longer), with a generous margin."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockbench._coordination import barrier_rounds, etcd_failover, failover
from lockbench._spawn import ServerProcess, spawned
from lockbench._targets import Backend
from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster


@pytest.fixture(scope="module")
def lockserver() -> Iterator[ServerProcess]:
    with spawned(Backend.LOCKSERVER) as server:
        yield server


def test_failover_after_resign_and_after_kill(lockserver: ServerProcess) -> None:
    """A resignation hands over (a positive time); a killed leader is replaced once its
    session can have expired: not before a third of its max age (its last keepalive was at
    most a third before the kill), and within the max age plus a generous margin."""
    assert failover(lockserver.port, "resign") > 0
    took = failover(lockserver.port, "kill", max_age=1.0)
    assert 1.0 / 3 <= took <= 1.0 + 2.0


def test_barrier_rounds(lockserver: ServerProcess) -> None:
    """Two processes pass 20 rounds of a cyclic barrier: a positive time per round."""
    assert barrier_rounds(lockserver.port, 2, 20) > 0


def test_etcd_failover(tmp_path: Path) -> None:
    """etcd's election through its gateway: a resignation and a kill -9 of the leader's
    process (lease TTL 1 s) both hand over to the standby."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    with EtcdCluster(tmp_path / "etcd") as etcd:
        endpoint = etcd.start(1).endpoints[0]
        assert etcd_failover(endpoint, "resign") > 0
        assert 0 < etcd_failover(endpoint, "kill", ttl=1) <= 1.0 + 3.0
