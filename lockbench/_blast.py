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

Several servers (shards): ``--target lockserver://127.0.0.1:7400-7401`` names them, ``--spawn
--shards N`` starts N (``lockserver --processes N``). ``--connections`` is then **per server**:
each server gets its own connections, carrying only the namespaces placed on it
(:mod:`._sharding`), so every server sees the load one server sees alone; the result counts
transactions per server and in total, and the server CPU and RSS figures are the shards' sums.
The mutex keys spread over 16 namespaces per server (``lb-0``, ...) with one server too, so
"1 server" and "N shards" run the same workload.

``--prefill N`` first loads N held entries, then reports the server's RSS before and after and
the bytes per entry. ``--suite`` runs the issue's four capacity figures against one prefilled
server: 1 connection pipelined; 64 connections unpipelined; 1 connection strict
request/response; 64 connections paced at half the capacity just measured. ``--bigtable``
runs the one phase of issue 19's stall shape instead (:mod:`._bigtable`): its own prefill
(1,000,000 entries in one table by default) and unique-var acquires that are never released,
from 64 connections by default.

Every phase reports the largest gap between consecutive replies when one blaster process
drove it (with several, each saw only its own replies). ``--pin`` runs the spawned server on
one CPU and the blaster on the others (:mod:`._layout`); every result names the layout.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from ._bigtable import (
    BIG_BATCH,
    BIG_TABLE,
    bigtable_worker,
    prefill_bigtable,
    server_args,
)
from ._blaster import (
    PREFILL_PER_TX,
    RING_KEYS,
    BlastSpec,
    ServerShare,
    blast_worker,
    prefill,
    server_entries,
)
from ._hdr import LatencyHistogram
from ._layout import CpuPlan
from ._profile import profile_report, profiled
from ._report import LiveProgress
from ._results import Result
from ._runner import (
    DEFAULT_COUNT,
    DEFAULT_DURATION,
    MAX_DURATION,
    Execution,
    WorkerFn,
    check_pin,
    execute,
    laid_out,
    layout_params,
    open_servers,
    split,
    window_figures,
)
from ._sampler import ServerProbe
from ._sharding import namespace_pool, plan, prefill_batches
from ._spawn import ServerProcess
from ._targets import Backend, Target, check_loopback

__all__ = ["BlastConfig", "run_blast"]

SUITE_PIPELINE = 64
SUITE_CONNECTIONS = 64
MAX_SHARDS = 64  # spawned shards: more than this machine's cores by far


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
    shards: int = 1  # with spawn: lockserver shard processes to start
    pin: bool = False  # the pinned layout: the spawned server on one CPU, the load on the rest
    bigtable: bool = False  # issue 19's stall shape instead of the mutex ring (see _bigtable)

    def validate(self) -> None:
        """Raise ValueError naming the first bad option (TargetError for a target that is
        not on loopback, before anything is sent)."""
        check_loopback(self.target.host)
        for host, _ in self.target.others:
            check_loopback(host)
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ValueError(f"--shards must be in 1..{MAX_SHARDS}, got {self.shards}")
        if self.shards > 1 and not self.spawn:
            raise ValueError(
                "--shards N starts N servers (needs --spawn); name running ones in the "
                "target instead: lockserver://HOST:FIRST-LAST"
            )
        if self.shards > 1 and self.target.backend is not Backend.LOCKSERVER:
            raise ValueError("--shards: only lockserver runs as shards")
        if self.profile is not None and (self.shards > 1 or self.target.others):
            raise ValueError("--profile samples one server: drop it or blast one server")
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
        if self.bigtable:
            self._validate_bigtable()
        if self.pin:
            if self.shards > 1:
                raise ValueError(
                    "--pin puts one server on one CPU: not with --shards (pin shards by hand, "
                    "see benchmarks/README.md)"
                )
            check_pin(self.spawn)

    def _validate_bigtable(self) -> None:
        if self.target.backend is not Backend.LOCKSERVER:
            raise ValueError("--bigtable: lockserver only (issue 19's stall shape)")
        if self.suite:
            raise ValueError("--bigtable and --suite are two kinds of run: give one")
        if self.shards > 1 or self.target.others:
            raise ValueError("--bigtable drives one server (one big table)")
        if self.pipeline != 1:
            raise ValueError("--bigtable keeps one request in flight per connection")
        if self.processes != 1:
            raise ValueError(
                "--bigtable runs its connections in one blaster process (the largest gap "
                "between replies is measured over all of them): drop --processes"
            )
        if self.prefill < 1:
            raise ValueError("--bigtable needs --prefill >= 1 (1,000,000 by default)")


# --- orchestration ----------------------------------------------------------------------------


@attrs.frozen
class _Phase:
    name: str
    summary: str
    connections: int
    pipeline: int
    rate: float | None = None


@attrs.frozen
class _Servers:
    """What a blast drives: the concrete target, each server's process (or None), the
    namespaces placed on each (lockserver), and the layout observed (:mod:`._layout`)."""

    target: Target
    processes: tuple[ServerProcess | None, ...]
    namespaces: list[tuple[str, ...]]
    layout: dict[str, Any]

    @property
    def count(self) -> int:
        return len(self.processes)

    def probe(self) -> ServerProbe:
        """A probe over every server (CPU and RSS summed)."""
        t = self.target
        assert t.port is not None
        others = [p or ServerProcess(h, pt, None, False) for p, (h, pt) in self._rest()]
        return ServerProbe(t.backend, t.host, t.port, self.processes[0], others)

    def _rest(self) -> list[tuple[ServerProcess | None, tuple[str, int]]]:
        return list(zip(self.processes[1:], self.target.others, strict=True))


def run_blast(config: BlastConfig, console: Console | None = None) -> list[Result]:
    """Run the blast (one phase, or the suite); one Result per phase."""
    config.validate()
    run_id = uuid.uuid4().hex[:8]
    results: list[Result] = []
    cpus: CpuPlan | None = check_pin(config.spawn) if config.pin else None
    with (
        open_servers(
            config.target,
            config.spawn,
            config.shards,
            args=server_args() if config.bigtable else (),
            cpus=None if cpus is None else cpus.server,
        ) as (target, processes),
        laid_out(cpus, processes) as layout,
    ):
        addresses = target.addresses
        placed: list[tuple[str, ...]] = [()]  # Redis: no namespaces
        if target.backend is Backend.LOCKSERVER:
            placed = plan(addresses)
        servers = _Servers(target, processes, placed, layout)
        if console is not None and servers.count > 1:
            console.print(
                f"{servers.count} servers, {config.connections} connection(s) each: "
                + "; ".join(
                    f"{h}:{p} {len(ns)} namespaces"
                    for (h, p), ns in zip(addresses, placed, strict=True)
                )
            )
        if console is not None:
            console.print(_layout_line(layout))
        memory: dict[str, Any] = {}
        if config.prefill:
            memory = _do_prefill(config, servers, run_id, console)
        per_server = "" if servers.count == 1 else " per server"
        if config.bigtable:
            phases = [
                _Phase(
                    "bigtable" if config.rate is None else "paced-bigtable",
                    f"{config.prefill:,} held in one table ({memory.get('prefill_sessions')} "
                    f"sessions, {BIG_BATCH} per execute), {config.connections} connections "
                    "sending unique-var acquires, 1 in flight each, no releases"
                    + ("" if config.rate is None else f", paced at {config.rate:,.0f}/s"),
                    config.connections,
                    1,
                    config.rate,
                )
            ]
        elif not config.suite:
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
                    f"1 connection{per_server}, {SUITE_PIPELINE} requests in flight",
                    1,
                    SUITE_PIPELINE,
                ),
                _Phase(
                    "capacity-64conn",
                    f"{SUITE_CONNECTIONS} connections{per_server}, 1 request in flight each",
                    SUITE_CONNECTIONS,
                    1,
                ),
                _Phase(
                    "strict-rr-1conn", f"1 connection{per_server}, strict request/response", 1, 1
                ),
            ]
        server = processes[0]
        if config.profile is not None and (server is None or server.pid is None):
            raise RuntimeError("--profile needs the server's pid (use --spawn)")
        _run_phases(config, servers, phases, run_id, memory, console, results)
    return results


def _layout_line(layout: dict[str, Any]) -> str:
    """The layout, as printed before the phases."""
    server = layout["server_cpus"]
    where = "unknown" if server is None else ",".join(map(str, server))
    return (
        f"layout {layout['layout']}: server on CPU {where}, "
        f"load on CPU {','.join(map(str, layout['load_cpus']))}"
    )


def _run_phases(
    config: BlastConfig,
    servers: _Servers,
    phases: list[_Phase],
    run_id: str,
    memory: dict[str, Any],
    console: Console | None,
    results: list[Result],
) -> None:
    for phase in phases:
        results.append(_run_phase(config, servers, phase, run_id, memory, console))
    if config.suite:
        half = results[1].requests_per_s / 2
        per_server = "" if servers.count == 1 else " per server"
        paced = _Phase(
            "paced-64conn-half",
            f"{SUITE_CONNECTIONS} connections{per_server} paced at half of capacity-64conn",
            SUITE_CONNECTIONS,
            1,
            half,
        )
        results.append(_run_phase(config, servers, paced, run_id, memory, console))


def _do_prefill(
    config: BlastConfig,
    servers: _Servers,
    run_id: str,
    console: Console | None,
) -> dict[str, Any]:
    target = servers.target
    procs = [s.process() if s is not None else None for s in servers.processes]
    known = all(p is not None for p in procs)
    before = sum(p.memory_info().rss for p in procs if p is not None) if known else None
    if console is not None:
        console.print(f"prefilling {config.prefill:,} entries ...")
    seconds = 0.0
    shape: dict[str, Any] = {}
    if config.bigtable:
        seconds, sessions = prefill_bigtable(target.host, target.port or 0, config.prefill, run_id)
        shape = {"prefill_sessions": sessions, "prefill_batch": BIG_BATCH, "table": BIG_TABLE}
    else:
        # Transaction j's namespace is the pool's j-th (cyclically); it goes where it lives.
        batches = prefill_batches(config.prefill, namespace_pool(servers.count), PREFILL_PER_TX)
        for (host, port), names in zip(target.addresses, servers.namespaces, strict=True):
            mine = (
                [b for b in batches if b[0] in names]
                if target.backend is Backend.LOCKSERVER
                else []
            )
            seconds += prefill(target.backend, host, port, config.prefill, run_id, mine)
    time.sleep(0.5)
    after = sum(p.memory_info().rss for p in procs if p is not None) if known else None
    counts = [server_entries(target.backend, h, p) for h, p in target.addresses]
    held = None if None in counts else sum(c for c in counts if c is not None)
    out: dict[str, Any] = {
        "prefill_entries": config.prefill,
        "prefill_seconds": round(seconds, 2),
        "entries_held": held,
        "rss_before_bytes": before,
        "rss_after_prefill_bytes": after,
        **shape,
    }
    if servers.count > 1:
        out["entries_held_per_server"] = counts
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


def _specs(
    config: BlastConfig, servers: _Servers, phase: _Phase, run_id: str
) -> tuple[int, list[BlastSpec]]:
    """(blaster processes, their specs): each server's ``phase.connections`` split over the
    processes, every process driving its share of every server."""
    processes = min(config.processes, phase.connections)
    conns = split(phase.connections, processes)
    counts = split(config.count, processes)
    total_conns = phase.connections * servers.count
    rate_per_conn = None if phase.rate is None else phase.rate / total_conns
    specs = []
    first = [s * phase.connections for s in range(servers.count)]
    for w in range(processes):
        shares = []
        for s, (host, port) in enumerate(servers.target.addresses):
            shares.append(ServerShare(s, host, port, first[s], conns[w], servers.namespaces[s]))
            first[s] += conns[w]
        specs.append(
            BlastSpec(
                servers.target.backend,
                tuple(shares),
                phase.pipeline,
                max(1, counts[w]),
                rate_per_conn,
                run_id,
                servers.count,
            )
        )
    return processes, specs


def _run_phase(
    config: BlastConfig,
    servers: _Servers,
    phase: _Phase,
    run_id: str,
    memory: dict[str, Any],
    console: Console | None,
) -> Result:
    target, server = servers.target, servers.processes[0]
    processes, specs = _specs(config, servers, phase, run_id)
    worker: WorkerFn = bigtable_worker if config.bigtable else blast_worker
    probe = servers.probe()
    gc_before = _gc_figures(probe)
    passes_before = _pass_figures(probe)
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
                    ex = execute(worker, specs, on_sample=live.update, **kwargs)
            else:
                ex = execute(worker, specs, **kwargs)
        gc_after = _gc_figures(probe)
        passes_after = _pass_figures(probe)
        if config.bigtable:
            memory = {**memory, **_bigtable_after(servers, ex)}
    finally:
        probe.close()
    if gc_before is not None and gc_after is not None:
        memory = {**memory, "server_gc": _gc_delta(gc_before, gc_after)}
    if passes_before is not None and passes_after is not None:
        memory = {**memory, "server_passes": _pass_delta(passes_before, passes_after)}
    result = _phase_result(config, servers, phase, processes, ex, memory)
    if console is not None and servers.count > 1:
        console.print(
            f"{phase.name}: {result.requests_per_s:,.0f} tx/s over {servers.count} servers, "
            f"{phase.connections} connection(s) each: "
            + ", ".join(f"{x['server']} {x['tx_per_s']:,.0f}" for x in result.extra["servers"])
        )
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


def _bigtable_after(servers: _Servers, ex: Execution) -> dict[str, Any]:
    """The store after a bigtable phase, against the acquires that succeeded: entries held
    now, acquires answered OK over the whole run, requests unanswered when it stopped (the
    server may or may not have run those)."""
    time.sleep(0.2)  # let the server finish what the closed connections had sent
    host, port = servers.target.addresses[0]
    return {
        "entries_held_after": server_entries(Backend.LOCKSERVER, host, port),
        "acquired_total": sum(r.acquired_total for r in ex.reports),
        "unanswered_at_end": sum(r.unanswered for r in ex.reports),
    }


def _gc_figures(probe: ServerProbe) -> dict[str, list[float]] | None:
    """The lockserver's collector counters (statistics ``gc``), summed over the servers, or
    None (Redis, no answer)."""
    total: dict[str, list[float]] | None = None
    for stats in probe.statistics_each():
        gc = None if stats is None else stats.get("gc")
        if not isinstance(gc, dict) or "collections" not in gc or "pause_total_ms" not in gc:
            return None
        figures = {
            "collections": list(gc["collections"]),
            "pause_total_ms": list(gc["pause_total_ms"]),
        }
        if isinstance(gc.get("freezes"), int):  # servers since issue 19: big tables frozen
            figures["freezes"] = [gc["freezes"]]
        if total is None:
            total = figures
        else:
            total = {k: [a + b for a, b in zip(total[k], figures[k], strict=True)] for k in total}
    return total


def _pass_figures(probe: ServerProbe) -> dict[str, int] | None:
    """The lockservers' read passes by duration bucket (statistics ``read_pass_histogram``:
    upper bound in seconds as text -> passes), summed over the servers, or None (Redis, a
    server from before it counted them, no answer)."""
    total: dict[str, int] = {}
    for stats in probe.statistics_each():
        server = None if stats is None else stats.get("server")
        hist = None if not isinstance(server, dict) else server.get("read_pass_histogram")
        if not isinstance(hist, dict):
            return None
        for bound, count in hist.items():
            total[bound] = total.get(bound, 0) + int(count)
    return total or None


#: The pass durations a phase reports counts beyond (milliseconds): lockbench's own bounds,
#: each one of the server's bucket bounds.
PASS_REPORT_MS = (2.5, 5.0, 10.0)


def _pass_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    """The server's read passes during a phase (warm-up included): how many, and how many
    took longer than each of :data:`PASS_REPORT_MS` -- a client's slow reply with no long pass
    beside it was delayed outside the server's work."""
    delta = {b: after.get(b, 0) - before.get(b, 0) for b in after}

    def beyond(ms: float) -> int:
        return sum(n for b, n in delta.items() if b == "+inf" or float(b) * 1000 > ms)

    return {
        "passes": sum(delta.values()),
        "over_ms": {f"{ms:g}": beyond(ms) for ms in PASS_REPORT_MS},
    }


def _gc_delta(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, Any]:
    """Collections and pause time per generation between two readings: what the collector
    cost during a phase (warm-up included), to tell a GC pause from other stalls; and the
    server's heap freezes meanwhile (``freezes``, one number in a list), when it counts them."""
    return {
        key: [round(a - b, 3) for a, b in zip(after[key], before[key], strict=True)]
        for key in ("collections", "pause_total_ms", "freezes")
        if key in before and key in after
    }


def _phase_result(
    config: BlastConfig,
    servers: _Servers,
    phase: _Phase,
    processes: int,
    ex: Execution,
    memory: dict[str, Any],
) -> Result:
    target = servers.target
    w = window_figures(ex)
    elapsed, ops, cpu_s = w["elapsed"], w["ops"], w["cpu_s"]
    in_params, in_extra = layout_params(servers.layout)
    extra: dict[str, Any] = {"phase": phase.summary, **in_extra, **memory, **w["cpu_use"]}
    if len(ex.reports) == 1:  # one blaster saw every reply: its gap is the server's
        (report,) = ex.reports
        extra["reply_gap_max_us"] = round(report.reply_gap_ns / 1000, 1)
        extra["reply_gap_at_s"] = report.reply_gap_at
        if report.arrival_histogram or report.arrival_unstamped:
            # The bigtable blaster, with kernel timestamps: the replies it measured, if any
            # (the kernel may stamp none of a short run's), and those it could not.
            extra["arrival_unstamped"] = report.arrival_unstamped
            if report.arrival_histogram:
                arrival = LatencyHistogram.decode(report.arrival_histogram)
                extra["arrival_latency_us"] = arrival.summary()
                extra["client_read_delay_max_us"] = round(report.read_delay_max_ns / 1000, 1)
    if servers.count > 1:
        extra["servers"] = _per_server(servers, phase, ex, elapsed)
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
    if servers.count > 1:  # only then: one-server results pair with earlier files
        params["servers"] = servers.count
    if config.bigtable:
        params["bigtable"] = True
    params.update(in_params)
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


def _per_server(
    servers: _Servers, phase: _Phase, ex: Execution, elapsed: float
) -> list[dict[str, Any]]:
    """Each server's share of the window: its address, connections, namespaces, replies."""
    out = []
    for s, (host, port) in enumerate(servers.target.addresses):
        tx = sum(r.per_server[s] for r in ex.reports if r.per_server)
        out.append(
            {
                "server": f"{host}:{port}",
                "connections": phase.connections,
                "namespaces": len(servers.namespaces[s]),
                "tx": tx,
                "tx_per_s": round(tx / elapsed, 3),
            }
        )
    return out
