"""Histories shaped like a fault lab run, made without a lab: for the checkers' and the report's
tests (no namespaces, no servers).

``lab_history`` simulates three nodes under three faults (n1 isolated 30-45 s, n2's replica
killed 60-68 s, n3's clock stepped at 80 s) with a register workload (six clients, two per
node, on three keys; every operation takes effect at one instant inside its window, so the
history is linearizable) and a mutex workload (four clients taking one lock in turn,
writing to the fenced resource inside each hold). A client on the isolated node times out
(unknown: half of its writes took effect); one whose replica is down fails fast until it
fails over. ``double_grant`` makes the lock behave like a lock without guarantees: when n1 is
cut off, the next client is granted at once while the cut-off holder keeps going, so the
holds overlap, and the resource refuses the old holder's later writes. ``stale_read`` adds a
read that returns a value overwritten long before.
"""

from __future__ import annotations

import random
from typing import Any

from lockbench.faults import Fault, History, Meta, Op, ResourceWrite
from lockbench.safety import Interval

NODES = ("n1", "n2", "n3")
FAULTS = (
    Fault("isolate", ("n1",), 30.0, 45.0, "n1 | n2 n3"),
    Fault("kill-replica", ("n2",), 60.0, 68.0, "kill -9, restart"),
    Fault("clock-step", ("n3",), 80.0, 80.5, "+3600 s"),
)
LEASE = 3.0  # a holder's guarantee, seconds after its grant


def _isolated(node: str, t: float) -> bool:
    return node == "n1" and 30.0 <= t < 45.0


def _killed(node: str, t: float) -> bool:
    return node == "n2" and 60.0 <= t < 62.0  # the client fails over after 2 s


def _register(rng: random.Random, duration: float) -> list[Op]:
    plan: list[tuple[float, Op]] = []  # (instant it takes effect or inf, op without result)
    for p in range(6):
        node = NODES[p % 3]
        t = rng.uniform(0, 0.05)
        while t < duration:
            key = f"k{rng.randrange(3)}"
            f = rng.choice(["read", "read", "write", "cas"])
            outcome: Any
            if _isolated(node, t):
                complete, outcome = t + 1.0, "unknown"
                point = rng.uniform(t, t + 1.0) if rng.random() < 0.5 else float("inf")
            elif _killed(node, t):
                complete, outcome, point = t + 0.002, "fail", float("inf")
            else:
                complete, outcome = t + rng.uniform(0.004, 0.03), "ok"
                point = rng.uniform(t, complete)
            plan.append(
                (point, Op(f"r{p}", "register", f, key, None, t, complete, outcome, node=node))
            )
            t = complete + rng.uniform(0.01, 0.05)
    state: dict[str, Any] = {}
    last_read: dict[tuple[str, str], Any] = {}
    counter = 0
    out = []
    for point, op in sorted(plan, key=lambda x: x[0]):
        applied = point != float("inf")
        value: Any
        outcome = op.outcome
        if op.f == "read":
            value = state.get(op.key) if outcome == "ok" else None
            if outcome == "ok":
                last_read[op.process, op.key] = value
        elif op.f == "write":
            counter += 1
            value = counter
            if applied:
                state[op.key] = counter
        else:
            counter += 1
            value = [last_read.get((op.process, op.key)), counter]
            if applied and state.get(op.key) == value[0]:
                state[op.key] = counter
            elif outcome == "ok":
                outcome = "fail"  # found another value
        out.append(
            Op(
                op.process,
                op.workload,
                op.f,
                op.key,
                value,
                op.invoke,
                op.complete,
                outcome,
                node=op.node,
            )
        )
    return out


def _mutex(
    rng: random.Random, duration: float, double_grant: bool
) -> tuple[list[Op], list[Interval], list[ResourceWrite]]:
    ops: list[Op] = []
    holds: list[Interval] = []
    writes: list[ResourceWrite] = []
    fence = 100
    highest: int | None = None
    t = 0.1
    turn = 0

    def write(holder: str, f: int, at: float) -> None:
        nonlocal highest
        accepted = highest is None or f >= highest
        writes.append(ResourceWrite("L", holder, f, at, accepted, highest))
        if accepted:
            highest = f

    pending: list[tuple[float, str, int]] = []  # writes of a cut-off holder still to come
    while t < duration:
        holder = f"m{turn % 4}"
        node = NODES[turn % 4 % 3]
        turn += 1
        if _isolated(node, t) or _killed(node, t):
            t += 0.05
            continue
        invoke = t
        fence += rng.randint(1, 3)
        complete = t + rng.uniform(0.003, 0.01)
        valid_until = complete + LEASE
        ops.append(
            Op(
                holder,
                "mutex",
                "acquire",
                "L",
                {"valid_until": valid_until},
                invoke,
                complete,
                "ok",
                fence,
                node,
            )
        )
        start = complete + 0.0005
        cut = node == "n1" and start < 30.0 <= start + 0.2
        end = start + rng.uniform(0.02, 0.1)
        for pt, ph, pf in [p for p in pending if p[0] <= start]:
            write(ph, pf, pt)
        pending = [p for p in pending if p[0] > start]
        write(holder, fence, start + 0.001)
        if cut and double_grant:
            # the holder is cut off but keeps writing for 5 s; the lock is granted again at once
            end = 35.0
            pending.extend((30.0 + k, holder, fence) for k in range(1, 6))
            holds.append(Interval("L", "w", start, end, fence, holder))
            ops.append(Op(holder, "mutex", "release", "L", None, end, None, "unknown", None, node))
            t = 30.05
            continue
        if cut:
            # the holder stops at its guarantee; the lock waits for it to run out
            end = min(end + 5.0, valid_until - 0.01)
            holds.append(Interval("L", "w", start, end, fence, holder))
            ops.append(Op(holder, "mutex", "release", "L", None, end, None, "unknown", None, node))
            t = valid_until + 0.01
            continue
        holds.append(Interval("L", "w", start, end, fence, holder))
        release_done = end + rng.uniform(0.003, 0.01)
        ops.append(
            Op(holder, "mutex", "release", "L", None, end + 0.0001, release_done, "ok", None, node)
        )
        t = release_done + rng.uniform(0.0, 0.02)
    for pt, ph, pf in pending:
        write(ph, pf, pt)
    writes.sort(key=lambda w: w.time)
    return ops, holds, writes


def lab_history(
    system: str = "lockserver",
    seed: int = 1,
    duration: float = 100.0,
    *,
    double_grant: bool = False,
    stale_read: bool = False,
) -> History:
    """A simulated lab run (see the module header)."""
    rng = random.Random(seed)
    register = _register(rng, duration)
    if stale_read:
        written = sorted(
            (op for op in register if op.f == "write" and op.outcome == "ok" and op.key == "k0"),
            key=lambda op: op.invoke,
        )
        old = next(op for op in written if op.invoke > 10.0)
        register.append(Op("r9", "register", "read", "k0", old.value, 50.0, 50.01, "ok", node="n3"))
    ops, holds, writes = _mutex(rng, duration, double_grant)
    meta = Meta(system, NODES, seed, 1000.0, 1.7e9, {"duration": duration})
    return History(
        meta=meta,
        ops=tuple(register + ops),
        holds=tuple(holds),
        writes=tuple(writes),
        faults=FAULTS,
    )
