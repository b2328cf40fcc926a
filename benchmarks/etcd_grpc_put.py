"""etcd's put through its gRPC API against its JSON gateway, from Python (issue 29, step 1).

Issue 29's lone acquire in a group costs ~2.2x etcd's put; inside a replica ~1.0 ms of it is
the put's round trip through etcd's JSON gateway, which in etcd 3.4 is itself a gRPC client
of the server over loopback (one more hop per put, one JSON encode per watcher and event).
This script measures whether speaking gRPC directly cuts that round trip enough to build a
transport for it: sequential puts of a 200-byte value to one key against one etcd member
(fsync on, unpinned), the ways interleaved round by round:

- ``gateway http.client``: ``POST /v3/kv/put`` through the standard library (the issue's);
- ``gateway h11``: :meth:`lockserver.replication._etcd.Etcd.put` over the gateway;
- ``client grpc``: the same over gRPC (the replica's client since issue 29);
- ``grpc h2 sync``: ``/etcdserverpb.KV/Put`` over one HTTP/2 connection on a blocking socket
  (``h2`` frames it, ``protobuf`` encodes; the least a Python gRPC client adds);
- ``grpc h2 trio``: the same on trio, a reader task dispatching frames to waiting calls (the
  shape a replica's transport would have);

and the replica's critical path, a put and its watch event: the time from sending the put
to receiving its event on an open watch, through the gateway (``Etcd.watch`` + ``Etcd.put``:
two connections) and through gRPC (the watch stream and the puts on one HTTP/2 connection).

This is a measuring prototype: no TLS, no auth, no failover, no bounds beyond a timeout.

    python -m benchmarks.etcd_grpc_put --rounds 3 --puts 2000
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import h2.config
import h2.connection
import h2.events
import trio

from lockserver.replication import _etcd_rpc_pb2 as pb

__all__ = ["main"]

VALUE = b"v" * 200
PUT = "/etcdserverpb.KV/Put"
WATCH = "/etcdserverpb.Watch/Watch"


def _figures(samples: list[float]) -> dict[str, Any]:
    samples = sorted(samples)
    n = len(samples)
    return {
        "p50_us": samples[n // 2] * 1e6,
        "p99_us": samples[min(n - 1, int(n * 0.99))] * 1e6,
        "mean_us": statistics.fmean(samples) * 1e6,
        "count": n,
    }


def _frame(message: bytes) -> bytes:
    """gRPC's length-prefixed message: not compressed, 4-byte big-endian length."""
    return b"\0" + struct.pack(">I", len(message)) + message


def _headers(port: int, path: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def _timed(calls: int, one: Callable[[], None]) -> list[float]:
    for _ in range(min(200, calls)):
        one()  # warm: connections, caches
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        one()
        samples.append(time.perf_counter() - start)
    return samples


# --- the gateway ---------------------------------------------------------------------------


def gateway_http_client(port: int, calls: int) -> list[float]:
    body = json.dumps(
        {"key": base64.b64encode(b"/bench/gw").decode(), "value": base64.b64encode(VALUE).decode()}
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def one() -> None:
        connection.request("POST", "/v3/kv/put", body=body)
        answer = connection.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"etcd answered {answer.status}")
        answer.read()

    try:
        return _timed(calls, one)
    finally:
        connection.close()


async def client_put(
    port: int, calls: int, transport: Literal["gateway", "grpc"] = "gateway"
) -> list[float]:
    """:meth:`lockserver.replication._etcd.Etcd.put` over ``transport``."""
    from lockserver.replication._etcd import Etcd

    async with Etcd([f"127.0.0.1:{port}"], transport=transport) as etcd:
        for _ in range(min(200, calls)):
            await etcd.put(b"/bench/h11", VALUE)
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            await etcd.put(b"/bench/h11", VALUE)
            samples.append(time.perf_counter() - start)
        return samples


async def gateway_watch(port: int, calls: int) -> list[float]:
    """A put and its event on an open watch, through the gateway: the put's send to the
    event's arrival."""
    from lockserver.replication._etcd import Etcd

    async with Etcd([f"127.0.0.1:{port}"], transport="gateway") as etcd:
        revision = await etcd.current_revision()
        async with etcd.watch(b"/bench/gww/", start_revision=revision + 1) as events:
            samples = []
            for i in range(calls + min(200, calls)):
                start = time.perf_counter()
                put = await etcd.put(b"/bench/gww/k", VALUE)
                while True:
                    batch = await events.__anext__()
                    if any(e.mod_revision == put for e in batch):
                        break
                if i >= min(200, calls):
                    samples.append(time.perf_counter() - start)
            return samples


# --- gRPC over h2 ---------------------------------------------------------------------------


def _h2_connection() -> h2.connection.H2Connection:
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    conn = h2.connection.H2Connection(config=config)
    conn.initiate_connection()
    # A large connection window: etcd's answers never wait for our WINDOW_UPDATEs.
    conn.increment_flow_control_window(16 * 1024 * 1024)
    return conn


def _put_message() -> bytes:
    return _frame(pb.PutRequest(key=b"/bench/grpc", value=VALUE).SerializeToString())


def grpc_sync(port: int, calls: int) -> list[float]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn = _h2_connection()
    sock.sendall(conn.data_to_send())
    headers = _headers(port, PUT)

    def one() -> None:
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, headers)
        conn.send_data(stream, _put_message(), end_stream=True)
        sock.sendall(conn.data_to_send())
        data = b""
        status = None
        while status is None:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("etcd closed the connection")
            for event in conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, stream)
                elif isinstance(event, h2.events.TrailersReceived):
                    status = dict(event.headers).get(b"grpc-status")
                elif isinstance(event, h2.events.StreamReset):
                    raise RuntimeError(f"stream reset {event.error_code}")
            if out := conn.data_to_send():
                sock.sendall(out)
        if status != b"0":
            raise RuntimeError(f"grpc-status {status!r}")
        answer = pb.PutResponse.FromString(data[5:])
        if answer.header.revision <= 0:
            raise RuntimeError("no revision")

    try:
        return _timed(calls, one)
    finally:
        sock.close()


class TrioGrpc:
    """One HTTP/2 connection on trio: calls send their frames, a reader task hands each
    stream's data and trailers to the call waiting on it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = _h2_connection()
        self.stream: trio.SocketStream | None = None
        self.waiting: dict[int, tuple[trio.Event, list[bytes], list[bytes]]] = {}
        self.watch_send, self.watch_receive = trio.open_memory_channel[bytes](1000)
        self.watch_id = -1
        self.send_lock = trio.Lock()

    async def connect(self, nursery: trio.Nursery) -> None:
        self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        await self.flush()
        nursery.start_soon(self.read)

    async def flush(self) -> None:
        assert self.stream is not None
        if out := self.conn.data_to_send():
            async with self.send_lock:
                await self.stream.send_all(out)

    async def read(self) -> None:
        assert self.stream is not None
        while chunk := await self.stream.receive_some(65536):
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                    if event.stream_id == self.watch_id:
                        self.watch_send.send_nowait(event.data)
                    else:
                        self.waiting[event.stream_id][1].append(event.data)
                elif isinstance(event, h2.events.TrailersReceived):
                    if event.stream_id in self.waiting:
                        done, _, trailers = self.waiting[event.stream_id]
                        trailers.append(dict(event.headers).get(b"grpc-status", b"?"))
                        done.set()
                elif isinstance(event, h2.events.StreamReset):
                    raise RuntimeError(f"stream reset {event.error_code}")
            await self.flush()

    async def put(self, key: bytes) -> int:
        stream = self.conn.get_next_available_stream_id()
        done, data, status = trio.Event(), list[bytes](), list[bytes]()
        self.waiting[stream] = (done, data, status)
        self.conn.send_headers(stream, _headers(self.port, PUT))
        message = _frame(pb.PutRequest(key=key, value=VALUE).SerializeToString())
        self.conn.send_data(stream, message, end_stream=True)
        await self.flush()
        await done.wait()
        del self.waiting[stream]
        if status != [b"0"]:
            raise RuntimeError(f"grpc-status {status!r}")
        revision: int = pb.PutResponse.FromString(b"".join(data)[5:]).header.revision
        return revision

    async def watch(self, prefix: bytes, start_revision: int) -> None:
        self.watch_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(self.watch_id, _headers(self.port, WATCH))
        create = pb.WatchCreateRequest(
            key=prefix,
            range_end=prefix[:-1] + bytes([prefix[-1] + 1]),
            start_revision=start_revision,
        )
        self.conn.send_data(
            self.watch_id, _frame(pb.WatchRequest(create_request=create).SerializeToString())
        )
        await self.flush()
        created = await self.watch_message()
        if not created.created:
            raise RuntimeError("the watch was not created")

    async def watch_message(self) -> pb.WatchResponse:
        buffer = b""
        while len(buffer) < 5 or len(buffer) < 5 + struct.unpack(">I", buffer[1:5])[0]:
            buffer += await self.watch_receive.receive()
        length = struct.unpack(">I", buffer[1:5])[0]
        if len(buffer) != 5 + length:
            raise RuntimeError("prototype: one message per DATA frame expected")
        answer: pb.WatchResponse = pb.WatchResponse.FromString(buffer[5:])
        return answer


async def grpc_trio(port: int, calls: int) -> list[float]:
    async with trio.open_nursery() as nursery:
        client = TrioGrpc(port)
        await client.connect(nursery)
        for _ in range(min(200, calls)):
            await client.put(b"/bench/grpct")
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            await client.put(b"/bench/grpct")
            samples.append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
        return samples


async def grpc_watch(port: int, calls: int) -> list[float]:
    async with trio.open_nursery() as nursery:
        client = TrioGrpc(port)
        await client.connect(nursery)
        revision = await client.put(b"/bench/gw0")
        await client.watch(b"/bench/grw/", revision + 1)
        samples = []
        for i in range(calls + min(200, calls)):
            start = time.perf_counter()
            put = await client.put(b"/bench/grw/k")
            while True:
                answer = await client.watch_message()
                if any(e.kv.mod_revision == put for e in answer.events):
                    break
            if i >= min(200, calls):
                samples.append(time.perf_counter() - start)
        nursery.cancel_scope.cancel()
        return samples


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--puts", type=int, default=2000, help="sequential puts per way and round")
    p.add_argument("--json", type=Path, default=None, help="write every run here")
    args = p.parse_args(argv)
    ways: dict[str, Callable[[int, int], list[float]]] = {
        "gateway http.client": gateway_http_client,
        "gateway h11": lambda port, n: trio.run(client_put, port, n),
        "client grpc": lambda port, n: trio.run(client_put, port, n, "grpc"),
        "grpc h2 sync": grpc_sync,
        "grpc h2 trio": lambda port, n: trio.run(grpc_trio, port, n),
        "put+watch gateway h11": lambda port, n: trio.run(gateway_watch, port, n),
        "put+watch grpc h2 trio": lambda port, n: trio.run(grpc_watch, port, n),
    }
    runs: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="etcd-grpc-put-"))
    with EtcdCluster(work / "etcd") as etcd:
        etcd.start(1)
        port = etcd.members[0].client_port
        for rnd in range(args.rounds):
            for name, way in ways.items():
                r = _figures(way(port, args.puts))
                r.update(round=rnd, way=name)
                runs.append(r)
                print(
                    f"round {rnd} {name:24} p50 {r['p50_us']:7,.0f} us  p99 "
                    f"{r['p99_us']:7,.0f} us  mean {r['mean_us']:7,.0f} us",
                    flush=True,
                )
    print("\nmedians over the rounds: p50 / p99 us, p50 against the gateway's http.client")
    base = statistics.median(r["p50_us"] for r in runs if r["way"] == "gateway http.client")
    for name in ways:
        rs = [r for r in runs if r["way"] == name]
        p50 = statistics.median(r["p50_us"] for r in rs)
        p99 = statistics.median(r["p99_us"] for r in rs)
        print(f"| {name} | {p50:,.0f} / {p99:,.0f} | {p50 / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
