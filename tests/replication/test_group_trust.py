"""The group's state machine with a group secret and its clock (``lockserver.replication._group``,
issue 29), without etcd: what is not sealed by the group's secret changes nothing and is counted
(a forged registration and entry -- the two-put theft --, an entry sealed with another key,
an unsealed entry of an unknown format, a registration record naming another replica, a
second registration of a live replica, an old entry put again after its replica's
registration was put again); an authenticated entry of an unknown format stops applying
(EntryFormatError); a skipped revision changes nothing but its count. The clock: a stamp more
than the window ahead moves the group's time by the window only (counted, the witness
voided), a stamp its proposer made before it applied that clamp moves nothing, every entry
moves the time by the window at most; the witness's anchor and jumps; a state snapshotted by
the version before loads with the new bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockserver.replication._group import (
    CLOCK_WINDOW,
    ENTRY_FORMAT,
    HEARTBEAT,
    EntryFormatError,
    GroupState,
    encode_entry,
    encode_ops,
    wire,
)
from lockserver.replication._groupauth import GroupKeys, Sealer
from protocol import (
    Assert,
    EndSession,
    Execute,
    HoldersPage,
    ListQuery,
    LockLost,
    SessionSpec,
    SetVar,
    Transaction,
    TransactionResult,
    pack,
    unpack,
)

from .test_group_state import GENESIS, acquire_op

SECRET = b"s" * 40
CONTEXT = pack(["g", GENESIS.instance])
KEYS = GroupKeys([SECRET])
ENTRIES = KEYS.sealer(b"entry", CONTEXT)
REPLICAS = KEYS.sealer(b"replica", CONTEXT)
T = GENESIS.started_at


def registration(rid: str, keys: GroupKeys = KEYS, address: str | None = None) -> bytes:
    """The sealed registration record of ``rid`` as a replica holding ``keys`` writes it."""
    record = pack([rid, address or f"{rid}:7400", list(keys.ids)])
    return keys.sealer(b"replica", CONTEXT).seal_all(record)


class Group:
    """A sealed group's state, fed events at increasing revisions."""

    def __init__(self) -> None:
        self.state = GroupState(GENESIS)
        self.revision = 10
        self.registered: dict[str, int] = {}
        self.batches: dict[str, int] = {}
        self.outs: list[Any] = []

    def next(self) -> int:
        self.revision += 1
        return self.revision

    def register(self, rid: str, value: bytes | None = None) -> int:
        revision = self.next()
        self.outs += self.state.apply_registered(
            rid, registration(rid) if value is None else value, revision, REPLICAS
        )
        self.registered[rid] = revision
        return revision

    def depart(self, rid: str) -> None:
        self.outs += self.state.apply_departed(rid, self.next())

    def entry(
        self,
        rid: str,
        ops: list[Any],
        stamp: float,
        *,
        base: int | None = None,
        sealer: Sealer | None = ENTRIES,
        fmt: int = ENTRY_FORMAT,
    ) -> bytes:
        """The sealed entry ``rid`` proposes next (its batch, its registration)."""
        self.batches[rid] = self.batches.get(rid, 0) + 1
        body = encode_entry(
            rid,
            self.batches[rid],
            stamp,
            1.0,
            ops,
            registration=self.registered.get(rid, 0),
            base=self.revision if base is None else base,
        )
        if fmt != ENTRY_FORMAT:
            body = pack([fmt, *list(_fields(body))[1:]])
        return body if sealer is None else sealer.seal(body)

    def apply(self, data: bytes) -> list[Any]:
        outs = self.state.apply_entry(data, self.next(), None, ENTRIES)
        self.outs += outs
        return outs


def _fields(body: bytes) -> list[Any]:
    fields: list[Any] = unpack(body)
    return fields


def holders(state: GroupState) -> dict[str, list[str]]:
    """var -> sessions holding it (namespace ns)."""
    page = state.core.read_listing("holders", ListQuery(namespace="ns"))
    assert isinstance(page, HoldersPage)
    out: dict[str, list[str]] = {}
    for h in page.holders:
        out.setdefault(h.var, []).append(h.session)
    return out


def test_the_two_put_theft_changes_nothing() -> None:
    """A registration put by someone without the secret, then an entry of that made-up
    replica (or posing as a registered one) ending the victim's session as admin and granting
    the attacker's: each is rejected and counted, and nothing else changes -- the victim
    still holds."""
    g = Group()
    g.register("r1")
    g.apply(g.entry("r1", [acquire_op(1, 1, "victim", "x", None)], T + 0.1))
    assert holders(g.state) == {"x": ["victim"]}
    before, at = g.state.fingerprint(), g.state.revision
    forged = pack(["evil", "attacker:7400", [KEYS.signing_id]])
    wrong_key = GroupKeys([b"w" * 40])
    g.state.apply_registered("evil", forged, g.next(), REPLICAS)  # unsealed
    sealed_wrong = wrong_key.sealer(b"replica", CONTEXT).seal_all(forged)
    g.state.apply_registered("evil", sealed_wrong, g.next(), REPLICAS)
    theft = [
        ["e", 1, "admin", True, wire(EndSession(1, "victim"))],
        acquire_op(1, 2, "thief", "x", None),
    ]
    for rid in ("evil", "r1"):  # its own id, and posing as the registered replica
        plain = encode_entry(rid, 99, T + 0.2, 1.0, theft, registration=g.registered.get(rid, 0))
        assert g.state.apply_entry(plain, g.next(), None, ENTRIES) == []
        wrong = wrong_key.sealer(b"entry", CONTEXT).seal(plain)
        assert g.state.apply_entry(wrong, g.next(), None, ENTRIES) == []
    assert g.state.rejected == 6
    assert holders(g.state) == {"x": ["victim"]}
    g.state.revision, g.state.rejected = at, 0
    assert g.state.fingerprint() == before


def test_an_entry_of_another_group_or_purpose_is_rejected() -> None:
    """An entry sealed with the group's key for another group (context) or as another kind of
    record does not open here."""
    g = Group()
    g.register("r1")
    body = encode_entry("r1", 1, T + 0.1, 1.0, [["t"]], registration=g.registered["r1"])
    elsewhere = KEYS.sealer(b"entry", pack(["other", GENESIS.instance])).seal(body)
    as_registration = KEYS.sealer(b"replica", CONTEXT).seal(body)
    for data in (elsewhere, as_registration):
        assert g.apply(data) == []
    assert g.state.rejected == 2 and g.state.entries == 0


def test_a_replayed_entry_changes_nothing() -> None:
    """An authenticated entry put again later: its batch was applied (skipped); after its
    replica departed: not registered (skipped); after that replica's registration was put
    again too (both replayed): it names the old registration (rejected)."""
    g = Group()
    first = g.register("r1")
    entry = g.entry("r1", [acquire_op(1, 1, "a", "x", None)], T + 0.1)
    g.apply(entry)
    assert g.apply(entry) == [] and g.state.skipped == 1
    g.depart("r1")
    assert g.apply(entry) == [] and g.state.skipped == 2
    again = g.register("r1", registration("r1"))  # the old registration record, put again
    assert again != first and g.state.registrations["r1"] == again
    assert g.apply(entry) == []
    assert g.state.rejected == 1
    assert g.state.entries == 1


def test_registrations_that_do_not_fit_are_rejected() -> None:
    """A record naming another replica than its key, a second put of a registered replica's
    key, a record without keys: rejected; the registered replica's record is unchanged."""
    g = Group()
    g.register("r1")
    revision = g.state.registrations["r1"]
    g.state.apply_registered("r2", registration("r3"), g.next(), REPLICAS)
    g.state.apply_registered("r1", registration("r1", address="thief:1"), g.next(), REPLICAS)
    empty = KEYS.sealer(b"replica", CONTEXT).seal_all(pack(["r4", "r4:1", []]))
    g.state.apply_registered("r4", empty, g.next(), REPLICAS)
    assert g.state.rejected == 3
    assert g.state.replicas == {"r1": "r1:7400"}
    assert g.state.registrations["r1"] == revision


def test_an_unknown_format_halts_only_when_authenticated() -> None:
    """An entry of a format this version does not know, sealed with the group's key: a newer
    replica wrote it -- EntryFormatError (the replica halts). The same entry unsealed (anyone
    can put it): rejected and counted, nothing else."""
    g = Group()
    g.register("r1")
    future = g.entry("r1", [["t"]], T + 0.1, fmt=ENTRY_FORMAT + 1, sealer=None)
    assert g.apply(future) == []
    assert g.state.rejected == 1
    with pytest.raises(EntryFormatError, match=f"format {ENTRY_FORMAT + 1}"):
        g.apply(ENTRIES.seal(future))


def test_a_skipped_revision_changes_nothing_but_its_count() -> None:
    g = Group()
    g.register("r1")
    before = g.state.fingerprint()
    g.state.apply_skipped(g.next())
    assert g.state.skipped_revisions == 1
    g.state.skipped_revisions = 0
    g.state.revision = 11
    assert g.state.fingerprint() == before


def test_key_conflicts_name_the_replica_and_the_key() -> None:
    """A replica cannot apply the log beside one that signs with a key it does not hold, nor
    beside one that does not hold its signing key; holding both (a rotation's middle step) is
    no conflict."""
    old, new = b"o" * 40, b"n" * 40
    g = Group()
    g.state.keysets["a"] = GroupKeys([old]).ids
    g.state.replicas["a"] = "a:1"
    assert g.state.key_conflict("b", GroupKeys([old, new]).ids) is None
    conflict = g.state.key_conflict("b", GroupKeys([new, old]).ids)
    assert conflict is not None and "does not hold this replica's signing key" in conflict
    conflict = g.state.key_conflict("b", GroupKeys([new]).ids)
    assert conflict is not None and "signs its entries with key" in conflict
    assert GroupKeys([old]).ids[0].hex() in conflict and "a (a:1)" in conflict
    g.state.keysets["a"] = GroupKeys([old, new]).ids
    assert g.state.key_conflict("b", GroupKeys([new, old]).ids) is None


# --- the clock ------------------------------------------------------------------------------


def test_a_stamp_past_the_window_moves_time_by_the_window() -> None:
    """One replica's clock leapt an hour: its stamp moves the group's time by the window
    only (counted; the witness voided); its next stamp, made before it applied that clamp,
    moves nothing; once it has applied it, its stamps count again."""
    g = Group()
    g.register("r1")
    g.register("r2")
    g.apply(g.entry("r2", [["k", 77, 86_400, T]], T + 0.2))
    assert g.state.witness == (77, 86_400, T)
    before = g.revision
    g.apply(g.entry("r1", [["t"]], T + 3600, base=before))
    assert g.state.now == T + 0.2 + CLOCK_WINDOW
    assert g.state.clamped == 1 and g.state.witness is None
    clamped_at = g.revision
    g.apply(g.entry("r1", [["t"]], T + 3600.5, base=before))  # in flight before the clamp
    assert g.state.now == T + 0.2 + CLOCK_WINDOW and g.state.clamped == 2
    g.apply(g.entry("r1", [["t"]], T + 0.2 + CLOCK_WINDOW + 0.3, base=clamped_at))
    assert g.state.now == pytest.approx(T + 0.5 + CLOCK_WINDOW)
    assert g.state.clamped == 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["r1", "r2", "r3"]),
            st.floats(-5000, 5000, allow_nan=False),
            st.integers(0, 6),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_no_entry_moves_time_by_more_than_the_window(
    entries: list[tuple[str, float, int]],
) -> None:
    """Whatever the stamps (any replica's clock anywhere, entries in flight): the group's
    time never goes back, no entry moves it by more than the window, and an entry whose
    proposer had not applied its own last clamp never moves it."""
    g = Group()
    for rid in ("r1", "r2", "r3"):
        g.register(rid)
    for rid, offset, lag in entries:
        before = g.state.now
        clamped_at = g.state.clamped_at.get(rid, -1)
        base = max(0, g.revision - lag)
        g.apply(g.entry(rid, [["t"]], T + offset, base=base))
        assert before <= g.state.now <= before + CLOCK_WINDOW
        if base < clamped_at:
            assert g.state.now == before


def test_honest_stamps_within_the_window_are_the_groups_time() -> None:
    """Stamps that move forward by less than the window each (replicas that tick every
    heartbeat): the group's time is the latest, nothing is clamped."""
    g = Group()
    g.register("r1")
    g.register("r2")
    t = T
    for i in range(30):
        t += HEARTBEAT
        g.apply(g.entry("r1" if i % 3 else "r2", [["t"]], t))
        assert g.state.now == t
    assert g.state.clamped == 0


def test_the_witness_jump_and_its_time() -> None:
    """``k`` anchors the witness at the group's time (a claim ahead of it is not believed);
    the witness's time is its anchor plus what etcd counted, less a margin, and unknown when
    the lease is gone; ``j`` moves the group's time forward (never back), expiring what is
    due, counted."""
    g = Group()
    g.register("r1")
    g.apply(g.entry("r1", [acquire_op(1, 1, "s1", "x", None)], T + 0.1))
    g.apply(g.entry("r1", [["k", 5, 86_400, T + 50]], T + 0.2))
    assert g.state.witness == (5, 86_400, T + 0.2)
    assert g.state.witness_time(-1, 0) is None
    assert g.state.witness_time(86_400 - 100, 86_400) == pytest.approx(
        T + 0.2 + 99 - CLOCK_WINDOW - HEARTBEAT
    )
    outs = g.apply(g.entry("r1", [["j", T + 100], ["t"]], T + 0.3))
    assert g.state.now == T + 100 and g.state.jumps == 1
    assert g.state.jumped == pytest.approx(100 - 0.3)
    assert any(isinstance(p, LockLost) for _, p in outs)  # s1 (max age 5) expired
    g.apply(g.entry("r1", [["j", T + 10]], T + 100.1))
    assert g.state.now == pytest.approx(T + 100.1) and g.state.jumps == 1


def test_a_snapshot_of_the_previous_version_loads_with_defaults() -> None:
    """A GroupState pickled before issue 29 (without the new bookkeeping) restores with it
    empty, and goes on applying."""
    state = GroupState(GENESIS)
    state.apply_registered("r1", "r1:7400", 2)
    for name in (
        "registrations",
        "keysets",
        "clamped_at",
        "rejected",
        "clamped",
        "jumps",
        "jumped",
        "graced",
        "skipped_revisions",
        "witness",
    ):
        del state.__dict__[name]
    restored = GroupState.restore(state.snapshot())
    assert restored.registrations == {} and restored.witness is None and restored.rejected == 0
    assert restored.graced == 0
    tx = Transaction("ns", (Assert(SetVar("L", "v", "s")),))
    op = ["x", 1, "", wire(Execute(1, SessionSpec("s", 5.0), tx, None))]
    data = pack([2, "r1", 1, T + 0.5, 1.0, encode_ops([op])])
    (out,) = restored.apply_entry(data, 3)
    assert isinstance(out[1], TransactionResult) and out[1].ok
