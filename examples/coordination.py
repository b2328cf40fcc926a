"""Coordination recipes: a leader election with a failover, a group with a watcher, a barrier
and a countdown latch, on a lockserver this script starts (docs/recipes.md).

Run from the repository root after ``pip install -e .``::

    .venv/bin/python examples/coordination.py          # the demo, then serves until Ctrl-C
    .venv/bin/python examples/coordination.py --once   # exits after the demo (used by tests)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading

from client import (
    Barrier,
    CountDownLatch,
    Election,
    Group,
    LockClient,
    ReentrantMutex,
)

NS = "demo"


def election(c: LockClient) -> None:
    """Two nodes campaign; the second waits on the server and takes over the moment the first
    node's session ends (its process died), with a larger term; a watcher sees both."""
    with c.session(description="node-a") as a, c.session(description="node-b") as b:
        changes = Election(b, NS, "primary").observe()
        print(f"observe: {next(changes).leader}")  # nobody yet
        node_a = Election(a, NS, "primary")
        term_a = node_a.campaign({"addr": "10.0.0.1"})
        print(f"node-a leads, term {term_a}")
        print(f"observe: leader {next(changes).leader.value}")  # type: ignore[union-attr]
        node_b = Election(b, NS, "primary")
        taken = threading.Event()
        terms: list[int | None] = []

        def standby() -> None:
            terms.append(node_b.campaign({"addr": "10.0.0.2"}))
            taken.set()

        thread = threading.Thread(target=standby)
        thread.start()
        c.end_session(a.id)  # node-a's process dies: its session ends, and with it the lease
        taken.wait(10)
        thread.join(10)
        print(f"node-b leads, term {terms[0]} > {term_a}: {terms[0] > term_a}")  # type: ignore[operator]
        change = next(changes)
        while change.leader is None or change.leader.session != b.id:
            change = next(changes)
        print(f"observe: leader {change.leader.value}")
        changes.close()
        node_b.resign()


def group(c: LockClient) -> None:
    """Workers join with their capabilities; a watcher hears joins and leaves, and why."""
    with c.session() as w, c.session() as x, c.session() as y:
        watch = Group(w, NS, "workers").watch()
        next(watch)
        gx = Group(x, NS, "workers", member_id="x")
        gx.join({"gpu": True})
        print(f"joined: {[m.member_id for m in next(watch).joined]}")
        with Group(y, NS, "workers", member_id="y").membership({"gpu": False}):
            print(f"joined: {[m.member_id for m in next(watch).joined]}")
            print(f"members: {[(m.member_id, m.metadata) for m in gx.members()]}")
        print(f"left: {[(m.member_id, why) for m, why in next(watch).left]}")
        c.end_session(x.id)
        print(f"left: {[(m.member_id, why) for m, why in next(watch).left]}")
        watch.close()


def barrier_and_latch(c: LockClient) -> None:
    """Three workers meet at a barrier twice; each counts a latch down that the boss waits on;
    a reentrant mutex is taken twice by one thread."""
    sessions = [c.session() for _ in range(3)]
    rounds: list[str] = []
    mu = threading.Lock()

    def worker(i: int) -> None:
        barrier = Barrier(sessions[i], NS, "phase", parties=3)
        for phase in ("load", "compute"):
            barrier.wait()
            with mu:
                rounds.append(f"{phase}:{i}")
        CountDownLatch(sessions[i], NS, "done", count=3).count_down()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    with c.session() as boss:
        opened = CountDownLatch(boss, NS, "done", count=3).wait(timeout=30)
        print(f"latch open: {opened}")
        rm = ReentrantMutex(boss, NS, "config")
        with rm, rm:
            print(f"reentrant mutex held {rm.count} times, fence {rm.fence is not None}")
    for t in threads:
        t.join(30)
    phases = [r.split(":")[0] for r in rounds]
    print(f"barrier: all loaded before any computed: {phases == ['load'] * 3 + ['compute'] * 3}")
    for s in sessions:
        s.end()


def demo(host: str, port: int) -> None:
    with LockClient(host, port) as c:
        election(c)
        group(c)
        barrier_and_latch(c)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=7400)
    parser.add_argument("--once", action="store_true", help="exit after the demo")
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "lockserver", "--port", str(args.port), "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()  # "lockserver listening on HOST:PORT"
        if not line.startswith("lockserver listening on "):
            print("the server did not start", file=sys.stderr)
            return 1
        print(line)
        host, _, port = line.rpartition(" ")[2].rpartition(":")
        demo(host.strip("[]"), int(port))
        if args.once:
            return 0
        print("The server keeps running; press Ctrl-C to stop it.")
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.terminate()
        server.wait(timeout=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
