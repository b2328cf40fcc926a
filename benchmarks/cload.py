"""Issue 19's measurement the way its authors made it: a C load client (``cload.c``, written
from PROTOCOL.md alone) against a fresh server per run, server and load on their own CPUs.

Why: lockbench's load generator is a Python process; on the 2-core VM it is itself
descheduled for up to ~14 ms, so its worst latency cannot say whether the server keeps "worst
<= 5 ms in every 10 s window with 1,000,000 entries held". ``cload`` is one epoll thread of C
(a few µs of CPU per request) that checks every reply and records, besides each latency, when
each reply reached the kernel, so its own delays show apart from the server's.

What a run is: ``cload.c`` compiled with ``gcc -O2`` into a cache directory (keyed by the
source's and the compiler's digest; ``CC`` picks another compiler), a lockserver spawned
with lockbench's helpers (``lockbench._spawn``: a free loopback port, ``--max-entries-per-
session`` raised as the bigtable phase does, ``LOCKBENCH_SERVER_ROOT`` honoured) or a
redis-server, then the C client with ``--stat-pid`` of the server: it reads the server's
CPU time (utime + stime of ``/proc/PID/stat``) when the measured window opens and closes,
so the server CPU per transaction covers exactly the window. (lockbench's ``Sampler`` does
the same with psutil from a thread of its own process; here the window opens inside another
process, so the reading is made there.) After the run the server's own statistics give its
build and its entry count, which must equal the prefill plus every acquire answered OK.
Each run also lists the machine's other threads that used CPU meanwhile (``other_tasks``,
from ``/proc/*/task/*/stat``) beside the client's involuntary context switches: on the
2-vCPU VM the client, even pinned alone on CPU 1 and spinning, loses its CPU a few hundred
times in 10 s to the VM's own threads (``kdamond.0``, its agent), one 4 ms tick (HZ=250)
at a time.

Layout (``--pin``): the server on the first CPU this process may use (CPU 0) and the C client
on the others, as ``lockbench --pin`` does (``lockbench._layout``); without it nothing is
bound. The layout is recorded as observed (the two processes' affinities), not as asked.

Usage (from the repository root)::

    python -m benchmarks.cload [--pin] [--shape c64,pipelined,bigtable] [--target lockserver]
        [--duration 10] [--rate R|half] [--repeat N] [--server-root PATH] [--build pure]
        [--json FILE]
    python -m benchmarks.cload --summarize FILE...      # the table of saved documents

``--rate half`` runs each closed-loop run again, paced at half of what it served, on a fresh
server. Every run is bounded by ``--duration`` and ``--count``; the C client also stops at
``--max-errors`` errors. The table shows each run; ``--json`` writes every run's raw JSON
(the C client's object plus the server's figures) with the machine stamp.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from lockbench._bigtable import server_args
from lockbench._layout import LayoutError, layout_of, load_on, pin_plan
from lockbench._results import machine_info
from lockbench._sampler import ServerProbe
from lockbench._spawn import SERVER_ROOT_VARIABLE, ServerProcess, SpawnError, spawn_env, spawned
from lockbench._targets import Backend

__all__ = [
    "SHAPES",
    "SOURCE",
    "Build",
    "CloadError",
    "CompilerMissing",
    "RunSpec",
    "build",
    "main",
    "run",
    "server_build",
]

SOURCE = Path(__file__).with_name("cload.c")
CFLAGS = ("-O2", "-std=c11", "-Wall", "-Wextra")
SHAPES = ("c64", "pipelined", "bigtable")
REDIS_SHAPES = ("c64", "pipelined")
#: Seconds a client run may take beyond its warm-up, window and drain: connecting, and the
#: prefill at no less than 20,000 entries a second.
SLACK_S = 60.0
PREFILL_RATE_FLOOR = 20_000


class CompilerMissing(RuntimeError):
    """No C compiler to build the client with."""


class CloadError(RuntimeError):
    """The client could not run (a usage or setup error: its stderr says which)."""


@attrs.frozen
class Build:
    """The compiled client and what the compiler said when it was built (empty when it was
    found in the cache)."""

    path: Path
    warnings: str


def _compiler() -> str:
    name = os.environ.get("CC", "gcc")
    found = shutil.which(name)
    if found is None:
        raise CompilerMissing(
            f"benchmarks/cload.c needs a C compiler: {name!r} is not on PATH "
            "(Debian: apt-get install gcc; or name one in CC)"
        )
    return found


def default_cache() -> Path:
    """Where built clients are kept: ``$XDG_CACHE_HOME/lockserver-cload`` (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lockserver-cload"


def build(cache: Path | None = None) -> Build:
    """The client compiled from ``cload.c`` (``gcc -O2``), reused from ``cache`` when this
    source was built there by the same compiler with the same flags.

    Raises:
        CompilerMissing: no compiler (the message names it and how to install one).
        CloadError: the compiler failed (its output attached).
    """
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    key = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        cc.encode(),
        version.stdout.encode(),
        *map(str.encode, CFLAGS),
    ):
        key.update(part)
        key.update(b"\0")
    where = cache or default_cache()
    where.mkdir(parents=True, exist_ok=True)
    exe = where / f"cload-{key.hexdigest()[:16]}"
    if exe.exists():
        return Build(exe, "")
    # Build beside the final name and rename, so a concurrent build never runs a half file.
    fd, tmp = tempfile.mkstemp(prefix=exe.name + ".", dir=where)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *CFLAGS, "-o", tmp, str(SOURCE)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise CloadError(f"{cc} could not build {SOURCE}:\n{done.stderr.strip()}")
        os.replace(tmp, exe)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return Build(exe, done.stderr.strip())


@attrs.frozen
class RunSpec:
    """One run: the target and shape, and the client's options (None: the shape's default)."""

    target: str = "lockserver"
    shape: str = "c64"
    connections: int | None = None
    depth: int | None = None
    prefill: int | None = None
    rate: float | None = None
    duration: float = 10.0
    warmup: float = 1.0
    window: float = 10.0
    count: int = 10_000_000
    max_errors: int = 1000
    pin: bool = False
    spin: bool = False
    tag: str | None = None

    def client_args(self) -> list[str]:
        """The C client's options for this run (but host, port and the server's pid)."""
        args = ["--target", self.target, "--shape", self.shape]
        for flag, value in (
            ("--connections", self.connections),
            ("--depth", self.depth),
            ("--prefill", self.prefill),
            ("--rate", self.rate),
            ("--tag", self.tag),
        ):
            if value is not None:
                args += [flag, str(value)]
        args += ["--duration", str(self.duration), "--warmup", str(self.warmup)]
        args += ["--window", str(self.window), "--count", str(self.count)]
        if self.spin:
            args += ["--spin", "1"]
        return [*args, "--max-errors", str(self.max_errors)]

    def bound_s(self) -> float:
        """The longest the client may take before it is killed."""
        prefill = (
            self.prefill
            if self.prefill is not None
            else (1_000_000 if self.shape == "bigtable" else 0)
        )
        return self.warmup + self.duration + 5.0 + prefill / PREFILL_RATE_FLOOR + SLACK_S


def run(
    exe: Path,
    spec: RunSpec,
    *,
    server: ServerProcess | None = None,
    server_options: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One run of the client against a fresh server (or ``server``, already running and not
    pinned by this call): the client's JSON object, with ``exit_status``, the observed
    ``layout`` and ``cpus``, and ``server`` (pid, build, entries after the run, and whether
    they are what the run put there: ``entries_expected``).

    Raises:
        CloadError: the client refused to run (exit 2), printed no JSON, or overran its bound.
        LayoutError: ``pin`` on a machine with one CPU.
    """
    plan = pin_plan() if spec.pin else None
    backend = Backend(spec.target)
    if server is not None:
        return _run_client(exe, spec, server, plan.load if plan else None, fresh=False)
    options = list(server_args() if server_options is None else server_options)
    if backend is Backend.REDIS:
        options = []
    with spawned(backend, args=options, cpus=plan.server if plan else None) as fresh:
        return _run_client(exe, spec, fresh, plan.load if plan else None, fresh=True)


def _run_client(
    exe: Path, spec: RunSpec, server: ServerProcess, load: frozenset[int] | None, fresh: bool
) -> dict[str, Any]:
    argv = [str(exe), "--host", server.host, "--port", str(server.port), *spec.client_args()]
    if server.pid is not None:
        argv += ["--stat-pid", str(server.pid)]
    exclude = {os.getpid()} | ({server.pid} if server.pid is not None else set())
    before = task_times(exclude)
    with load_on(load):
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client_cpus = frozenset(os.sched_getaffinity(proc.pid))
    except OSError:  # it finished already
        client_cpus = frozenset(os.sched_getaffinity(0)) if load is None else load
    server_cpus = None
    if server.pid is not None:
        with contextlib.suppress(OSError):
            server_cpus = frozenset(os.sched_getaffinity(server.pid))
    try:
        out, err = proc.communicate(timeout=spec.bound_s())
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise CloadError(f"cload overran its bound of {spec.bound_s():.0f} s: killed") from None
    if proc.returncode == 2 or not out.strip():
        raise CloadError(f"cload exit {proc.returncode}: {err.strip() or '(no output)'}")
    result: dict[str, Any] = json.loads(out)
    result["exit_status"] = proc.returncode
    result["layout"] = layout_of(server_cpus, client_cpus)
    result["cpus"] = {
        "server": None if server_cpus is None else sorted(server_cpus),
        "load": sorted(client_cpus),
    }
    result["other_tasks"] = other_tasks(before, task_times(exclude))
    result["server"] = _server_figures(spec, server, result, fresh)
    return result


#: A thread's process id, name, CPU seconds (utime + stime) and the CPU it last ran on, by
#: its /proc path.
TaskTimes = dict[str, tuple[int, str, float, int]]


def _task_stat_paths() -> list[Path]:
    """``/proc/*/task/*/stat`` listed one directory at a time, so that a process that exits
    between two listings is passed over (a glob over ``/proc`` raises when it does)."""
    paths: list[Path] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            threads = os.listdir(f"/proc/{entry}/task")
        except OSError:  # gone meanwhile
            continue
        paths.extend(Path(f"/proc/{entry}/task/{tid}/stat") for tid in threads if tid.isdigit())
    return paths


def task_times(exclude: set[int]) -> TaskTimes:
    """Every thread of the machine now (``/proc/*/task/*/stat``) but those of the processes
    ``exclude`` (this one, the server)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: TaskTimes = {}
    for path in _task_stat_paths():
        pid = int(path.parts[2])
        if pid in exclude:
            continue
        try:
            text = path.read_text()
        except OSError:  # gone meanwhile
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[str(path)] = (pid, name, (int(fields[11]) + int(fields[12])) / tick, int(fields[36]))
    return out


def other_tasks(before: TaskTimes, after: TaskTimes, top: int = 6) -> list[dict[str, Any]]:
    """The threads that were there before the run and used CPU during it (most first, at
    most ``top``): what shared the machine with the server (left out of both snapshots) and
    the client (started after ``before``). Clock-tick resolution (10 ms)."""
    used = [
        (after[p][2] - before[p][2], after[p][0], after[p][1], after[p][3])
        for p in after
        if p in before and after[p][2] > before[p][2]
    ]
    used.sort(reverse=True)
    return [
        {"pid": pid, "task": name, "cpu_s": round(cpu, 3), "last_cpu": last}
        for cpu, pid, name, last in used[:top]
    ]


def _server_figures(
    spec: RunSpec, server: ServerProcess, result: dict[str, Any], fresh: bool
) -> dict[str, Any]:
    """What the server says after the run: its build and entry count (lockserver), its key
    count (Redis); ``entries_expected``: the prefill plus every acquire answered OK, which a
    server started for the run (``fresh``) holds exactly when no request was left
    unanswered (None for a server that was there before)."""
    expected = int(result["prefill"]) + int(result["acquired_total"])
    figures: dict[str, Any] = {
        "pid": server.pid,
        "fresh": fresh,
        "entries_expected": expected if fresh else None,
    }
    if spec.target == "redis":
        import redis  # the bench extra

        with contextlib.closing(redis.Redis(host=server.host, port=server.port)) as r:
            figures["entries"] = int(r.dbsize())  # the script cache holds no key
        return figures
    probe = ServerProbe(Backend.LOCKSERVER, server.host, server.port, server)
    try:
        stats = probe.statistics() or {}
    finally:
        probe.close()
    figures["build"] = (stats.get("server") or {}).get("build")
    figures["entries"] = (stats.get("engine") or {}).get("entries")
    return figures


def server_build() -> str:
    """``pure`` or ``compiled``: the build a spawned lockserver would run (its ``--version``
    in the environment lockbench spawns it with). A server older than the compiled build
    (its version line names no build, e.g. ``--server-root`` a checkout of a7f247a) runs
    pure Python."""
    done = subprocess.run(
        [sys.executable, "-P", "-m", "lockserver", "--version"],
        capture_output=True,
        text=True,
        env=spawn_env(),
        check=False,
    )
    text = done.stdout + done.stderr
    for name in ("compiled", "partial", "pure"):
        if f"({name} build)" in text:
            return name
    if done.returncode == 0 and text.strip().startswith("lockserver ") and "(" not in text:
        return "pure"
    raise SpawnError(f"lockserver --version said: {text.strip() or '(nothing)'}")


# --- the command ------------------------------------------------------------------------------


def _specs(args: argparse.Namespace) -> Iterator[RunSpec]:
    targets = ["lockserver", "redis"] if args.target == "both" else [args.target]
    shapes = [s.strip() for s in args.shape.split(",") if s.strip()]
    for _ in range(args.repeat):
        for target in targets:
            for shape in shapes:
                if target == "redis" and shape not in REDIS_SHAPES:
                    continue
                yield RunSpec(
                    target=target,
                    shape=shape,
                    connections=args.connections,
                    depth=args.depth,
                    prefill=args.prefill if target == "lockserver" else None,
                    rate=None if args.rate in (None, "half") else float(args.rate),
                    duration=args.duration,
                    warmup=args.warmup,
                    window=args.window,
                    count=args.count,
                    pin=args.pin,
                    spin=args.spin,
                )


def _num(value: Any, scale: float = 1.0, digits: int = 0) -> str:
    return "-" if value is None else f"{value / scale:,.{digits}f}"


def _layout(r: dict[str, Any]) -> str:
    return str(r["layout"]) + ("+spin" if r.get("spin") else "")


def _load(r: dict[str, Any]) -> str:
    return "closed" if r["rate"] is None else f"{r['rate']:,.0f}/s"


def _entries(r: dict[str, Any]) -> str:
    entries, expected = r["server"].get("entries"), r["server"]["entries_expected"]
    return "-" if expected is None else "ok" if entries == expected else f"{entries}!"


#: The table: (heading, width, cell). Latencies in µs up to p99.9, the worst ones in ms:
#: worst (from the send, or the due time when paced), per --window slice, to the reply's
#: arrival in the kernel, from the write to the arrival (the server's turnaround), the
#: longest a reply lay unread and (paced) the client's own lateness; CPU per transaction of
#: the server and of the client; other: CPU seconds of everything else during the window
#: (tick accounting: +-2 s when paced); preempt: times another task took the client's CPU.
COLUMNS: tuple[tuple[str, int, Callable[[dict[str, Any]], str]], ...] = (
    ("target", -10, lambda r: r["target"]),
    ("shape", -9, lambda r: r["shape"]),
    ("layout", -13, _layout),
    ("load", 9, _load),
    ("tx/s", 8, lambda r: _num(r["tx_per_s"])),
    ("p50", 6, lambda r: _num(r["p50_us"])),
    ("p99", 6, lambda r: _num(r["p99_us"])),
    ("p99.9", 6, lambda r: _num(r["p999_us"])),
    ("worst", 6, lambda r: _num(r["worst_us"], 1000, 2)),
    ("windows", 7, lambda r: "/".join(_num(w, 1000, 1) for w in r["worst_per_window_us"])),
    ("arrive", 6, lambda r: _num(r["arrival_worst_us"], 1000, 2)),
    ("turn", 6, lambda r: _num(r["send_to_arrival_worst_us"], 1000, 2)),
    ("unread", 6, lambda r: _num(r["read_delay_max_us"], 1000, 2)),
    ("late", 5, lambda r: _num(r["send_late_max_us"], 1000, 2)),
    ("srv/tx", 6, lambda r: _num(r["server_cpu_us_per_tx"], 1, 1)),
    ("cli/tx", 6, lambda r: _num(r["client_cpu_us_per_tx"], 1, 1)),
    ("other", 5, lambda r: _num(r["other_cpu_s"], 1, 1)),
    ("preempt", 7, lambda r: _num(r.get("client_preempted"))),
    ("errors", 6, lambda r: str(r["errors"])),
    ("entries", 7, _entries),
)


def _cells(cells: Sequence[str]) -> str:
    return " ".join(
        f"{c:<{-w}}" if w < 0 else f"{c:>{w}}" for c, (_, w, _f) in zip(cells, COLUMNS, strict=True)
    )


def header() -> str:
    """The table's heading (µs: p50 to p99.9; ms: worst to late; µs: CPU per tx; s: other)."""
    return _cells([name for name, _, _ in COLUMNS])


def row(r: dict[str, Any]) -> str:
    """One run as a line of the table."""
    return _cells([cell(r) for _, _, cell in COLUMNS])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cload", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--shape", default="bigtable", help="c64, pipelined, bigtable (a list)")
    parser.add_argument("--target", choices=("lockserver", "redis", "both"), default="lockserver")
    parser.add_argument(
        "--pin", action="store_true", help="server on CPU 0, the client on the rest"
    )
    parser.add_argument(
        "--spin", action="store_true", help="the client never sleeps (busy-polls; needs --pin)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds (10)")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before (1)")
    parser.add_argument("--window", type=float, default=10.0, help="worst-latency slice (10 s)")
    parser.add_argument("--rate", default=None, help="requests/s over all connections, or half")
    parser.add_argument("--connections", type=int, default=None)
    parser.add_argument("--depth", type=int, default=None, help="requests in flight each")
    parser.add_argument("--prefill", type=int, default=None, help="bigtable: entries (1,000,000)")
    parser.add_argument("--count", type=int, default=10_000_000, help="most requests measured")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each (interleaved)")
    parser.add_argument("--server-root", type=Path, default=None, help="another checkout's server")
    parser.add_argument(
        "--build",
        choices=("pure", "compiled"),
        default=None,
        help="refuse unless the server runs this build",
    )
    parser.add_argument("--cache", type=Path, default=None, help="where the client is built")
    parser.add_argument("--json", type=Path, default=None, help="write every run's JSON here")
    parser.add_argument(
        "--summarize",
        type=Path,
        nargs="+",
        default=None,
        metavar="FILE",
        help="print the table of saved --json documents (and run nothing)",
    )
    args = parser.parse_args(argv)
    if args.summarize is not None:
        print(header())
        for path in args.summarize:
            for r in json.loads(path.read_text())["runs"]:
                print(row(r))
        return 0
    if args.rate not in (None, "half"):
        try:
            if float(args.rate) <= 0:
                raise ValueError
        except ValueError:
            parser.error(f"--rate: a positive number or 'half', not {args.rate!r}")
    for shape in args.shape.split(","):
        if shape.strip() and shape.strip() not in SHAPES:
            parser.error(f"--shape: one of {', '.join(SHAPES)}, not {shape!r}")
    if args.spin and not args.pin:
        parser.error(
            "--spin needs --pin: a spinning client without a CPU of its own takes the server's"
        )
    if args.server_root is not None:
        os.environ[SERVER_ROOT_VARIABLE] = str(args.server_root.resolve())
    try:
        exe = build(args.cache)
        which = server_build() if args.target != "redis" else None
        if args.build is not None and which != args.build:
            raise CloadError(
                f"the server runs the {which} build, not {args.build}: "
                + (
                    "build it (python scripts/mypyc_build.py)"
                    if args.build == "compiled"
                    else "clean it (python scripts/mypyc_build.py --clean)"
                )
                + " in the server's checkout"
            )
        runs: list[dict[str, Any]] = []
        print(header(), flush=True)
        for spec in _specs(args):
            result = run(exe.path, spec)
            runs.append(result)
            print(row(result), flush=True)
            if args.rate == "half" and (result["tx_per_s"] or 0) > 0:
                half = attrs.evolve(spec, rate=round(result["tx_per_s"] / 2))
                result = run(exe.path, half)
                runs.append(result)
                print(row(result), flush=True)
    except (CompilerMissing, CloadError, SpawnError, LayoutError) as exc:
        print(f"cload: {exc}", file=sys.stderr)
        return 2
    if args.json is not None:
        document = {
            "tool": "benchmarks.cload",
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine_info(),
            "server_build": which,
            "client": exe.path.name,
            "runs": runs,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    bad = [r for r in runs if r["exit_status"] != 0 or r["errors"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
