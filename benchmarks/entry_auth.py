"""What authenticating a log entry costs (issue 29), in process: sealing it (the proposer, once
per entry) and opening it (every replica, before it decodes anything), beside what applying
the same entry costs, for entries of lockbench's shape (one connection's pipelined acquires:
1, 64 and 1,024 ops, deflated as the replicas write them).

Every figure is the median of ``--repeat`` timed loops of ``--loops`` calls each, in µs per
entry. Applying runs on a fresh group state per call (every op is a grant), its making
subtracted; ``+open %`` is what opening adds to applying.

    python -m benchmarks.entry_auth
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

__all__ = ["main"]


def _ops(n: int) -> list[list[Any]]:
    from lockserver.replication._group import wire
    from protocol import Assert, Execute, SessionSpec, SetVar, Transaction

    session = SessionSpec("blast-0123456789-3")
    return [
        [
            "x",
            3,
            "",
            wire(
                Execute(
                    i + 1,
                    session,
                    Transaction("lockbench", (Assert(SetVar("Mutex", f"b3:{i}", f"t3.{i}")),)),
                    None,
                )
            ),
        ]
        for i in range(n)
    ]


def _median_us(call: Callable[[], object], loops: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(loops):
            call()
        times.append((time.perf_counter() - started) / loops * 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from lockserver.replication._group import Genesis, GroupState, encode_entry
    from lockserver.replication._groupauth import GroupKeys
    from protocol import pack

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loops", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    limits = {
        "max_sessions": 1_000_000,
        "max_entries": 10_000_000,
        "max_entries_per_session": 100_000,
        "max_store_bytes": 4 << 30,
    }
    waits = {
        "max_waiters": 100_000,
        "max_waiters_per_session": 1000,
        "max_waiters_per_owner": 10_000,
        "max_waiting_ops_per_variable": 200_000,
        "max_waiting_ops_per_session": 100_000,
        "max_waiting_ops_per_principal": 10_000_000,
    }
    genesis = Genesis(1_700_000_000.0, "0123456789abcdef", False, limits, waits)
    sealer = GroupKeys([b"k" * 64]).sealer(b"entry", pack(["bench", genesis.instance]))
    print(f"{'ops':>5} {'entry B':>8} {'seal us':>8} {'open us':>8} {'apply us':>9} {'+open %':>8}")
    for n in (1, 64, 1024):
        body = encode_entry("r1", 1, genesis.started_at + 0.5, 1.0, _ops(n), registration=2)
        sealed = sealer.seal(body)
        loops = max(20, args.loops // n)
        seal = _median_us(partial(sealer.seal, body), args.loops, args.repeat)
        opened = _median_us(partial(sealer.open, sealed), args.loops, args.repeat)

        def fresh() -> GroupState:
            state = GroupState(genesis)
            state.apply_registered("r1", "r1:7400", 2)
            return state

        def apply(data: bytes = body) -> None:
            fresh().apply_entry(data, 3)

        # applying, less making the fresh state each loop needs
        plain = _median_us(apply, loops, args.repeat) - _median_us(fresh, loops, args.repeat)
        print(
            f"{n:>5} {len(sealed):>8,} {seal:>8.2f} {opened:>8.2f} {plain:>9.1f} "
            f"{opened / plain * 100:>7.2f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
