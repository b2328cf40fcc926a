"""What the replica's gRPC transport costs per put (issue 29): h2's share, and PING ACKs.

Two measurements, one script:

- ``h2``: the CPU h2 spends on one put, in this process, with no socket: building and
  serializing a put's HEADERS and DATA as the transport configures h2; parsing an answer
  (HEADERS, DATA, trailers) with h2's inbound header checks on (the transport's setting) and
  off; parsing etcd's WINDOW_UPDATE and PING and queueing the ACK. Each the mean of
  ``--calls`` calls, against h2's own server side.
- ``pings``: sequential puts of 300 bytes to one etcd member through
  :class:`lockserver.replication._etcd.Etcd` over gRPC, the transport as it is (etcd's PING
  acknowledged with the next request) against the same transport acknowledging each PING at
  once (a subclass whose flushes never hold), interleaved round by round, each both with
  the caller sleeping while it waits and with a task polling the loop as the replica's
  commit poll does. p50 of each run and the CPU per put (``time.process_time``).

    python -m benchmarks.grpc_costs --rounds 4 --puts 1500
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import trio

__all__ = ["main"]

VALUE = b"x" * 300
HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/etcdserverpb.KV/Put"),
    (":authority", "127.0.0.1:2379"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def _client(validate_inbound: bool) -> h2.connection.H2Connection:
    """A client configured as the transport configures it, inbound header checks aside."""
    from lockserver.replication._etcd_grpc import h2_config

    config = h2_config()
    config.validate_inbound_headers = config.normalize_inbound_headers = validate_inbound
    return h2.connection.H2Connection(config=config)


def h2_costs(calls: int, validate_inbound: bool) -> dict[str, float]:
    """Mean µs per put of each of h2's parts (module header)."""
    from lockserver.replication import _etcd_rpc_pb2 as pb
    from lockserver.replication._etcd_json import put_body
    from lockserver.replication._etcd_messages import request_message

    client = _client(validate_inbound)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())
    message = request_message("/v3/kv/put", put_body(b"/lockserver/g/log", VALUE, 0))
    body = struct.pack(">BI", 0, len(message)) + message
    header = pb.ResponseHeader(cluster_id=1 << 60, member_id=1 << 61, revision=123456, raft_term=5)
    answer = pb.PutResponse(header=header).SerializeToString()
    answer_body = struct.pack(">BI", 0, len(answer)) + answer
    # etcd's WINDOW_UPDATE (connection, 300) and PING, as it sends them on a request's DATA.
    ping = (
        b"\x00\x00\x04\x08\x00\x00\x00\x00\x00"
        + struct.pack(">I", 300)
        + b"\x00\x00\x08\x06\x00\x00\x00\x00\x00"
        + b"\x02\x04\x10\x10\x09\x0e\x07\x07"
    )
    build = parse = pinged = 0.0
    clock = time.perf_counter
    for _ in range(calls):
        start = clock()
        stream = client.get_next_available_stream_id()
        client.send_headers(stream, HEADERS)
        client.send_data(stream, body, end_stream=True)
        out = client.data_to_send()
        build += clock() - start
        for event in server.receive_data(out):
            if isinstance(event, h2.events.DataReceived):
                server.acknowledge_received_data(event.flow_controlled_length, stream)
        server.send_headers(stream, [(":status", "200"), ("content-type", "application/grpc")])
        server.send_data(stream, answer_body)
        server.send_headers(stream, [("grpc-status", "0"), ("grpc-message", "")], end_stream=True)
        reply = server.data_to_send()
        start = clock()
        events = client.receive_data(reply)
        parse += clock() - start
        start = clock()
        client.receive_data(ping)
        client.data_to_send()
        pinged += clock() - start
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                client.acknowledge_received_data(event.flow_controlled_length, stream)
        server.receive_data(client.data_to_send())
    return {
        "build_us": build / calls * 1e6,
        "parse_us": parse / calls * 1e6,
        "ping_us": pinged / calls * 1e6,
    }


async def puts(port: int, calls: int, hold: bool, poll: bool) -> tuple[float, float]:
    """p50 µs and CPU µs per put of ``calls`` puts (after 100 unmeasured)."""
    from lockserver.replication import _etcd_grpc
    from lockserver.replication._etcd import Etcd
    from lockserver.replication._etcd_http import Endpoint

    class AtOnce(_etcd_grpc.GrpcConnection):
        """The transport acknowledging every PING at once (the rule before issue 29's
        seventh session)."""

        __slots__ = ()

        async def _flush(self, *, hold_acks: bool = False) -> None:
            await super()._flush()

    class AtOncePool(_etcd_grpc.GrpcPool):
        async def _connect(self, endpoint: Endpoint) -> _etcd_grpc.GrpcConnection:
            return await AtOnce.open(endpoint, self.tls)

    async def spin() -> None:
        while True:
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery, Etcd([f"127.0.0.1:{port}"]) as etcd:
        if not hold:
            etcd._grpc = AtOncePool(None)  # the variant measured
        if poll:
            nursery.start_soon(spin)
        for _ in range(100):
            await etcd.put(b"/bench/pings", VALUE)
        samples = []
        cpu = time.process_time()
        for _ in range(calls):
            start = time.perf_counter()
            await etcd.put(b"/bench/pings", VALUE)
            samples.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu
        nursery.cancel_scope.cancel()
    return statistics.median(samples) * 1e6, cpu / calls * 1e6


def _run_puts(port: int, *, calls: int, hold: bool, poll: bool) -> tuple[float, float]:
    return trio.run(puts, port, calls, hold, poll)


def main(argv: list[str] | None = None) -> int:
    from lockbench.etcd import EtcdCluster

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--puts", type=int, default=1500, help="puts per run")
    p.add_argument("--calls", type=int, default=3000, help="calls per h2 measurement")
    args = p.parse_args(argv)
    for validate in (True, False):
        costs = h2_costs(args.calls, validate)
        print(
            f"h2, inbound header checks {'on ' if validate else 'off'}: build and serialize a "
            f"put {costs['build_us']:.0f} us, parse its answer {costs['parse_us']:.0f} us, "
            f"etcd's WINDOW_UPDATE and PING {costs['ping_us']:.0f} us",
            flush=True,
        )
    ways: dict[str, Callable[[int], tuple[float, float]]] = {}
    for hold in (False, True):
        for poll in (False, True):
            name = f"{'next request' if hold else 'at once':12} {'polls' if poll else 'sleeps'}"
            ways[name] = partial(_run_puts, calls=args.puts, hold=hold, poll=poll)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    work = Path(tempfile.mkdtemp(prefix="grpc-costs-"))
    with EtcdCluster(work / "etcd") as etcd:
        etcd.start(1)
        port = etcd.members[0].client_port
        for rnd in range(args.rounds):
            for name, way in ways.items():
                p50, cpu = way(port)
                results[name].append((p50, cpu))
                print(f"round {rnd} ACK {name}: p50 {p50:,.0f} us, CPU {cpu:,.0f} us per put")
    print("\nmedians over the rounds: | PING ACK | caller | p50 us | CPU us per put |")
    for name, runs in results.items():
        when, caller = name[:12].strip(), name[12:].strip()
        p50 = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"| {when} | {caller} | {p50:,.0f} | {cpu:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
