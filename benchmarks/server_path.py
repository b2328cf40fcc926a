"""Where the server's per-request Python time goes, in process (issue 19).

``python -m benchmarks.server_path [--batch N]`` feeds the blast's frames (one connection's
ring of acquire/release executes, ``lockbench._blaster.lockserver_ring``) through the real
``RequestHandler.process`` of a ``Server`` built without serving, ``--batch`` frames per
call, with a peer whose send only clears the outbox (no sockets, no event loop passes). It
prints the CPU time (``process_time``, best of 5) per request of:

- ``whole``: ``process()``, everything the server does per request but the syscalls, trio
  and the poller;
- each stage alone, looped over the same frames: framing, msgpack, ``request_from_wire``
  (of which the tree), the door (``LockCore.execute``), the trust monitor, the reply encode;
- ``composed``: those stages in one loop, and each stage *in context*: what the composed loop
  saves when that stage is replaced by its precomputed output. On this VM a stage costs up
  to twice as much among the others as alone (the interpreter's caches are shared), so the
  in-context figures are the ones that add up.

Run it pinned (``taskset -c 0``) on a quiet core; compare figures of one sitting only.
"""

from __future__ import annotations

import argparse
import gc
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import trio

from lockbench._blaster import lockserver_ring
from lockserver import ServerConfig
from lockserver._peer import Peer
from lockserver.shell._server import Server
from protocol import PROTOCOL_VERSION, Connection, Hello, Role
from protocol._codec import pack, request_from_wire, request_to_wire, unpack
from protocol._framing import frame
from protocol._trees import statements_from_wire

ROUNDS = 40


class _Unsent(Peer):
    """A peer whose replies go nowhere: ``flush`` drops the outbox."""

    def flush(self) -> None:
        self.outbox.clear()


def _best(f: Callable[[int], object], per_round: int) -> float:
    """µs of CPU per request: the best of 5 measurements of ``f(ROUNDS)``."""
    times = []
    for _ in range(5):
        t = time.process_time_ns()
        f(ROUNDS)
        times.append(time.process_time_ns() - t)
    return min(times) / (ROUNDS * per_round) / 1000


async def _measure(batch: int) -> dict[str, float]:
    listener = trio.SocketListener(
        trio.socket.from_stdlib_socket(socket.create_server(("127.0.0.1", 0)))
    )
    server = Server(ServerConfig(), [listener])
    handler, core, trust, limits = server.requests, server.core, server.trust, server.tree_limits
    a, _b = socket.socketpair()
    proto = Connection(Role.SERVER, limits=limits, require_hello=True)
    peer = _Unsent(
        a,
        "bench",
        proto,
        trio.current_time(),
        max_send_buffer=1 << 30,
        send_timeout=10,
        on_slow=lambda p, why: None,
        totals=server.totals,
    )
    hello = frame(pack(request_to_wire(Hello(0, PROTOCOL_VERSION, "bench"))))
    handler.process(peer, memoryview(hello))
    frames = lockserver_ring(0, "bench")
    n = len(frames)
    batches = [b"".join(frames[i : i + batch]) for i in range(0, n, batch)]
    payloads = [f[4:] for f in frames]
    wires = [unpack(p) for p in payloads]
    msgs: list[Any] = [request_from_wire(w, limits) for w in wires]
    raws = [w["statements"] for w in wires]
    now = trio.current_time()
    results: list[Any] = [
        core.execute(peer, m.request_id, m.session, m.transaction, None, now, 1.0, "")[0][1]
        for m in msgs
    ]
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)  # the server's setting (__main__._tune_gc)

    def whole(rounds: int) -> None:
        for _ in range(rounds):
            for data in batches:
                handler.process(peer, memoryview(data))

    def framing(rounds: int) -> None:
        c = Connection(Role.SERVER)
        for _ in range(rounds):
            for data in batches:
                c.receive_data(data)
                while c.next_frame() is not None:
                    pass

    def msgpack_(rounds: int) -> None:
        for _ in range(rounds):
            for p in payloads:
                unpack(p, 1024)

    def decode(rounds: int) -> None:
        for _ in range(rounds):
            for w in wires:
                request_from_wire(w, limits)

    def tree(rounds: int) -> None:
        for _ in range(rounds):
            for r in raws:
                statements_from_wire(r, limits)

    def door(rounds: int) -> None:
        for _ in range(rounds):
            for m in msgs:
                core.execute(peer, m.request_id, m.session, m.transaction, None, now, 1.0, "")

    def trust_(rounds: int) -> None:
        for _ in range(rounds):
            for _m in msgs:
                trust.record_call(now, source=peer.number)
                trust.trust(now)

    def encode(rounds: int) -> None:
        for _ in range(rounds):
            for m, r in zip(msgs, results, strict=True):
                proto.send_result(m.request_id, r)

    def composed(skip: str) -> Callable[[int], None]:
        def run(rounds: int) -> None:
            c = Connection(Role.SERVER)
            for _ in range(rounds):
                i = 0
                for data in batches:
                    c.receive_data(data)
                    while (payload := c.next_frame()) is not None:
                        w = unpack(payload, 1024)
                        m: Any = msgs[i] if skip == "decode" else request_from_wire(w, limits)
                        t = 1.0
                        if skip != "trust":
                            trust.record_call(now, source=peer.number)
                            t = trust.trust(now)
                        r: Any
                        if skip == "door":
                            r = results[i]
                        else:
                            out = core.execute(
                                peer, m.request_id, m.session, m.transaction, None, now, t, ""
                            )
                            r = out[0][1]
                        if skip != "encode":
                            proto.send_result(m.request_id, r)
                        i += 1

        return run

    got = {"whole process()": _best(whole, n)}
    for name, f in [
        ("framing", framing),
        ("msgpack unpack", msgpack_),
        ("request_from_wire", decode),
        ("  of which the tree", tree),
        ("door (LockCore.execute)", door),
        ("trust monitor", trust_),
        ("reply encode", encode),
    ]:
        got[name] = _best(f, n)
    all_in = got["composed, one loop"] = _best(composed(""), n)
    for stage in ("decode", "door", "trust", "encode"):
        got[f"  in context: {stage}"] = all_in - _best(composed(stage), n)
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="frames per process() call")
    args = parser.parse_args(argv)
    got = trio.run(_measure, args.batch)
    for name, us in got.items():
        print(f"  {name:32s} {us:6.2f} us/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
