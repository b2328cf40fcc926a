"""Fuzz a running lock server with random and mutated frames, at length (issue #8).

Why: the fuzz tests (tests/fuzz) check a few hundred frames against a server in a thread; a
peer can send millions. This spawns ``python -m lockserver --port 0``, blasts frames from
:mod:`lockbench.fuzz` (each knows its right answers) over several connections (separate
processes), reconnecting after each close, then checks that the server is alive and answers a
correct request, and reports frames sent, errors by code, closes, internal errors (from the
server's statistics) and the server's RSS before and after. Exit status 1 on an internal error,
a failed worker or a wrong answer at the end. Run from the repository root:

    python -m benchmarks.fuzz_server --frames 1000000 --connections 4
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from lockbench.fuzz import Conversation, encode, make_case
from protocol import ErrorReply, Reply

__all__ = ["main"]


def _worker(port: int, frames: int, seed: int, batch: int, out: Any) -> None:
    counts: collections.Counter[str] = collections.Counter()
    try:
        _blast(port, frames, seed, batch, counts)
    except BaseException as exc:
        counts[f"worker_failed:{type(exc).__name__}: {exc}"] += 1
        raise
    finally:
        out.put(dict(counts))


def _blast(port: int, frames: int, seed: int, batch: int, counts: collections.Counter[str]) -> None:
    rng = random.Random(seed)
    sent = 0
    conv = Conversation(port)
    rid = 1
    while sent < frames:
        chunk = []
        data = bytearray()
        for _ in range(min(batch, frames - sent)):
            case = make_case(rng, rid)
            rid += 1
            chunk.append(case)
            data += case.data
            if case.closes:
                break
        sent += len(chunk)
        data += encode({"type": "ping", "id": 2**63 + rid})
        if not conv.send(bytes(data)):
            counts["send_failed"] += 1
        closed = False
        while True:
            m = conv.next()
            if m is None:
                closed = True
                break
            if isinstance(m, ErrorReply):
                counts[f"error:{int(m.code)}"] += 1
            else:
                counts["reply"] += 1
                if getattr(m, "request_id", None) == 2**63 + rid:
                    break
        if closed:
            counts["closes"] += 1
            conv.close()
            conv = Conversation(port)
    conv.close()
    counts["frames"] = sent


def _stats(port: int) -> dict[str, Any]:
    conv = Conversation(port)
    conv.send(encode({"type": "stats", "id": 7}))
    m = conv.next()
    conv.close()
    assert isinstance(m, Reply)
    return dict(m.body.values)  # type: ignore[union-attr]


def _correct_request(port: int) -> bool:
    """A lock, a conflicting lock and a release, with the right answers."""
    from client import Assert, DeleteVar, LockClient, SetVar

    with LockClient("127.0.0.1", port, timeout=5.0) as c:
        a, b = c.session(keepalive=False), c.session(keepalive=False)
        ok = a.execute("fz-check", [Assert(SetVar("t", "v", 1))]).ok
        conflict = not b.execute("fz-check", [Assert(SetVar("t", "v", 2))]).ok
        released = a.execute("fz-check", [Assert(DeleteVar("t", "v"))]).ok
        a.end()
        b.end()
    return ok and conflict and released


def main(argv: list[str] | None = None) -> int:
    # The harness's private server spawner: these repository scripts share lockbench's
    # internals on purpose (psutil, the bench extra, is imported only here).
    from lockbench._spawn import spawned
    from lockbench._targets import Backend

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=1_000_000)
    p.add_argument("--connections", type=int, default=4, help="worker processes")
    p.add_argument("--batch", type=int, default=64, help="frames per write")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--port", type=int, default=0, help="fuzz a running server instead")
    args = p.parse_args(argv)

    def run(port: int, rss: Callable[[], int | None]) -> int:
        rss_before = rss()
        t0 = time.monotonic()
        q: Any = multiprocessing.get_context("spawn").Queue()
        per = args.frames // args.connections
        procs = [
            multiprocessing.get_context("spawn").Process(
                target=_worker, args=(port, per, args.seed + i, args.batch, q)
            )
            for i in range(args.connections)
        ]
        for proc in procs:
            proc.start()
        totals: collections.Counter[str] = collections.Counter()
        for _ in procs:
            totals.update(q.get())
        for proc in procs:
            proc.join()
        elapsed = time.monotonic() - t0
        alive = _correct_request(port)
        stats = _stats(port)
        rss_after = rss()
        server = stats["server"]
        engine = stats["engine"]
        print(f"frames sent:      {totals['frames']:,} in {elapsed:.1f} s")
        print(f"replies (ok):     {totals['reply']:,}")
        print(f"closes:           {totals['closes']:,}")
        for key in sorted(k for k in totals if k.startswith(("error:", "worker_failed"))):
            print(f"  {key}: {totals[key]:,}")
        print(f"internal errors:  {server['internal_errors']}")
        print(f"protocol errors:  {server['protocol_errors']:,}")
        print(f"engine: sessions={engine['sessions']} entries={engine['entries']}")
        print(f"RSS before/after: {rss_before} / {rss_after} bytes")
        print(f"correct request answered at the end: {alive}")
        good = alive and server["internal_errors"] == 0 and worker_ok(procs)
        print("OK" if good else "FAILED")
        return 0 if good else 1

    def worker_ok(procs: list[Any]) -> bool:
        return all(proc.exitcode == 0 for proc in procs)

    if args.port:
        return run(args.port, lambda: None)
    with spawned(Backend.LOCKSERVER) as server:
        proc = server.process()

        def rss() -> int | None:
            return None if proc is None else int(proc.memory_info().rss)

        return run(server.port, rss)


if __name__ == "__main__":
    sys.exit(main())
