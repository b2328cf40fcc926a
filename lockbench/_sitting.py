"""``lockbench sitting``: every measurement of benchmarks/README.md in one go, on one machine.

Why: "measured in one sitting" is only reproducible if the sitting is a command. This runs the
end-to-end comparisons (our client + server vs redis-py + Redis), every workload on both
backends, and the blast suites (with 1,000,000 entries prefilled) on both servers and on
``shards`` lockserver shards (``lockserver --processes N``, the same suite with its
connections per shard and the entries spread by placement: the "N shards" rows next to
"1 server"); writes the JSON results, the plots, the server profile, and ``summary.md`` — the
results tables and each issue target marked met / not met with its figure. Nothing here
tunes anything: every run uses the same options a user would type (the README lists them).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from ._blast import BlastConfig, run_blast
from ._report import print_results
from ._results import Result, ResultDocument, machine_info, read_document, write_document
from ._runner import RunConfig, run
from ._spawn import redis_server_path
from ._targets import Backend, Target
from ._workloads import WORKLOADS, WorkloadParams

__all__ = [
    "E2E_SHAPES",
    "PARTS_ALL",
    "WORKLOAD_SHAPE",
    "Sitting",
    "blast_medians",
    "run_sitting",
    "targets_table",
    "write_summary",
]


@attrs.frozen
class Shape:
    """One end-to-end shape: a name for the tables and the run options."""

    key: str
    summary: str
    connections: int
    concurrency: int
    pipeline: int


E2E_SHAPES = (
    Shape("sync-1conn", "one sync connection (sync clients)", 1, 1, 1),
    Shape("async-64tasks-64conn", "64 async tasks, 64 connections", 64, 64, 1),
    Shape("async-64tasks-1conn", "64 async tasks sharing 1 connection", 1, 64, 1),
    Shape("pipelined-1conn-p64", "1 async task, 64 requests pipelined", 1, 1, 64),
)
WORKLOAD_SHAPE = Shape("async-16tasks-16conn", "16 async tasks, 16 connections", 16, 16, 1)


PARTS_ALL = ("e2e", "workloads", "blast", "profile")


@attrs.frozen
class Sitting:
    """Options of a sitting."""

    out: Path
    duration: float = 10.0
    warmup: float = 1.0
    prefill: int = 1_000_000
    parts: tuple[str, ...] = PARTS_ALL
    repeats: int = 3  # end-to-end pairs, interleaved; the tables show the median
    blast_repeats: int = 3  # blast suites per server, interleaved; judged by the median
    shards: int = 2  # lockserver shards of the "N shards" blast suite; 1: none


def _e2e(
    sitting: Sitting,
    backend: Backend,
    workload: str,
    shape: Shape,
    console: Console,
    profile: str | None = None,
) -> Result:
    config = RunConfig(
        workload=workload,
        target=Target(backend),
        spawn=True,
        connections=shape.connections,
        concurrency=shape.concurrency,
        pipeline=shape.pipeline,
        duration=sitting.duration,
        warmup=sitting.warmup,
        params=WorkloadParams(seed=1),
        profile=profile,
    )
    console.print(f"[bold]{backend} {workload} {shape.key}")
    result = run(config)
    return attrs.evolve(result, extra={**result.extra, "shape": shape.key})


def run_sitting(sitting: Sitting, console: Console) -> dict[str, Any]:
    """Run the parts asked for (all by default); write files into ``sitting.out``; rebuild
    ``summary.md`` and the plots from every result file present there.

    Profiles are taken in runs of their own, after the measurements: py-spy costs the
    machine CPU (2 cores!), so a profiled run is not a measurement.
    """
    out = sitting.out
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    backends = [Backend.LOCKSERVER]
    if redis_server_path() is not None:
        backends.append(Backend.REDIS)
    else:
        console.print("[yellow]redis-server not installed: lockserver only")

    if "e2e" in sitting.parts:
        machine["loadavg_before"] = os.getloadavg()
        # Interleaved (ours, Redis, Redis, ours, ...) so a slow spell of the shared machine
        # hits both sides; each pair gives one ratio, and the median pair is reported.
        e2e = []
        for shape in E2E_SHAPES:
            for rep in range(sitting.repeats):
                for backend in backends if rep % 2 == 0 else backends[::-1]:
                    r = _e2e(sitting, backend, "mutex-uncontended", shape, console)
                    e2e.append(attrs.evolve(r, extra={**r.extra, "repeat": rep}))
        write_document(out / "e2e.json", ResultDocument(tuple(e2e), _stamp(machine)))
        print_results(console, e2e, "end to end: mutex-uncontended (acquire+release pairs)")
    if "workloads" in sitting.parts:
        machine["loadavg_before"] = os.getloadavg()
        workloads = [
            _e2e(sitting, backend, workload, WORKLOAD_SHAPE, console)
            for workload in WORKLOADS
            for backend in backends
        ]
        write_document(out / "workloads.json", ResultDocument(tuple(workloads), _stamp(machine)))
        print_results(console, workloads, f"every workload, {WORKLOAD_SHAPE.summary}")
    if "blast" in sitting.parts:
        # Repeated and interleaved like the end-to-end pairs: one 10 s window's p99 on a
        # shared 2-core VM swings by 10x with what else runs, so one run is not a figure.
        machine["loadavg_before"] = os.getloadavg()
        layouts = [(backend, 1) for backend in backends]
        if sitting.shards > 1:
            layouts.append((Backend.LOCKSERVER, sitting.shards))
        suites: dict[tuple[Backend, int], list[Result]] = {layout: [] for layout in layouts}
        for rep in range(sitting.blast_repeats):
            for backend, shards in layouts if rep % 2 == 0 else layouts[::-1]:
                results = _blast_suite(sitting, backend, console, profile=None, shards=shards)
                name = _layout_name(str(backend), shards)
                print_results(console, results, f"{name} blast suite, run {rep + 1}")
                suites[backend, shards] += [
                    attrs.evolve(r, extra={**r.extra, "repeat": rep}) for r in results
                ]
        for (backend, shards), results in suites.items():
            write_document(
                out / _blast_file(str(backend), shards),
                ResultDocument(tuple(results), _stamp(machine)),
            )
    if "profile" in sitting.parts:
        profiles = out / "profiles"
        for shape in E2E_SHAPES:
            prefix = str(profiles / f"lockserver-e2e-{shape.key}")
            _e2e(sitting, Backend.LOCKSERVER, "mutex-uncontended", shape, console, prefix)
        _blast_suite(sitting, Backend.LOCKSERVER, console, str(profiles / "lockserver-blast"))
    return write_summary(out, console)


def _stamp(machine: dict[str, Any]) -> dict[str, Any]:
    return {**machine, "loadavg_after": os.getloadavg()}


def _blast_suite(
    sitting: Sitting, backend: Backend, console: Console, profile: str | None, shards: int = 1
) -> list[Result]:
    name = _layout_name(str(backend), shards)
    console.print(f"[bold]{name} blast suite, prefill {sitting.prefill:,}")
    return run_blast(
        BlastConfig(
            Target(backend),
            spawn=True,
            duration=sitting.duration,
            warmup=sitting.warmup,
            prefill=sitting.prefill,
            suite=True,
            profile=profile,
            shards=shards,
        ),
        console,
    )


def _layout_name(backend: str, shards: int) -> str:
    return backend if shards == 1 else f"{backend}, {shards} shards"


def _blast_file(backend: str, shards: int) -> str:
    return f"blast-{backend}.json" if shards == 1 else f"blast-{backend}-{shards}shards.json"


def write_summary(out: Path, console: Console | None = None) -> dict[str, Any]:
    """Rebuild summary.md and the plots from the result files in ``out``."""
    from ._plot import plot

    def load(name: str) -> tuple[list[Result], dict[str, Any]]:
        path = out / name
        if not path.exists():
            return [], {}
        doc = read_document(path)
        return list(doc.results), dict(doc.machine)

    e2e, machine = load("e2e.json")
    workloads, m2 = load("workloads.json")
    # Which commit each part was measured on (`--parts` reruns one part on a later commit).
    commits = {"end to end": machine.get("commit"), "workloads": m2.get("commit")}
    blasts: dict[str, list[Result]] = {}
    for backend in Backend:
        results, m3 = load(f"blast-{backend}.json")
        if results:
            blasts[str(backend)] = results
            commits[f"blast {backend}"] = m3.get("commit")
            machine = machine or m3
    for path in sorted(out.glob("blast-lockserver-*shards.json")):
        shards = int(path.stem.rsplit("-", 1)[1].removesuffix("shards"))
        results, m4 = load(path.name)
        if results:
            name = _layout_name("lockserver", shards)
            blasts[name] = results
            commits[f"blast {name}"] = m4.get("commit")
    machine = {**(machine or m2), "commits": {k: v for k, v in commits.items() if v}}
    if e2e:
        plot(e2e, out / "e2e.png", "end to end, Python clients: mutex acquire+release pairs/s")
    if workloads:
        plot(workloads, out / "workloads.png", f"every workload, {WORKLOAD_SHAPE.summary}")
    all_blasts = [r for rs in blasts.values() for r in blast_medians(rs)]
    if all_blasts:
        prefill = all_blasts[0].params.get("prefill", 0)
        plot(all_blasts, out / "blast.png", f"server capacity (blast), {prefill:,} entries held")
    summary = targets_table(e2e, workloads, blasts, machine)
    (out / "summary.md").write_text(summary, encoding="utf-8")
    if console is not None:
        console.print(summary)
    return {"e2e": e2e, "workloads": workloads, "blasts": blasts}


def _find(results: list[Result], backend: str, shape: str) -> Result | None:
    """The median (by ops/s) of the repeats of one backend and shape."""
    found = sorted(
        (r for r in results if r.backend == backend and r.extra.get("shape") == shape),
        key=lambda r: r.ops_per_s,
    )
    return found[(len(found) - 1) // 2] if found else None


def _ratios(results: list[Result], shape_a: str, shape_b: str) -> list[float]:
    """ours(shape_a) / redis(shape_b) for each repeat present on both sides."""
    a = {
        r.extra.get("repeat", 0): r
        for r in results
        if r.backend == "lockserver" and r.extra.get("shape") == shape_a
    }
    b = {
        r.extra.get("repeat", 0): r
        for r in results
        if r.backend == "redis" and r.extra.get("shape") == shape_b
    }
    return sorted(a[k].ops_per_s / b[k].ops_per_s for k in a.keys() & b.keys() if b[k].ops_per_s)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _ratio_text(values: list[float]) -> str:
    m = _median(values)
    if m is None:
        return "-"
    if len(values) == 1:
        return f"{m:.2f}x"
    return f"{m:.2f}x ({values[0]:.2f} to {values[-1]:.2f}, n={len(values)})"


def _ratio(a: Result | None, b: Result | None) -> float | None:
    """a / b in ops/s (one run each)."""
    if a is None or b is None or b.ops_per_s == 0:
        return None
    return a.ops_per_s / b.ops_per_s


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**met**" if ok else "**not met**")


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _lat(r: Result) -> str:
    return f"p50 {r.latency_us['p50']:,.0f} / p99 {r.latency_us['p99']:,.0f} µs"


def targets_table(
    e2e: list[Result],
    workloads: list[Result],
    blasts: dict[str, list[Result]],
    machine: dict[str, Any],
) -> str:
    """summary.md: machine, tables, and the issue's targets with met / not met."""
    lines = ["# lockbench sitting", ""]
    pk = machine.get("packages", {})
    lines.append(
        f"Machine: {machine.get('nproc')} cores, {machine.get('cpu')}, Python "
        f"{machine.get('python')}, commit {machine.get('commit')}, "
        f"{machine.get('redis_server') or 'no redis-server'}; "
        + ", ".join(f"{k} {v}" for k, v in pk.items())
        + "."
    )
    commits = machine.get("commits", {})
    if len(set(commits.values())) > 1:
        lines.append("")
        lines.append(
            "Parts measured on different commits: "
            + ", ".join(f"{part} {commit}" for part, commit in commits.items())
            + "."
        )
    lines.append("")
    lines.append(
        "The machine is shared: the *other* CPU % columns (of one core; 200 = both cores) say "
        "how much ran besides the server and lockbench's own processes during each window."
    )
    lines += ["", "## End to end (Python client + server), mutex-uncontended", ""]
    lines.append(
        "| shape | lockserver pairs/s | redis pairs/s | ratio | lockserver latency | "
        "redis latency | server CPU ms/1k pairs (ours / redis) | CPU % server, client, other "
        "(ours / redis) |"
    )
    lines.append("|---|---:|---:|---:|---|---|---:|---|")
    for shape in E2E_SHAPES:
        a, b = _find(e2e, "lockserver", shape.key), _find(e2e, "redis", shape.key)
        if a is None:
            continue
        lines.append(
            f"| {shape.summary} | {a.ops_per_s:,.0f} | "
            f"{'-' if b is None else f'{b.ops_per_s:,.0f}'} | "
            f"{_ratio_text(_ratios(e2e, shape.key, shape.key))} | {_lat(a)} | "
            f"{'-' if b is None else _lat(b)} | {_cpu(a)} / {_cpu(b)} | "
            f"{_use(a)} / {_use(b)} |"
        )
    lines += ["", f"## Every workload, {WORKLOAD_SHAPE.summary}", ""]
    lines.append(
        "| workload | lockserver ops/s | redis ops/s | ratio | lockserver ok % | redis ok % |"
        " lockserver p99 µs | redis p99 µs | other CPU % (ours / redis) |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in WORKLOADS:
        a = next((r for r in workloads if r.name == name and r.backend == "lockserver"), None)
        b = next((r for r in workloads if r.name == name and r.backend == "redis"), None)
        if a is None:
            continue
        lines.append(
            f"| {name} | {a.ops_per_s:,.0f} | {'-' if b is None else f'{b.ops_per_s:,.0f}'} | "
            f"{_x(_ratio(a, b))} | {_ok(a)} | {_ok(b)} | {a.latency_us['p99']:,.0f} | "
            f"{_p99(b)} | {_other(a)} / {_other(b)} |"
        )
    for backend, results in blasts.items():
        lines += ["", f"## Blast ({backend}): server capacity, raw pre-encoded client", ""]
        medians = blast_medians(results)
        runs = len({r.extra.get("repeat", 0) for r in results})
        if runs > 1:
            lines.append(
                f"{runs} runs of the suite; each row is the median run of its phase (by tx/s, "
                "by p99 for the paced phase); *runs* lists every run's figure, in run order."
            )
            lines.append("")
        lines.append(
            "| phase | tx/s | p50 µs | p99 µs | p99.9 µs | max µs | CPU % server, blaster, other | "
            "server CPU µs/tx (user + kernel) | one-core ceiling tx/s | GC passes (ms) | errors |"
            " runs |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---|---|---:|---|---:|---|")
        for r in medians:
            lines.append(
                f"| {r.name} ({r.extra.get('phase', '')}) | {r.requests_per_s:,.0f} | "
                f"{r.latency_us['p50']:,.0f} | {r.latency_us['p99']:,.0f} | "
                f"{r.latency_us['p99.9']:,.0f} | {r.latency_us['max']:,.0f} | {_use(r)} | "
                f"{_us_per_tx(r)} | {_ceiling(r)} | {_gc(r)} | {r.errors} | "
                f"{_runs(results, r.name)} |"
            )
        if medians and "bytes_per_entry" in medians[0].extra:
            x = medians[0].extra
            lines.append("")
            lines.append(
                f"Prefill: {x['prefill_entries']:,} entries in {x['prefill_seconds']} s; server "
                f"holds {x.get('entries_held')}; RSS {x['rss_before_bytes'] / 2**20:.1f} -> "
                f"{x['rss_after_prefill_bytes'] / 2**20:.1f} MiB = "
                f"**{x['bytes_per_entry']:.0f} bytes per entry**."
            )
    lines += _shards_section(blasts)
    lines += ["", "## The issue's targets", "", "| target | figure | verdict |", "|---|---|---|"]
    lines += _target_rows(e2e, blasts)
    return "\n".join(lines) + "\n"


#: The issue's target for N shards' blast capacity over one server's, pipelined (issue 17).
SHARDS_PIPELINED_TARGET = 1.6


def _shard_layouts(blasts: dict[str, list[Result]]) -> list[tuple[str, int]]:
    """(blasts key, shards) of every "N shards" layout present, by N."""
    out = []
    for key in blasts:
        if key.startswith("lockserver, ") and key.endswith(" shards"):
            out.append((key, int(key.split(", ")[1].split()[0])))
    return sorted(out, key=lambda x: x[1])


def _shards_section(blasts: dict[str, list[Result]]) -> list[str]:
    """The "N shards" rows next to "1 server": the same suite, phase by phase."""
    one = {r.name: r for r in blast_medians(blasts.get("lockserver", []))}
    lines: list[str] = []
    for key, n in _shard_layouts(blasts):
        lines += ["", f"## Blast: {n} shards next to 1 server", ""]
        lines.append(
            f"The same suite in the same sitting (interleaved runs, medians): 1 server, and "
            f"{n} shard processes (`lockserver --processes {n}`) each given the connections "
            "the one server gets, carrying only the namespaces placed on it "
            "(`client._placement.place`); the prefilled entries are spread the same way. "
            "CPU % columns: the servers' sum, the blaster, the rest. On a machine with fewer "
            f"cores than {n} shards plus the blaster, they compete for the cores."
        )
        lines.append("")
        lines.append(
            f"| phase | 1 server tx/s | {n} shards tx/s | ratio | tx/s of each shard | "
            f"p99 µs (1 / {n}) | CPU % servers, blaster, other (1 / {n}) |"
        )
        lines.append("|---|---:|---:|---:|---|---|---|")
        for r in blast_medians(blasts[key]):
            a = one.get(r.name)
            each = " / ".join(f"{x['tx_per_s']:,.0f}" for x in r.extra.get("servers", []))
            lines.append(
                f"| {r.name} ({r.extra.get('phase', '')}) | "
                f"{'-' if a is None else f'{a.requests_per_s:,.0f}'} | "
                f"{r.requests_per_s:,.0f} | {_x(_tx_ratio(r, a))} | {each or '-'} | "
                f"{_p99(a)} / {_p99(r)} | {_use(a)} / {_use(r)} |"
            )
    return lines


def _tx_ratio(b: Result | None, a: Result | None) -> float | None:
    """b / a in tx/s."""
    if a is None or b is None or not a.requests_per_s:
        return None
    return b.requests_per_s / a.requests_per_s


def _by_p99(name: str) -> bool:
    """The paced phases are about latency: their median run is the median p99."""
    return name.startswith("paced")


def _key(r: Result) -> float:
    return r.latency_us["p99"] if _by_p99(r.name) else r.requests_per_s


def blast_medians(results: list[Result]) -> list[Result]:
    """One result per phase, in phase order: the median run of the repeats (by tx/s, by p99
    for a paced phase; the lower middle of an even count)."""
    names = list(dict.fromkeys(r.name for r in results))
    medians = []
    for name in names:
        runs = sorted((r for r in results if r.name == name), key=_key)
        medians.append(runs[(len(runs) - 1) // 2])
    return medians


def _runs(results: list[Result], name: str) -> str:
    runs = [r for r in results if r.name == name]
    if len(runs) < 2:
        return "-"
    if _by_p99(name):
        return " / ".join(f"p99 {r.latency_us['p99']:,.0f}" for r in runs)
    return " / ".join(f"{r.requests_per_s:,.0f}" for r in runs)


def _gc(r: Result) -> str:
    """The server's collector passes during the phase: "gen0 3 (12 ms), gen1 1 (34 ms)";
    "none"; "-" when not reported (Redis)."""
    gc = r.extra.get("server_gc")
    if not isinstance(gc, dict):
        return "-"
    parts = [
        f"gen{g} {n:.0f} ({ms:.0f} ms)"
        for g, (n, ms) in enumerate(zip(gc["collections"], gc["pause_total_ms"], strict=True))
        if n
    ]
    return ", ".join(parts) or "none"


def _use(r: Result | None) -> str:
    """ "server, client, other" CPU % of one core over the window."""
    if r is None or "machine_cpu_pct" not in r.extra:
        return "-"
    x = r.extra
    return ", ".join(
        "?" if x.get(k) is None else f"{x[k]:.0f}"
        for k in ("server_cpu_pct", "client_cpu_pct", "other_cpu_pct")
    )


def _other(r: Result | None) -> str:
    if r is None or r.extra.get("other_cpu_pct") is None:
        return "-"
    return f"{r.extra['other_cpu_pct']:.0f}"


def _p99(r: Result | None) -> str:
    return "-" if r is None else f"{r.latency_us['p99']:,.0f}"


def _cpu(r: Result | None) -> str:
    if r is None or r.server_cpu_s_per_1k_ops is None:
        return "-"
    return f"{1000 * r.server_cpu_s_per_1k_ops:.1f}"


def _us_per_tx(r: Result) -> str:
    if r.server_cpu_s_per_1k_ops is None:
        return "-"
    total = f"{1000 * r.server_cpu_s_per_1k_ops:.1f}"
    user, kernel = r.extra.get("server_user_us_per_op"), r.extra.get("server_sys_us_per_op")
    if user is None or kernel is None:
        return total
    return f"{total} ({user:.1f} + {kernel:.1f})"


def _ceiling(r: Result) -> str:
    """1 / (server CPU per tx): what one fully busy core would serve at this cost per tx —
    an extrapolation, robust to a busy machine because CPU time is not wall time."""
    if not r.server_cpu_s_per_1k_ops:
        return "-"
    return f"{1000 / r.server_cpu_s_per_1k_ops:,.0f}"


def _ok(r: Result | None) -> str:
    if r is None or r.acquire_success_ratio is None:
        return "-"
    return f"{100 * r.acquire_success_ratio:.1f}"


def _target_rows(e2e: list[Result], blasts: dict[str, list[Result]]) -> list[str]:
    rows = []

    def ratio_row(label: str, shape: str, need: float, redis_shape: str | None = None) -> None:
        ratios = _ratios(e2e, shape, redis_shape or shape)
        r = _median(ratios)
        a, b = _find(e2e, "lockserver", shape), _find(e2e, "redis", redis_shape or shape)
        figure = "-"
        if r is not None and a is not None and b is not None:
            figure = (
                f"{_ratio_text(ratios)}; medians {a.ops_per_s:,.0f} vs {b.ops_per_s:,.0f} pairs/s"
            )
        rows.append(f"| {label} | {figure} | {_met(None if r is None else r >= need)} |")

    ratio_row("E2E one sync connection >= 1.0x Redis", "sync-1conn", 1.0)
    ratio_row("E2E 64 async tasks >= 1.5x Redis (64 connections each)", "async-64tasks-64conn", 1.5)
    ratio_row(
        "(same, our 64 tasks on 1 multiplexed connection vs redis-py's 64 connections)",
        "async-64tasks-1conn",
        1.5,
        "async-64tasks-64conn",
    )
    ratio_row(
        "E2E pipelined (64 in flight, 1 connection) >= 1.0x Redis", "pipelined-1conn-p64", 1.0
    )
    ours = {r.name: r for r in blast_medians(blasts.get("lockserver", []))}

    def blast_row(label: str, name: str, check: Callable[[Result], bool], fig: str) -> None:
        r = ours.get(name)
        if r is None:
            rows.append(f"| {label} | - | n/a |")
            return
        rows.append(f"| {label} | {fig.format(r=r, l=r.latency_us)} | {_met(check(r))} |")

    blast_row(
        "Blast: 1 pipelined connection >= 200,000 tx/s (1M held)",
        "capacity-1conn-pipelined",
        lambda r: r.requests_per_s >= 200_000,
        "{r.requests_per_s:,.0f} tx/s",
    )
    blast_row(
        "Blast: 64 unpipelined connections >= 40,000 tx/s (1M held)",
        "capacity-64conn",
        lambda r: r.requests_per_s >= 40_000,
        "{r.requests_per_s:,.0f} tx/s",
    )
    blast_row(
        "Blast: 1 connection strict request/response >= 14,000 tx/s, p99 <= 150 µs",
        "strict-rr-1conn",
        lambda r: r.requests_per_s >= 14_000 and r.latency_us["p99"] <= 150,
        "{r.requests_per_s:,.0f} tx/s, p99 {l[p99]:,.0f} µs",
    )
    blast_row(
        "Blast: p99 <= 1 ms at half of capacity, 64 connections",
        "paced-64conn-half",
        lambda r: r.latency_us["p99"] <= 1000,
        "p99 {l[p99]:,.0f} µs at {r.requests_per_s:,.0f} tx/s",
    )
    for key, n in _shard_layouts(blasts):
        sharded = {r.name: r for r in blast_medians(blasts[key])}
        a, b = ours.get("capacity-1conn-pipelined"), sharded.get("capacity-1conn-pipelined")
        ratio = _tx_ratio(b, a)
        figure = "-"
        if ratio is not None and a is not None and b is not None:
            figure = f"{ratio:.2f}x: {b.requests_per_s:,.0f} vs {a.requests_per_s:,.0f} tx/s"
        rows.append(
            f"| Blast: {n} shards >= {SHARDS_PIPELINED_TARGET}x one server, 1 pipelined "
            f"connection each (issue 17) | {figure} | "
            f"{_met(None if ratio is None else ratio >= SHARDS_PIPELINED_TARGET)} |"
        )
    first = next(iter(ours.values()), None)
    bpe = None if first is None else first.extra.get("bytes_per_entry")
    rows.append(
        f"| Memory <= 400 bytes per held entry at 1,000,000 | "
        f"{'-' if bpe is None else f'{bpe:.0f} bytes'} | "
        f"{_met(None if bpe is None else bpe <= 400)} |"
    )
    return rows
