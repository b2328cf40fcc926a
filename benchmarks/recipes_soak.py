"""The coordination recipes' soak: elections and barrier rounds through a replicated group while
faults are injected; every leadership and every barrier attempt is recorded and the whole
history checked (issue 33): at most one leader at a time, each term once and larger for every
later leader (``lockbench.safety.check_leaders``), and no party ever passed a barrier before
all of its parties had arrived (``check_barrier``).

Starts a real etcd cluster (``--etcd-members`` 1 or 3, ``lockbench.etcd``) and ``--replicas``
``lockserver --replicate`` processes (``lockbench.replicas``) on loopback ports, then
``--processes`` worker processes. Each worker runs, with one client (given the whole group:
it fails over by itself) and one session per thread:

- a candidate for each of ``--elections`` elections: campaign, record the leadership (from
  the campaign's return to before the resignation is sent, with its term), resign, again;
- a party of each of ``--barriers`` cyclic barriers of ``--processes`` parties (one party per
  worker): ``wait``, recording when it arrived and when it passed, again.

Every ``--fault-every`` seconds one fault, in turn: ``kill`` (SIGKILL a replica, start it again
a moment later), ``stop`` (SIGSTOP a replica past its lease, then SIGCONT), ``etcd`` (three
members only: SIGKILL an etcd member, restart it). A call that fails under a fault is counted
and the thread goes on (what is checked is safety, and that elections and rounds keep coming).

It ends when ``--elections-target`` leaderships and ``--rounds-target`` barrier rounds are
recorded (or after ``--seconds``), checks the files and exits 1 on any violation::

    python -m benchmarks.recipes_soak --elections-target 10000 --rounds-target 10000
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

NAMESPACE = "soak"


def _candidate(
    addresses: list[str], name: str, holder: str, recorder: Any, stop: Any, counts: Any
) -> None:
    from client import Election, LockClient, LockClientError

    while not stop.is_set():
        try:
            with LockClient(servers=[addresses], timeout=3.0) as c:
                session = c.session(max_age=10.0, description=holder)
                while not stop.is_set():
                    # A fresh candidate each time (as the mutex soak does): one whose resign
                    # failed still believes it leads; its cleanup is sent again before the
                    # session's next call (client.recipes), so the next campaign is clean.
                    election = Election(session, NAMESPACE, name)
                    try:
                        term = election.campaign(holder, timeout=3.0)
                    except LockClientError as exc:
                        counts.error(exc)
                        continue
                    if term is None:
                        continue
                    with recorder.hold(name, "w", term, holder):
                        pass  # the leader's act: the soak records that it led, and when
                    counts.add("elections")
                    try:
                        election.resign()
                    except LockClientError as exc:
                        counts.error(exc)
        except LockClientError as exc:
            counts.error(exc)
            time.sleep(0.1)


def _party(
    addresses: list[str],
    name: str,
    parties: int,
    holder: str,
    out: Any,
    mu: threading.Lock,
    stop: Any,
    counts: Any,
) -> None:
    from client import Barrier, LockClient, LockClientError, LockLostError

    while not stop.is_set():
        try:
            with LockClient(servers=[addresses], timeout=3.0) as c:
                session = c.session(max_age=10.0, description=holder)
                barrier = Barrier(session, NAMESPACE, name, parties=parties)
                while not stop.is_set():
                    arrived = time.monotonic()
                    try:
                        passed = barrier.wait(timeout=5.0)
                    except LockClientError as exc:
                        counts.error(exc)
                        passed = False
                        # Drop out of the round cleanly (the others stop counting this party):
                        # a party whose entries stayed would hold the next rounds up.
                        for _ in range(20):
                            try:
                                barrier.release()
                                break
                            except LockLostError:
                                break
                            except LockClientError:
                                time.sleep(0.1)
                    record = {
                        "barrier": name,
                        "party": holder,
                        "arrived": arrived,
                        "passed": time.monotonic() if passed else None,
                        "ended": time.monotonic(),
                    }
                    with mu:
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                    if passed:
                        counts.add("passes")
        except LockClientError as exc:
            counts.error(exc)
            time.sleep(0.1)


class _Counts:
    def __init__(self, elections: Any, passes: Any) -> None:
        self._shared = {"elections": elections, "passes": passes}
        self._mu = threading.Lock()
        self.errors: dict[str, int] = {}

    def add(self, what: str) -> None:
        value = self._shared[what]
        with value.get_lock():
            value.value += 1

    def error(self, exc: BaseException) -> None:
        with self._mu:
            name = type(exc).__name__
            self.errors[name] = self.errors.get(name, 0) + 1


def _worker(
    addresses: list[str],
    index: int,
    processes: int,
    elections: int,
    barriers: int,
    leaders_path: str,
    attempts_path: str,
    elected: Any,
    passes: Any,
    stop: Any,
) -> None:
    from lockbench.safety import Recorder

    counts = _Counts(elected, passes)
    mu = threading.Lock()
    with Recorder(leaders_path) as recorder, open(attempts_path, "a", encoding="utf-8") as out:
        threads = [
            threading.Thread(
                target=_candidate,
                args=(addresses, f"e{k}", f"p{index}-e{k}", recorder, stop, counts),
                daemon=True,
            )
            for k in range(elections)
        ] + [
            threading.Thread(
                target=_party,
                args=(addresses, f"b{k}", processes, f"p{index}", out, mu, stop, counts),
                daemon=True,
            )
            for k in range(barriers)
        ]
        for t in threads:
            t.start()
        while not stop.is_set():
            time.sleep(0.2)
        for t in threads:
            t.join(30)
    print(f"worker {index}: errors {counts.errors}", flush=True)


def _load_attempts(paths: list[str]) -> list[Any]:
    from lockbench.safety import Attempt

    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    d = json.loads(line)
                    out.append(
                        Attempt(d["barrier"], d["party"], d["arrived"], d["passed"], d["ended"])
                    )
    return out


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster
    from lockbench.replicas import ReplicaGroup
    from lockbench.safety import check_barrier, check_leaders, load

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elections-target", type=int, default=10_000, help="leaderships to record")
    p.add_argument("--rounds-target", type=int, default=10_000, help="barrier rounds to record")
    p.add_argument("--seconds", type=float, default=1800.0, help="time bound")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--etcd-members", type=int, default=1, choices=(1, 3))
    p.add_argument("--processes", type=int, default=3, help="workers (= each barrier's parties)")
    p.add_argument("--elections", type=int, default=2, help="elections contended for")
    p.add_argument("--barriers", type=int, default=2, help="cyclic barriers run")
    p.add_argument("--fault-every", type=float, default=4.0, help="seconds between faults")
    p.add_argument("--snapshot-every", type=int, default=2000)
    p.add_argument("--dir", default=None, help="where logs and JSON-lines go (default: temp)")
    args = p.parse_args(argv)

    workdir = Path(args.dir or tempfile.mkdtemp(prefix="recipes-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    kinds = ["kill", "stop"] + (["etcd"] if args.etcd_members == 3 else [])
    faults: dict[str, int] = dict.fromkeys(kinds, 0)
    with (
        EtcdCluster(workdir / "etcd") as etcd,
        ReplicaGroup(
            etcd.start(args.etcd_members).endpoints,
            workdir / "replicas",
            n=args.replicas,
            group="recipes-soak",
            snapshot_every=args.snapshot_every,
        ) as group,
    ):
        group.start()
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Event()
        elected = ctx.Value("q", 0)
        passes = ctx.Value("q", 0)
        leaders = [str(workdir / f"leaders-{i}.jsonl") for i in range(args.processes)]
        attempts = [str(workdir / f"attempts-{i}.jsonl") for i in range(args.processes)]
        for path in leaders + attempts:
            Path(path).unlink(missing_ok=True)
        procs = [
            ctx.Process(
                target=_worker,
                args=(
                    group.addresses,
                    i,
                    args.processes,
                    args.elections,
                    args.barriers,
                    leaders[i],
                    attempts[i],
                    elected,
                    passes,
                    stop,
                ),
            )
            for i in range(args.processes)
        ]
        for proc in procs:
            proc.start()
        t0 = time.monotonic()
        next_fault = t0 + args.fault_every
        turn = itertools.cycle(kinds)
        victim = itertools.cycle(range(args.replicas))
        members = itertools.cycle(range(args.etcd_members))
        last_report = t0
        while True:
            now = time.monotonic()
            rounds = passes.value // args.processes
            if (
                elected.value >= args.elections_target and rounds >= args.rounds_target
            ) or now - t0 >= args.seconds:
                break
            if now - last_report >= 10:
                print(
                    f"{now - t0:6.1f} s: {elected.value:,} elections, {rounds:,} barrier rounds, "
                    f"faults {faults}",
                    flush=True,
                )
                last_report = now
            if now >= next_fault:
                kind = next(turn)
                faults[kind] += 1
                if kind == "kill":
                    i = next(victim)
                    group.kill(i)
                    time.sleep(0.5)
                    group.start([i])
                elif kind == "stop":
                    i = next(victim)
                    group.stop(i)
                    time.sleep(group.lease_ttl + 1.0)  # past its lease: it must rejoin
                    group.cont(i)
                else:
                    m = next(members)
                    etcd.kill(m)
                    time.sleep(1.0)
                    etcd.restart(m)
                next_fault = time.monotonic() + args.fault_every
            time.sleep(0.05)
        stop.set()
        for proc in procs:
            proc.join(90)
        elapsed = time.monotonic() - t0
        leaderships = load(leaders)
        barrier_attempts = _load_attempts(attempts)
        leader_report = check_leaders(leaderships)
        barrier_report = check_barrier(barrier_attempts, args.processes)
        rounds = passes.value // args.processes
        print(
            f"replicas={args.replicas} etcd members={args.etcd_members} "
            f"processes={args.processes} elections={args.elections} barriers={args.barriers}"
        )
        print(
            f"elections: {elected.value:,}, barrier rounds: {rounds:,} in {elapsed:.1f} s "
            f"({elected.value / elapsed:,.0f} elections/s, {rounds / elapsed:,.0f} rounds/s)"
        )
        print(f"faults injected: {faults} (one every {args.fault_every:g} s)")
        print(f"leaderships checked: {len(leaderships):,}; barrier attempts checked: "
              f"{len(barrier_attempts):,} (files in {workdir})")  # fmt: skip
        print("leaders:", leader_report.summary())
        print("barrier:", barrier_report.summary())
        bad = (
            not leader_report.ok
            or not barrier_report.ok
            or any(proc.exitcode != 0 for proc in procs)
            or elected.value < args.elections_target
            or rounds < args.rounds_target
        )
        print("FAILED" if bad else "OK")
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
