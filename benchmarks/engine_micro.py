"""In-process micro-benchmark of the lock engine and the codec (no sockets, no server).

Measures, each repeated ``--repeat`` times (median and min..max spread are printed so noise is
visible):

- ``acquire``: a mutex acquire ``[Assert(Not(Exists(T, k))), Assert(SetVar(T, k, ticket))]`` on
  distinct keys, pre-built Transaction objects, 1,000 sessions taking turns;
- ``release``: ``AnywayContinueAfter(DeleteVar(T, k, ticket))`` of those locks;
- ``contended``: the same acquire by other sessions while the keys are held (fails at
  ``0:/AssertOp/``, rolls nothing back because nothing changed);
- ``door acquire`` / ``door release``: the same acquire and release through the lock core's
  door (``LockCore.execute``: the wait queue, the session routing, the output list), as the
  server calls it: what the door costs over the bare engine;
- ``door acquire+release, N parked``: the same pairs through the door while ``--parked``
  transactions (each in its own session) wait on another variable: what waiters that the
  traffic does not concern cost every request;
- ``codec request`` / ``codec reply``: encode + decode of an Execute request and of a
  TransactionResult reply through ``protocol.Connection`` (send, receive_data, next_message);
- ``pure-Python floor``: the least any pure-Python server does per blast request (split the
  frames, unpack, read the fields, one dict write or delete, pack a short reply), with none of
  the validation, sessions or results of ours: how far pure Python can go at all;
- ``acquire @ 1M``: the acquire with ``--fill`` entries already held, plus the resident memory
  (VmRSS) and bytes per held entry;
- ``prefill``: memory per held entry shaped like ``lockbench blast --prefill`` (``--prefill``
  distinct vars ``pf:<i>`` in table ``Mutex`` with values ``"t<i>"``, 100 SetVars per
  transaction, 1,000 entries per session), measured in a fresh process (VmRSS growth over the
  fill, so memory freed by earlier rounds cannot hide any of it), plus the time of one full
  ``gc.collect()`` with those entries held (what a gen-2 collection costs the server).

Run from the repository root::

    python -m benchmarks.engine_micro [--count 100000] [--repeat 5] [--fill 1000000]
                                      [--prefill 1000000] [--only-prefill]

The issue's target is >= 200,000 simple acquire transactions/s on one core.
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import statistics
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path

import msgpack

from lockserver.engine import Engine, EngineLimits, LockCore
from protocol import (
    AnywayContinueAfter,
    Assert,
    Connection,
    DeleteVar,
    Execute,
    Exists,
    FrameBuffer,
    Not,
    Reply,
    Role,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TreeLimits,
    encode_execute,
    request_from_wire,
    statements_from_wire,
    unpack,
)

TABLE = "locks"
NAMESPACE = "bench"
SESSIONS = 1_000
NOW = 1_000.0
BIG = EngineLimits(max_sessions=10_000_000, max_entries=100_000_000, max_entries_per_session=10**8)


def acquire_tx(key: str, ticket: int) -> Transaction:
    """The 3-op mutex acquire: not held by anyone else, then take it exclusively."""
    return Transaction(
        NAMESPACE, [Assert(Not(Exists(TABLE, key))), Assert(SetVar(TABLE, key, ticket))]
    )


def release_tx(key: str, ticket: int) -> Transaction:
    """The release: delete the caller's entry if it still carries the ticket."""
    return Transaction(NAMESPACE, [AnywayContinueAfter(DeleteVar(TABLE, key, ticket))])


def sessions(prefix: str, count: int = SESSIONS) -> list[SessionSpec]:
    """``count`` session specs with a long max age (nothing expires during a run)."""
    return [SessionSpec(f"{prefix}{i}", max_age=1e9) for i in range(count)]


def rss_bytes() -> int:
    """This process's resident set size, from /proc/self/status (0 when unavailable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    return 0


class Table:
    """Rows of (name, median, min, max, unit) printed as an aligned table."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []

    def rate(self, name: str, samples: Sequence[float]) -> None:
        """Add a row of per-second rates."""
        med = statistics.median(samples)
        spread = (max(samples) - min(samples)) / med * 100 if med else 0.0
        self.rows.append(
            (
                name,
                f"{med:,.0f}",
                f"{min(samples):,.0f}",
                f"{max(samples):,.0f}",
                f"ops/s  (spread {spread:.1f}%)",
            )
        )
        rounds = ", ".join(f"{x:,.0f}" for x in samples)
        print(f"  {name}: median {med:,.0f} ops/s (rounds: {rounds})", flush=True)

    def value(self, name: str, value: float, unit: str) -> None:
        """Add a row with a single figure."""
        self.rows.append((name, f"{value:,.0f}", "", "", unit))

    def print(self) -> None:
        """Print the table."""
        header = ("measurement", "median", "min", "max", "")
        widths = [max(len(r[i]) for r in [header, *self.rows]) for i in range(5)]
        line = "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
        print()
        print(line)
        print("-" * len(line))
        for row in self.rows:
            print(
                "  ".join(
                    c.ljust(w) if i in (0, 4) else c.rjust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )


def timed(run: Callable[[], int]) -> float:
    """Operations per second of one call of ``run`` (which returns its operation count)."""
    start = time.perf_counter()
    ops = run()
    return ops / (time.perf_counter() - start)


def batch_rate(
    engine: Engine, batch: list[tuple[SessionSpec, Transaction]], expect: Status | None
) -> float:
    """Transactions per second of executing ``batch`` (checking the last outcome). The
    collector stays on while timing (a server runs with it), but starts from a clean slate so
    the freshly built batch is not what it spends the round traversing."""
    gc.collect()
    execute = engine.execute
    start = time.perf_counter()
    for spec, tx in batch:
        result = execute(spec, tx, now=NOW)
    rate = len(batch) / (time.perf_counter() - start)
    assert expect is None or result.status is expect, result
    return rate


def engine_rounds(count: int, repeat: int) -> tuple[list[float], list[float], list[float]]:
    """Acquire, contended acquire and release rates, one fresh engine per repetition."""
    owners = sessions("owner-")
    rivals = sessions("rival-")
    acquires, contended, releases = [], [], []
    for r in range(repeat):
        keys = [f"r{r}-key-{i}" for i in range(count)]
        acq = [(owners[i % SESSIONS], acquire_tx(k, i)) for i, k in enumerate(keys)]
        rival = [(rivals[i % SESSIONS], acquire_tx(k, -i)) for i, k in enumerate(keys)]
        rel = [(owners[i % SESSIONS], release_tx(k, i)) for i, k in enumerate(keys)]
        engine = Engine(started_at=0.0, limits=BIG)
        acquires.append(batch_rate(engine, acq, Status.TRANSACTION_OK))
        assert engine.entry_count == count
        contended.append(batch_rate(engine, rival, Status.TRANSACTION_ERROR))
        assert engine.entry_count == count
        releases.append(batch_rate(engine, rel, Status.TRANSACTION_OK))
        assert engine.entry_count == 0
        del engine, acq, rival, rel
        gc.collect()
    return acquires, contended, releases


def door_rounds(count: int, repeat: int) -> tuple[list[float], list[float]]:
    """Acquire and release rates through ``LockCore.execute``, one fresh core per round."""
    owners = sessions("owner-")
    acquires: list[float] = []
    releases: list[float] = []
    owner = object()  # one connection, as a pipelining client
    for r in range(repeat):
        keys = [f"r{r}-key-{i}" for i in range(count)]
        acq = [(owners[i % SESSIONS], acquire_tx(k, i)) for i, k in enumerate(keys)]
        rel = [(owners[i % SESSIONS], release_tx(k, i)) for i, k in enumerate(keys)]
        core: LockCore[Hashable] = LockCore(started_at=0.0, limits=BIG)
        for batch, rates in ((acq, acquires), (rel, releases)):
            gc.collect()
            execute = core.execute
            start = time.perf_counter()
            for rid, (spec, tx) in enumerate(batch):
                outs = execute(owner, rid, spec, tx, wait=None, now=NOW, trust=1.0, principal="")
            rates.append(len(batch) / (time.perf_counter() - start))
            assert outs[-1][1].status is Status.TRANSACTION_OK, outs  # type: ignore[union-attr]
        assert core.engine.entry_count == 0
        del core, acq, rel
        gc.collect()
    return acquires, releases


def parked_rounds(count: int, repeat: int, parked: int) -> list[float]:
    """Acquire+release pairs per second through the door while ``parked`` transactions wait
    on a held variable the pairs never touch; one fresh core per round."""
    owner = object()
    spec = SessionSpec("traffic", 600.0)
    held = acquire_tx("held", 0)
    rates = []
    for r in range(repeat):
        core: LockCore[Hashable] = LockCore(started_at=0.0, limits=BIG)
        holder = SessionSpec("holder", 600.0)
        core.execute(owner, 0, holder, held, wait=None, now=NOW, trust=1.0, principal="")
        for i in range(parked):
            waiter = SessionSpec(f"waiter-{i}", 600.0)
            tx = acquire_tx("held", i + 1)
            core.execute(owner, i + 1, waiter, tx, wait=500.0, now=NOW, trust=1.0, principal="")
        assert len(core.waits) == parked
        pairs = [(acquire_tx(f"r{r}-k{i}", i), release_tx(f"r{r}-k{i}", i)) for i in range(count)]
        gc.collect()
        execute = core.execute
        rid = parked + 1
        start = time.perf_counter()
        for acq, rel in pairs:
            execute(owner, rid, spec, acq, wait=None, now=NOW, trust=1.0, principal="")
            execute(owner, rid + 1, spec, rel, wait=None, now=NOW, trust=1.0, principal="")
            rid += 2
        rates.append(count / (time.perf_counter() - start))
        assert core.engine.entry_count == 1 and len(core.waits) == parked
        del core, pairs
        gc.collect()
    return rates


def codec_rounds(count: int, repeat: int) -> tuple[list[float], list[float]]:
    """Encode + decode rates of an Execute request and of a TransactionResult reply."""
    client = Connection(Role.CLIENT)
    server = Connection(Role.SERVER)
    spec = SessionSpec("client-1", max_age=30.0, description="bench")
    request = Execute(7, spec, acquire_tx("orders/42", 12345), wait=None)
    engine = Engine(started_at=0.0, host="bench-host")
    result = engine.execute(spec, request.transaction, now=NOW, trust=0.9)
    reply = Reply(7, result)
    requests, replies = [], []
    for _ in range(repeat):

        def request_round() -> int:
            for _ in range(count):
                server.receive_data(client.send(request))
                server.next_message()
            return count

        def reply_round() -> int:
            for _ in range(count):
                client.receive_data(server.send(reply))
                client.next_message()
            return count

        requests.append(timed(request_round))
        replies.append(timed(reply_round))
    assert server.next_message() is None and client.next_message() is None
    return requests, replies


def decode_rounds(count: int, repeat: int) -> dict[str, list[float]]:
    """The server's decode of pipelined executes (the blast shape: one Assert(SetVar) per
    transaction, 64 frames per receive), whole and by stage, in frames per second: what the
    "Server profile" of benchmarks/README.md calls reading and decoding."""
    frames = b"".join(
        encode_execute(
            i, SessionSpec(f"s{i % 8}", 60.0), NAMESPACE, [Assert(SetVar(TABLE, f"k{i}", f"t{i}"))]
        )
        for i in range(64)
    )
    buffer = FrameBuffer()
    buffer.feed(frames)
    payloads = list(iter(buffer.next_frame, None))
    wires = [unpack(p) for p in payloads]
    trees = [w["statements"] for w in wires]
    limits = TreeLimits()
    batches = max(1, count // 64)

    def whole() -> int:
        conn = Connection(Role.SERVER)
        for _ in range(batches):
            conn.receive_data(frames)
            while conn.next_message() is not None:
                pass
        return batches * 64

    def framing() -> int:
        for _ in range(batches):
            fb = FrameBuffer()
            fb.feed(frames)
            while fb.next_frame() is not None:
                pass
        return batches * 64

    def stage(work: Callable[[], object]) -> Callable[[], int]:
        def run() -> int:
            for _ in range(batches):
                work()
            return batches * 64

        return run

    rounds: dict[str, list[float]] = {}
    runs = {
        "decode 64 pipelined executes (whole)": whole,
        "  framing (length prefixes, copies)": framing,
        "  msgpack unpack": stage(lambda: [unpack(p) for p in payloads]),
        "  request_from_wire (validated objects)": stage(
            lambda: [request_from_wire(w, limits) for w in wires]
        ),
        "    of which the tree": stage(lambda: [statements_from_wire(t, limits) for t in trees]),
    }
    for name, run in runs.items():
        rounds[name] = [timed(run) for _ in range(repeat)]
    return rounds


def floor_rounds(count: int, repeat: int) -> list[float]:
    """Transactions per second of the *least* any pure-Python server must do per blast
    request (acquire / release alternating, 64 frames per receive): split the frames, unpack
    each, read its fields, one dict write or delete, pack and frame a short reply. No
    validation, no sessions, no results object, no sockets. The gap between this and the
    server's CPU per transaction is what validation and lock semantics cost; the floor itself
    says how far a pure-Python path can go (benchmarks/README.md, "Server profile")."""
    frames = b"".join(
        encode_execute(
            i,
            SessionSpec(f"s{i // 2 % 8}", 60.0),
            NAMESPACE,
            [Assert(SetVar(TABLE, f"k{i // 2}", f"t{i // 2}"))]
            if i % 2 == 0
            else [AnywayContinueAfter(DeleteVar(TABLE, f"k{i // 2}", f"t{i // 2}"))],
        )
        for i in range(64)
    )
    unpackb, packb = msgpack.unpackb, msgpack.packb
    store: dict[tuple[str, str, str], tuple[str, object]] = {}
    batches = max(1, count // 64)

    def serve(data: bytes) -> bytes:
        out = []
        pos, end = 0, len(data)
        while pos < end:
            size = int.from_bytes(data[pos : pos + 4], "big")
            m = unpackb(data[pos + 4 : pos + 4 + size])
            pos += 4 + size
            sid, ns, node = m["session"], m["namespace"], m["statements"][0]
            op = node[1]
            key = (ns, op[1], op[2])
            if node[0] == "Assert":
                ok = key not in store
                if ok:
                    store[key] = (sid, op[3])
            else:
                ok = True
                held = store.get(key)
                if held is not None and held[0] == sid:
                    del store[key]
            reply = packb({"type": "result", "id": m["id"], "status": 0 if ok else 1, "fence": 1})
            out.append(len(reply).to_bytes(4, "big") + reply)
        return b"".join(out)

    def run() -> int:
        for _ in range(batches):
            serve(frames)
        assert not store
        return batches * 64

    return [timed(run) for _ in range(repeat)]


def fill_keys(fill: int) -> Iterator[tuple[SessionSpec, Transaction]]:
    """Acquire transactions for ``fill`` distinct keys, built one at a time."""
    owners = sessions("holder-")
    for i in range(fill):
        yield owners[i % SESSIONS], acquire_tx(f"held-{i}", i)


def filled_rounds(fill: int, count: int, repeat: int) -> tuple[list[float], int, int]:
    """Acquire rates with ``fill`` entries already held, and the memory the fill took."""
    gc.collect()
    rss_before = rss_bytes()
    engine = Engine(started_at=0.0, limits=BIG)
    for spec, tx in fill_keys(fill):
        engine.execute(spec, tx, now=NOW)
    assert engine.entry_count == fill
    gc.collect()
    rss_after = rss_bytes()
    owners = sessions("owner-")
    rates = []
    for r in range(repeat):
        keys = [f"r{r}-key-{i}" for i in range(count)]
        acq = [(owners[i % SESSIONS], acquire_tx(k, i)) for i, k in enumerate(keys)]
        rel = [(owners[i % SESSIONS], release_tx(k, i)) for i, k in enumerate(keys)]
        rates.append(batch_rate(engine, acq, Status.TRANSACTION_OK))
        assert engine.entry_count == fill + count
        batch_rate(engine, rel, Status.TRANSACTION_OK)
    return rates, rss_after, rss_after - rss_before


PREFILL_PER_TX = 100
PREFILL_PER_SESSION = 1_000


def prefill_memory(n: int) -> tuple[int, float]:
    """RSS growth (bytes) of filling an engine with ``n`` entries shaped like the blast
    prefill, and the seconds of one full collection with them held. Run in a fresh process."""
    gc.collect()
    rss_before = rss_bytes()
    engine = Engine(started_at=0.0, limits=BIG)
    now = NOW
    for start in range(0, n, PREFILL_PER_TX):
        stop = min(n, start + PREFILL_PER_TX)
        spec = SessionSpec(f"prefill-{start // PREFILL_PER_SESSION}", max_age=3600.0)
        statements = [Assert(SetVar("Mutex", f"pf:{i}", f"t{i}")) for i in range(start, stop)]
        now += 1e-6
        result = engine.execute(spec, Transaction("lockbench", statements), now=now)
        assert result.status is Status.TRANSACTION_OK, result
    assert engine.entry_count == n
    gc.collect()
    used = rss_bytes() - rss_before
    start_gc = time.perf_counter()
    gc.collect()
    return used, time.perf_counter() - start_gc


def prefill_in_child(n: int) -> tuple[int, float]:
    """:func:`prefill_memory` in a fresh interpreter (multiprocessing "spawn")."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(prefill_memory, (n,))


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run every measurement, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="transactions per round")
    parser.add_argument("--codec-count", type=int, default=50_000, help="messages per round")
    parser.add_argument("--repeat", type=int, default=5, help="rounds per measurement")
    parser.add_argument("--fill", type=int, default=1_000_000, help="entries held (0: skip)")
    parser.add_argument(
        "--prefill", type=int, default=1_000_000, help="blast-prefill entries (0: skip)"
    )
    parser.add_argument(
        "--only-prefill", action="store_true", help="measure only the prefill memory"
    )
    parser.add_argument(
        "--parked", type=int, default=1_000, help="waiters parked beside the traffic (0: skip)"
    )
    args = parser.parse_args(argv)

    table = Table()
    if args.prefill:
        print(f"prefill (blast shape): {args.prefill:,} entries in a fresh process ...", flush=True)
        used, gc_seconds = prefill_in_child(args.prefill)
        table.value("prefill bytes per held entry", used / args.prefill, "B (RSS growth / entries)")
        table.value(f"full gc.collect() with {args.prefill:,} held", gc_seconds * 1e3, "ms")
        if args.only_prefill:
            table.print()
            return
    print(f"engine: {args.count:,} transactions x {args.repeat} rounds", flush=True)
    acquires, contended, releases = engine_rounds(args.count, args.repeat)
    table.rate("acquire (3 ops)", acquires)
    table.rate("release", releases)
    table.rate("contended acquire (fails)", contended)
    door_acquires, door_releases = door_rounds(args.count, args.repeat)
    table.rate("door acquire (LockCore.execute)", door_acquires)
    table.rate("door release (LockCore.execute)", door_releases)
    if args.parked:
        table.rate(
            f"door acquire+release pairs, {args.parked:,} parked",
            parked_rounds(args.count // 4, args.repeat, args.parked),
        )
    print(f"codec: {args.codec_count:,} messages x {args.repeat} rounds", flush=True)
    requests, replies = codec_rounds(args.codec_count, args.repeat)
    table.rate("codec execute request enc+dec", requests)
    table.rate("codec result reply enc+dec", replies)
    for name, rates in decode_rounds(args.codec_count, args.repeat).items():
        table.rate(name, rates)
    table.rate(
        "pure-Python floor: blast request, no checks", floor_rounds(args.codec_count, args.repeat)
    )
    if args.fill:
        print(f"filling {args.fill:,} entries ...", flush=True)
        rates, rss, used = filled_rounds(args.fill, args.count, args.repeat)
        table.rate(f"acquire with {args.fill:,} held", rates)
        table.value("RSS after fill", rss / 2**20, "MiB")
        table.value("bytes per held entry", used / args.fill, "B (RSS growth / entries)")
    table.print()


if __name__ == "__main__":
    main()
