"""benchmarks/cload: the C load client written from PROTOCOL.md (issue 19) compiles without a
warning, its frames are requests the reference codec reads, each shape runs against a real
server for half a second with every reply right and the server holding exactly what the run
acquired, and a wrong reply (a refusal, a failed transaction) is an error and a non-zero exit,
never a transaction. Short bounds, loopback only, no timing assertions; skipped only without
a C compiler (CI installs gcc)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from benchmarks import cload
from benchmarks.cload import CloadError, CompilerMissing, RunSpec, build, run
from lockbench._bigtable import PER_SESSION_LIMIT, server_args
from lockbench._layout import PINNED, UNPINNED, available_cpus
from lockbench._spawn import redis_server_path, spawned
from lockbench._targets import Backend
from protocol import (
    Assert,
    Execute,
    Hello,
    SessionSpec,
    SetVar,
    Transaction,
    request_from_wire,
    unpack,
)

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CC", "gcc")) is None,
    reason="benchmarks/cload.c needs a C compiler (gcc) to build the client",
)

SHORT = {"duration": 0.5, "warmup": 0.1}


@pytest.fixture(scope="module")
def exe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = build(tmp_path_factory.mktemp("cload-build"))
    assert built.warnings == ""  # -Wall -Wextra, not a word
    return built.path


def _frames(data: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(data):
        (n,) = struct.unpack_from(">I", data, at)
        out.append(data[at + 4 : at + 4 + n])
        at += 4 + n
    assert at == len(data)
    return out


def _acquire(tag: str, conn: int, k: int) -> Execute:
    session = SessionSpec(f"cload-{tag}-a{conn}", max_age=3600)
    var = f"{tag}.a{conn:04d}.{k % 10**10:010d}"
    return Execute(k + 1, session, Transaction("cload", [Assert(SetVar("Big", var))]))


def test_the_frames_are_the_requests_protocol_md_describes(exe: Path, tmp_path: Path) -> None:
    """What the client sends, decoded by the reference codec: the hello, prefill executes of
    250 ``Assert(SetVar("Big", unique))`` in sessions of their own (the last one shorter),
    and acquires whose id and 10-digit counter the template rewrites."""
    out = tmp_path / "frames.bin"
    subprocess.run([exe, "--dump", out, "--tag", "t1", "--prefill", "600"], check=True)
    decoded = [request_from_wire(unpack(f)) for f in _frames(out.read_bytes())]
    prefill = [
        Execute(
            rid,
            SessionSpec(f"cload-t1-p{rid - 1}", max_age=3600),
            Transaction(
                "cload", [Assert(SetVar("Big", f"t1.p.{i:010d}")) for i in range(first, last)]
            ),
        )
        for rid, first, last in ((1, 0, 250), (2, 250, 500))
    ]
    acquires = [
        _acquire("t1", c, k)
        for c, k in ((0, 0), (0, 1), (1, 0), (3, 12345), (3, 10**10 - 1), (3, 10**10 + 1))
    ]
    # Ids past 2**32 wrap (the count is capped far below that): the last two are reduced.
    acquires[4] = Execute((10**10) % 2**32, acquires[4].session, acquires[4].transaction)
    acquires[5] = Execute((10**10 + 2) % 2**32, acquires[5].session, acquires[5].transaction)
    assert decoded == [Hello(0, client_name="cload"), *prefill, *acquires]


def test_the_client_refuses_bad_options(exe: Path) -> None:
    """Usage errors exit 2 with a line on stderr and no JSON; load off loopback is refused."""
    for args, words in (
        (["--port", "7400", "--shape", "square"], "--shape"),
        (["--port", "7400", "--host", "10.0.0.1"], "loopback"),
        (["--port", "7400", "--target", "redis", "--shape", "bigtable"], "lockserver's"),
        (["--shape", "c64"], "--port is required"),
    ):
        done = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
        assert done.returncode == 2, args
        assert words in done.stderr and done.stdout == ""


def _sane(r: dict[str, object], layout: str = UNPINNED, due_in_warmup: int = 0) -> None:
    """Every reply right, figures consistent, and the fresh server holds exactly the prefill
    plus every acquire answered OK (none left unanswered). Latency is sampled for every
    request sent (paced: due) in the window, whenever answered, and ``tx`` counts the replies
    that came in the window: a paced run that fell behind its schedule answers in the window
    up to ``due_in_warmup`` requests that were due in the warm-up, which count in ``tx`` but
    are not sampled."""
    assert r["exit_status"] == 0 and r["errors"] == 0, r["error_samples"]
    assert r["fatal"] is None and r["stopped_by"] == "duration"
    assert isinstance(r["tx"], int) and r["tx"] > 0
    assert r["tx"] == r["replies"]
    assert r["latency_count"] + due_in_warmup >= r["tx"]  # type: ignore[operator]
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["p999_us"] <= r["worst_us"]  # type: ignore[operator]
    assert r["worst_per_window_us"] == [r["worst_us"]]  # 0.5 s: one window
    assert r["unanswered"] == 0 and r["acquired_total"] == r["sent_total"]
    server = r["server"]
    assert isinstance(server, dict)
    assert server["fresh"] is True
    assert server["entries"] == server["entries_expected"]
    assert server["entries_expected"] == r["prefill"] + r["acquired_total"]  # type: ignore[operator]
    assert r["layout"] == layout


def test_c64_and_the_server_holds_every_acquire(exe: Path) -> None:
    """4 connections (sessions) of unique-var acquires, closed loop: all succeed, the server's
    CPU over the window is read from /proc and the build is reported."""
    r = run(exe, RunSpec(shape="c64", connections=4, **SHORT))
    _sane(r)
    assert r["connections"] == 4 and r["depth"] == 1 and r["prefill"] == 0
    assert r["server_cpu_s"] is not None and r["server_cpu_s"] >= 0  # type: ignore[operator]
    assert r["server"]["build"] in ("pure", "compiled")  # type: ignore[index]
    # Who else ran: the client's preemptions and the machine's other threads, never the
    # server's or the client's own.
    assert isinstance(r["client_preempted"], int) and r["client_preempted"] >= 0
    assert isinstance(r["other_tasks"], list)
    assert all(t["cpu_s"] > 0 for t in r["other_tasks"])  # type: ignore[index]
    others = {t["pid"] for t in r["other_tasks"]}  # type: ignore[index]
    assert r["server"]["pid"] not in others and os.getpid() not in others  # type: ignore[index]
    # The worst latency's moment and the table's size then (no prefill: what was granted).
    assert 0 <= r["worst_at_s"] <= 0.5 + 5  # type: ignore[operator]
    assert 0 < r["entries_at_worst"] <= r["acquired_total"]  # type: ignore[operator]


def test_bigtable_prefills_through_16_sessions_then_acquires(exe: Path) -> None:
    """2,000 entries in 8 executes of 250 (8 sessions: fewer than 16 executes), then 4 load
    connections, pinned and spinning when the machine has two CPUs (the server on the first,
    the client on the rest, never sleeping)."""
    pin = len(available_cpus()) >= 2
    spec = RunSpec(shape="bigtable", prefill=2000, connections=4, pin=pin, spin=pin, **SHORT)
    r = run(exe, spec)
    _sane(r, PINNED if pin else UNPINNED)
    assert (r["prefill"], r["prefill_sessions"], r["prefill_batch"]) == (2000, 8, 250)
    assert r["spin"] is pin
    # The turnaround (write to arrival) is within the latency (due or send to read).
    assert 0 < r["send_to_arrival_worst_us"] <= r["worst_us"]  # type: ignore[operator]
    if pin:
        assert r["cpus"] == {
            "server": [min(available_cpus())],
            "load": sorted(available_cpus())[1:],
        }


def test_paced_never_sends_ahead_of_its_schedule(exe: Path) -> None:
    """``--rate``: request k of connection c is due at t0 + (c + 4k)/R; nothing is sent
    before it is due, so the run sends at most R * (warm-up + window) + one per connection
    (the ones due when it stops)."""
    rate = 2000.0
    r = run(exe, RunSpec(shape="bigtable", prefill=500, connections=4, rate=rate, **SHORT))
    _sane(r, due_in_warmup=int(rate * SHORT["warmup"]) + 4)
    assert r["rate"] == rate
    assert r["sent_total"] <= rate * (0.5 + 0.1) + 4  # type: ignore[operator]
    assert r["send_late_max_us"] is not None


def test_the_command_runs_pipelined_and_writes_its_json(
    exe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m benchmarks.cload``: one connection with 8 in flight, the table printed and
    the document written with the machine stamp and the run's raw JSON, which
    ``--summarize`` prints again."""
    out = tmp_path / "runs.json"
    args = ["--shape", "pipelined", "--depth", "8", "--duration", "0.5", "--warmup", "0.1"]
    rc = cload.main([*args, "--cache", str(exe.parent), "--json", str(out)])
    assert rc == 0
    document = json.loads(out.read_text())
    assert document["machine"]["server_commit"] and document["server_build"] in (
        "pure",
        "compiled",
    )
    (r,) = document["runs"]
    _sane(r)
    assert (r["shape"], r["connections"], r["depth"]) == ("pipelined", 1, 8)
    # --summarize prints the same row again from the file.
    printed = capsys.readouterr().out.splitlines()
    assert cload.main(["--summarize", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [cload.header(), printed[-1]]


def test_a_refused_acquire_is_an_error_not_a_transaction(exe: Path) -> None:
    """A server that allows 50 entries per session: each of 2 load sessions gets exactly 50,
    every later acquire is refused (TOO_MANY_ENTRIES, 304), counted as an error, and the run
    exits 1; the server holds the 100 that were granted."""
    spec = RunSpec(shape="c64", connections=2, max_errors=200, **SHORT)
    r = run(exe, spec, server_options=("--max-entries-per-session", "50"))
    assert r["exit_status"] == 1 and r["stopped_by"] == "errors"
    assert r["errors"] >= 200 and r["acquired_total"] == 100
    assert any("error 304 TOO_MANY_ENTRIES" in s for s in r["error_samples"])  # type: ignore[attr-defined]
    assert r["server"]["entries"] == r["server"]["entries_expected"] == 100  # type: ignore[index]


def test_a_failed_transaction_is_an_error(exe: Path) -> None:
    """The same tag twice on one server: the second run's acquires name variables its own
    sessions already hold, so each result is TransactionError (status 1, the Assert failed):
    errors, no transactions, exit 1."""
    with spawned(Backend.LOCKSERVER, args=server_args()) as server:
        first = run(exe, RunSpec(shape="c64", connections=2, tag="again", **SHORT), server=server)
        assert first["errors"] == 0 and first["server"]["entries_expected"] is None  # type: ignore[index]
        spec = RunSpec(shape="c64", connections=2, tag="again", max_errors=50, **SHORT)
        second = run(exe, spec, server=server)
    assert second["exit_status"] == 1 and second["tx"] == 0 and second["errors"] >= 50
    assert "result status 1 cause 1 failed 0:/AssertOp/" in second["error_samples"][0]  # type: ignore[index]


def test_a_prefill_the_server_cannot_hold_is_refused_naming_the_option(exe: Path) -> None:
    """The welcome's limits are read before the prefill: 250 entries per session against a
    limit of 50 stops the client (exit 2) naming the option to raise."""
    spec = RunSpec(shape="bigtable", prefill=2000, connections=2, **SHORT)
    with pytest.raises(CloadError, match="--max-entries-per-session 250"):
        run(exe, spec, server_options=("--max-entries-per-session", "50"))
    assert server_args() == ("--max-entries-per-session", str(PER_SESSION_LIMIT))


@pytest.mark.skipif(redis_server_path() is None, reason="redis-server is not installed")
def test_redis_with_the_same_client(exe: Path) -> None:
    """Redis, EVALSHA of a SET NX script per unique key (RESP by hand): every reply ``:1``,
    and the server holds one key per acquire."""
    r = run(exe, RunSpec(target="redis", shape="c64", connections=2, **SHORT))
    _sane(r)
    assert r["target"] == "redis"


def test_a_missing_compiler_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No compiler: the error names the one looked for and how to get it."""
    monkeypatch.setenv("CC", "no-such-cc-here")
    with pytest.raises(CompilerMissing, match=r"'no-such-cc-here' is not on PATH.*apt-get"):
        build(tmp_path)


def test_asking_for_the_other_build_is_refused(
    exe: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--build`` names the build the server must run; the other one stops the command
    before any run, saying how to get it."""
    other = "compiled" if cload.server_build() == "pure" else "pure"
    assert cload.main(["--build", other, "--cache", str(exe.parent)]) == 2
    assert "scripts/mypyc_build.py" in capsys.readouterr().err


def test_a_process_that_exits_while_the_threads_are_listed_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CPU snapshot around a run lists /proc while processes come and go: a process whose
    task directory is gone by the time it is read is left out, not an error (CI once failed on
    exactly this race)."""
    real_listdir = os.listdir
    vanished = str(os.getppid())

    def listdir(path: str) -> list[str]:
        if path == f"/proc/{vanished}/task":
            raise FileNotFoundError(path)
        return real_listdir(path)

    monkeypatch.setattr(cload.os, "listdir", listdir)
    times = cload.task_times(exclude={os.getpid()})
    pids = {pid for pid, _name, _cpu, _core in times.values()}
    assert int(vanished) not in pids
    assert pids, "the other processes are still listed"
