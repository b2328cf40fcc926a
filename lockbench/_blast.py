"""``lockbench blast``: server capacity, with the raw client of :mod:`._blaster`.

Why: the end-to-end runs measure the Python client as much as the server; here the load comes
from pre-encoded bytes (see :mod:`._blaster` for what is sent and how replies are counted),
so what is measured is the server.

Modes:
- capacity: each connection keeps ``pipeline`` requests in flight (refilled as replies come);
- strict request/response: ``--pipeline 1`` (latency per request, p50/p99);
- paced (``--rate R``, pipeline 1): each connection sends on a fixed schedule (R/connections
  per second, staggered), never more than one in flight. Latency is measured from the
  *scheduled* send time (no coordinated omission: a late send counts its lateness) and, in
  ``extra.service_latency_us``, from the actual send.

``--prefill N`` first loads N held entries, then reports the server's RSS before and after and
the bytes per entry. ``--suite`` runs the issue's four capacity figures against one prefilled
server: 1 connection pipelined; 64 connections unpipelined; 1 connection strict
request/response; 64 connections paced at half the capacity just measured.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from ._blaster import RING_KEYS, BlastSpec, blast_worker, prefill, server_entries
from ._hdr import LatencyHistogram
from ._profile import profile_report, profiled
from ._report import LiveProgress
from ._results import Result
from ._runner import (
    DEFAULT_COUNT,
    DEFAULT_DURATION,
    MAX_DURATION,
    Execution,
    execute,
    open_target,
    split,
    window_figures,
)
from ._sampler import ServerProbe
from ._spawn import ServerProcess
from ._targets import Target, check_loopback

__all__ = ["BlastConfig", "run_blast"]

SUITE_PIPELINE = 64
SUITE_CONNECTIONS = 64


@attrs.frozen
class BlastConfig:
    """The ``lockbench blast`` options."""

    target: Target
    spawn: bool = False
    connections: int = 1
    pipeline: int = 64
    duration: float = DEFAULT_DURATION
    count: int = DEFAULT_COUNT
    warmup: float = 1.0
    processes: int = 1
    prefill: int = 0
    rate: float | None = None
    suite: bool = False
    interval: float = 0.5
    profile: str | None = None  # path prefix: py-spy the server during the phases

    def validate(self) -> None:
        """Raise ValueError naming the first bad option (TargetError for a target that is
        not on loopback, before anything is sent)."""
        check_loopback(self.target.host)
        if self.connections < 1 or self.pipeline < 1:
            raise ValueError("--connections and --pipeline must be >= 1")
        if self.pipeline > RING_KEYS:
            raise ValueError(f"--pipeline must be <= {RING_KEYS}")
        if not 0 < self.duration <= MAX_DURATION:
            raise ValueError(f"--duration must be in (0, {MAX_DURATION:g}] s")
        if not 1 <= self.count <= DEFAULT_COUNT:
            raise ValueError(f"--count must be in 1..{DEFAULT_COUNT:,}")
        if not 0 <= self.warmup <= MAX_DURATION:
            raise ValueError(f"--warmup must be in [0, {MAX_DURATION:g}] s")
        if not 1 <= self.processes <= self.connections:
            raise ValueError("--processes must be in 1..--connections")
        if not 0 <= self.prefill <= 10_000_000:
            raise ValueError("--prefill must be in 0..10,000,000")
        if self.rate is not None and (self.rate <= 0 or self.pipeline != 1):
            raise ValueError("--rate needs a positive rate and --pipeline 1")


# --- orchestration ----------------------------------------------------------------------------


@attrs.frozen
class _Phase:
    name: str
    summary: str
    connections: int
    pipeline: int
    rate: float | None = None


def run_blast(config: BlastConfig, console: Console | None = None) -> list[Result]:
    """Run the blast (one phase, or the suite); one Result per phase."""
    config.validate()
    run_id = uuid.uuid4().hex[:8]
    results: list[Result] = []
    with open_target(config.target, config.spawn) as (target, server):
        assert target.port is not None
        memory: dict[str, Any] = {}
        if config.prefill:
            memory = _do_prefill(config, target, server, run_id, console)
        if not config.suite:
            phases = [
                _Phase(
                    "blast",
                    "custom shape",
                    config.connections,
                    config.pipeline,
                    config.rate,
                )
            ]
        else:
            phases = [
                _Phase(
                    "capacity-1conn-pipelined",
                    f"1 connection, {SUITE_PIPELINE} requests in flight",
                    1,
                    SUITE_PIPELINE,
                ),
                _Phase(
                    "capacity-64conn",
                    f"{SUITE_CONNECTIONS} connections, 1 request in flight each",
                    SUITE_CONNECTIONS,
                    1,
                ),
                _Phase("strict-rr-1conn", "1 connection, strict request/response", 1, 1),
            ]
        if config.profile is not None and (server is None or server.pid is None):
            raise RuntimeError("--profile needs the server's pid (use --spawn)")
        _run_phases(config, target, server, phases, run_id, memory, console, results)
    return results


def _run_phases(
    config: BlastConfig,
    target: Target,
    server: ServerProcess | None,
    phases: list[_Phase],
    run_id: str,
    memory: dict[str, Any],
    console: Console | None,
    results: list[Result],
) -> None:
    for phase in phases:
        results.append(_run_phase(config, target, server, phase, run_id, memory, console))
    if config.suite:
        half = results[1].requests_per_s / 2
        paced = _Phase(
            "paced-64conn-half",
            f"{SUITE_CONNECTIONS} connections paced at half of capacity-64conn",
            SUITE_CONNECTIONS,
            1,
            half,
        )
        results.append(_run_phase(config, target, server, paced, run_id, memory, console))


def _do_prefill(
    config: BlastConfig,
    target: Target,
    server: ServerProcess | None,
    run_id: str,
    console: Console | None,
) -> dict[str, Any]:
    assert target.port is not None
    proc = server.process() if server is not None else None
    before = proc.memory_info().rss if proc is not None else None
    if console is not None:
        console.print(f"prefilling {config.prefill:,} entries ...")
    seconds = prefill(target.backend, target.host, target.port, config.prefill, run_id)
    time.sleep(0.5)
    after = proc.memory_info().rss if proc is not None else None
    held = server_entries(target.backend, target.host, target.port)
    out: dict[str, Any] = {
        "prefill_entries": config.prefill,
        "prefill_seconds": round(seconds, 2),
        "entries_held": held,
        "rss_before_bytes": before,
        "rss_after_prefill_bytes": after,
    }
    if before is not None and after is not None:
        out["bytes_per_entry"] = round((after - before) / config.prefill, 1)
    if console is not None:
        console.print(
            f"prefilled in {seconds:.1f} s; server holds {held} entries; "
            + (
                f"RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB "
                f"({out['bytes_per_entry']:.0f} bytes/entry)"
                if before is not None and after is not None
                else "RSS unknown"
            )
        )
    return out


def _run_phase(
    config: BlastConfig,
    target: Target,
    server: ServerProcess | None,
    phase: _Phase,
    run_id: str,
    memory: dict[str, Any],
    console: Console | None,
) -> Result:
    assert target.port is not None
    processes = min(config.processes, phase.connections)
    conns = split(phase.connections, processes)
    counts = split(config.count, processes)
    rate_per_conn = None if phase.rate is None else phase.rate / phase.connections
    specs = []
    first = 0
    for w in range(processes):
        specs.append(
            BlastSpec(
                target.backend,
                target.host,
                target.port,
                first,
                conns[w],
                phase.pipeline,
                max(1, counts[w]),
                rate_per_conn,
                run_id,
            )
        )
        first += conns[w]
    probe = ServerProbe(target.backend, target.host, target.port, server)
    gc_before = _gc_figures(probe)
    profile: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    raw = f"{config.profile}-{phase.name}.raw.txt"
    if config.profile is not None and server is not None and server.pid is not None:
        profile = profiled(server.pid, raw)
    try:
        kwargs: dict[str, Any] = {
            "warmup": config.warmup,
            "duration": config.duration,
            "interval": config.interval,
            "probe": probe,
        }
        with profile:
            if console is not None:
                with LiveProgress(
                    console, f"{target.backend} {phase.name}", config.duration, config.count
                ) as live:
                    ex = execute(blast_worker, specs, on_sample=live.update, **kwargs)
            else:
                ex = execute(blast_worker, specs, **kwargs)
        gc_after = _gc_figures(probe)
    finally:
        probe.close()
    if gc_before is not None and gc_after is not None:
        memory = {**memory, "server_gc": _gc_delta(gc_before, gc_after)}
    result = _phase_result(config, target, phase, processes, ex, memory)
    if config.profile is not None and Path(raw).exists():
        summary = profile_report(
            raw,
            f"server profile (py-spy) during {phase.name}: {phase.summary}, "
            f"{result.requests_per_s:,.0f} tx/s",
        )
        top = Path(f"{config.profile}-{phase.name}.top.txt")
        top.write_text(summary + "\n", encoding="utf-8")
        if console is not None:
            console.print(summary)
    return result


def _gc_figures(probe: ServerProbe) -> dict[str, list[float]] | None:
    """The lockserver's collector counters (statistics ``gc``), or None (Redis, no answer)."""
    stats = probe.statistics()
    gc = None if stats is None else stats.get("gc")
    if not isinstance(gc, dict) or "collections" not in gc or "pause_total_ms" not in gc:
        return None
    return {"collections": list(gc["collections"]), "pause_total_ms": list(gc["pause_total_ms"])}


def _gc_delta(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, Any]:
    """Collections and pause time per generation between two readings: what the collector
    cost during a phase (warm-up included), to tell a GC pause from other stalls."""
    return {
        key: [round(a - b, 3) for a, b in zip(after[key], before[key], strict=True)]
        for key in ("collections", "pause_total_ms")
    }


def _phase_result(
    config: BlastConfig,
    target: Target,
    phase: _Phase,
    processes: int,
    ex: Execution,
    memory: dict[str, Any],
) -> Result:
    w = window_figures(ex)
    elapsed, ops, cpu_s = w["elapsed"], w["ops"], w["cpu_s"]
    extra: dict[str, Any] = {"phase": phase.summary, **memory, **w["cpu_use"]}
    if phase.rate is not None:
        extra["rate_target"] = round(phase.rate, 1)
        service = LatencyHistogram()
        for r in ex.reports:
            service.merge(LatencyHistogram.decode(r.extra_histogram))
        extra["service_latency_us"] = service.summary()
    if w["trusts"]:
        extra["trust_min"] = min(w["trusts"])
    params = {
        "connections": phase.connections,
        "concurrency": phase.connections,
        "pipeline": phase.pipeline,
        "duration": config.duration,
        "count": config.count,
        "warmup": config.warmup,
        "processes": processes,
        "prefill": config.prefill,
        "rate": phase.rate,
    }
    return Result(
        name=phase.name,
        kind="blast",
        backend=str(target.backend),
        target=target.url,
        spawned=config.spawn,
        client="raw",
        params=params,
        elapsed_s=round(elapsed, 6),
        ops=ops,
        requests=w["requests"],
        ops_per_s=round(ops / elapsed, 3),
        requests_per_s=round(w["requests"] / elapsed, 3),
        acquires=w["acquires"],
        acquired=w["acquired"],
        errors=w["errors"],
        error_samples=w["error_samples"],
        latency_us=w["hist"].summary(),
        latency_hdr=w["hist"].encode(),
        server_cpu_s=None if cpu_s is None else round(cpu_s, 4),
        server_cpu_s_per_1k_ops=None if cpu_s is None or not ops else round(cpu_s / ops * 1000, 6),
        server_rss_bytes=w["rss"],
        timeline=w["timeline"],
        extra=extra,
    )
