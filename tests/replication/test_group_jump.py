"""The witness jump after a stall expires no session inside its holder's guarantee (issue 31,
finding (b) of the second long sitting).

The scenario, modelled on explicit real and group times (no clock, no etcd): the group's
time runs with real time, the witness is anchored, then nothing is applied for X seconds
(every replica's watch stalled on a stopped etcd member) while real time runs on; the
replicas apply again with the group's time lagging real time by X (their estimates follow
the group's), serve clients from it -- each holder is told its session lasts its max age
from when it sent its request, in real time -- and then one replica proposes the jump the
witness measured. The rule (``GroupState._clock_op``): the jump expires what was idle since
before the witness's anchor, and a session used since the anchor expires the jump later, so
no session expires before its holder's real-time guarantee ran out.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver.replication._group import CLOCK_WINDOW, Genesis, GroupState, encode_entry, wire
from protocol import Assert, Execute, LockLost, SessionSpec, SetVar, Transaction

LIMITS = {
    "max_sessions": 1000,
    "max_entries": 10_000,
    "max_entries_per_session": 1000,
    "max_store_bytes": 10_000_000,
}
WAIT_LIMITS = {
    "max_waiters": 1000,
    "max_waiters_per_session": 100,
    "max_waiters_per_owner": 100,
    "max_waiting_ops_per_variable": 100_000,
    "max_waiting_ops_per_session": 100_000,
    "max_waiting_ops_per_principal": 1_000_000,
}
GENESIS = Genesis(1_700_000_000.0, "group-instance", False, LIMITS, WAIT_LIMITS)
T = GENESIS.started_at
WITNESS_TTL = 86_400
TICK = 0.2  # real seconds between two applied entries while the group applies


def acquire(conn: int, session: str, max_age: float) -> list[Any]:
    tx = Transaction("ns", (Assert(SetVar("L", session, session)),))
    return ["x", conn, "", wire(Execute(conn, SessionSpec(session, max_age), tx, None))]


class Log:
    """One replica's entries applied to a fresh group state, each at a real time; remembers
    the real time at which each session's loss, and each answer to a connection, was
    applied."""

    def __init__(self) -> None:
        self.state = GroupState(GENESIS)
        self.revision = 2
        self.batch = 0
        self.state.apply_registered("r1", "r1:7400", self.revision)
        self.lost: dict[str, float] = {}
        self.answered: dict[int, float] = {}

    def entry(self, real: float, stamp: float, ops: list[list[Any]]) -> None:
        self.revision += 1
        self.batch += 1
        data = encode_entry("r1", self.batch, stamp, 1.0, ops, base=self.revision - 1)
        for owner, payload in self.state.apply_entry(data, self.revision):
            if isinstance(payload, LockLost):
                self.lost.setdefault(payload.session_id, real)
            elif isinstance(owner, tuple):
                self.answered.setdefault(owner[1], real)


@settings(max_examples=60, deadline=None)
@given(
    before=st.floats(0.0, 3.0),
    stall=st.floats(2.0, 20.0),
    uses=st.lists(st.tuples(st.floats(0.0, 4.0), st.floats(1.0, 8.0)), min_size=1, max_size=6),
    jump_after=st.floats(0.0, 5.0),
)
def test_a_jump_after_a_stall_expires_no_session_inside_its_guarantee(
    before: float, stall: float, uses: list[tuple[float, float]], jump_after: float
) -> None:
    """Sessions used while the group's time lagged real time by a stall of ``stall`` s keep
    their max age in real time across the jump that ends the lag; a session idle since
    before the witness's anchor and past its max age in real time is expired by the jump."""
    log = Log()
    # Real time and the group's time run together: an idle session, then the anchor.
    log.entry(T + 1.0, T + 1.0, [acquire(1, "idle", 5.0)])
    anchored_at = T + 2.0
    log.entry(anchored_at, anchored_at, [["k", 77, WITNESS_TTL, anchored_at]])
    real = anchored_at
    while real < anchored_at + before:
        real += TICK
        log.entry(real, real, [["t"]])
    group = log.state.now
    # The stall: real time runs on, nothing is applied.
    real += stall
    lag = real - group
    # The replicas apply again; their estimates follow the group's (lagging) time.
    promised: dict[str, float] = {}
    resumed = real
    pending = sorted(((resumed + at, f"s{i}", age) for i, (at, age) in enumerate(uses)))
    jump_at = resumed + jump_after
    conn = 10
    while real < jump_at or pending:
        real += TICK
        ops: list[list[Any]] = [["t"]]
        while pending and pending[0][0] <= real:
            _, session, age = pending.pop(0)
            conn += 1
            ops.append(acquire(conn, session, age))
            promised[session] = real + age  # the holder sent it no later than it applied
        log.entry(real, real - lag, ops)
    # The jump, as the witness measures it (etcd counts whole seconds of the lease).
    counted = real - anchored_at
    target = log.state.witness_time(WITNESS_TTL - math.floor(counted), WITNESS_TTL)
    assert target is not None
    jumped = max(0.0, target - log.state.now)
    live = {s for s in promised if s not in log.lost}
    log.entry(real, real - lag, [["j", target]])
    # Then time runs with real time again, past every max age.
    end = real + 20.0
    while real < end:
        real += TICK
        log.entry(real, real - lag + jumped, [["t"]])
    assert log.state.now <= real  # the group's time never ran ahead of real time
    for session, until in promised.items():
        assert session in log.lost, f"{session} never expired"
        assert log.lost[session] >= until - 1e-9, (
            f"{session} expired at {log.lost[session] - T:.2f}, inside its guarantee "
            f"(until {until - T:.2f}; stall {stall:.2f} s, jump {jumped:.2f} s)"
        )
    # The idle session was last used at T + 1 (max age 5 s), before the anchor.
    if log.state.jumps and target >= T + 1.0 + 5.0:
        assert log.lost["idle"] <= real - 20.0 + 1e-9, "the jump spared an idle session"
    assert log.state.graced == (len(live) if log.state.jumps else 0)


def test_a_jump_without_a_witness_graces_every_session() -> None:
    """A jump applied when the witness is void (a clamp since it was measured) cannot say
    since when time was lost: it expires no session, it moves every deadline by the jump."""
    log = Log()
    log.entry(T + 1.0, T + 1.0, [acquire(1, "a", 5.0)])
    assert log.state.witness is None
    log.entry(T + 2.0, T + 2.0, [["j", T + 30.0]])
    assert log.state.now == T + 30.0 and log.state.jumps == 1 and log.state.graced == 1
    assert "a" not in log.lost
    log.entry(T + 4.0, T + 30.0 + CLOCK_WINDOW, [["t"]])
    assert "a" not in log.lost
    for step in range(1, 40):
        log.entry(T + 4.0 + step * 0.2, T + 31.0 + step * 0.2, [["t"]])
    assert "a" in log.lost and log.lost["a"] >= T + 6.0  # 5 s after its use, in real time


def set_ttl(conn: int, session: str, ttl: float) -> list[Any]:
    """An entry of ``session`` (max age an hour: only the TTL can end it) that expires by
    itself after ``ttl`` s."""
    tx = Transaction("ns", (Assert(SetVar("T", session, session, ttl=ttl)),))
    return ["x", conn, "", wire(Execute(conn, SessionSpec(session, 3600.0), tx, None))]


def wait_for(conn: int, session: str, wait: float) -> list[Any]:
    """A request of ``session`` for the variable the session ``holder`` holds (``acquire``):
    it parks ``wait`` s."""
    tx = Transaction("ns", (Assert(SetVar("L", "holder", session)),))
    return ["x", conn, "", wire(Execute(conn, SessionSpec(session, 3600.0), tx, wait))]


@settings(max_examples=60, deadline=None)
@given(
    stall=st.floats(5.0, 20.0),  # past the witness's margin (2.4 s): there is a jump
    at=st.floats(0.0, 4.0),
    ttl=st.floats(1.0, 8.0),
    wait=st.floats(1.0, 8.0),
    jump_after=st.floats(0.0, 5.0),
)
def test_a_jump_ends_no_ttl_and_no_wait_early(
    stall: float, at: float, ttl: float, wait: float, jump_after: float
) -> None:
    """A TTL set and a wait parked while the group's time lagged real time by a stall keep
    their length in real time across the jump that ends the lag (the entry expires, the wait
    is answered, no earlier than their client chose); a TTL set before the witness's anchor
    whose length passed in real time expires at the jump."""
    log = Log()
    log.entry(T + 0.5, T + 0.5, [acquire(1, "holder", 3600.0)])
    log.entry(T + 1.0, T + 1.0, [set_ttl(2, "old", 1.5)])
    anchored_at = T + 2.0
    log.entry(anchored_at, anchored_at, [["k", 77, WITNESS_TTL, anchored_at]])
    assert "old" not in log.lost
    group = log.state.now
    real = anchored_at + stall
    lag = real - group
    set_real = parked_real = math.inf
    jump_at = real + at + jump_after
    while real < jump_at or set_real == math.inf:
        real += TICK
        ops: list[list[Any]] = [["t"]]
        if set_real == math.inf and real >= anchored_at + stall + at:
            ops += [set_ttl(3, "new", ttl), wait_for(4, "waiter", wait)]
            set_real = parked_real = real  # the client sent both no later than they applied
        log.entry(real, real - lag, ops)
    assert log.answered[3] == set_real  # granted at once
    counted = real - anchored_at
    target = log.state.witness_time(WITNESS_TTL - math.floor(counted), WITNESS_TTL)
    assert target is not None
    jumped = max(0.0, target - log.state.now)
    log.entry(real, real - lag, [["j", target]])
    assert log.state.jumps == 1
    jumped_at = real
    end = real + 20.0
    while real < end:
        real += TICK
        log.entry(real, real - lag + jumped, [["t"]])
    assert log.state.now <= real  # the group's time never ran ahead of real time
    assert log.lost["new"] >= set_real + ttl - 1e-9, (
        f"the TTL ended {log.lost['new'] - set_real:.2f} s after it was set, not {ttl:.2f}"
    )
    assert log.answered[4] >= parked_real + wait - 1e-9, (
        f"the wait ended {log.answered[4] - parked_real:.2f} s after it parked, not {wait:.2f}"
    )
    # "old" (TTL 1.5 s, set at T + 1, before the anchor) ended during the stall in real time:
    # the group's lagging time or, at the latest, the jump expired it.
    assert log.lost["old"] <= jumped_at
    assert log.state.graced >= 2  # the TTL and the wait (and their sessions)
