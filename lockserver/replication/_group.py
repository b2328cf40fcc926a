"""A replicated group's state machine: the log's entries, their encoding, and applying them
through the lock core's door (``GroupState``). Pure and synchronous: no sockets, no clock, no
etcd. The trio side that proposes entries to etcd and watches them is ``_replica.py``.

Why this shape (issue 18, docs/replication.md): etcd is the group's ordered, replicated log,
the lock core is its state machine. Every replica applies the same entries, in etcd revision
order, through the same door calls with the same ``now`` and ``trust``: so every replica holds
the same lock state, and the replica that received a request answers it once it has applied
the entry carrying it. Nothing here reads a clock: an entry carries its proposer's estimate
of the group's time, and the group's time is decided from those stamps by the rule below.

Rules kept:

- **Deterministic**: ``apply`` of the same events (entries, replica registrations and
  departures, each with its revision) in the same order gives the same outputs and the same
  state on any replica, whatever its hash seed (the door's own rule, and
  ``ShardedDict``'s hash-independent pickling for snapshots).
- **Owners are names, not objects**: a connection is ``(replica id, connection number)``. Each
  replica maps its own names to its sockets; outputs addressed to another replica's
  connections are that replica's to send.
- **Only the group's replicas write what is applied** (issue 29, with a group secret): an
  entry or a registration is opened (``_groupauth.Sealer``) before anything in it is
  decoded; one that does not open is rejected whole and counted (``rejected``), never
  applied, never a reason to stop. An authenticated entry names the revision of its
  proposer's registration, so an old entry put again (a replay) is rejected even when its
  replica's registration was put again too.
- **A replica's entries count while it is registered**: its registration key (held by an etcd
  lease) is put before its first entry; when the key goes (the lease lapsed, or it left), every
  connection of it is gone, as a door call at that point of the log, and entries it proposed
  later are ignored -- so a replica that was cut off and comes back cannot act on old state.
- **Exactly once**: each entry carries its proposer's batch number; a batch already applied
  (a proposal retried after a timeout that had in fact committed) is skipped.
- **Fences from the log**: before an entry is applied, the engine's fence is raised to
  ``fence_base + (revision << 16) + index``, so every grant's fence names the etcd revision of
  the entry that made it (and its place in it): strictly increasing across replicas and
  restarts of any of them.
- **Group time never runs faster than real time** (docs/replication.md "Time"): a session
  expires when the group's time passes its deadline, and its holder was promised that much
  real time. An entry's stamp is its proposer's estimate (the group's time when it last
  applied an entry, plus its own monotonic clock since: a wall clock never counts). The
  entry's time is ``max(group time, stamp)``, but a stamp more than :data:`CLOCK_WINDOW`
  ahead of the group's time moves it by the window only (it is *clamped*, and counted:
  ``clamped``), and a later stamp of the same replica proposed before it applied that clamp
  (its ``base`` revision is older) moves nothing: one replica whose clock leaps moves the
  group's time by one window at most. Replicas propose a tick every :data:`HEARTBEAT` while
  anything has a deadline, so an honest stamp is never that far ahead. Time that passed while
  no entry could be committed (the whole group down) comes back only through a *jump* op
  measured by etcd's own clock (the *witness* lease, ``_replica.py``); a clamp voids the
  witness until it is anchored again. A jump expires only what was idle since before the
  witness's anchor: every live session used since then (or every one, with no witness) is
  moved the jump later, and so is every entry TTL set and every wait parked since then
  (``graced`` counts them), since the time may have been lost before its use and replicas
  may have served it from lagging time (issue 31: every replica's watch stalled on one etcd
  member, then a jump of 3.7 s expired sessions granted a moment before).

Entry (msgpack): ``[3, replica, registration, batch, stamp, base, trust, ops]`` --
``registration`` the revision of the proposer's registration, ``base`` the revision it had
applied when it stamped the entry, ``ops`` the msgpack array of the entry's ops deflated
(zlib, level 1; :func:`encode_ops`): an entry is written to etcd's WAL and database and sent
to every watcher base64'd in JSON, and its ops repeat sessions, namespaces and keys, so
deflating it cuts what etcd and every replica handle several-fold (measured on lockbench's
load: a 64-op entry of 7.9 kB deflates to 0.7 kB, in 24 µs; inflating takes 10 µs). Ops of
less than 1 KiB (a lone client's entry) are a zlib stream too, of one stored block: they
deflate by little, and deflating cost their proposer more than the rest of the encoding. With a
group secret the entry is sealed (``_groupauth``: a key id and an HMAC-SHA256 tag before it).
The header stays plain: an entry that is skipped (its replica is not registered, its batch
applied already) is not inflated. Formats 2 (``[2, replica, batch, stamp, trust, ops]``) and
1 (the same with the ops array inline) are still applied in a group without a secret: a group
restarted on this version applies the log its previous version wrote. Decoding is strict:
ops that do not inflate, inflate past :data:`MAX_OPS_BYTES` or hold anything but an array
raise ValueError (every replica of the version meets such an entry alike and skips it alike);
another format number raises :class:`EntryFormatError`: a newer replica wrote it and the
replicas that know it apply it, so a replica that meets it halts (``_replica.Replica``)
rather than diverge -- with a secret only when the entry is authenticated (an unsealed one is
rejected first). Op (a list, first item its kind):

- ``["x", conn, principal, request]`` execute; ``["e", conn, principal, admin, request]`` end;
  ``["c", conn, request]`` cancel; ``["r", conn, request]`` force-release;
  ``["s", conn, request, principal]`` subscribe (a log of an older version: without the
  principal); ``["u", conn, request]`` unsubscribe -- ``request`` is
  the client's request as its protocol wire map (``protocol.request_to_wire``);
- ``["g", conn]`` the connection closed; ``["b", conn, request id]`` a read barrier (the
  proposer answers a read from its applied state once the barrier is applied: reads never see
  state older than the request); ``["t"]`` a tick (time passes: expiries, wait deadlines);
- ``["k", lease, ttl, claim]`` the witness is anchored: etcd lease ``lease`` was granted with
  ``ttl`` seconds when the group's time was at least ``claim``; ``["j", time]`` the group's
  time jumps to ``time`` (measured by the witness after the whole group was down).
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import zlib
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import attrs

from lockserver._build import COMPILED_MODULES
from lockserver.engine import BigTable, EngineLimits, LockCore, Output, ShardedDict, WaitLimits
from protocol import (
    Cancel,
    EndSession,
    Execute,
    ForceRelease,
    Subscribe,
    TreeLimits,
    Unsubscribe,
    pack,
    request_from_wire,
    request_to_wire,
    unpack,
)

from ._groupauth import Sealer

__all__ = [
    "CLOCK_WINDOW",
    "ENTRY_FORMAT",
    "HEARTBEAT",
    "EntryFormatError",
    "EntryKeyError",
    "MAX_OPS_BYTES",
    "STORED_BELOW",
    "Barrier",
    "Entry",
    "Genesis",
    "GroupState",
    "Owner",
    "SnapshotError",
    "decode_entry",
    "decode_header",
    "decode_ops",
    "encode_entry",
    "encode_ops",
]

#: The entry format this code writes (every replica of a group runs the same format:
#: docs/replication.md, "Upgrading").
ENTRY_FORMAT: Final = 3
#: Bytes an entry's ops may inflate to (a bound against a corrupt entry; a proposer's entry
#: is far below it: etcd takes at most ~1.5 MiB per value, and ops deflate ~10-fold).
MAX_OPS_BYTES: Final = 1 << 28
#: Bytes of packed ops below which an entry carries them stored rather than deflated: a
#: lone client's entry (one op, ~100-300 bytes) deflates by little, and zlib's setup (its
#: ~270 KiB of state, cold in a busy replica) cost ~20 µs of the proposer's critical path
#: per entry (benchmarks/group_probe.py, issue 29); batches of many ops still deflate.
STORED_BELOW: Final = 1024
_STORED_HEAD: Final = struct.Struct("<HH")
_ADLER: Final = struct.Struct(">I")
#: Grants one entry may make before its fences would reach the next revision's.
FENCES_PER_REVISION: Final = 1 << 16
#: Seconds one stamp may move the group's time past where it stands (more is clamped).
CLOCK_WINDOW: Final = 1.0
#: Seconds of group time after which a replica proposes a tick while anything has a
#: deadline (the first registered; the others a quarter later each, so one usually does).
HEARTBEAT: Final = 0.4
# The log was validated by the replica that proposed it (with the group's limits); applying
# it decodes with bounds that never refuse what a replica accepted.
_LOG_LIMITS: Final = TreeLimits(
    max_depth=1 << 16,
    max_ops=1 << 30,
    max_name=1 << 30,
    max_text=1 << 30,
    max_value=1 << 30,
    max_ttl=1e15,
)

#: A connection in the group: (replica id, connection number).
Owner = tuple[str, int]


class SnapshotError(Exception):
    """A snapshot could not be read (corrupt, another format, a forbidden object)."""


@attrs.frozen
class Barrier:
    """The output of an applied read barrier: the proposer now answers request ``request_id``
    of its connection from its applied state."""

    request_id: int


@attrs.frozen
class Genesis:
    """What a group is fixed with when its first replica creates it (etcd key ``genesis``):
    the group time of uptime 0 (wall-clock seconds), the fence base, the ``instance`` every
    replica's welcome names (so a client reconnecting to another replica knows it is the same
    state), and the limits every replica applies (determinism needs them equal)."""

    started_at: float
    instance: str
    authenticated: bool
    limits: dict[str, int]
    wait_limits: dict[str, int]

    def to_bytes(self) -> bytes:
        return pack(
            {
                "started_at": self.started_at,
                "instance": self.instance,
                "authenticated": self.authenticated,
                "limits": self.limits,
                "wait_limits": self.wait_limits,
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Genesis:
        w = unpack(data)
        return cls(
            float(w["started_at"]),
            str(w["instance"]),
            bool(w["authenticated"]),
            dict(w["limits"]),
            dict(w["wait_limits"]),
        )

    @property
    def fence_base(self) -> int:
        """Fences start above the creation time in µs, like a standalone server's."""
        return int(self.started_at * 1_000_000)


#: The limits of a genesis that are the door's subscription caps (the rest are the
#: engine's); a genesis written before them has none: the defaults apply.
FEED_LIMITS: Final = ("max_subscriptions", "max_subscriptions_per_principal")


def _feed_limits(genesis: Genesis) -> dict[str, int]:
    """The subscription caps ``genesis`` fixes, as ``LockCore`` takes them."""
    return {k: int(v) for k, v in genesis.limits.items() if k in FEED_LIMITS}


def encode_ops(ops: list[list[Any]]) -> bytes:
    """An entry's ops as the entry carries them: their msgpack array as a zlib stream --
    deflated, or, below :data:`STORED_BELOW` bytes, in one *stored* block (RFC 1950/1951:
    the bytes as they are, with their length and Adler-32). Both inflate alike, so a
    replica of any version of format 2 or 3 reads either (the format is unchanged)."""
    raw = pack(ops)
    if len(raw) < STORED_BELOW:
        return _stored(raw)
    return zlib.compress(raw, 1)


def _stored(raw: bytes) -> bytes:
    """``raw`` as a zlib stream of one final stored block (at most 65,535 bytes): CMF 0x78
    (deflate, 32 KiB window), FLG 0x01 (no dictionary, level "fastest", a header that is a
    multiple of 31), BFINAL=1 and BTYPE=00, LEN and its complement, the bytes, Adler-32."""
    n = len(raw)
    return b"\x78\x01\x01" + _STORED_HEAD.pack(n, n ^ 0xFFFF) + raw + _ADLER.pack(zlib.adler32(raw))


def decode_ops(packed: bytes | list[list[Any]]) -> list[list[Any]]:
    """The ops :func:`encode_ops` made ``packed`` of (formats 2 and 3), or ``packed`` itself
    when it is the list a format-1 entry holds; ValueError when they do not inflate
    (completely, within :data:`MAX_OPS_BYTES`, with nothing after them) to an array."""
    if isinstance(packed, list):
        return packed
    inflater = zlib.decompressobj()
    try:
        raw = inflater.decompress(packed, MAX_OPS_BYTES)
    except zlib.error as exc:
        raise ValueError(f"a log entry's ops do not inflate ({exc})") from None
    if inflater.unconsumed_tail or not inflater.eof or inflater.unused_data:
        raise ValueError(
            "a log entry's ops are truncated, followed by other bytes, or inflate past "
            f"{MAX_OPS_BYTES} bytes"
        )
    ops = unpack(raw)
    if type(ops) is not list:
        raise ValueError(f"a log entry's ops are a {type(ops).__name__}, not an array")
    return ops


def encode_entry(
    replica: str,
    batch: int,
    stamp: float,
    trust: float,
    ops: list[list[Any]] | bytes,
    *,
    registration: int = 0,
    base: int = 0,
) -> bytes:
    """One log entry (a batch of ops proposed by ``replica`` registered at revision
    ``registration``, stamped after it had applied revision ``base``), unsealed; ``ops`` as a
    list, or as :func:`encode_ops` encoded it (a proposer that measured its size)."""
    packed = ops if isinstance(ops, bytes) else encode_ops(ops)
    return pack([ENTRY_FORMAT, replica, registration, batch, stamp, base, trust, packed])


class EntryFormatError(ValueError):
    """A log entry of a format this version does not know. Unlike a malformed entry, which
    every replica of the same version meets alike (and skips alike), this one is applied by
    the replicas that know its format: a replica that skipped it would diverge from them."""


class EntryKeyError(ValueError):
    """A log entry sealed with a key this replica does not hold but a registered replica of
    the group does: it is most likely that replica's entry, which the others apply; a replica
    that skipped it would diverge from them (a rotation of the secret out of order)."""


class Entry(NamedTuple):
    """A decoded entry's fields (formats 1 and 2 carry no ``registration`` and ``base``:
    -1). ``ops`` is as the entry carries them until :func:`decode_ops` (or a list, from
    :func:`decode_entry`)."""

    replica: str
    registration: int
    batch: int
    stamp: float
    base: int
    trust: float
    ops: Any


def decode_header(data: bytes, *, legacy: bool = True) -> Entry:
    """The fields of an (unsealed) entry, its ops as :func:`encode_ops` made them (formats 2
    and 3) or as a list (format 1); ``legacy``: formats 1 and 2 (written before format 3, read
    still in a group without a secret, so a group restarted on this version applies the log
    its previous version left) are entries too. EntryFormatError for another format number
    (the message names it); ValueError when it is no entry."""
    w = unpack(data)
    fmt = w[0] if type(w) is list and w else None
    if type(fmt) is int and fmt not in (1, 2, ENTRY_FORMAT):
        raise EntryFormatError(
            f"a log entry of format {fmt}, which this version cannot apply (it applies "
            f"format {ENTRY_FORMAT}{' and formats 1 and 2' if legacy else ''}): a replica of "
            "a newer version wrote it; every replica of a group must run the same entry "
            "format (docs/replication.md, 'Upgrading')"
        )
    if fmt == ENTRY_FORMAT and len(w) == 8 and type(w[7]) is bytes:
        return Entry(str(w[1]), int(w[2]), int(w[3]), float(w[4]), int(w[5]), float(w[6]), w[7])
    if legacy and len(w) == 6 and (fmt, type(w[5])) in ((2, bytes), (1, list)):
        return Entry(str(w[1]), -1, int(w[2]), float(w[3]), -1, float(w[4]), w[5])
    raise ValueError(
        f"not a log entry of format {ENTRY_FORMAT}{' (or 2, or 1)' if legacy else ''} (its "
        f"format: {fmt!r}): every replica of a group must run the same entry format"
    )


def decode_entry(data: bytes) -> Entry:
    """An (unsealed) entry's fields, its ops decoded; ValueError when it is not one."""
    entry = decode_header(data)
    return entry._replace(ops=decode_ops(entry.ops))


def wire(request: Any) -> dict[str, Any]:
    """A client request as the wire map an op carries."""
    return request_to_wire(request)


class GroupState:
    """The replicated state: the lock core and the group's bookkeeping around it (live
    replicas, their connections, the last batch of each, group time, the last revision,
    the clock's bookkeeping).

    ``apply_*`` calls return the door's outputs (addresses ``((replica, conn), request id)``);
    the caller keeps those of its own replica. With ``sealer`` (a group secret), entries and
    registrations are authenticated first; a group is sealed or not from its creation (the
    replica checks its genesis), so every replica of it passes a sealer, or none does."""

    def __init__(self, genesis: Genesis) -> None:
        self.genesis = genesis
        limits = genesis.limits
        self.core: LockCore[Owner] = LockCore(
            started_at=genesis.started_at,
            host="",
            fence_epoch=genesis.fence_base,
            limits=EngineLimits(**{k: v for k, v in limits.items() if k not in FEED_LIMITS}),
            wait_limits=WaitLimits(**genesis.wait_limits),
            authenticated=genesis.authenticated,
            **_feed_limits(genesis),
        )
        self.now = genesis.started_at
        self.trust = 1.0
        self.revision = 0
        # replica id -> its address, in registration order
        self.replicas: dict[str, str] = {}
        self._defaults()
        # replica id -> its connections that made calls (insertion-ordered: determinism)
        self.owners: dict[str, dict[Owner, None]] = {}
        # replica id -> the last batch of it applied
        self.batches: dict[str, int] = {}
        self.entries = 0
        self.skipped = 0

    def _defaults(self) -> None:
        """The bookkeeping a snapshot of the version before issue 29 does not hold."""
        # replica id -> the revision of its registration, and the key ids it holds (its
        # signing key first; empty without a secret)
        self.registrations: dict[str, int] = {}
        self.keysets: dict[str, tuple[bytes, ...]] = {}
        # replica id -> the revision of its last clamped stamp
        self.clamped_at: dict[str, int] = {}
        self.rejected = 0  # entries and registrations that failed authentication
        self.clamped = 0  # stamps that would have moved time past the window
        self.jumps = 0  # witness jumps applied, and the seconds they moved time
        self.jumped = 0.0
        # sessions, entry TTLs and waits a jump moved forward (since the witness's anchor)
        self.graced = 0
        self.skipped_revisions = 0  # revisions skipped as told (--skip-revision)
        # key id -> the last revision at which an entry sealed with it was applied
        self.signers: dict[bytes, int] = {}
        # The witness: (etcd lease, its TTL, group time at its grant), None when unknown or
        # void (a clamp since: time was lost that the lease would count)
        self.witness: tuple[int, int, float] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        # The saved attributes in their order (a fingerprint compares it), then what a snapshot
        # of the version before issue 29 lacks.
        self.__dict__.update(state)
        fresh = GroupState.__new__(GroupState)
        fresh._defaults()
        for name, value in fresh.__dict__.items():
            self.__dict__.setdefault(name, value)

    # --- events of the log --------------------------------------------------------------------

    def apply_entry(
        self,
        data: bytes,
        revision: int,
        decoded: Callable[[str, int], list[Any] | None] | None = None,
        sealer: Sealer | None = None,
    ) -> list[Output[Owner]]:
        """Apply one log entry found at ``revision``. An entry that does not open with
        ``sealer`` (given: the group has a secret) is rejected (counted) and changes nothing;
        neither does one of a replica that is not registered (gone, or never), one naming
        another registration of its replica (a replay), nor one of a batch applied already.

        ``decoded(replica, batch)``, when given, may return the entry's requests as the
        proposer held them (one per op, None where it holds none): the request of an
        execute op is taken from there instead of decoded from its wire map again. That
        changes no outcome: the wire map is ``request_to_wire`` of that very request, and
        decoding it gives an equal request (the protocol's round trip) -- the proposer only
        skips the work the others do."""
        self.revision = revision
        if sealer is not None:
            body = sealer.open(data)
            if body is None:
                self._unopened(data, sealer)
                return []
            self.signers[Sealer.key_ids(data)[0]] = revision
            data = body
        replica, registration, batch, stamp, base, trust, packed = decode_header(
            data, legacy=sealer is None
        )
        held = decoded(replica, batch) if decoded is not None else None
        if replica not in self.replicas or batch <= self.batches.get(replica, 0):
            self.skipped += 1
            return []
        if sealer is not None and registration != self.registrations.get(replica):
            self.rejected += 1  # sealed for another registration of its replica: a replay
            return []
        ops = decode_ops(packed)
        self.batches[replica] = batch
        self.entries += 1
        now = self._time(replica, stamp, base, revision)
        self.trust = trust
        core = self.core
        floor = self.genesis.fence_base + revision * FENCES_PER_REVISION
        out = core.advance(now, trust=trust, fence_floor=floor)
        owners = self.owners.setdefault(replica, {})
        requests = held if held is not None and len(held) == len(ops) else None
        for i, op in enumerate(ops):
            kind = op[0]
            if kind in ("j", "k"):
                now = self._clock_op(op, now, trust, out)
                continue
            request = None if requests is None else requests[i]
            out += self._op(replica, owners, op, now, trust, request)
        return out

    def _unopened(self, data: bytes, sealer: Sealer) -> None:
        """An entry that does not open: rejected and counted, unless a registered replica
        declared the key it names and this one does not hold it (EntryKeyError)."""
        declared = {kid for held in self.keysets.values() for kid in held}
        for kid in Sealer.key_ids(data):
            if kid in declared and not sealer.holds(kid):
                raise EntryKeyError(
                    f"a log entry is sealed with key {kid.hex()}, which a replica of the group "
                    "holds and this one does not: it cannot apply the log alike with the "
                    "others. Give it that key too, until the group has written a snapshot "
                    "past the last entry sealed with it (docs/replication.md, 'Rotating the "
                    "group secret')"
                )
        self.rejected += 1

    def apply_registered(
        self, replica: str, value: bytes | str, revision: int, sealer: Sealer | None = None
    ) -> list[Output[Owner]]:
        """A replica registered (its key was put): its entries count from now on. ``value``:
        its address (str, or the key's bytes); with ``sealer``, the sealed record of its id,
        address and key ids (one that does not open, names another id, or re-registers a
        registered id is rejected and counted)."""
        self.revision = revision
        if replica in self.replicas:  # a replica never puts its key twice: a replay
            self.rejected += 1
            return []
        keys: tuple[bytes, ...] = ()
        if sealer is None:
            address = value if isinstance(value, str) else value.decode()
        else:
            body = sealer.open(value.encode() if isinstance(value, str) else value)
            record = None if body is None else unpack(body)
            if (
                type(record) is not list
                or len(record) != 3
                or record[0] != replica
                or type(record[1]) is not str
                or type(record[2]) is not list
                or not record[2]
                or not all(type(k) is bytes for k in record[2])
            ):
                self.rejected += 1
                return []
            address, keys = record[1], tuple(record[2])
        self.replicas[replica] = address
        self.registrations[replica] = revision
        self.keysets[replica] = keys
        return []

    def apply_departed(self, replica: str, revision: int) -> list[Output[Owner]]:
        """A replica's key went (its lease lapsed, or it left): every connection of it is
        gone now, on every replica; its later entries are ignored."""
        self.revision = revision
        if self.replicas.pop(replica, None) is None:
            return []
        self.batches.pop(replica, None)
        self.registrations.pop(replica, None)
        self.keysets.pop(replica, None)
        self.clamped_at.pop(replica, None)
        out: list[Output[Owner]] = []
        core = self.core
        for owner in self.owners.pop(replica, {}):
            out += core.owner_gone(owner, now=self.now, trust=self.trust)
        return out

    def apply_skipped(self, revision: int) -> list[Output[Owner]]:
        """The entry at ``revision`` is skipped as the operator told every replica
        (``--skip-revision``): nothing of it applies."""
        self.revision = revision
        self.skipped_revisions += 1
        return []

    # --- what the group knows of its replicas -------------------------------------------------

    def key_conflict(self, replica: str, ids: tuple[bytes, ...]) -> str | None:
        """Why ``replica`` (holding the key ids ``ids``, its signing key first) cannot apply
        the log alongside the replicas registered now: one of them signs with a key it does
        not hold (it would reject that replica's entries), or does not hold its signing key
        (that replica would reject its entries); None when there is no such conflict."""
        for other, held in self.keysets.items():
            if other == replica or not held:
                continue
            address = self.replicas.get(other, "?")
            if held[0] not in ids:
                return (
                    f"replica {other} ({address}) signs its entries with key {held[0].hex()}, "
                    "which this replica does not hold"
                )
            if ids[0] not in held:
                return (
                    f"replica {other} ({address}) does not hold this replica's signing key "
                    f"{ids[0].hex()}"
                )
        return None

    def retired_signers(self) -> dict[bytes, int]:
        """The keys that sealed applied entries but are no registered replica's signing key
        any more (a rotation), each with the last revision it sealed."""
        signing = {held[0] for held in self.keysets.values() if held}
        return {kid: rev for kid, rev in self.signers.items() if kid not in signing}

    def writer(self) -> str | None:
        """The replica that writes snapshots and anchors the witness: the registered replica
        with the smallest id among those that have proposed an entry (so an id whose
        registration was put again by someone else, which proposes nothing, is never it)."""
        active = [r for r in self.replicas if r in self.batches]
        return min(active) if active else None

    def witness_time(self, remaining: int, granted: int) -> float | None:
        """The group's time by the witness, given what etcd says of its lease now (seconds
        remaining, TTL granted; remaining <= 0: gone): its anchor plus the seconds etcd has
        counted since its grant, less a margin (the TTL's rounding, the window, a heartbeat),
        so it never runs ahead of real time. None when there is no valid witness or its lease
        is gone (unknown: a lease can be revoked by anyone who writes to etcd)."""
        witness = self.witness
        if witness is None or remaining <= 0 or granted <= 0:
            return None
        _, _, anchored = witness
        counted = max(0, granted - remaining - 1)
        return anchored + counted - CLOCK_WINDOW - HEARTBEAT

    # --- time ---------------------------------------------------------------------------------

    def _time(self, replica: str, stamp: float, base: int, revision: int) -> float:
        """The group's time for an entry of ``replica`` stamped ``stamp`` after it applied
        revision ``base`` (the module's rule: the window, the clamp, the stamps in flight)."""
        now = self.now
        if stamp <= now:
            return now
        if base >= 0 and base < self.clamped_at.get(replica, -1):
            # Stamped before its proposer applied its clamped stamp: its clock may still be
            # the one that leapt. It moves nothing.
            self.clamped += 1
            return now
        if stamp > now + CLOCK_WINDOW:
            self.clamped += 1
            self.clamped_at[replica] = revision
            self.witness = None  # real time passed that the group's time did not count
            stamp = now + CLOCK_WINDOW
        self.now = stamp
        return stamp

    def _clock_op(self, op: list[Any], now: float, trust: float, out: list[Output[Owner]]) -> float:
        """Apply a witness op (``k``: anchor, ``j``: jump); the entry's time from now on."""
        if op[0] == "k":
            lease, ttl, claim = int(op[1]), int(op[2]), float(op[3])
            self.witness = (lease, ttl, min(claim, now))
            return now
        value = float(op[1])
        if value <= now:
            return now
        # The jump may expire only what was idle since before the witness's anchor: real
        # time since such a use is at least what the jump counts. Where in the span since
        # the anchor the time was lost is unknown (a whole group down, or every replica's
        # watch stalled while clients were served from lagging time), so a session used
        # since then keeps the time it was promised: it expires the jump later. So do an
        # entry's TTL and a wait's deadline, chosen in real time by their clients.
        witness = self.witness
        since = -math.inf if witness is None else witness[2]
        self.graced += sum(self.core.grace(since, value - now))
        self.jumps += 1
        self.jumped += value - now
        self.now = value
        out += self.core.advance(value, trust=trust)
        return value

    # --- ops ----------------------------------------------------------------------------------

    def _op(
        self,
        replica: str,
        owners: dict[Owner, None],
        op: list[Any],
        now: float,
        trust: float,
        request: Any = None,
    ) -> list[Output[Owner]]:
        kind = op[0]
        if kind == "t":
            return []
        owner = (replica, int(op[1]))
        core = self.core
        if kind == "x":
            owners[owner] = None
            msg: Any = request_from_wire(op[3], _LOG_LIMITS) if request is None else request
            assert type(msg) is Execute
            # A session's parked requests follow the session (the door's rule for sites).
            return core.execute(
                owner,
                msg.request_id,
                msg.session,
                msg.transaction,
                msg.wait,
                now,
                trust,
                op[2],
                site=replica,
            )
        if kind == "g":
            owners.pop(owner, None)
            return core.owner_gone(owner, now=now, trust=trust)
        if kind == "b":
            return [((owner, int(op[2])), Barrier(int(op[2])))]  # type: ignore[list-item]
        owners[owner] = None
        if kind == "e":
            msg = request_from_wire(op[4], _LOG_LIMITS)
            assert type(msg) is EndSession
            return core.end_session(
                owner,
                msg.request_id,
                msg.session_id,
                now=now,
                trust=trust,
                principal=op[2],
                admin=bool(op[3]),
            )
        msg = request_from_wire(op[2], _LOG_LIMITS)
        if kind == "c":
            assert type(msg) is Cancel
            return core.cancel(owner, msg.request_id, msg.target_id, now=now, trust=trust)
        if kind == "r":
            assert type(msg) is ForceRelease
            return core.release(
                owner,
                msg.request_id,
                msg.namespace,
                msg.table,
                msg.var,
                msg.session,
                now=now,
                trust=trust,
            )
        if kind == "s":
            assert type(msg) is Subscribe
            # The principal came with the op since the subscription caps (none before).
            principal = str(op[3]) if len(op) > 3 else ""
            return core.subscribe(owner, msg.request_id, msg.namespace, msg.table, principal)
        if kind == "u":
            assert type(msg) is Unsubscribe
            return core.unsubscribe(owner, msg.request_id, msg.target)
        raise ValueError(f"unknown op kind {kind!r}")

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The whole state as bytes (a pickle: every replica runs the same code; see
        :func:`restore` for what it may contain). The same format from the pure and the
        compiled build, and either loads in either (``_Pickler``)."""
        out = io.BytesIO()
        _Pickler(out, protocol=5).dump(self)
        return out.getvalue()

    @staticmethod
    def restore(data: bytes) -> GroupState:
        """The state a :meth:`snapshot` saved. Only the engine's, the protocol's and a few
        builtin types may appear in it (SnapshotError otherwise): a snapshot in etcd cannot
        make a replica run anything."""
        try:
            state = _Unpickler(io.BytesIO(data)).load()
        except SnapshotError:
            raise
        except Exception as exc:
            raise SnapshotError(f"snapshot unreadable: {exc}") from exc
        if type(state) is not GroupState:
            raise SnapshotError(f"snapshot holds a {type(state).__name__}, not a GroupState")
        # The feed's indexes are rebuilt (a snapshot of an older version keeps others).
        state.core.restored(**_feed_limits(state.genesis))
        return state

    def fingerprint(self) -> bytes:
        """The whole state as comparable bytes: equal on two replicas that applied the same
        log, whatever their hash seeds and whichever objects each happens to share (every
        object is written out by value, in its pickled form; its repr, not a pickle, whose
        memo would show which equal strings are the same object)."""
        return repr(_by_value(self, set())).encode()


_PRIMITIVE: Final = (str, bytes, int, float, bool, type(None))


def _by_value(obj: Any, path: set[int]) -> Any:
    """``obj`` as nested tuples of primitives: each object as its type's name and what its
    pickled form carries (a reference back up the path, a cycle, as ``("cycle",)``)."""
    if isinstance(obj, _PRIMITIVE):
        return obj
    if id(obj) in path:
        return ("cycle",)
    path.add(id(obj))
    try:
        if isinstance(obj, (list, tuple)):
            return (type(obj).__name__, tuple(_by_value(x, path) for x in obj))
        if type(obj) is dict:
            return ("dict", tuple((_by_value(k, path), _by_value(v, path)) for k, v in obj.items()))
        if isinstance(obj, (set, frozenset)):
            return (type(obj).__name__, tuple(sorted(repr(_by_value(x, path)) for x in obj)))
        if isinstance(obj, type):
            return ("type", obj.__module__, obj.__qualname__)
        reduced = _reduce(obj)
        parts = [_by_value(x, path) for x in reduced[1:3]]
        if len(reduced) > 3 and reduced[3] is not None:
            parts.append(tuple(_by_value(x, path) for x in reduced[3]))
        if len(reduced) > 4 and reduced[4] is not None:
            parts.append(tuple(_by_value(x, path) for x in reduced[4]))
        return (type(obj).__module__, type(obj).__qualname__, tuple(parts))
    finally:
        path.discard(id(obj))


_ALLOWED_BUILTINS: Final = frozenset(
    {"dict", "list", "set", "frozenset", "tuple", "str", "bytes", "int", "float", "bool", "slice"}
)
_ALLOWED_PREFIXES: Final = ("lockserver.engine.", "lockserver.replication._group", "protocol.")


# The modules of the build switch (lockserver/_build.py): their classes pickle differently in
# the two builds (a pure slotted object's state is (None, {slot: value}); a compiled one's is
# mypyc's {attribute: value}, and it has a __setstate__ that takes only that), so the snapshot
# writes them in one form of its own, which ``_set_attributes`` restores in either build.
# ShardedDict (and BigTable) keep their own hash-independent state, the same in both.
# Restoring makes each object with ``cls.__new__(cls)``: a compiled class's __new__ runs
# __init__ (with no arguments: refused) unless the class allows interpreted subclasses, which
# is why the engine's classes a snapshot holds are marked so (mypyc's ``serializable`` would
# say the same, but its classes are then left uninitialised when made from Python).
_SWITCHED: Final = frozenset(COMPILED_MODULES)
# By type, not isinstance: a compiled ShardedDict (an ABC) claims every dict as an instance.
_OWN_STATE: Final = (ShardedDict, BigTable)


def _reduce(obj: Any) -> tuple[Any, ...]:
    """``obj``'s pickled form (``__reduce_ex__``), the same in both builds for the classes of
    the build switch: their attributes as one dict, sorted by name."""
    reduced = obj.__reduce_ex__(5)  # (copyreg.__newobj__, (cls,), state, items...)
    cls = type(obj)
    if cls.__module__ not in _SWITCHED or cls in _OWN_STATE or isinstance(obj, BaseException):
        return reduced  # type: ignore[no-any-return]
    state = reduced[2] if len(reduced) > 2 else None
    if type(state) is tuple:  # (the __dict__ or None, the slots)
        state = {**(state[0] or {}), **state[1]}
    listitems = reduced[3] if len(reduced) > 3 else None
    dictitems = reduced[4] if len(reduced) > 4 else None
    state = dict(sorted((state or {}).items()))
    return (reduced[0], reduced[1], state, listitems, dictitems, _set_attributes)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj).__module__ not in _SWITCHED:
            return NotImplemented
        return _reduce(obj)


def _set_attributes(obj: Any, state: dict[str, Any]) -> None:
    """Restore what ``_Pickler`` wrote of ``obj``."""
    for name, value in state.items():
        setattr(obj, name, value)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "lockserver._group":  # this module's name before issue 32's move
            module = __name__
        if module == "builtins" and name in _ALLOWED_BUILTINS:
            return super().find_class(module, name)
        if module == "copyreg" and name in ("_reconstructor", "__newobj__"):
            return super().find_class(module, name)
        if module.startswith(_ALLOWED_PREFIXES) or module == "collections":
            if module == "collections" and name not in ("deque", "OrderedDict"):
                raise SnapshotError(f"snapshot names a forbidden object {module}.{name}")
            return super().find_class(module, name)
        raise SnapshotError(f"snapshot names a forbidden object {module}.{name}")
