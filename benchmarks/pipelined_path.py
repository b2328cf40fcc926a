"""The pipelined shape's per-request server path, in process, for this tree or an older
checkout (issue 32).

``python -m benchmarks.pipelined_path [--root DIR] [--bytecodes]`` feeds cload's
``pipelined`` frames (one session, acquires of unique variables in one table, never
released, 64 frames per batch) through the server's whole synchronous path (the request
handler's ``process``: framing, decode, the door, the reply's encode) of a ``Server`` built
without serving, after a prefill of 8,192. ``--root``: the server code of another checkout
(its ``lockserver`` and ``protocol`` first on the path; checkouts before the door, e.g.
a7f247a, have ``_Shell._process`` instead). It prints:

- by default, the CPU time (``process_time``) per request of 7 rounds of 16,384 requests
  (best and median): a measurement, so run it pinned (``taskset -c 0``) in a quiet sitting
  and compare figures of one sitting only;
- ``--bytecodes``: the bytecodes the interpreter runs per request (``sys.settrace`` opcode
  events over 1,024 requests), in total and by function: no noise, the same on every run, so
  two trees compare exactly (calls into C, such as ``len`` or msgpack, are not counted).
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import os
import socket
import sys
import time
from types import FrameType
from typing import Any

PREFILL = 8192
PER_ROUND = 16384
ROUNDS = 7
TRACED = 1024


def _frame(i: int) -> bytes:
    import msgpack

    body: bytes = msgpack.packb(
        {
            "type": "execute",
            "id": i,
            "session": "cload-x-a0",
            "max_age": 3600,
            "namespace": "cload",
            "statements": [["Assert", ["SetVar", "Big", f"x.a0000.{i:010d}"]]],
        }
    )
    return len(body).to_bytes(4, "big") + body


def _batches(start: int, n: int) -> list[bytes]:
    frames = [_frame(start + i) for i in range(n)]
    return [b"".join(frames[i : i + 64]) for i in range(0, n, 64)]


async def _serve(args: argparse.Namespace) -> None:
    import trio

    import lockserver.__main__ as lsmain
    from lockserver import ServerConfig
    from protocol import PROTOCOL_VERSION, Connection, Hello, Role
    from protocol._codec import pack, request_to_wire
    from protocol._framing import frame

    listener = trio.SocketListener(
        trio.socket.from_stdlib_socket(socket.create_server(("127.0.0.1", 0)))
    )
    config = ServerConfig(max_entries_per_session=10_000_000)
    a, _b = socket.socketpair()
    now = trio.current_time()
    kw: dict[str, Any] = {
        "max_send_buffer": 1 << 30,
        "send_timeout": 10,
        "on_slow": lambda p, w: None,
    }
    try:  # since issue 32's move: the serving shell in its own subpackage
        shell = importlib.import_module("lockserver.shell._server")
    except ImportError:  # an older checkout (--root)
        shell = importlib.import_module("lockserver._server")
    if hasattr(shell, "Server"):
        base: Any = importlib.import_module("lockserver._peer").Peer
        server: Any = shell.Server(config, [listener])
    else:  # before the door (issue 15): the shell and its clients
        base = importlib.import_module("lockserver._client").Client
        server = shell._Shell(config, [listener])

    class Unsent(base):  # type: ignore[misc]
        def flush(self) -> None:
            self.outbox.clear()

    if "totals" in inspect.signature(base).parameters:
        kw["totals"] = server.totals
    ckw = (
        {"require_hello": True}
        if "require_hello" in inspect.signature(Connection).parameters
        else {}
    )
    proto = Connection(Role.SERVER, limits=server.tree_limits, max_frame=config.max_frame, **ckw)
    peer = Unsent(a, "bench", proto, now, **kw)
    requests = getattr(server, "requests", None)
    process = requests.process if requests is not None else server._process
    process(peer, memoryview(frame(pack(request_to_wire(Hello(0, PROTOCOL_VERSION, "bench"))))))
    prefill = _batches(0, PREFILL)
    lsmain._tune_gc()  # the server's collector settings (before the prefill, as at start-up)
    for b in prefill:
        process(peer, memoryview(b))
    name = os.path.basename(os.path.abspath(args.root or "."))
    if args.bytecodes:
        counts: collections.Counter[str] = collections.Counter()

        def tracer(frame_: FrameType, event: str, arg: object) -> Any:
            frame_.f_trace_opcodes = True
            code = frame_.f_code
            key = f"{os.path.relpath(code.co_filename, args.root or '.')}:{code.co_name}"

            def local(frame_: FrameType, event: str, arg: object) -> Any:
                if event == "opcode":
                    counts[key] += 1
                return local

            return local

        traced = _batches(PREFILL, TRACED)
        sys.settrace(tracer)
        for b in traced:
            process(peer, memoryview(b))
        sys.settrace(None)
        print(f"{name}: {sum(counts.values()) / TRACED:.1f} bytecodes per request")
        for key, n in counts.most_common(args.top):
            print(f"{n / TRACED:9.2f}  {key}")
        return
    rounds = [_batches(PREFILL + k * PER_ROUND, PER_ROUND) for k in range(ROUNDS)]
    times = []
    for batches in rounds:
        t = time.process_time_ns()
        for b in batches:
            process(peer, memoryview(b))
        times.append((time.process_time_ns() - t) / PER_ROUND / 1000)
    print(
        f"{name}: process() {min(times):.2f} us/request best, "
        f"median {sorted(times)[ROUNDS // 2]:.2f} ({' '.join(f'{t:.2f}' for t in times)})"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="the checkout whose server code runs")
    parser.add_argument("--bytecodes", action="store_true", help="count bytecodes instead")
    parser.add_argument("--top", type=int, default=40, help="functions listed (--bytecodes)")
    args = parser.parse_args(argv)
    if args.root:
        sys.path.insert(0, os.path.abspath(args.root))
        for loaded in [m for m in sys.modules if m.split(".")[0] in ("lockserver", "protocol")]:
            del sys.modules[loaded]
    import trio

    trio.run(_serve, args)


if __name__ == "__main__":
    main()
