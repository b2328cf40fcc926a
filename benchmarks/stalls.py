"""The longest single engine call under churn with a big store (no sockets, no server).

Why: throughput hides a call that stops everything for tens of milliseconds (a dict
rebuilding its whole table, a mass expiry); the p99.9 and max of a blast run show it, but not
where it comes from. Each measurement here times every call of one kind and prints the mean,
p99.9 and max, with the cyclic collector off (its pauses are reported by the server's ``gc``
statistics, not here):

- ``table churn``: acquire + release of new keys (``Assert(SetVar)`` then
  ``AnywayContinueAfter(DeleteVar)``) in one table already holding ``--held`` locks;
- ``session churn``: a new session's first transaction + the end of an old one, with
  ``--held`` live sessions;
- ``mass expiry``: one ``sweep`` when ``--expire`` sessions of one entry each expire together;
- ``big end``: the end of one of 16 sessions that together hold ``--held`` locks in one
  table (the issue-19 prefill shape), 8 of them in turn;
- ``growth``: one session acquires ``--grow`` new keys in one empty table, one per
  transaction (the C load client's pipelined shape): the table and the session's own index of
  what it holds grow together; the row also says at which acquire the max came.

Run from the repository root::

    python -m benchmarks.stalls [--held 1000000] [--churn 600000] [--expire 200000]
                                [--grow 400000] [--only table|session|expiry|end|growth ...]

Only the engine's public API is used, so the same file measures an older commit too.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable, Sequence

from lockserver.engine import Engine, EngineLimits
from protocol import AnywayContinueAfter, Assert, DeleteVar, SessionSpec, SetVar, Transaction

NS = "stalls"
TABLE = "T"
BIG = EngineLimits(max_sessions=10**8, max_entries=10**8, max_entries_per_session=10**8)
NOW = 1.0


def _times(calls: int, call: Callable[[int], object]) -> list[float]:
    """Seconds of each ``call(i)``, the collector off."""
    gc.collect()
    gc.disable()
    try:
        clock = time.perf_counter
        out = []
        for i in range(calls):
            start = clock()
            call(i)
            out.append(clock() - start)
        return out
    finally:
        gc.enable()


def _row(name: str, seconds: list[float]) -> str:
    ordered = sorted(seconds)
    p999 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.999))]
    mean = sum(ordered) / len(ordered)
    return (
        f"{name:<44} {len(ordered):>9,} calls  mean {mean * 1e6:7.2f} us  "
        f"p99.9 {p999 * 1e6:8.1f} us  max {ordered[-1] * 1e3:8.2f} ms"
    )


def table_churn(held: int, churn: int) -> list[float]:
    """Acquire + release of ``churn`` new keys, ``held`` locks already in the table."""
    engine = Engine(started_at=0.0, limits=BIG)
    holder = SessionSpec("holder", 1e9)
    for start in range(0, held, 1000):
        stop = min(held, start + 1000)
        statements = [Assert(SetVar(TABLE, f"h{i}", i)) for i in range(start, stop)]
        engine.execute(holder, Transaction(NS, statements), now=NOW)
    owner = SessionSpec("owner", 1e9)

    def cycle(i: int) -> None:
        engine.execute(owner, Transaction(NS, [Assert(SetVar(TABLE, f"k{i}", i))]), now=NOW)
        release = [AnywayContinueAfter(DeleteVar(TABLE, f"k{i}", i))]
        engine.execute(owner, Transaction(NS, release), now=NOW)

    return _times(churn, cycle)


def session_churn(held: int, churn: int) -> list[float]:
    """A new session's first call + the end of an old one, ``held`` sessions live."""
    engine = Engine(started_at=0.0, limits=BIG)
    empty = Transaction(NS, [])
    for i in range(held):
        engine.execute(SessionSpec(f"s{i}", 1e9), empty, now=NOW)

    def cycle(i: int) -> None:
        engine.execute(SessionSpec(f"n{i}", 1e9), empty, now=NOW)
        engine.end_session(f"s{i % held}" if i < held else f"n{i - held}", now=NOW)

    return _times(churn, cycle)


def mass_expiry(sessions: int) -> list[float]:
    """One sweep that finds ``sessions`` sessions of one entry each expired at once."""
    engine = Engine(started_at=0.0, limits=BIG)
    for i in range(sessions):
        tx = Transaction(NS, [Assert(SetVar(TABLE, f"k{i}", i))])
        engine.execute(SessionSpec(f"s{i}", 10.0), tx, now=NOW)
    seconds = _times(1, lambda _: engine.sweep(NOW + 100.0))
    assert engine.entry_count == 0
    return seconds


def big_end(held: int) -> list[float]:
    """The end of 8 of 16 sessions holding ``held`` locks in one table between them, each
    filled by transactions of 250 acquires."""
    engine = Engine(started_at=0.0, limits=BIG)
    per = held // 16
    for s in range(16):
        spec = SessionSpec(f"prefill-{s}", 1e9)
        for lo in range(s * per, (s + 1) * per, 250):
            hi = min(lo + 250, (s + 1) * per)
            statements = [Assert(SetVar(TABLE, f"h{i}")) for i in range(lo, hi)]
            engine.execute(spec, Transaction(NS, statements), now=NOW)
    return _times(8, lambda i: engine.end_session(f"prefill-{i}", now=NOW))


def growth(count: int) -> list[float]:
    """``count`` acquires of new keys in one table by one session, one per transaction."""
    engine = Engine(started_at=0.0, limits=BIG)
    owner = SessionSpec("owner", 1e9)

    def acquire(i: int) -> None:
        engine.execute(owner, Transaction(NS, [Assert(SetVar(TABLE, f"k{i}", i))]), now=NOW)

    seconds = _times(count, acquire)
    assert engine.entry_count == count
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run the measurements asked for (all by default), print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", type=int, default=1_000_000, help="locks / sessions held")
    parser.add_argument("--churn", type=int, default=600_000, help="cycles measured")
    parser.add_argument("--expire", type=int, default=200_000, help="sessions expiring at once")
    parser.add_argument("--grow", type=int, default=400_000, help="keys one session acquires")
    parser.add_argument(
        "--only",
        choices=("table", "session", "expiry", "end", "growth"),
        action="append",
        help="run only these measurements (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    only = set(args.only or ("table", "session", "expiry", "end", "growth"))
    if "table" in only:
        print(_row(f"table churn, {args.held:,} held", table_churn(args.held, args.churn)))
    if "session" in only:
        print(_row(f"session churn, {args.held:,} live", session_churn(args.held, args.churn)))
    if "expiry" in only:
        print(_row(f"mass expiry, {args.expire:,} sessions", mass_expiry(args.expire)))
    if "end" in only:
        print(_row(f"big end, 1/16 of {args.held:,} held", big_end(args.held)))
    if "growth" in only:
        seconds = growth(args.grow)
        at = max(range(len(seconds)), key=seconds.__getitem__)
        print(f"{_row(f'growth, {args.grow:,} keys, one session', seconds)}  (acquire {at:,})")


if __name__ == "__main__":
    main()
