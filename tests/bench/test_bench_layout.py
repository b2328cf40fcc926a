"""Layouts (issue 19): ``--pin`` puts the spawned server on one CPU and lockbench's load on
the others, its refusals (no --spawn, shards, one CPU), the names a result gets for the
layout it observed, and the sitting's --layouts. Short runs bounded by --count; no timing
assertions."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from lockbench import main
from lockbench._blast import BlastConfig, run_blast
from lockbench._cli import _layouts, build_parser
from lockbench._layout import (
    PARTIAL,
    PINNED,
    UNKNOWN,
    UNPINNED,
    LayoutError,
    layout_of,
    load_on,
    observe,
    pin_plan,
    thread_on,
)
from lockbench._runner import RunConfig, laid_out, open_servers, run
from lockbench._spawn import spawned
from lockbench._targets import Backend, Target

ROOT = Path(__file__).resolve().parents[2]
CPUS = frozenset(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="the pinned layout needs 2 CPUs")


def _allowed_list(pid: int | str) -> str:
    """Cpus_allowed_list of /proc/PID/status (or of a thread: /proc/self/task/TID)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def _as_list(cpus: frozenset[int]) -> str:
    """The kernel's compact form of a CPU set: '0', '1-3', '0,2'."""
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0]
    for c in [*ordered[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def test_pin_plan_gives_the_first_cpu_to_the_server() -> None:
    """The server gets the lowest CPU lockbench may use, the load all the others."""
    plan = pin_plan([0, 1])
    assert (plan.server, plan.load) == ({0}, {1})
    plan = pin_plan([5, 2, 3])
    assert (plan.server, plan.load) == ({2}, {3, 5})


def test_pin_plan_refuses_one_cpu() -> None:
    """One CPU: a clear error naming what --pin needs and what there is."""
    with pytest.raises(LayoutError, match=r"--pin needs 2 CPUs or more .* may use 1 \(CPU 0\)"):
        pin_plan([0])


def test_layout_names_what_it_sees() -> None:
    """Disjoint CPU sets are pinned, equal ones unpinned, overlapping ones partial, an
    unknown server unknown."""
    assert layout_of(frozenset({0}), frozenset({1})) == PINNED
    assert layout_of(frozenset({0, 1}), frozenset({0, 1})) == UNPINNED
    assert layout_of(frozenset({0, 1}), frozenset({1})) == PARTIAL
    assert layout_of(None, frozenset({0, 1})) == UNKNOWN
    seen = observe([os.getpid()])
    assert seen == {"layout": UNPINNED, "server_cpus": sorted(CPUS), "load_cpus": sorted(CPUS)}
    assert observe([None])["layout"] == UNKNOWN


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["blast", "--target", "lockserver://127.0.0.1:7400", "--pin"],
            "--pin binds the server lockbench starts: add --spawn",
        ),
        (["run", "ping", "--target", "lockserver://127.0.0.1:7400", "--pin"], "add --spawn"),
        (["blast", "--spawn", "--shards", "2", "--pin"], "not with --shards"),
        (["sitting", "--layouts", "pinned,sideways"], "unknown --layouts sideways"),
        (["sitting", "--layouts", ","], "unknown --layouts (none)"),
    ],
)
def test_bad_layout_options_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Impossible layouts fail before anything starts: exit 2 and one line naming why."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lockbench: error:") and message in err, err


def test_pin_parses() -> None:
    """--pin is an option of the commands that spawn a server, off by default."""
    parser = build_parser()
    assert parser.parse_args(["blast", "--spawn", "--pin"]).pin is True
    assert parser.parse_args(["run", "ping", "--spawn", "--pin"]).pin is True
    assert parser.parse_args(["blast", "--spawn"]).pin is False
    assert parser.parse_args(["sitting"]).layouts is None
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "a.json", "b.json", "--pin"])


def test_one_cpu_machine_refuses_pin_and_the_sitting_leaves_it_out(tmp_path: Path) -> None:
    """lockbench bound to one CPU (as on a 1-CPU machine): --pin exits 2 with the reason,
    before any server starts; the sitting's default layouts leave pinned out with a note,
    and asking for pinned there is an error."""
    one = frozenset(sorted(CPUS)[:1])
    with thread_on(one):  # the child inherits this thread's CPUs
        blast = subprocess.run(
            [sys.executable, "-m", "lockbench", "blast", "--spawn", "--pin"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        sitting = subprocess.run(
            [sys.executable, "-m", "lockbench", "sitting", "--layouts", "pinned"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert blast.returncode == 2
    assert "--pin needs 2 CPUs or more" in blast.stderr
    assert sitting.returncode == 2
    assert "--pin needs 2 CPUs or more" in sitting.stderr

    out = io.StringIO()
    with thread_on(one):
        assert _layouts(None, Console(file=out, width=300)) == (UNPINNED,)
    assert "the pinned layout is left out: --pin needs 2 CPUs or more" in out.getvalue()
    if len(CPUS) > 1:
        assert _layouts(None, Console(file=io.StringIO())) == (PINNED, UNPINNED)


@two_cpus
def test_pinned_spawn_binds_the_server_and_the_load(tmp_path: Path) -> None:
    """The spawned server runs on the first CPU only (its /proc status says so from the
    start); inside the layout every thread of lockbench, a thread started there and a
    process started there run on the other CPUs; afterwards lockbench is unbound again."""
    plan = pin_plan()
    with (
        open_servers(Target(Backend.LOCKSERVER), True, cpus=plan.server) as (_, servers),
        laid_out(plan, servers) as layout,
    ):
        (server,) = servers
        assert server is not None and server.pid is not None
        assert _allowed_list(server.pid) == _as_list(plan.server)
        assert os.sched_getaffinity(server.pid) == plan.server
        assert layout == {
            "layout": PINNED,
            "server_cpus": sorted(plan.server),
            "load_cpus": sorted(plan.load),
        }
        for tid in os.listdir("/proc/self/task"):
            assert _allowed_list(f"self/task/{tid}") == _as_list(plan.load)
        seen: list[set[int]] = []
        thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        assert seen == [plan.load]
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert child.stdout.strip() == str(sorted(plan.load))
    assert os.sched_getaffinity(0) == CPUS
    for tid in os.listdir("/proc/self/task"):
        assert _allowed_list(f"self/task/{tid}") == _as_list(CPUS)


@two_cpus
def test_pin_needs_no_taskset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The binding is the kernel's affinity call, not the taskset program: with nothing on
    PATH a pinned server still starts, bound."""
    monkeypatch.setenv("PATH", "")
    plan = pin_plan()
    with spawned(Backend.LOCKSERVER, cpus=plan.server) as server:
        assert server.pid is not None
        assert os.sched_getaffinity(server.pid) == plan.server


@two_cpus
def test_pinned_blast_and_run_name_their_layout() -> None:
    """`blast --spawn --pin` and `run --spawn --pin`: results in the pinned layout, with the
    CPUs seen (server the first, load the rest); unpinned ones say so too, and lockbench
    is unbound after each."""
    plan = pin_plan()
    target = Target(Backend.LOCKSERVER)
    (r,) = run_blast(
        BlastConfig(target, spawn=True, pin=True, connections=2, pipeline=4, count=400, warmup=0)
    )
    assert r.errors == 0 and r.requests >= 400
    assert r.params["layout"] == PINNED
    assert r.extra["cpus"] == {"server": sorted(plan.server), "load": sorted(plan.load)}
    assert r.label.endswith(" pinned")
    assert os.sched_getaffinity(0) == CPUS
    r = run(RunConfig("ping", target, spawn=True, pin=True, count=100, warmup=0, interval=0.1))
    assert r.params["layout"] == PINNED and r.errors == 0
    assert r.extra["cpus"]["server"] == sorted(plan.server)
    (r,) = run_blast(BlastConfig(target, spawn=True, connections=2, count=200, warmup=0))
    assert r.params["layout"] == UNPINNED
    assert r.extra["cpus"] == {"server": sorted(CPUS), "load": sorted(CPUS)}
    assert os.sched_getaffinity(0) == CPUS


def test_load_on_without_a_plan_binds_nothing() -> None:
    """No plan (unpinned): the context changes nothing."""
    with load_on(None), thread_on(None):
        assert os.sched_getaffinity(0) == CPUS
