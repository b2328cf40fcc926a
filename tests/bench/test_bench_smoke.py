"""Short smoke runs: every workload against a spawned lockserver (and Redis when installed),
the blaster with a prefill, several processes, and the CLI writing JSON. A few hundred
operations each, bounded by --count; no timing assertions."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockbench import main
from lockbench._blast import BlastConfig, run_blast
from lockbench._results import read_document
from lockbench._runner import RunConfig, run
from lockbench._spawn import ServerProcess, redis_server_path, spawned
from lockbench._targets import Backend, Target
from lockbench._workloads import WORKLOADS, WorkloadParams

COUNT = 200


@pytest.fixture(scope="module")
def lockserver() -> Iterator[ServerProcess]:
    with spawned(Backend.LOCKSERVER) as server:
        yield server


@pytest.fixture(scope="module")
def redis_server() -> Iterator[ServerProcess]:
    if redis_server_path() is None:
        pytest.skip("redis-server not installed: apt-get install redis-server")
    with spawned(Backend.REDIS) as server:
        yield server


def _config(server: ServerProcess, backend: Backend, workload: str, **kw: object) -> RunConfig:
    base: dict[str, object] = {
        "count": COUNT,
        "warmup": 0.0,
        "duration": 20.0,
        "interval": 0.1,
        "params": WorkloadParams(seed=3),
    }
    base.update(kw)
    return RunConfig(workload, Target(backend, server.host, server.port), **base)  # type: ignore[arg-type]


def _check(result_ops: int, errors: int, samples: object) -> None:
    assert errors == 0, samples
    assert COUNT <= result_ops < COUNT + 64  # stops at --count (plus the cycles in flight)


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_each_workload_async(lockserver: ServerProcess, workload: str) -> None:
    """Every workload runs over the trio client: 4 tasks, 2 connections, pipelined by 2."""
    r = run(
        _config(lockserver, Backend.LOCKSERVER, workload, connections=2, concurrency=4, pipeline=2)
    )
    _check(r.ops, r.errors, r.error_samples)
    assert r.client == "async"
    assert r.latency_us["count"] == r.requests > 0
    if os.geteuid() == 0:  # other users' sockets are visible to root only
        assert r.server_cpu_s is not None  # the pid was found by port
    if workload != "ping":
        assert r.acquires >= r.ops and 0 < r.acquired <= r.acquires
    if workload in ("mutex-uncontended", "session-churn"):
        assert r.acquired == r.acquires  # private keys never conflict
        assert r.requests == 2 * r.ops
    assert any(p["trust"] is not None for p in r.timeline)


@pytest.mark.parametrize("workload", ["mutex-uncontended", "mds", "ping"])
def test_sync_client(lockserver: ServerProcess, workload: str) -> None:
    """One unpipelined task on one connection uses the sync client."""
    r = run(_config(lockserver, Backend.LOCKSERVER, workload))
    _check(r.ops, r.errors, r.error_samples)
    assert r.client == "sync"


def test_contended_hold(lockserver: ServerProcess) -> None:
    """--hold keeps the lock for a while: with 4 tasks on 1 hot key, most tries fail."""
    r = run(
        _config(
            lockserver,
            Backend.LOCKSERVER,
            "mutex-contended",
            connections=4,
            hold=0.002,
            params=WorkloadParams(seed=3, keys=1),
        )
    )
    _check(r.ops, r.errors, r.error_samples)
    assert r.acquire_success_ratio is not None and r.acquire_success_ratio < 0.9


def test_two_processes(lockserver: ServerProcess) -> None:
    """--processes 2 splits tasks and count over two child processes and merges."""
    r = run(
        _config(lockserver, Backend.LOCKSERVER, "mutex-uncontended", connections=2, processes=2)
    )
    _check(r.ops, r.errors, r.error_samples)
    assert r.params["processes"] == 2


def test_sync_client_pipelines_with_execute_many(lockserver: ServerProcess) -> None:
    """--client sync --pipeline 4: the sync face sends each batch with execute_many."""
    r = run(_config(lockserver, Backend.LOCKSERVER, "mutex-uncontended", client="sync", pipeline=4))
    _check(r.ops, r.errors, r.error_samples)
    assert r.params["pipeline"] == 4


def test_bad_shapes_are_refused(lockserver: ServerProcess) -> None:
    """Impossible shapes fail before connecting, naming the option."""
    for kw, message in (
        ({"connections": 4, "concurrency": 2}, "--concurrency"),
        ({"client": "sync", "connections": 2}, "sync client"),
        ({"processes": 3, "connections": 2}, "--processes"),
        ({"count": 0}, "--count"),
        ({"duration": 0.0}, "--duration"),
        ({"params": WorkloadParams(keys=2), "pipeline": 4}, "--keys >= --pipeline"),
    ):
        with pytest.raises(ValueError, match=message):
            run(_config(lockserver, Backend.LOCKSERVER, "mutex-uncontended", **kw))


def test_blast_with_prefill(lockserver: ServerProcess) -> None:
    """The blaster pre-loads entries, reports memory per entry, and counts replies."""
    target = Target(Backend.LOCKSERVER, lockserver.host, lockserver.port)
    (r,) = run_blast(
        BlastConfig(target, pipeline=16, count=2000, duration=20, warmup=0, prefill=2000)
    )
    assert r.kind == "blast" and r.client == "raw"
    assert r.errors == 0, r.error_samples
    assert 2000 <= r.requests < 2000 + 64
    assert r.extra["entries_held"] >= 2000
    assert "bytes_per_entry" in r.extra
    assert r.acquires > 0 and r.acquired == r.acquires  # sampled decoded replies
    # The blaster's own keys are released again: only the prefill stays.
    (r2,) = run_blast(BlastConfig(target, connections=2, pipeline=1, count=300, warmup=0))
    assert r2.errors == 0
    assert r2.latency_us["count"] == r2.requests


def test_blast_paced(lockserver: ServerProcess) -> None:
    """Paced mode keeps a schedule and reports both latencies."""
    target = Target(Backend.LOCKSERVER, lockserver.host, lockserver.port)
    (r,) = run_blast(BlastConfig(target, connections=4, pipeline=1, rate=2000, count=400, warmup=0))
    assert r.errors == 0
    assert r.extra["service_latency_us"]["count"] == r.requests
    assert r.extra["rate_target"] == 2000


def test_cli_run_writes_json(tmp_path: Path) -> None:
    """`lockbench run ... --spawn --json` spawns, runs, stops, and writes a valid file."""
    out = tmp_path / "r.json"
    code = main(
        [
            *("run", "mutex-contended", "--spawn", "--count", "150", "--warmup", "0"),
            *("--quiet", "--connections", "2", "--json", str(out)),
        ]
    )
    assert code == 0
    (r,) = read_document(out).results
    assert r.spawned and r.name == "mutex-contended" and r.ops >= 150
    assert json.loads(out.read_text())["machine"]["nproc"] >= 1


@pytest.mark.parametrize("workload", ["mutex-uncontended", "mutex-contended", "rwlock"])
def test_redis_workloads(redis_server: ServerProcess, workload: str) -> None:
    """The Redis path: redis.asyncio with pipelines, and the sync redis-py client."""
    r = run(
        _config(redis_server, Backend.REDIS, workload, connections=2, concurrency=4, pipeline=2)
    )
    _check(r.ops, r.errors, r.error_samples)
    assert r.acquired > 0
    r = run(_config(redis_server, Backend.REDIS, workload))
    _check(r.ops, r.errors, r.error_samples)
    assert r.client == "sync"


def test_redis_other_workloads(redis_server: ServerProcess) -> None:
    """multilock, session-churn, mds and ping scripts run without errors."""
    for workload in ("multilock", "session-churn", "mds", "ping"):
        r = run(_config(redis_server, Backend.REDIS, workload, connections=2, pipeline=2))
        _check(r.ops, r.errors, r.error_samples)


def test_redis_blast_and_cli_spawn(tmp_path: Path, redis_server: ServerProcess) -> None:
    """The blaster speaks RESP too; `--target redis:// --spawn` starts a private redis."""
    target = Target(Backend.REDIS, redis_server.host, redis_server.port)
    (r,) = run_blast(BlastConfig(target, pipeline=8, count=1000, warmup=0, prefill=500))
    assert r.errors == 0 and r.acquired == r.acquires
    assert r.extra["entries_held"] >= 500
    out = tmp_path / "r.json"
    assert (
        main(
            [
                *("run", "ping", "--target", "redis://", "--spawn", "--count", "100"),
                *("--quiet", "--warmup", "0", "--json", str(out)),
            ]
        )
        == 0
    )
    assert read_document(out).results[0].backend == "redis"
