"""Where a lone acquire's time goes in a replicated group (issue 29): per-step timestamps in
the serving replica, and the CPU every process spends per entry.

Two parts, one script:

- ``serve``: runs the ``lockserver`` command in this process with probes wrapped around the
  steps of a request's path (nothing in ``lockserver`` changes: the wrappers are installed
  here, on the pure build, before the server starts). On SIGUSR1 it writes ``--out``
  (JSON): per step, the p50 / p90 of the time from the client's frame being read. The steps
  (``STEPS``): ``frame`` (the request handler gets the bytes) -> ``propose`` (the op is
  queued) -> ``fit`` (the proposer task runs) -> ``encode`` / ``encoded`` (the entry built)
  -> ``sealed`` -> ``put_call`` (the etcd client is asked) -> ``pool`` -> ``reusable`` (a
  kept-alive connection checked) -> ``h2_start`` / ``h2_done`` (HEADERS and DATA built and
  written) -> ``answer_msg`` (the put's answer read whole) -> ``watch_msg`` (a watch message
  parsed) -> ``watch`` (its batch reached ``_apply``) -> ``applied`` (the entry went through
  the state machine) -> ``deliver`` / ``reply`` (the answers written), and ``put_answer``
  (the put's answer is back). A cycle is the first occurrence of each step after a
  ``frame`` (after its ``put_call``, for the steps from there on); cycles without a reply
  or a put are dropped (ticks and heartbeats).
- ``run`` (the default): one etcd member, ``--replicas`` replicas (replica 0 through
  ``serve``), ``cload`` strict against replica 0 for ``--duration`` seconds; reads every
  process's CPU (``/proc``, utime + stime) at the window's edges and prints it per
  transaction (strict: one entry each), with the probe's step table. The probe costs two
  clock reads and a list append per step: compare probed figures with each other.

    python -m benchmarks.group_probe --replicas 1,3 --duration 8 --grpc
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

STEPS = (
    "frame",
    "propose",
    "fit",
    "encode",
    "encoded",
    "sealed",
    "put_call",
    "pool",
    "reusable",
    "h2_start",
    "h2_done",
    "answer_msg",
    "watch_msg",
    "watch",
    "applied",
    "deliver",
    "reply",
    "put_answer",
)
#: Steps before the put: their first occurrence in a cycle counts; every later step's first
#: occurrence after the cycle's put_call does (the others belong to other entries).
_BEFORE_PUT = frozenset(STEPS[: STEPS.index("put_call") + 1])


def _install(marks: list[tuple[str, float]]) -> None:
    """Wrap the request path's steps to append ``(step, perf_counter())`` to ``marks``."""
    from lockserver.replication import (
        _etcd,
        _etcd_grpc,
        _etcd_grpc_watch,
        _group,
        _groupauth,
        _replica,
    )
    from lockserver.shell import _requests, _server

    clock = time.perf_counter
    add = marks.append

    def around(owner: Any, name: str, before: str | None, after: str | None) -> None:
        original = getattr(owner, name)
        if hasattr(original, "__code__") and original.__code__.co_flags & 0x80:  # coroutine

            async def awrapped(*args: Any, **kwargs: Any) -> Any:
                if before:
                    add((before, clock()))
                result = await original(*args, **kwargs)
                if after:
                    add((after, clock()))
                return result

            setattr(owner, name, awrapped)
            return

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if before:
                add((before, clock()))
            result = original(*args, **kwargs)
            if after:
                add((after, clock()))
            return result

        setattr(owner, name, wrapped)

    around(_requests.RequestHandler, "process", "frame", None)
    around(_replica.Replica, "propose", "propose", None)
    around(_replica, "_fit", "fit", None)
    around(_replica, "encode_entry", "encode", "encoded")
    around(_etcd_grpc.GrpcPool, "unary", "pool", None)
    around(_etcd_grpc.GrpcConnection, "reusable", None, "reusable")
    around(_etcd_grpc_watch.GrpcWatchStream, "_next_response", None, "watch_msg")
    around(_groupauth.Sealer, "seal", None, "sealed")
    around(_etcd.Etcd, "put", "put_call", "put_answer")
    around(_etcd_grpc.GrpcConnection, "_start", "h2_start", "h2_done")
    around(_etcd, "answer_json", "answer_msg", None)
    around(_replica.Replica, "_apply", "watch", None)
    around(_group.GroupState, "apply_entry", None, "applied")
    around(_server.Server, "_deliver_applied", "deliver", "reply")


def _cycles(marks: list[tuple[str, float]]) -> dict[str, list[float]]:
    """Per step, the µs from the cycle's frame (see the module header)."""
    out: dict[str, list[float]] = {s: [] for s in STEPS}
    cycle: dict[str, float] | None = None

    def close() -> None:
        if cycle and "reply" in cycle and "put_call" in cycle:
            t0 = cycle["frame"]
            for step, t in cycle.items():
                out[step].append((t - t0) * 1e6)

    for step, t in marks:
        if step == "frame":
            close()
            cycle = {"frame": t}
            continue
        if cycle is None:
            continue
        if step not in _BEFORE_PUT and "put_call" not in cycle:
            continue
        if step not in cycle:
            cycle[step] = t
    close()
    return out


def serve(argv: list[str]) -> int:
    """The ``lockserver`` command, probed; writes the step table to ``--out`` on SIGUSR1."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args, rest = p.parse_known_args(argv)
    if rest and rest[0] == "--":
        rest = rest[1:]
    marks: list[tuple[str, float]] = []
    _install(marks)
    import lockserver.__main__ as server_main

    def dump(*_: Any) -> None:
        table = _cycles(marks)
        summary = {
            step: {
                "n": len(v),
                "p50_us": statistics.median(v) if v else None,
                "p90_us": sorted(v)[int(len(v) * 0.9)] if v else None,
            }
            for step, v in table.items()
        }
        args.out.write_text(json.dumps(summary, indent=1))

    signal.signal(signal.SIGUSR1, dump)  # the server's own handlers take SIGINT and SIGTERM
    return server_main.main(rest)


def _cpu(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(n: int, duration: float, grpc: bool, work: Path, profile: str = "") -> dict[str, Any]:
    """One probed group of ``n`` replicas, cload strict against replica 0; ``profile``: a
    py-spy executable sampling each replica over the window (collapsed stacks in ``work``)."""
    from benchmarks.cload import RunSpec, build
    from benchmarks.cload import run as cload_run
    from lockbench._bigtable import server_args
    from lockbench._spawn import ServerProcess
    from lockbench.etcd import EtcdCluster
    from lockbench.replicas import ReplicaGroup

    exe = build().path
    out = work / f"probe-{n}.json"

    class Probed(ReplicaGroup):
        def command(self, replica: Any) -> list[str]:
            cmd = super().command(replica)
            if replica.index != 0:
                return cmd
            at = cmd.index("lockserver")
            return [*cmd[: at - 1], "-m", "benchmarks.group_probe", "serve", "--out", str(out),
                    "--", *cmd[at + 1 :]]  # fmt: skip

    with EtcdCluster(work / f"etcd-{n}") as etcd:
        etcd.start(1)
        where = ["etcd+grpc://" + ",".join(etcd.endpoints)] if grpc else etcd.endpoints
        with Probed(where, work / f"g{n}", n=n, group=f"p{n}", extra=server_args()) as group:
            group.start()
            procs = {f"replica{i}": r.process.pid for i, r in enumerate(group.replicas)}  # type: ignore[union-attr]
            procs["etcd"] = etcd.members[0].process.pid  # type: ignore[union-attr]
            spies = [
                subprocess.Popen(
                    [profile, "record", "--format", "raw", "--rate", "500", "--nonblocking",
                     "--pid", str(pid), "--duration", str(int(duration)), "--output",
                     str(work / f"spy-{n}-{name}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                for name, pid in procs.items()
                if profile and name.startswith("replica")
            ]  # fmt: skip
            before = {k: _cpu(pid) for k, pid in procs.items()}
            started = time.perf_counter()
            spec = RunSpec(shape="c64", connections=1, depth=1, duration=duration, window=10.0)
            host, port = group.addresses[0].rsplit(":", 1)
            raw = cload_run(
                exe, spec, server=ServerProcess(host, int(port), procs["replica0"], spawned=False)
            )
            elapsed = time.perf_counter() - started
            after = {k: _cpu(pid) for k, pid in procs.items()}
            for spy in spies:
                spy.wait(30)
            proc0 = group.replicas[0].process
            assert proc0 is not None
            proc0.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 10
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
    txs = raw["tx_per_s"] * elapsed  # the window's transactions, about (warm-up included)
    steps = json.loads(out.read_text())
    return {
        "replicas": n,
        "tx_per_s": raw["tx_per_s"],
        "p50_us": raw["p50_us"],
        "cpu_us_per_tx": {k: (after[k] - before[k]) / txs * 1e6 for k in procs},
        "steps": steps,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        return serve(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="1,3")
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--grpc", action="store_true", help="etcd+grpc:// (else the gateway)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--py-spy", default="", help="py-spy executable: profile every replica")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="group-probe-"))
    results = [
        run(int(n), args.duration, args.grpc, work, args.py_spy) for n in args.replicas.split(",")
    ]
    for r in results:
        print(f"\n{r['replicas']} replica(s): {r['tx_per_s']:,.0f} tx/s, p50 {r['p50_us']:,.0f} us")
        print(
            "  CPU us per tx: " + ", ".join(f"{k} {v:,.0f}" for k, v in r["cpu_us_per_tx"].items())
        )
        prev = 0.0
        for step in STEPS:
            s = r["steps"].get(step) or {}
            if s.get("p50_us") is None:
                continue
            print(
                f"  {step:12} +{s['p50_us'] - prev:7,.0f}  at {s['p50_us']:7,.0f} us (n {s['n']})"
            )
            prev = s["p50_us"]
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(f"\nwork directory: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
