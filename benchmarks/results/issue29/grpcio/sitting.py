"""The sitting that weighed grpcio (gRPC's C core) for the replica's etcd puts (issue 29).

Sequential puts of a 200-byte value to one etcd member (fsync on, unpinned, the ways
interleaved round by round): etcd's gateway through ``http.client`` (the baseline), our
client over gRPC (h2 in Python, the replica's), grpcio's blocking call on the main thread,
and the hand-offs a trio replica would need to use it: ``trio.to_thread.run_sync``, a
future's callback through ``TrioToken.run_sync_soon``, a dedicated put thread answering
through ``run_sync_soon``, and (without trio) a worker thread behind a queue. Then the bare
hand-off round trips. grpcio is not a dependency: install it first (``pip install grpcio``).

    python benchmarks/results/issue29/grpcio/sitting.py --rounds 3 --puts 1500
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-not-found,import-untyped,unused-ignore]
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

from benchmarks.etcd_grpc_put import VALUE, _timed, client_put, gateway_http_client
from lockserver.replication import _etcd_rpc_pb2 as pb

PUT = "/etcdserverpb.KV/Put"
MSG = pb.PutRequest(key=b"/bench/grpcio", value=VALUE).SerializeToString()
WARM = 200

Put = Callable[..., bytes]


def _channel(port: int) -> tuple[Any, Put]:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return channel, channel.unary_unary(PUT, request_serializer=None, response_deserializer=None)


def _checked(answer: bytes) -> None:
    if pb.PutResponse.FromString(answer).header.revision <= 0:
        raise RuntimeError("no revision")


async def _atimed(calls: int, one: Callable[[], Any]) -> list[float]:
    for _ in range(WARM):
        await one()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        await one()
        samples.append(time.perf_counter() - start)
    return samples


def grpcio_sync(port: int, calls: int) -> list[float]:
    channel, put = _channel(port)
    try:
        return _timed(calls, lambda: _checked(put(MSG, timeout=10)))
    finally:
        channel.close()


def grpcio_worker_thread(port: int, calls: int) -> list[float]:
    """No trio: the caller hands each put to a worker thread and waits on a queue."""
    channel, put = _channel(port)
    asks: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
    answers: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def worker() -> None:
        while (message := asks.get()) is not None:
            answers.put(put(message, timeout=10))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    def one() -> None:
        asks.put(MSG)
        _checked(answers.get())

    try:
        return _timed(calls, one)
    finally:
        asks.put(None)
        thread.join()
        channel.close()


async def _to_thread(port: int, calls: int) -> list[float]:
    channel, put = _channel(port)

    async def one() -> None:
        _checked(await trio.to_thread.run_sync(lambda: put(MSG, timeout=10)))

    try:
        return await _atimed(calls, one)
    finally:
        channel.close()


async def _future(port: int, calls: int) -> list[float]:
    channel, put = _channel(port)
    token = trio.lowlevel.current_trio_token()

    async def one() -> None:
        done = trio.Event()
        future = put.future(MSG, timeout=10)  # type: ignore[attr-defined]
        future.add_done_callback(lambda _: token.run_sync_soon(done.set))
        await done.wait()
        _checked(future.result())

    try:
        return await _atimed(calls, one)
    finally:
        channel.close()


async def _put_thread(port: int, calls: int) -> list[float]:
    channel, put = _channel(port)
    token = trio.lowlevel.current_trio_token()
    asks: queue.SimpleQueue[tuple[trio.Event, list[bytes]] | None] = queue.SimpleQueue()

    def worker() -> None:
        while (ask := asks.get()) is not None:
            done, box = ask
            box.append(put(MSG, timeout=10))
            token.run_sync_soon(done.set)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    async def one() -> None:
        done, box = trio.Event(), list[bytes]()
        asks.put((done, box))
        await done.wait()
        _checked(box[0])

    try:
        return await _atimed(calls, one)
    finally:
        asks.put(None)
        thread.join()
        channel.close()


async def _handoffs(calls: int) -> dict[str, list[float]]:
    """Round trips of nothing: trio to a cached worker thread and back, and to a dedicated
    thread (a queue) answering through ``run_sync_soon``."""
    token = trio.lowlevel.current_trio_token()
    asks: queue.SimpleQueue[trio.Event | None] = queue.SimpleQueue()

    def worker() -> None:
        while (done := asks.get()) is not None:
            token.run_sync_soon(done.set)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()

    async def dedicated() -> None:
        done = trio.Event()
        asks.put(done)
        await done.wait()

    try:
        return {
            "hand-off to_thread": await _atimed(calls, lambda: trio.to_thread.run_sync(int)),
            "hand-off dedicated thread": await _atimed(calls, dedicated),
        }
    finally:
        asks.put(None)


def _p(samples: list[float], q: float) -> float:
    samples = sorted(samples)
    return samples[min(len(samples) - 1, int(len(samples) * q))] * 1e6


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--puts", type=int, default=1500)
    args = p.parse_args(argv)
    ways: dict[str, Callable[[int, int], list[float]]] = {
        "gateway http.client": gateway_http_client,
        "client grpc (ours, h2)": lambda port, n: trio.run(client_put, port, n, "grpc"),
        "grpcio sync": grpcio_sync,
        "grpcio worker thread, no trio": grpcio_worker_thread,
        "grpcio trio to_thread": lambda port, n: trio.run(_to_thread, port, n),
        "grpcio trio future callback": lambda port, n: trio.run(_future, port, n),
        "grpcio trio put thread": lambda port, n: trio.run(_put_thread, port, n),
    }
    runs: list[tuple[str, float, float, float]] = []
    with EtcdCluster(Path(tempfile.mkdtemp(prefix="grpcio-sitting-")) / "etcd") as etcd:
        etcd.start(1)
        port = etcd.members[0].client_port
        for rnd in range(args.rounds):
            for name, way in ways.items():
                cpu = time.process_time()
                samples = way(port, args.puts)
                cpu = (time.process_time() - cpu) / (args.puts + WARM) * 1e6
                runs.append((name, _p(samples, 0.5), _p(samples, 0.99), cpu))
                print(
                    f"round {rnd} {name:30} p50 {runs[-1][1]:6,.0f} us  p99 "
                    f"{runs[-1][2]:6,.0f} us  CPU per put {cpu:4,.0f} us",
                    flush=True,
                )
    print("\nmedians over the rounds: p50, against http.client, CPU per put (this process)")
    base = statistics.median(r[1] for r in runs if r[0] == "gateway http.client")
    for name in ways:
        p50 = statistics.median(r[1] for r in runs if r[0] == name)
        cpu = statistics.median(r[3] for r in runs if r[0] == name)
        print(f"| {name} | {p50:,.0f} us | {p50 / base:.2f}x | {cpu:,.0f} us |")
    for name, samples in trio.run(_handoffs, 3000).items():
        print(f"{name}: p50 {_p(samples, 0.5):,.0f} us, p99 {_p(samples, 0.99):,.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
