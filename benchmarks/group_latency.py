"""One acquire in a replicated group against one etcd write, in one sitting (issue 29).

Issue 29 measured, from the outside, a lone client's acquire through a group (3 replicas, 1
etcd member on loopback) at p50 1.94 ms against etcd's own put at 0.93 ms and etcd's v3 lock
at 0.86 ms, and asks for an acquire p50 within 1.3x of etcd's put measured in the same
sitting, with no 10 s window's worst above 30 ms. This script makes that measurement:

- **group**: ``cload`` (the C client of benchmarks/cload.c, written from PROTOCOL.md)
  against replica 0 of a fresh group of three ``lockserver --replicate`` replicas: shape
  ``strict`` (one connection, one request in flight: a lone client), ``pipelined`` (one
  connection, 64 in flight) and ``c64`` (64 connections); unique-variable acquires, each
  reply checked. Its per-window worst is cload's (``--window``, 10 s).
- **etcd put**: sequential puts of a 200-byte value to one key, from this process, two ways:
  ``http.client`` as the issue did (a plain Python client: request building and response
  parsing in the interpreter), and ``raw`` (one kept-alive socket, the request bytes made
  once, the answer read up to its Content-Length: the least a client can add).
- **etcd lock**: etcd's own v3 lock service (``/v3/lock/lock`` then ``/v3/lock/unlock``,
  one lease, one lock name), through ``http.client`` as the issue did; each call is one
  transaction (lock and unlock are each one etcd write).

Everything runs against the same etcd member, interleaved round by round (odd rounds in the
reverse order of ``--roots``), and every server runs unpinned (etcd, three replicas and the
load share the machine's CPUs: the issue's layout). ``--roots NAME=PATH,...`` measures the
group of several checkouts in the same sitting (before/after: each round starts a fresh
group per root, through ``LOCKBENCH_SERVER_ROOT``); ``--etcd-tls`` deploys etcd with TLS,
client certificates and auth (the replicas' settings then name its CA, certificate and user;
the etcd side still plain: its figures are etcd's own). How a root's replicas reach etcd:
``--grpc NAME,...`` gives them ``etcd+grpc://``, ``--gateway NAME,...`` ``etcd+gateway://``
(since issue 29 step 2), any other ``HOST:PORT``, the checkout's default (the gateway before
that step, gRPC since); the summary says which each root got.

    python -m benchmarks.group_latency --rounds 3 --duration 10
    python -m benchmarks.group_latency --roots before=/tmp/before,after=. --shapes strict
    python -m benchmarks.group_latency --log-dir /tmp/gl --snapshot-every 3000 --shapes c64

``--log-dir DIR`` keeps etcd's and every replica's log there (``etcd/``, ``r<round>-<root>/``)
and, after each group run, prints what the replicas logged during it (snapshots, warnings)
beside the time of the run's worst request, and each replica's collector pauses in the run
(the ``gc`` statistics, before and after): the material to find a window's worst.
``--snapshot-every N`` passes ``--replica-snapshot-every N`` to the replicas, so a short run
writes snapshots inside its windows. Each group starts on a clean etcd (every key deleted,
the history compacted: ``clean_slate``), as a group that has its etcd to itself would.

The table: per round and system, tx/s, p50, p99 and the worst (per window for cload);
then the medians and the ratio of the group's strict p50 to etcd's put p50 (both ways).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

SHAPES = {"strict": (1, 1), "pipelined": (1, 64), "c64": (64, 1)}
VALUE = b"v" * 200


def _latencies(samples: list[float], elapsed: float, calls: int) -> dict[str, Any]:
    samples.sort()
    n = len(samples)
    return {
        "tx_per_s": calls / elapsed,
        "p50_us": samples[n // 2] * 1e6,
        "p99_us": samples[min(n - 1, int(n * 0.99))] * 1e6,
        "worst_us": samples[-1] * 1e6,
        "count": n,
    }


def etcd_put_http_client(port: int, duration: float) -> dict[str, Any]:
    """Sequential puts through ``http.client`` (one kept-alive connection)."""
    body = json.dumps(
        {"key": base64.b64encode(b"/bench/put").decode(), "value": base64.b64encode(VALUE).decode()}
    )
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    samples: list[float] = []
    try:
        for warm in (True, False):
            samples.clear()
            start = time.perf_counter()
            stop = start + (0.5 if warm else duration)
            while (now := time.perf_counter()) < stop and len(samples) < 1_000_000:
                connection.request("POST", "/v3/kv/put", body=body)
                connection.getresponse().read()
                samples.append(time.perf_counter() - now)
        return _latencies(samples, time.perf_counter() - start, len(samples))
    finally:
        connection.close()


def etcd_put_raw(port: int, duration: float) -> dict[str, Any]:
    """Sequential puts over one kept-alive socket: the request's bytes made once, the answer
    read until its head and Content-Length body are in."""
    body = json.dumps(
        {"key": base64.b64encode(b"/bench/raw").decode(), "value": base64.b64encode(VALUE).decode()}
    ).encode()
    request = (
        b"POST /v3/kv/put HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    samples: list[float] = []
    try:
        for warm in (True, False):
            samples.clear()
            start = time.perf_counter()
            stop = start + (0.5 if warm else duration)
            while (now := time.perf_counter()) < stop and len(samples) < 1_000_000:
                sock.sendall(request)
                data = sock.recv(65536)
                while b"\r\n\r\n" not in data:
                    data += sock.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(rest) < length:
                    rest += sock.recv(65536)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"etcd answered {head[:60]!r}")
                samples.append(time.perf_counter() - now)
        return _latencies(samples, time.perf_counter() - start, len(samples))
    finally:
        sock.close()


def etcd_lock(port: int, duration: float) -> dict[str, Any]:
    """etcd's v3 lock service through ``http.client``: lock then unlock one name under one
    lease, each call timed as one transaction."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        connection.request("POST", path, body=json.dumps(body))
        answer: dict[str, Any] = json.loads(connection.getresponse().read())
        if "error" in answer:
            raise RuntimeError(f"etcd {path}: {answer}")
        return answer

    name = base64.b64encode(b"/bench/lock").decode()
    lease = call("/v3/lease/grant", {"TTL": "60"})["ID"]
    samples: list[float] = []
    try:
        for warm in (True, False):
            samples.clear()
            start = time.perf_counter()
            stop = start + (0.5 if warm else duration)
            while (now := time.perf_counter()) < stop and len(samples) < 1_000_000:
                key = call("/v3/lock/lock", {"name": name, "lease": lease})["key"]
                locked = time.perf_counter()
                call("/v3/lock/unlock", {"key": key})
                samples += [locked - now, time.perf_counter() - locked]
        return _latencies(samples, time.perf_counter() - start, len(samples))
    finally:
        call("/v3/lease/revoke", {"ID": lease})
        connection.close()


def group_run(exe: Path, address: str, pid: int, shape: str, duration: float) -> dict[str, Any]:
    """cload against one replica (already running): its JSON, the figures we table, and
    ``worst_wall``: the wall-clock time of the worst request, estimated from the time cload
    ended (its window closes ``duration`` before that, less the drain of a few ms)."""
    from benchmarks.cload import RunSpec, run
    from lockbench._spawn import ServerProcess

    conns, depth = SHAPES[shape]
    host, port = address.rsplit(":", 1)
    spec = RunSpec(shape="c64", connections=conns, depth=depth, duration=duration, window=10.0)
    started = time.time()
    raw = run(exe, spec, server=ServerProcess(host, int(port), pid, spawned=False))
    ended = time.time()
    if raw.get("errors"):
        raise RuntimeError(f"cload saw errors: {raw.get('error_samples')}")
    return {
        "tx_per_s": raw["tx_per_s"],
        "p50_us": raw["p50_us"],
        "p99_us": raw["p99_us"],
        "worst_us": raw["worst_us"],
        "worst_per_window_us": raw["worst_per_window_us"],
        "worst_at_s": raw["worst_at_s"],
        "wall_start": started,
        "wall_end": ended,
        "worst_wall": ended - duration + raw["worst_at_s"],
        "raw": raw,
    }


def clean_slate(etcd: Any) -> None:
    """Delete every key and compact etcd's whole history (physically: when this returns,
    etcd has done it), so the group that starts next compacts only its own history and
    scans only its own keys: on one etcd, the groups and put loops before it would
    otherwise leave their keys and revisions to the next group's first compaction (which
    then stalled its writes for tens of ms, a figure of the sitting, not of the group)."""
    from lockbench.etcd import wipe

    wipe(etcd)
    revision = etcd.admin("/v3/kv/range", {"key": "AA==", "limit": 1})["header"]["revision"]
    etcd.admin("/v3/kv/compaction", {"revision": revision, "physical": True}, timeout=60.0)


def replica_gc(addresses: list[str]) -> list[dict[str, Any] | None]:
    """Each replica's ``gc`` and snapshot figures (None for one that does not answer)."""
    from client import LockClient, LockClientError

    out: list[dict[str, Any] | None] = []
    for address in addresses:
        try:
            with LockClient(servers=[[address]], timeout=5) as c:
                stats = c.statistics()
        except LockClientError:
            out.append(None)
            continue
        replication = stats.get("replication") or {}
        out.append(
            {
                "gc": stats.get("gc"),
                "snapshots_written": replication.get("snapshots_written"),
                "revision": replication.get("revision"),
            }
        )
    return out


def _log_time(line: str) -> float | None:
    """The wall-clock time of a lockserver log line (``%(asctime)s``: local time, ms)."""
    try:
        stamp = time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")
        return time.mktime(stamp) + int(line[20:23]) / 1000
    except (ValueError, IndexError):
        return None


def timeline(logs: list[Path], r: dict[str, Any]) -> list[str]:
    """What the replicas logged during run ``r`` (skipping per-request noise), each line with
    its offset from the run's worst request, and the gc figures of the run per replica."""
    lines: list[str] = []
    worst = r["worst_wall"]
    for i, path in enumerate(logs):
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            at = _log_time(line)
            if at is not None and r["wall_start"] - 1 <= at <= r["wall_end"] + 1:
                lines.append(f"  {at - worst:+8.3f} s  replica {i}: {line[24:].strip()[:160]}")
    pairs = zip(r.get("gc_before", []), r.get("gc_after", []), strict=True)
    for i, (before, after) in enumerate(pairs):
        if before and after and before["gc"] and after["gc"]:
            b, a = before["gc"], after["gc"]
            counts = [y - x for x, y in zip(b["collections"], a["collections"], strict=True)]
            lines.append(
                f"  replica {i}: gc collections {counts}, longest pause ms (since start) "
                f"{a['pause_max_ms']}, snapshots written {after['snapshots_written']}"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    from benchmarks.cload import build
    from lockbench._bigtable import server_args
    from lockbench._spawn import SERVER_ROOT_VARIABLE
    from lockbench.etcd import EtcdCluster
    from lockbench.replicas import ReplicaGroup

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    p.add_argument("--shapes", default="strict,pipelined,c64")
    p.add_argument("--roots", default="", help="NAME=PATH,... checkouts whose group to measure")
    p.add_argument("--etcd-tls", action="store_true", help="etcd with TLS, certificates, auth")
    p.add_argument(
        "--grpc",
        default="",
        help="NAME,... of --roots whose replicas are given etcd+grpc:// (gRPC: puts and watches "
        "only before issue 29's step 1, every call since)",
    )
    p.add_argument(
        "--gateway",
        default="",
        help="NAME,... of --roots whose replicas are given etcd+gateway:// (etcd's JSON gateway; "
        "checkouts since issue 29's step 2 only). Other roots get HOST:PORT, which means the "
        "gateway before that step and gRPC since",
    )
    p.add_argument("--json", type=Path, default=None, help="write every run here")
    p.add_argument(
        "--log-dir",
        type=Path,
        default=None,
        help="keep etcd's and the replicas' logs here; print each run's timeline",
    )
    p.add_argument(
        "--snapshot-every",
        type=int,
        default=10_000,
        help="the replicas' --replica-snapshot-every (entries between two snapshots)",
    )
    args = p.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    roots = [tuple(r.split("=", 1)) for r in args.roots.split(",") if r] or [("group", "")]
    grpc_roots = {name for name in args.grpc.split(",") if name}
    gateway_roots = {name for name in args.gateway.split(",") if name}
    exe = build().path
    if args.log_dir is not None:
        args.log_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="group-latency-", dir=args.log_dir))
    else:
        work = Path(tempfile.mkdtemp(prefix="group-latency-"))
    runs: list[dict[str, Any]] = []

    def record(rnd: int, system: str, shape: str, r: dict[str, Any]) -> None:
        r.update(round=rnd, system=system, shape=shape)
        runs.append(r)
        windows = r.get("worst_per_window_us")
        worst = (
            " ".join(f"{w / 1000:.1f}" for w in windows)
            if windows
            else f"{r['worst_us'] / 1000:.1f}"
        )
        print(
            f"round {rnd} {system:18} {shape:9} {r['tx_per_s']:9,.0f} tx/s  p50 "
            f"{r['p50_us']:7,.0f} us  p99 {r['p99_us']:8,.0f} us  worst ms {worst}",
            flush=True,
        )

    secure = bool(args.etcd_tls)
    with EtcdCluster(work / "etcd", tls=secure, client_cert_auth=secure, auth=secure) as etcd:
        etcd.start(1)
        if args.etcd_tls:  # the etcd-side figures need a plain member of their own
            plain = EtcdCluster(work / "etcd-plain").start(1)
            port = plain.members[0].client_port
        else:
            plain, port = etcd, etcd.members[0].client_port
        try:
            for rnd in range(args.rounds):
                # Odd rounds reverse the sides' order: the side measured first in a round
                # was measured faster (benchmarks/README.md, issue 29's lone acquire).
                for name, root in roots if rnd % 2 == 0 else roots[::-1]:
                    if root:
                        os.environ[SERVER_ROOT_VARIABLE] = str(Path(root).resolve())
                    else:
                        os.environ.pop(SERVER_ROOT_VARIABLE, None)
                    clean_slate(etcd)
                    if name in grpc_roots or name in gateway_roots:
                        kind = "grpc" if name in grpc_roots else "gateway"
                        scheme = f"etcds+{kind}://" if secure else f"etcd+{kind}://"
                        where = [scheme + ",".join(etcd.endpoints)]
                    else:  # HOST:PORT (the checkout's default) for older checkouts
                        where = etcd.urls if secure else etcd.endpoints
                    with ReplicaGroup(
                        where,
                        work / f"r{rnd}-{name}",
                        n=3,
                        group=f"b{rnd}{name}",
                        snapshot_every=args.snapshot_every,
                        # cload's acquires are never released: one pipelined session
                        # passes the default 100,000 entries in a window (as cload.py's own
                        # servers, the limit raised).
                        extra=(*server_args(), *etcd.replica_flags()),
                    ) as group:
                        group.start()
                        process = group.replicas[0].process
                        assert process is not None
                        for shape in shapes:
                            before = replica_gc(group.addresses) if args.log_dir else []
                            r = group_run(
                                exe, group.addresses[0], process.pid, shape, args.duration
                            )
                            record(rnd, name, shape, r)
                            if args.log_dir:
                                r["gc_before"] = before
                                r["gc_after"] = replica_gc(group.addresses)
                                logs = [replica.log_path for replica in group.replicas]
                                print("\n".join(timeline(logs, r)), flush=True)
                record(
                    rnd, "etcd put http.client", "strict", etcd_put_http_client(port, args.duration)
                )
                record(rnd, "etcd put raw", "strict", etcd_put_raw(port, args.duration))
                record(rnd, "etcd lock", "strict", etcd_lock(port, args.duration))
        finally:
            if plain is not etcd:
                plain.terminate()

    print("\nmedians over the rounds: tx/s, p50 / p99 us, worst ms (of all windows)")
    systems = [name for name, _ in roots] + ["etcd put http.client", "etcd put raw", "etcd lock"]
    medians: dict[tuple[str, str], float] = {}
    for system in systems:
        for shape in shapes:
            rs = [r for r in runs if r["system"] == system and r["shape"] == shape]
            if not rs:
                continue
            p50 = statistics.median(r["p50_us"] for r in rs)
            medians[system, shape] = p50
            worst = max(max(r.get("worst_per_window_us") or [r["worst_us"]]) for r in rs)
            print(
                f"| {system} | {shape} | {statistics.median(r['tx_per_s'] for r in rs):,.0f} | "
                f"{p50:,.0f} / {statistics.median(r['p99_us'] for r in rs):,.0f} | "
                f"{worst / 1000:.1f} |"
            )
    for name, root in roots:
        given = (
            "etcd+grpc://"
            if name in grpc_roots
            else "etcd+gateway://"
            if name in gateway_roots
            else "HOST:PORT (its default)"
        )
        print(f"{name}: {root or '.'}, replicas given {given}")
    for name, _ in roots:
        if (name, "strict") in medians:
            ours = medians[name, "strict"]
            raw = ours / medians["etcd put raw", "strict"]
            client = ours / medians["etcd put http.client", "strict"]
            print(
                f"{name}: strict p50 / etcd put p50 = {raw:.2f} (raw), {client:.2f} (http.client)"
            )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1, default=str))
    if args.log_dir is not None:
        print(f"logs kept in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
