"""A replicated group's state machine: the log's entries, their encoding, and applying them
through the lock core's door (``GroupState``). Pure and synchronous: no sockets, no clock, no
etcd. The trio side that proposes entries to etcd and watches them is ``_replica.py``.

Why this shape (issue 18, docs/replication.md): etcd is the group's ordered, replicated log,
the lock core is its state machine. Every replica applies the same entries, in etcd revision
order, through the same door calls with the same ``now`` and ``trust``: so every replica holds
the same lock state, and the replica that received a request answers it once it has applied
the entry carrying it. Nothing here reads a clock: an entry carries its proposer's clock and
trust reading, and time in the group is ``now = max(previous now, stamp)``.

Rules kept:

- **Deterministic**: ``apply`` of the same events (entries, replica registrations and
  departures, each with its revision) in the same order gives the same outputs and the same
  state on any replica, whatever its hash seed (the door's own rule, and
  ``ShardedDict``'s hash-independent pickling for snapshots).
- **Owners are names, not objects**: a connection is ``(replica id, connection number)``. Each
  replica maps its own names to its sockets; outputs addressed to another replica's
  connections are that replica's to send.
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

Entry (msgpack): ``[2, replica, batch, stamp, trust, ops]``, ``ops`` being the msgpack array
of the entry's ops deflated (zlib, level 1; :func:`encode_ops`): an entry is written to
etcd's WAL and database and sent to every watcher base64'd in JSON, and its ops repeat
sessions, namespaces and keys, so deflating it cuts what etcd and every replica handle
several-fold (measured on lockbench's load: a 64-op entry of 7.9 kB deflates to 0.7 kB, in
24 µs; inflating takes 10 µs). The header stays plain: an entry that is skipped (its replica
is not registered, its batch applied already) is not inflated. Format 1 (the same with the
ops array itself in place of its deflated bytes) is still applied: a group restarted on this
version applies the log its previous version wrote. Decoding is strict: ops that do not
inflate, inflate past :data:`MAX_OPS_BYTES` or hold anything but an array raise ValueError
(every replica of the version meets such an entry alike and skips it alike); another format
number raises :class:`EntryFormatError`: a newer replica wrote it and the replicas that know
it apply it, so a replica that meets it stops (``_replica.ReplicaHalted``) rather than
diverge. Op (a list, first item its kind):

- ``["x", conn, principal, request]`` execute; ``["e", conn, principal, admin, request]`` end;
  ``["c", conn, request]`` cancel; ``["r", conn, request]`` force-release;
  ``["s", conn, request, principal]`` subscribe (a log of an older version: without the
  principal); ``["u", conn, request]`` unsubscribe -- ``request`` is
  the client's request as its protocol wire map (``protocol.request_to_wire``);
- ``["g", conn]`` the connection closed; ``["b", conn, request id]`` a read barrier (the
  proposer answers a read from its applied state once the barrier is applied: reads never see
  state older than the request); ``["t"]`` a tick (time passes: expiries, wait deadlines).
"""

from __future__ import annotations

import io
import pickle
import zlib
from collections.abc import Callable, Hashable
from typing import Any, Final

import attrs

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

from ._build import COMPILED_MODULES
from .engine import BigTable, EngineLimits, LockCore, Output, ShardedDict, WaitLimits

__all__ = [
    "ENTRY_FORMAT",
    "EntryFormatError",
    "MAX_OPS_BYTES",
    "Barrier",
    "Genesis",
    "GroupState",
    "SnapshotError",
    "decode_entry",
    "decode_header",
    "decode_ops",
    "encode_entry",
    "encode_ops",
]

#: The entry format this code writes and the only one it applies (every replica of a group
#: runs the same format: docs/replication.md, "Upgrading").
ENTRY_FORMAT: Final = 2
#: Bytes an entry's ops may inflate to (a bound against a corrupt entry; a proposer's entry
#: is far below it: etcd takes at most ~1.5 MiB per value, and ops deflate ~10-fold).
MAX_OPS_BYTES: Final = 1 << 28
#: Grants one entry may make before its fences would reach the next revision's.
FENCES_PER_REVISION: Final = 1 << 16
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
    """An entry's ops as the entry carries them: their msgpack array, deflated."""
    return zlib.compress(pack(ops), 1)


def decode_ops(packed: bytes | list[list[Any]]) -> list[list[Any]]:
    """The ops :func:`encode_ops` made ``packed`` of (format 2), or ``packed`` itself when
    it is the list a format-1 entry holds; ValueError when they do not inflate (completely,
    within :data:`MAX_OPS_BYTES`, with nothing after them) to an array."""
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
    replica: str, batch: int, stamp: float, trust: float, ops: list[list[Any]] | bytes
) -> bytes:
    """One log entry (a batch of ops proposed by ``replica``); ``ops`` as a list, or as
    :func:`encode_ops` encoded it (a proposer that measured its size)."""
    packed = ops if isinstance(ops, bytes) else encode_ops(ops)
    return pack([ENTRY_FORMAT, replica, batch, stamp, trust, packed])


class EntryFormatError(ValueError):
    """A log entry of a format this version does not know. Unlike a malformed entry, which
    every replica of the same version meets alike (and skips alike), this one is applied by
    the replicas that know its format: a replica that skipped it would diverge from them."""


def decode_header(data: bytes) -> tuple[str, int, float, float, bytes | list[list[Any]]]:
    """(replica, batch, stamp, trust, ops) of an entry, its ops as :func:`encode_ops` made
    them (format 2) or as a list (format 1, written before format 2: read still, so a group
    restarted on this version applies the log its previous version left); ValueError when
    it is neither (the message names the format it has)."""
    w = unpack(data)
    if type(w) is list and len(w) == 6 and type(w[0]) is int and w[0] not in (1, ENTRY_FORMAT):
        raise EntryFormatError(
            f"a log entry of format {w[0]}, which this version cannot apply (it applies "
            f"formats 1 and {ENTRY_FORMAT}): a replica of a newer version wrote it; every "
            "replica of a group must run the same entry format (docs/replication.md, "
            "'Upgrading')"
        )
    if (
        type(w) is not list
        or len(w) != 6
        or (w[0], type(w[5])) not in ((ENTRY_FORMAT, bytes), (1, list))
    ):
        found = w[0] if type(w) is list and w else None
        raise ValueError(
            f"not a log entry of format {ENTRY_FORMAT} or 1 (its format: {found!r}): every "
            "replica of a group must run the same entry format"
        )
    return str(w[1]), int(w[2]), float(w[3]), float(w[4]), w[5]


def decode_entry(data: bytes) -> tuple[str, int, float, float, list[list[Any]]]:
    """(replica, batch, stamp, trust, ops) of an entry; ValueError when it is not one."""
    replica, batch, stamp, trust, ops = decode_header(data)
    return replica, batch, stamp, trust, decode_ops(ops)


def wire(request: Any) -> dict[str, Any]:
    """A client request as the wire map an op carries."""
    return request_to_wire(request)


class GroupState:
    """The replicated state: the lock core and the group's bookkeeping around it (live
    replicas, their connections, the last batch of each, group time, the last revision).

    ``apply_*`` calls return the door's outputs (addresses ``((replica, conn), request id)``);
    the caller keeps those of its own replica."""

    def __init__(self, genesis: Genesis) -> None:
        self.genesis = genesis
        limits = genesis.limits
        self.core = LockCore(
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
        # replica id -> its connections that made calls (insertion-ordered: determinism)
        self.owners: dict[str, dict[tuple[str, int], None]] = {}
        # replica id -> the last batch of it applied
        self.batches: dict[str, int] = {}
        self.entries = 0
        self.skipped = 0

    # --- events of the log --------------------------------------------------------------------

    def apply_entry(
        self,
        data: bytes,
        revision: int,
        decoded: Callable[[str, int], list[Any] | None] | None = None,
    ) -> list[Output]:
        """Apply one log entry found at ``revision``. An entry of a replica that is not
        registered (gone, or never) or of a batch applied already changes nothing.

        ``decoded(replica, batch)``, when given, may return the entry's requests as the
        proposer held them (one per op, None where it holds none): the request of an
        execute op is taken from there instead of decoded from its wire map again. That
        changes no outcome: the wire map is ``request_to_wire`` of that very request, and
        decoding it gives an equal request (the protocol's round trip) -- the proposer only
        skips the work the others do."""
        self.revision = revision
        replica, batch, stamp, trust, packed = decode_header(data)
        held = decoded(replica, batch) if decoded is not None else None
        if replica not in self.replicas or batch <= self.batches.get(replica, 0):
            self.skipped += 1
            return []
        ops = decode_ops(packed)
        self.batches[replica] = batch
        self.entries += 1
        now = self.now if stamp < self.now else stamp
        self.now = now
        self.trust = trust
        core = self.core
        engine = core.engine
        floor = self.genesis.fence_base + revision * FENCES_PER_REVISION
        engine.fence = max(engine.fence, floor)
        out = core.advance(now, trust=trust)
        owners = self.owners.setdefault(replica, {})
        if held is not None and len(held) == len(ops):
            for op, request in zip(ops, held, strict=True):
                out += self._op(replica, owners, op, now, trust, request)
        else:
            for op in ops:
                out += self._op(replica, owners, op, now, trust)
        return out

    def apply_registered(self, replica: str, address: str, revision: int) -> list[Output]:
        """A replica registered (its key was put): its entries count from now on."""
        self.revision = revision
        self.replicas[replica] = address
        return []

    def apply_departed(self, replica: str, revision: int) -> list[Output]:
        """A replica's key went (its lease lapsed, or it left): every connection of it is
        gone now, on every replica; its later entries are ignored."""
        self.revision = revision
        if self.replicas.pop(replica, None) is None:
            return []
        self.batches.pop(replica, None)
        out: list[Output] = []
        core = self.core
        for owner in self.owners.pop(replica, {}):
            out += core.owner_gone(owner, now=self.now, trust=self.trust)
        return out

    # --- ops ----------------------------------------------------------------------------------

    def _op(
        self,
        replica: str,
        owners: dict[tuple[str, int], None],
        op: list[Any],
        now: float,
        trust: float,
        request: Any = None,
    ) -> list[Output]:
        kind = op[0]
        owner = (replica, int(op[1])) if kind != "t" else None
        core = self.core
        if kind == "x":
            owners[owner] = None  # type: ignore[index]
            msg: Any = request_from_wire(op[3], _LOG_LIMITS) if request is None else request
            assert type(msg) is Execute
            sid = msg.session.session_id
            out: list[Output] = []
            if core.waits.parked_count(sid):
                # A session's parked requests follow the session: used through this replica
                # now, its requests parked through another replica are answered (their
                # connection most likely died with that replica, before its lease lapsed;
                # granted later, they would hold a lock nobody knows of).
                out = core.drop_waits(sid, _of_replica(replica), now=now, trust=trust)
            return out + core.execute(
                owner, msg.request_id, msg.session, msg.transaction, msg.wait, now, trust, op[2]
            )
        if kind == "t":
            return []
        if kind == "g":
            owners.pop(owner, None)  # type: ignore[arg-type]
            return core.owner_gone(owner, now=now, trust=trust)
        if kind == "b":
            return [((owner, int(op[2])), Barrier(int(op[2])))]  # type: ignore[list-item]
        owners[owner] = None  # type: ignore[index]
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


def _of_replica(replica: str) -> Callable[[Hashable], bool]:
    """Whether an owner (a connection's name) is one of ``replica``'s."""

    def mine(owner: Any) -> bool:
        return bool(owner[0] == replica)

    return mine


_ALLOWED_BUILTINS: Final = frozenset(
    {"dict", "list", "set", "frozenset", "tuple", "str", "bytes", "int", "float", "bool", "slice"}
)
_ALLOWED_PREFIXES: Final = ("lockserver.engine.", "lockserver._group", "protocol.")


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
        if module == "builtins" and name in _ALLOWED_BUILTINS:
            return super().find_class(module, name)
        if module == "copyreg" and name in ("_reconstructor", "__newobj__"):
            return super().find_class(module, name)
        if module.startswith(_ALLOWED_PREFIXES) or module == "collections":
            if module == "collections" and name not in ("deque", "OrderedDict"):
                raise SnapshotError(f"snapshot names a forbidden object {module}.{name}")
            return super().find_class(module, name)
        raise SnapshotError(f"snapshot names a forbidden object {module}.{name}")
