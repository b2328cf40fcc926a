"""``lockbench run``: one workload against one target, measured.

Why: this is the orchestration — validate the shape of the load, find or spawn the server, split
tasks and connections over the worker processes, open the start gate for all of them at once,
watch from the side while they run (:mod:`._sampler`), then fold everything into one
:class:`~._results.Result`. The load itself lives in :mod:`._worker`.

Bounds: every run stops at ``duration`` seconds after its warm-up OR after ``count`` cycles,
whichever comes first (defaults 10 s and 10,000,000); workers that overrun their deadline by
more than a grace period are cancelled. Targets are loopback-only (:mod:`._targets`).

Layouts (:mod:`._layout`): with ``pin`` the spawned server is bound to one CPU and this
process's threads (so the workers, the sampler) to the others for the run; every result
names the layout it observed (``params.layout``, ``extra.cpus``).

With ``--processes 1`` (the default) the worker runs in this process; otherwise each child
process (``multiprocessing`` "spawn" context: no fork of a process with threads) runs its share
and reports its counters to a shared array (progress) and its final figures through a queue.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from ._hdr import LatencyHistogram
from ._layout import CpuPlan, load_on, observe, pin_plan
from ._profile import profile_report, profiled
from ._results import Result
from ._sampler import Sample, Sampler, ServerProbe
from ._spawn import ServerProcess, find_pid_by_port, spawned, spawned_shards
from ._targets import Target, check_loopback
from ._worker import Gate, Recorder, WorkerReport, WorkerSpec, run_worker
from ._workloads import WORKLOADS, WorkloadParams

__all__ = [
    "Execution",
    "execute",
    "window_figures",
    "DEFAULT_COUNT",
    "DEFAULT_DURATION",
    "MAX_DURATION",
    "RunConfig",
    "open_target",
    "open_servers",
    "check_pin",
    "laid_out",
    "layout_params",
    "run",
    "split",
    "WorkerFn",
]

DEFAULT_DURATION = 10.0
DEFAULT_COUNT = 10_000_000
MAX_DURATION = 3600.0
READY_TIMEOUT = 60.0


@attrs.frozen
class RunConfig:
    """The shape of one run (the ``lockbench run`` options)."""

    workload: str
    target: Target
    spawn: bool = False
    connections: int = 1
    concurrency: int | None = None  # None: one task per connection
    pipeline: int = 1
    duration: float = DEFAULT_DURATION
    count: int = DEFAULT_COUNT
    warmup: float = 1.0
    params: WorkloadParams = attrs.field(factory=WorkloadParams)
    hold: float = 0.0
    processes: int = 1
    client: str = "auto"  # "auto", "sync" or "async"
    interval: float = 0.5
    profile: str | None = None  # path prefix: py-spy the server while the load runs
    pin: bool = False  # the pinned layout: the spawned server on one CPU, the load on the rest

    @property
    def tasks(self) -> int:
        """Concurrent tasks in total."""
        return self.connections if self.concurrency is None else self.concurrency

    @property
    def client_kind(self) -> str:
        """The client face used: auto picks sync for one task on one connection, unpipelined."""
        if self.client != "auto":
            return self.client
        if self.tasks == 1 and self.connections == 1 and self.pipeline == 1:
            return "sync"
        return "async"

    def validate(self) -> None:
        """Raise ValueError naming the first bad option (TargetError for a target that is
        not on loopback, before anything is sent)."""
        check_loopback(self.target.host)
        if self.target.others:
            raise ValueError(
                "lockbench run drives one server (the Python client's own placement over "
                "several servers comes with LockClient(servers=...)); blast several with "
                "lockbench blast"
            )
        if self.workload not in WORKLOADS:
            raise ValueError(f"unknown workload {self.workload!r} (known: {', '.join(WORKLOADS)})")
        if self.connections < 1:
            raise ValueError(f"--connections must be >= 1, got {self.connections}")
        if self.tasks < self.connections:
            raise ValueError(
                f"--concurrency ({self.tasks}) must be >= --connections ({self.connections})"
            )
        if self.pipeline < 1:
            raise ValueError(f"--pipeline must be >= 1, got {self.pipeline}")
        if not 0 < self.duration <= MAX_DURATION:
            raise ValueError(f"--duration must be in (0, {MAX_DURATION:g}] s, got {self.duration}")
        if not 1 <= self.count <= DEFAULT_COUNT:
            raise ValueError(f"--count must be in 1..{DEFAULT_COUNT:,}, got {self.count}")
        if not 0 <= self.warmup <= MAX_DURATION:
            raise ValueError(f"--warmup must be in [0, {MAX_DURATION:g}] s, got {self.warmup}")
        if self.hold < 0:
            raise ValueError(f"--hold must be >= 0, got {self.hold}")
        if not 1 <= self.processes <= self.connections:
            raise ValueError(
                f"--processes must be in 1..--connections ({self.connections}), "
                f"got {self.processes}"
            )
        if self.client not in ("auto", "sync", "async"):
            raise ValueError(f"--client must be auto, sync or async, got {self.client!r}")
        if self.client_kind == "sync" and (
            self.tasks != self.processes or self.connections != self.processes
        ):
            raise ValueError(
                "the sync client runs one task on one connection per process: "
                "use --concurrency = --connections = --processes, or --client async"
            )
        if self.pin:
            check_pin(self.spawn)
        spec = WORKLOADS[self.workload]
        keys = spec.default_keys if self.params.keys is None else self.params.keys
        if keys < spec.min_keys:
            raise ValueError(f"{self.workload} needs --keys >= {spec.min_keys}, got {keys}")
        if self.workload in ("mutex-uncontended", "session-churn") and keys < self.pipeline:
            raise ValueError(f"{self.workload} needs --keys >= --pipeline ({self.pipeline})")

    def as_params(self) -> dict[str, Any]:
        """The knobs, for the result file."""
        return {
            "connections": self.connections,
            "concurrency": self.tasks,
            "pipeline": self.pipeline,
            "duration": self.duration,
            "count": self.count,
            "warmup": self.warmup,
            "keys": self.params.keys
            if self.params.keys is not None
            else WORKLOADS[self.workload].default_keys,
            "seed": self.params.seed,
            "write_ratio": self.params.write_ratio,
            "hold": self.hold,
            "processes": self.processes,
        }


def check_pin(spawn: bool) -> CpuPlan:
    """The pinned layout's CPUs; ValueError without ``spawn`` or with one CPU."""
    if not spawn:
        raise ValueError(
            "--pin binds the server lockbench starts: add --spawn (for a running server, bind "
            "it and lockbench yourself, e.g. with taskset: the result records what it finds)"
        )
    return pin_plan()


@contextlib.contextmanager
def laid_out(
    plan: CpuPlan | None, servers: Sequence[ServerProcess | None]
) -> Iterator[dict[str, Any]]:
    """Inside: this process on the plan's load CPUs (nothing bound without a plan); yields
    the layout observed with ``servers`` up (:func:`._layout.observe`)."""
    with load_on(None if plan is None else plan.load):
        yield observe([None if s is None else s.pid for s in servers])


def layout_params(layout: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(params, extra) entries of a result that name its layout."""
    cpus = {"server": layout["server_cpus"], "load": layout["load_cpus"]}
    return {"layout": layout["layout"]}, {"cpus": cpus}


def split(total: int, parts: int) -> list[int]:
    """``total`` spread over ``parts`` as evenly as possible (larger shares first)."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


@contextlib.contextmanager
def open_target(
    target: Target,
    spawn: bool,
    *,
    args: Sequence[str] = (),
    cpus: frozenset[int] | None = None,
) -> Iterator[tuple[Target, ServerProcess | None]]:
    """The concrete target and its server process (spawned, or found by port, or None). A
    spawned server gets the extra options ``args`` and is bound to ``cpus`` (None: not)."""
    if spawn:
        with spawned(target.backend, host=target.host, args=args, cpus=cpus) as server:
            yield target.with_address(server.host, server.port), server
        return
    assert target.port is not None
    pid = find_pid_by_port(target.port)
    yield target, ServerProcess(target.host, target.port, pid, spawned=False)


@contextlib.contextmanager
def open_servers(
    target: Target,
    spawn: bool,
    shards: int = 1,
    *,
    args: Sequence[str] = (),
    cpus: frozenset[int] | None = None,
) -> Iterator[tuple[Target, tuple[ServerProcess | None, ...]]]:
    """Like :func:`open_target`, for a target of one server or several: the concrete target
    and one ServerProcess per server (with ``spawn``, ``shards`` lockserver shards are started
    by ``lockserver --processes SHARDS``; ``cpus`` binds one spawned server only)."""
    if spawn and shards > 1:
        assert cpus is None, "one CPU for several shards: refused by the callers"
        with spawned_shards(shards, args) as servers:
            yield target.with_addresses([(s.host, s.port) for s in servers]), servers
        return
    if not spawn and target.others:
        found = tuple(
            ServerProcess(host, port, find_pid_by_port(port), spawned=False)
            for host, port in target.addresses
        )
        yield target, found
        return
    with open_target(target, spawn, args=args, cpus=cpus) as (concrete, server):
        yield concrete, (server,)


def worker_specs(config: RunConfig, host: str, port: int) -> list[WorkerSpec]:
    """Each worker's share of tasks, connections and count."""
    p = config.processes
    tasks = split(config.tasks, p)
    conns = split(config.connections, p)
    counts = split(config.count, p)
    first = 0
    specs = []
    for w in range(p):
        specs.append(
            WorkerSpec(
                backend=config.target.backend,
                host=host,
                port=port,
                workload=config.workload,
                params=config.params,
                client=config.client_kind,
                first_task=first,
                tasks=tasks[w],
                connections=min(conns[w], tasks[w]),
                pipeline=config.pipeline,
                hold=config.hold,
                count=max(1, counts[w]),
            )
        )
        first += tasks[w]
    return specs


class _InlineGate:
    """The gate of a single in-process worker: opens as soon as it is ready."""

    def __init__(self, warmup: float, duration: float, on_open: Callable[[float], None]):
        self.warmup = warmup
        self.duration = duration
        self.on_open = on_open

    def wait(self) -> tuple[float, float]:
        measure_at = time.monotonic() + self.warmup
        self.on_open(measure_at)
        return measure_at, measure_at + self.duration


class _ProcessGate:
    """The gate of a child process: a barrier (all connected), then the parent's go."""

    def __init__(self, barrier: Any, go: Any, times: Any) -> None:
        self.barrier = barrier
        self.go = go
        self.times = times

    def wait(self) -> tuple[float, float]:
        self.barrier.wait(READY_TIMEOUT)
        if not self.go.wait(READY_TIMEOUT):
            raise TimeoutError("the parent never opened the gate")
        return float(self.times[0]), float(self.times[1])


WorkerFn = Callable[[Any, Gate, Callable[[Recorder], None] | None], WorkerReport]
"""(spec, gate, publish) -> report: what one worker runs (module-level, so picklable)."""


def _child(
    fn: WorkerFn, spec: Any, index: int, barrier: Any, go: Any, times: Any, counts: Any, out: Any
) -> None:
    """Entry point of a worker process."""

    def publish(rec: Recorder) -> None:
        counts[2 * index] = rec.ops
        counts[2 * index + 1] = rec.requests

    try:
        report = fn(spec, _ProcessGate(barrier, go, times), publish)
    except BaseException:
        with contextlib.suppress(Exception):
            barrier.abort()
        out.put((index, None, traceback.format_exc()))
        return
    out.put((index, report, None))


@attrs.frozen
class Execution:
    """What :func:`execute` hands back: the workers' reports and the side observations."""

    reports: list[WorkerReport]
    sampler: Sampler
    final: Sample
    measure_at: float


def execute(
    fn: WorkerFn,
    specs: Sequence[Any],
    *,
    warmup: float,
    duration: float,
    interval: float,
    probe: ServerProbe,
    on_sample: Callable[[Sample, float | None], None] | None = None,
) -> Execution:
    """Run ``fn`` once per spec — in this process when there is one spec, else one child
    process each — behind a common start gate, with a sampler watching."""
    window: dict[str, float] = {}

    def tick(sample: Sample) -> None:
        if on_sample is not None:
            on_sample(sample, window.get("measure_at"))

    if len(specs) == 1:
        live = [0, 0]
        sampler = Sampler(probe, lambda: (live[0], live[1]), interval, tick)

        def open_window(measure_at: float) -> None:
            window["measure_at"] = measure_at
            sampler.set_window(measure_at)

        def publish(rec: Recorder) -> None:
            live[0], live[1] = rec.ops, rec.requests

        sampler.start()
        try:
            reports = [fn(specs[0], _InlineGate(warmup, duration, open_window), publish)]
        finally:
            final = sampler.stop()
        return Execution(reports, sampler, final, window.get("measure_at", final.at))
    return _execute_processes(fn, specs, warmup, duration, interval, probe, window, tick)


def _execute_processes(
    fn: WorkerFn,
    specs: Sequence[Any],
    warmup: float,
    duration: float,
    interval: float,
    probe: ServerProbe,
    window: dict[str, float],
    tick: Callable[[Sample], None],
) -> Execution:
    ctx = multiprocessing.get_context("spawn")
    p = len(specs)
    barrier = ctx.Barrier(p + 1)
    go = ctx.Event()
    times = ctx.Array("d", 2, lock=False)
    counts = ctx.Array("q", 2 * p, lock=False)
    out = ctx.Queue()

    def totals() -> tuple[int, int]:
        values = list(counts)
        return sum(values[0::2]), sum(values[1::2])

    sampler = Sampler(probe, totals, interval, tick)
    procs = [
        ctx.Process(
            target=_child,
            args=(fn, spec, i, barrier, go, times, counts, out),
            name=f"lockbench-worker-{i}",
            daemon=True,
        )
        for i, spec in enumerate(specs)
    ]
    for proc in procs:
        proc.start()
    sampler.start()
    reports: list[WorkerReport | None] = [None] * p
    failures: list[str] = []
    try:
        try:
            barrier.wait(READY_TIMEOUT)
        except threading.BrokenBarrierError:
            pass
        else:
            measure_at = time.monotonic() + warmup
            times[0], times[1] = measure_at, measure_at + duration
            window["measure_at"] = measure_at
            go.set()
            sampler.set_window(measure_at)
        deadline = time.monotonic() + READY_TIMEOUT + warmup + duration + 30
        for _ in range(p):
            index, report, error = out.get(timeout=max(1.0, deadline - time.monotonic()))
            if error is not None:
                failures.append(f"worker {index}:\n{error}")
            reports[index] = report
    finally:
        final = sampler.stop()
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
    if failures:
        raise RuntimeError("a worker process failed:\n" + "\n".join(failures))
    done = [r for r in reports if r is not None]
    return Execution(done, sampler, final, window.get("measure_at", final.at))


def run(
    config: RunConfig, on_sample: Callable[[Sample, float | None], None] | None = None
) -> Result:
    """Run the workload and return its measured result.

    ``on_sample(sample, measure_at)`` is called from the sampler thread at every tick (for a
    live display); ``measure_at`` is None until the gate opens.
    """
    config.validate()
    plan = check_pin(config.spawn) if config.pin else None
    with (
        open_target(config.target, config.spawn, cpus=None if plan is None else plan.server) as (
            target,
            server,
        ),
        laid_out(plan, [server]) as layout,
    ):
        assert target.port is not None
        probe = ServerProbe(target.backend, target.host, target.port, server)
        profile: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        raw = f"{config.profile}.raw.txt"
        if config.profile is not None:
            if server is None or server.pid is None:
                raise RuntimeError("--profile needs the server's pid (use --spawn)")
            profile = profiled(server.pid, raw)
        try:
            with profile:
                ex = execute(
                    run_worker,
                    worker_specs(config, target.host, target.port),
                    warmup=config.warmup,
                    duration=config.duration,
                    interval=config.interval,
                    probe=probe,
                    on_sample=on_sample,
                )
            result = _assemble(config, target, probe, ex, layout)
        finally:
            probe.close()
        if config.profile is not None:
            summary = profile_report(
                raw,
                f"server profile (py-spy) during {result.label}: "
                f"{result.requests_per_s:,.0f} requests/s",
            )
            Path(f"{config.profile}.top.txt").write_text(summary + "\n", encoding="utf-8")
        return result


def window_figures(ex: Execution) -> dict[str, Any]:
    """Figures every kind of result shares: window, counts, merged histogram, server CPU,
    timeline and trust."""
    reports = ex.reports
    finished = max(r.finished_at for r in reports)
    elapsed = max(finished - ex.measure_at, 1e-9)
    hist = LatencyHistogram()
    for r in reports:
        hist.merge(LatencyHistogram.decode(r.histogram))
    start, final = ex.sampler.window_sample, ex.final
    cpu_s = None
    if start is not None and start.cpu_s is not None and final.cpu_s is not None:
        cpu_s = final.cpu_s - start.cpu_s
    cpu_use: dict[str, float] = {}
    if start is not None:
        span = max(final.at - start.at, 1e-9)
        if start.machine_busy_s is not None and final.machine_busy_s is not None:
            cpu_use["machine_cpu_pct"] = 100 * (final.machine_busy_s - start.machine_busy_s) / span
        if start.client_cpu_s is not None and final.client_cpu_s is not None:
            cpu_use["client_cpu_pct"] = 100 * (final.client_cpu_s - start.client_cpu_s) / span
        if cpu_s is not None:
            cpu_use["server_cpu_pct"] = 100 * cpu_s / span
        if start.server_sys_s is not None and final.server_sys_s is not None:
            cpu_use["server_sys_cpu_pct"] = 100 * (final.server_sys_s - start.server_sys_s) / span
        if {"machine_cpu_pct", "client_cpu_pct", "server_cpu_pct"} <= set(cpu_use):
            # Whatever else ran: other programs, the kernel's own work, the sampler's probe.
            cpu_use["other_cpu_pct"] = (
                cpu_use["machine_cpu_pct"] - cpu_use["client_cpu_pct"] - cpu_use["server_cpu_pct"]
            )
    ops = sum(r.ops for r in reports)
    if (
        cpu_s is not None
        and ops
        and start is not None
        and start.server_sys_s is not None
        and final.server_sys_s is not None
    ):
        sys_s = final.server_sys_s - start.server_sys_s
        cpu_use["server_user_us_per_op"] = 1e6 * (cpu_s - sys_s) / ops
        cpu_use["server_sys_us_per_op"] = 1e6 * sys_s / ops
    timeline = timeline_from(ex.sampler.samples, ex.measure_at)
    trusts = [s["trust"] for s in timeline if s["t"] >= 0 and s["trust"] is not None]
    return {
        "elapsed": elapsed,
        "hist": hist,
        "ops": ops,
        "requests": sum(r.requests for r in reports),
        "acquires": sum(r.acquires for r in reports),
        "acquired": sum(r.acquired for r in reports),
        "errors": sum(r.errors for r in reports),
        "error_samples": [s for r in reports for s in r.error_samples][:10],
        "cpu_s": cpu_s,
        "rss": final.rss_bytes,
        "timeline": timeline,
        "trusts": trusts,
        "cpu_use": {k: round(v, 2) for k, v in cpu_use.items()},
    }


def _assemble(
    config: RunConfig, target: Target, probe: ServerProbe, ex: Execution, layout: dict[str, Any]
) -> Result:
    w = window_figures(ex)
    in_params, in_extra = layout_params(layout)
    elapsed, hist, ops, requests, cpu_s = (
        w["elapsed"],
        w["hist"],
        w["ops"],
        w["requests"],
        w["cpu_s"],
    )
    extra: dict[str, Any] = {
        "workload": WORKLOADS[config.workload].summary,
        **in_extra,
        **w["cpu_use"],
    }
    if w["trusts"]:
        extra["trust_min"] = min(w["trusts"])
        extra["trust_last"] = w["trusts"][-1]
    stats = probe.statistics()
    if stats is not None:
        extra["server_statistics"] = stats
    return Result(
        name=config.workload,
        kind="run",
        backend=str(target.backend),
        target=target.url,
        spawned=config.spawn,
        client=config.client_kind,
        params={**config.as_params(), **in_params},
        elapsed_s=round(elapsed, 6),
        ops=ops,
        requests=requests,
        ops_per_s=round(ops / elapsed, 3),
        requests_per_s=round(requests / elapsed, 3),
        acquires=w["acquires"],
        acquired=w["acquired"],
        errors=w["errors"],
        error_samples=w["error_samples"],
        latency_us=hist.summary(),
        latency_hdr=hist.encode(),
        server_cpu_s=None if cpu_s is None else round(cpu_s, 4),
        server_cpu_s_per_1k_ops=None if cpu_s is None or ops == 0 else round(cpu_s / ops * 1000, 6),
        server_rss_bytes=w["rss"],
        timeline=w["timeline"],
        extra=extra,
    )


def timeline_from(
    samples: list[Sample], measure_at: float, min_dt: float = 0.2
) -> list[dict[str, Any]]:
    """Samples as timeline points: time from the window's start, rates since the previous
    sample (op counters restart at the window's start; a drop means a restart)."""
    out: list[dict[str, Any]] = []
    prev: Sample | None = None
    for s in samples:
        point: dict[str, Any] = {
            "t": round(s.at - measure_at, 4),
            "ops_per_s": None,
            "requests_per_s": None,
            "server_cpu_pct": None,
            "server_rss_bytes": s.rss_bytes,
            "trust": s.trust,
            "uptime": s.uptime,
        }
        # A tick much closer than an interval (the final one) would give a noisy rate.
        if prev is not None and s.at - prev.at >= min_dt:
            dt = s.at - prev.at
            d_ops = s.ops - prev.ops if s.ops >= prev.ops else s.ops
            d_req = s.requests - prev.requests if s.requests >= prev.requests else s.requests
            point["ops_per_s"] = round(d_ops / dt, 2)
            point["requests_per_s"] = round(d_req / dt, 2)
            if s.cpu_s is not None and prev.cpu_s is not None:
                point["server_cpu_pct"] = round(100 * (s.cpu_s - prev.cpu_s) / dt, 2)
        out.append(point)
        prev = s
    return out
