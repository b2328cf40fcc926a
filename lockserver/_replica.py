"""A replica of a replicated group: proposes its clients' requests to the group's log in etcd,
applies the log through the group's state machine, answers its own clients.

``Replica`` is the trio side of ``_group.py``; ``ReplicatedDoor`` stands where the shell's
lock core stands in a single server, with the same calls: each call that would decide
something becomes an op in the next proposal and returns nothing now; its answer is delivered
when the entry that carries it has been applied (``Replica.on_outputs``, the shell's
delivery). The shell, the request handler and the HTTP face are the single server's.

Theory of operation (docs/replication.md):

- **Keys** under ``/lockserver/<group>/``: ``genesis`` (the group's fixed settings,
  ``_group.Genesis``), ``log`` (one key, put once per entry: the entries are its revisions,
  in etcd's order), ``replicas/<id>`` (a replica's address, held by its etcd lease),
  ``snapshot`` (the latest snapshot's revision and chunk count) and ``snapshot/<revision>/<i>``
  (its chunks).
- **Joining**: read or create the genesis; load the latest snapshot (or start empty at the
  genesis); register under a new id with a lease; watch the prefix from the snapshot's
  revision + 1 and apply everything in revision order; serve once the own registration has
  been applied.
- **Proposing**: ops collect while one put is in flight, so a busy replica sends many per
  etcd write (group commit; bounded by ``batch_ops`` and by etcd's request size). A put that
  fails is retried with the same batch number (the state machine skips a batch it has
  applied) until ``commit_timeout``; then the connections whose requests it carried are
  closed with UNAVAILABLE: their effect, if the put did land, is seen after reconnecting.
- **Time**: the group clock is this machine's wall clock (``time.time()`` read once, then
  trio's clock), stamped on each entry; the log makes it monotone. Ticks are proposed when
  the applied state has a deadline due (expiries, waits) and no tick of this replica is on its
  way.
- **Leaving**: a replica whose lease lapsed (cut off, paused, dead) has its registration key
  deleted by etcd; applying that deletion drops its connections everywhere. When a replica
  sees its own departure (or its keepalive fails) it closes every client connection and
  registers again under a new id.
- **Snapshots**: the replica with the smallest id among the registered ones writes one every
  ``snapshot_every`` applied entries (and at most every ``snapshot_interval`` seconds when
  something happened), then deletes older chunks and compacts etcd to its revision. A
  replica whose watch falls behind a compaction loads the snapshot again (its connections
  are closed: answers in the skipped entries cannot be delivered).
"""

from __future__ import annotations

import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Hashable
from typing import Any, Final

import attrs
import trio

from protocol import (
    Cancel,
    Cause,
    EndSession,
    ErrorCode,
    Execute,
    ForceRelease,
    ListQuery,
    SessionSpec,
    Status,
    Subscribe,
    Transaction,
    TransactionResult,
    Unsubscribe,
    pack,
    unpack,
)

from ._etcd import Compacted, Etcd, EtcdError, LeaseGone
from ._group import (
    Barrier,
    EntryFormatError,
    Genesis,
    GroupState,
    encode_entry,
    encode_ops,
    wire,
)
from ._peer import Peer
from .engine import (
    CoreStatistics,
    Engine,
    LockCore,
    Output,
    SessionsListing,
    Visibility,
    VisibleCounts,
)

__all__ = ["ReplicaHalted", "ReplicatedDoor", "Replica", "ReplicationSettings", "group_prefix"]

log = logging.getLogger("lockserver.replica")


class ReplicaHalted(Exception):
    """This replica cannot go on applying the group's log (an entry of a format it does not
    know): it stops rather than serve from state the rest of the group no longer has. The
    ``lockserver`` command exits with status 1 and the message."""


#: Bytes of one etcd value this side writes at most (etcd refuses requests past ~1.5 MiB).
VALUE_LIMIT: Final = 1_000_000


@attrs.frozen
class ReplicationSettings:
    """How a replica uses etcd (``--replicate``, ``--group``, docs/replication.md)."""

    endpoints: tuple[str, ...]
    group: str
    lease_ttl: int = 5
    batch_ops: int = 1024
    commit_timeout: float = 3.0
    snapshot_every: int = 10_000
    snapshot_interval: float = 60.0
    compact: bool = True


def group_prefix(group: str) -> bytes:
    """The etcd key prefix of ``group``'s keys."""
    return f"/lockserver/{group}/".encode()


class Replica:
    """One replica: its registration, proposals, the watch that applies the log, snapshots.

    Create with :meth:`join` (async: it reads etcd); run :meth:`run` in a nursery; the shell
    sets :attr:`on_outputs` (delivers outputs to this replica's peers) and :attr:`on_reset`
    (closes every client connection)."""

    def __init__(
        self,
        settings: ReplicationSettings,
        etcd: Etcd,
        address: str,
        genesis: Genesis,
        state: GroupState,
    ) -> None:
        self.settings = settings
        self.etcd = etcd
        self.address = address
        self.genesis = genesis
        self.state = state
        self.prefix = group_prefix(settings.group)
        self.log_key = self.prefix + b"log"
        self.replicas_prefix = self.prefix + b"replicas/"
        self.rid = ""
        self.started = trio.current_time()  # this replica's own uptime counts from here
        self.lease = 0
        self.batch = 0
        # the group clock: wall-clock seconds, read once, then trio's clock
        self.offset = time.time() - trio.current_time()
        # this replica's connections: peer <-> number
        self._numbers: dict[Peer, int] = {}
        self._peers: dict[int, Peer] = {}
        self._next = 0
        self._ops: list[list[Any]] = []
        # the request each op carries, as this replica decoded it from its client (None for
        # ops without one), parallel to _ops; then per proposed entry (rid, batch) until it
        # is applied: applying its own entry, a replica does not decode them again
        self._requests: list[Any] = []
        self._proposed: dict[tuple[str, int], list[Any]] = {}
        self._have_ops = trio.Event()
        self.tick_pending = False
        self._reads: dict[tuple[int, int], Callable[[], list[Output]]] = {}
        self.registered = trio.Event()
        self.registered_at = 0  # the revision of this replica's registration
        self.joined_at = 0  # the revision of the state it started from (a snapshot's, or 0)
        self.trust: Callable[[float], float] = lambda now: 1.0
        self.on_outputs: Callable[[list[Output]], None] = lambda outs: None
        self.on_reset: Callable[[str], None] = lambda why: None
        self.wake: Callable[[float], None] = lambda deadline: None
        self.on_replicas: Callable[[tuple[str, ...]], None] = lambda replicas: None
        self.applied_since_snapshot = 0
        self.snapshots_written = 0
        self.snapshots_loaded = 0
        self.commit_failures = 0
        self.resets = 0
        self.apply_errors = 0
        self.late_deliveries_refused = 0
        # When the last keepalive (or the registration) that succeeded was asked: the lease
        # lives at least lease_ttl past it. Not registered yet: no connection to guard.
        self._lease_from = math.inf
        self._withholding = False  # answers are being withheld (logged once per pause)
        self._reregister = False
        self.puts = 0
        self.ops_proposed = 0

    # --- joining ------------------------------------------------------------------------------

    @classmethod
    async def join(
        cls, settings: ReplicationSettings, etcd: Etcd, address: str, genesis: Genesis
    ) -> Replica:
        """Read (or create) the group's genesis and its latest state; not yet registered."""
        prefix = group_prefix(settings.group)
        key = prefix + b"genesis"
        created, _ = await etcd.put_if_absent(key, genesis.to_bytes())
        kv = await etcd.get(key)
        assert kv is not None
        found = Genesis.from_bytes(kv.value)
        if not created:
            differ = [
                name
                for name in ("authenticated", "limits", "wait_limits")
                if getattr(found, name) != getattr(genesis, name)
            ]
            if differ:
                # Determinism needs every replica to apply the same limits: the group's win.
                log.warning(
                    "group %r (instance %s) was created with other %s than this replica's "
                    "settings: the group's apply (docs/replication.md)",
                    settings.group,
                    found.instance,
                    " and ".join(differ),
                )
        state, from_snapshot = await load_state(etcd, prefix, found, kv.mod_revision)
        replica = cls(settings, etcd, address, found, state)
        replica.joined_at = state.revision
        replica.snapshots_loaded = int(from_snapshot)
        return replica

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, apply the log, propose, keep the lease, write snapshots; ``started``
        once this replica's registration has been applied (it serves from then on)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch_loop)
            await self._register()
            nursery.start_soon(self._keepalive_loop)
            nursery.start_soon(self._propose_loop)
            nursery.start_soon(self._snapshot_loop)
            await self.registered.wait()
            task_status.started()

    async def _register(self) -> None:
        self._unregistered()
        self.rid = secrets.token_hex(6)
        self.batch = 0
        asked = trio.current_time()
        lease, _ = await self.etcd.lease_grant(self.settings.lease_ttl)
        self.lease = lease
        self._lease_from, self._withholding = asked, False
        _, revision = await self.etcd.put_if_absent(
            self.replicas_prefix + self.rid.encode(), self.address.encode(), lease=lease
        )
        self.registered_at = revision
        log.info(
            "replica %s of group %r registered (revision %d)",
            self.rid,
            self.settings.group,
            revision,
        )

    # --- the clock ----------------------------------------------------------------------------

    def group_now(self) -> float:
        return trio.current_time() + self.offset

    # --- connections --------------------------------------------------------------------------

    def number(self, peer: Peer) -> int:
        n = self._numbers.get(peer)
        if n is None:
            self._next += 1
            n = self._numbers[peer] = self._next
            self._peers[n] = peer
        return n

    def forget(self, peer: Peer) -> int | None:
        n = self._numbers.pop(peer, None)
        if n is not None:
            self._peers.pop(n, None)
        return n

    # --- proposing ----------------------------------------------------------------------------

    def propose(self, op: list[Any], request: Any = None) -> None:
        """Add ``op`` to the next proposal; ``request`` is the request its wire map encodes
        (``request_to_wire(request)``), when it carries one."""
        self._ops.append(op)
        self._requests.append(request)
        self._have_ops.set()

    def _held(self, replica: str, batch: int) -> list[Any] | None:
        """The requests of this replica's entry ``batch`` as proposed (and forgotten now)."""
        if replica != self.rid or not self._proposed:
            return None
        return self._proposed.pop((replica, batch), None)

    def read(self, peer: Peer, request_id: int, answer: Callable[[Hashable], list[Output]]) -> None:
        """Answer a read once everything proposed before it has been applied: ``answer`` is
        called with the connection's name in the group then."""
        n = self.number(peer)
        name = (self.rid, n)
        self._reads[n, request_id] = lambda: answer(name)
        self.propose(["b", n, request_id])

    def _unregistered(self) -> None:
        """Until this replica's (new) registration is applied, proposals wait: an entry of a
        replica the group does not know is ignored, and its requests would go unanswered.
        (Only a set event is replaced, so nobody waits on one that is never set.)"""
        if self.registered.is_set():
            self.registered = trio.Event()

    async def _propose_loop(self) -> None:
        limit = self.settings.batch_ops
        while True:
            await self._have_ops.wait()
            self._have_ops = trio.Event()
            while self._ops:
                while not self.registered.is_set():
                    await self.registered.wait()
                ops, self._ops = self._ops[:limit], self._ops[limit:]
                requests, self._requests = self._requests[:limit], self._requests[limit:]
                done = 0
                for chunk, packed in _fit(ops):
                    await self._commit(chunk, packed, requests[done : done + len(chunk)])
                    done += len(chunk)

    async def _commit(self, ops: list[list[Any]], packed: bytes, requests: list[Any]) -> None:
        """Put one entry (``ops``, encoded as ``packed``), retried with the same batch number
        until ``commit_timeout``."""
        self.batch += 1
        if len(self._proposed) > 64:  # entries that never came back (a failed commit, a reset)
            self._proposed.clear()
        self._proposed[self.rid, self.batch] = requests
        data = encode_entry(
            self.rid, self.batch, self.group_now(), self.trust(trio.current_time()), packed
        )
        delay = 0.05
        with trio.move_on_after(self.settings.commit_timeout):
            while True:
                try:
                    await self.etcd.put(self.log_key, data)
                    self.puts += 1
                    self.ops_proposed += len(ops)
                    return
                except EtcdError as exc:
                    log.warning("replica %s: proposing failed, retrying: %s", self.rid, exc)
                    await trio.sleep(delay)
                    delay = min(delay * 2, 0.5)
        self.commit_failures += 1
        message = (
            f"this replica cannot reach the group's log (etcd) for "
            f"{self.settings.commit_timeout:g} s: nothing is answered here; reconnect to another "
            "replica (a request of this connection may have committed: see it there)"
        )
        for op in ops:
            if op[0] == "t":
                self.tick_pending = False
                continue
            peer = self._peers.get(int(op[1]))
            if peer is not None:
                peer.stop(ErrorCode.UNAVAILABLE, message)

    # --- applying -----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        backoff = 0.05
        while True:
            try:
                async with self.etcd.watch(
                    self.prefix, start_revision=self.state.revision + 1
                ) as batches:
                    backoff = 0.05
                    async for events in batches:
                        self._apply(events)
            except Compacted as exc:
                log.warning(
                    "replica %s: the log was compacted past what it applied (%d < %d): loading "
                    "the snapshot",
                    self.rid,
                    self.state.revision,
                    exc.compact_revision,
                )
                self.state, _ = await load_state(
                    self.etcd, self.prefix, self.genesis, self.state.revision
                )
                self.snapshots_loaded += 1
                self._reset("the replica reloaded the group's state from a snapshot")
                continue
            except EtcdError as exc:
                log.warning("replica %s: watching the log failed, resuming: %s", self.rid, exc)
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _apply(self, events: list[Any]) -> None:
        state = self.state
        outs: list[Output] = []
        log_key = self.log_key
        replicas = self.replicas_prefix
        for ev in events:
            try:
                outs += self._apply_event(ev, log_key, replicas)
            except EntryFormatError as exc:
                # The replicas that know the format apply it: skipping it would diverge.
                # Its clients are told at once and fail over; nothing of the entry applied.
                self.apply_errors += 1
                why = f"replica {self.rid} stopped at revision {ev.mod_revision}: {exc}"
                log.critical("%s", why)
                self._reset(why)
                raise ReplicaHalted(why) from exc
            except Exception:  # a bug: every replica meets it alike (the log is the same)
                self.apply_errors += 1
                log.exception(
                    "replica %s: applying revision %d failed; skipped", self.rid, ev.mod_revision
                )
                state.revision = max(state.revision, ev.mod_revision)
        try:
            self._deliver(outs)
        except Exception:
            self.apply_errors += 1
            log.exception("replica %s: delivering answers failed", self.rid)
        self.tick_pending = False  # time moved with what was applied: a new tick if due
        due = state.core.next_deadline()
        if due is not None:
            self.wake(due - self.offset)

    def _apply_event(self, ev: Any, log_key: bytes, replicas: bytes) -> list[Output]:
        state = self.state
        outs: list[Output] = []
        key = ev.key
        if key == log_key:
            if ev.kind == "put":
                outs += state.apply_entry(ev.value, ev.mod_revision, self._held)
                self.applied_since_snapshot += 1
        elif key.startswith(replicas):
            rid = key[len(replicas) :].decode()
            if ev.kind == "put":
                outs += state.apply_registered(rid, ev.value.decode(), ev.mod_revision)
                if rid == self.rid:
                    self.registered.set()
            else:
                outs += state.apply_departed(rid, ev.mod_revision)
                if rid == self.rid:
                    self._departed()
            self.on_replicas(tuple(dict.fromkeys(state.replicas.values())))
        else:
            state.revision = max(state.revision, ev.mod_revision)
        return outs

    def lease_may_have_lapsed(self, now: float) -> bool:
        """True when no keepalive asked within the lease TTL before ``now`` has succeeded:
        the lease may have lapsed (this replica was paused, or cut off from etcd), and the
        group may have dropped its connections and expired their sessions in entries this
        replica has not applied yet."""
        return now - self._lease_from > self.settings.lease_ttl

    def _deliver(self, outs: list[Output]) -> None:
        """Hand the outputs addressed to this replica's connections to the shell (their
        peers in place of their names); a read barrier of this replica runs its read now
        and its answer goes out in the same order.

        Nothing is delivered while the lease may have lapsed: an answer applied from a
        backlog after a pause (a grant at an old revision) can be one the group has undone
        since (the session expired, the lock went to another). The connections are closed
        instead (UNAVAILABLE), and their clients carry on through a replica in the group."""
        mine: list[Output] = []
        rid = self.rid
        peers = self._peers
        queue = list(outs)
        i = 0
        while i < len(queue):
            (owner, request_id), payload = queue[i]
            i += 1
            o: Any = owner
            if o[0] != rid:
                continue
            kind: Any = type(payload)  # a Barrier is the group's own output, not the door's
            if kind is Barrier:
                assert request_id is not None
                answer = self._reads.pop((o[1], request_id), None)
                if answer is not None:
                    queue[i:i] = answer()
                continue
            peer = peers.get(o[1])
            if peer is None:  # closed meanwhile: its "gone" is on its way
                continue
            if type(payload) is SessionsListing:
                payload = self.local_owners(payload)
            mine.append(((peer, request_id), payload))
        if mine and self.lease_may_have_lapsed(trio.current_time()):
            self.late_deliveries_refused += len(mine)
            if not self._withholding:  # once per pause, not once per applied batch
                self._withholding = True
                log.warning(
                    "replica %s: no keepalive succeeded for more than the lease TTL (%d s); "
                    "closing its connections rather than answering from a backlog",
                    self.rid,
                    self.settings.lease_ttl,
                )
            self._reset("this replica may have lost its place in the group (paused or cut off)")
            return
        if mine:
            self.on_outputs(mine)

    def local_owners(self, listing: SessionsListing) -> SessionsListing:
        """A sessions page with each session's owners as this replica's connections (the
        connections of other replicas are theirs to name)."""
        rid, peers = self.rid, self._peers
        return SessionsListing(
            listing.page,
            tuple(
                tuple(peers[p[1]] for p in owners if p[0] == rid and p[1] in peers)  # type: ignore[index]
                for owners in listing.owners
            ),
        )

    def _departed(self) -> None:
        """This replica's registration is gone (its lease lapsed): every connection of it was
        dropped by the group. Close them and register again."""
        log.warning("replica %s: its registration lapsed; closing its connections", self.rid)
        self._reset("this replica lost its place in the group (its etcd lease lapsed)")
        self._unregistered()
        self._reregister = True

    def _reset(self, why: str) -> None:
        self.resets += 1
        self._reads.clear()
        self._ops.clear()
        self._requests.clear()
        self._proposed.clear()
        self.on_reset(why)
        self._numbers.clear()
        self._peers.clear()

    # --- the lease ----------------------------------------------------------------------------

    async def _keepalive_loop(self) -> None:
        self._reregister = False
        while True:
            await trio.sleep(self.settings.lease_ttl / 3)
            if not self._reregister:
                try:
                    asked = trio.current_time()
                    await self.etcd.lease_keepalive(self.lease)
                    self._lease_from = asked  # etcd renewed it after we asked: early
                    self._withholding = False
                    continue
                except LeaseGone:
                    log.warning("replica %s: its lease is gone", self.rid)
                    self._reset("this replica lost its place in the group (its etcd lease lapsed)")
                    self._unregistered()
                except EtcdError as exc:
                    log.warning("replica %s: keepalive failed: %s", self.rid, exc)
                    continue
            self._reregister = False
            try:
                await self._register()
            except EtcdError as exc:
                log.warning("replica %s: registering again failed: %s", self.rid, exc)
                self._reregister = True

    # --- snapshots ----------------------------------------------------------------------------

    def snapshot_writer(self) -> bool:
        """Whether this replica writes the group's snapshots: the registered replica with the
        smallest id (every replica agrees, from the applied state)."""
        replicas = self.state.replicas
        return bool(replicas) and min(replicas) == self.rid

    async def _snapshot_loop(self) -> None:
        settings = self.settings
        last = trio.current_time()
        while True:
            await trio.sleep(1.0)
            due = self.applied_since_snapshot >= settings.snapshot_every or (
                self.applied_since_snapshot > 0
                and trio.current_time() - last >= settings.snapshot_interval
            )
            if not due or not self.snapshot_writer():
                continue
            try:
                await self.write_snapshot()
            except EtcdError as exc:
                log.warning("replica %s: writing a snapshot failed: %s", self.rid, exc)
            last = trio.current_time()

    async def write_snapshot(self) -> int:
        """Write the applied state as the group's snapshot; delete older chunks; compact etcd
        to its revision. Returns the revision."""
        revision = self.state.revision
        data = self.state.snapshot()
        self.applied_since_snapshot = 0
        chunks = [data[i : i + VALUE_LIMIT] for i in range(0, len(data), VALUE_LIMIT)] or [b""]
        base = self.prefix + b"snapshot/%020d/" % revision
        for i, chunk in enumerate(chunks):
            await self.etcd.put(base + b"%06d" % i, chunk)
        meta = pack(
            {
                "revision": revision,
                "chunks": len(chunks),
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        old = await self.etcd.get(self.prefix + b"snapshot")
        await self.etcd.put(self.prefix + b"snapshot", meta)
        if old is not None:
            previous = int(unpack(old.value)["revision"])
            if previous < revision:
                await self.etcd.delete_prefix(self.prefix + b"snapshot/%020d/" % previous)
        self.snapshots_written += 1
        if self.settings.compact:
            try:
                await self.etcd.compact(revision)
            except EtcdError as exc:  # compacted further already, by someone else
                log.info("replica %s: compaction at %d: %s", self.rid, revision, exc)
        log.info(
            "replica %s: snapshot at revision %d (%d bytes, %d chunks)",
            self.rid,
            revision,
            len(data),
            len(chunks),
        )
        return revision

    def statistics(self) -> dict[str, Any]:
        return {
            "group": self.settings.group,
            "replica": self.rid,
            "replicas": dict(self.state.replicas),
            "revision": self.state.revision,
            "entries_applied": self.state.entries,
            "entries_skipped": self.state.skipped,
            "puts": self.puts,
            "ops_proposed": self.ops_proposed,
            "commit_failures": self.commit_failures,
            "snapshots_written": self.snapshots_written,
            "snapshots_loaded": self.snapshots_loaded,
            "resets": self.resets,
            "late_deliveries_refused": self.late_deliveries_refused,
            "apply_errors": self.apply_errors,
        }


async def load_state(
    etcd: Etcd, prefix: bytes, genesis: Genesis, at_least: int
) -> tuple[GroupState, bool]:
    """The group's latest snapshot (True), or a fresh state at the genesis (revision
    ``at_least``; False)."""
    meta_kv = await etcd.get(prefix + b"snapshot")
    if meta_kv is None:
        state = GroupState(genesis)
        state.revision = at_least
        return state, False
    meta = unpack(meta_kv.value)
    revision = int(meta["revision"])
    base = prefix + b"snapshot/%020d/" % revision
    kvs, _ = await etcd.get_prefix(base)
    data = b"".join(kv.value for kv in kvs)
    if len(kvs) != int(meta["chunks"]) or hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise EtcdError(f"snapshot at revision {revision} is incomplete or corrupt")
    state = GroupState.restore(data)
    log.info("loaded the group's snapshot at revision %d (%d bytes)", revision, len(data))
    return state, True


def _fit(ops: list[list[Any]]) -> list[tuple[list[list[Any]], bytes]]:
    """Split ``ops`` into runs whose entry fits an etcd value, each with its encoded ops
    (an entry's header adds less than 100 bytes to them; VALUE_LIMIT leaves far more)."""
    packed = encode_ops(ops)
    if len(ops) <= 1 or len(packed) <= VALUE_LIMIT:
        return [(ops, packed)]
    half = len(ops) // 2
    return _fit(ops[:half]) + _fit(ops[half:])


class ReplicatedDoor:
    """The lock core's calls, for the shell of a replica: requests become ops of the next
    proposal (nothing is returned now: answers come when their entry is applied); reads of
    the state (statistics, uptime, deadlines) read the applied state."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    @property
    def core(self) -> LockCore:
        return self.replica.state.core

    @property
    def engine(self) -> Engine:
        return self.replica.state.core.engine

    def execute(
        self,
        owner: Hashable,
        request_id: int,
        session: SessionSpec,
        tx: Transaction,
        wait: float | None,
        now: float,
        trust: float,
        principal: str,
    ) -> list[Output]:
        r = self.replica
        if tx.min_uptime:
            # The uptime gate is this replica's own (docs/replication.md): a replica that
            # (re)started refuses a contract its process uptime does not meet, as a server
            # that restarted would; the group's uptime is checked again by the door.
            mine = now - r.started
            if mine < tx.min_uptime:
                refusal = TransactionResult(
                    Status.TRANSACTION_ERROR,
                    Cause.MINIMUM_REQUIREMENTS,
                    tx.transaction_id,
                    "",
                    mine,
                    trust,
                    None,
                    (),
                    r.state.core.engine.fence,
                    None,
                )
                return [((owner, request_id), refusal)]
        n = r.number(owner)  # type: ignore[arg-type]
        request = Execute(request_id, session, tx, wait)
        r.propose(["x", n, principal, wire(request)], request)
        return []

    def end_session(
        self,
        owner: Hashable,
        request_id: int,
        session_id: str,
        *,
        now: float,
        trust: float,
        principal: str,
        admin: bool = False,
    ) -> list[Output]:
        r = self.replica
        n = r.number(owner)  # type: ignore[arg-type]
        r.propose(["e", n, principal, admin, wire(EndSession(request_id, session_id))])
        return []

    def release(
        self,
        owner: Hashable,
        request_id: int,
        namespace: str,
        table: str,
        var: str,
        session_id: str | None,
        *,
        now: float,
        trust: float,
    ) -> list[Output]:
        r = self.replica
        n = r.number(owner)  # type: ignore[arg-type]
        msg = ForceRelease(request_id, namespace, table, var, session_id)
        r.propose(["r", n, wire(msg)])
        return []

    def listing(
        self,
        owner: Hashable,
        request_id: int,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> list[Output]:
        r = self.replica

        def answer(name: Hashable) -> list[Output]:
            return r.state.core.listing(
                name,
                request_id,
                kind,
                query,
                now=r.state.now,
                trust=r.state.trust,
                visible=visible,
            )

        if isinstance(owner, Peer):
            r.read(owner, request_id, answer)
            return []
        # The HTTP face (not a connection of the protocol): the applied state, as of now.
        outs = answer(owner)
        return [
            (address, r.local_owners(p) if type(p) is SessionsListing else p) for address, p in outs
        ]

    def busiest_tables(self, n: int, *, visible: Visibility | None = None) -> Any:
        return self.core.busiest_tables(n, visible=visible)

    def subscribe(
        self,
        owner: Hashable,
        request_id: int,
        namespace: str,
        table: str | None,
        principal: str = "",
    ) -> list[Output]:
        r = self.replica
        n = r.number(owner)  # type: ignore[arg-type]
        r.propose(["s", n, wire(Subscribe(request_id, namespace, table)), principal])
        return []

    def unsubscribe(self, owner: Hashable, request_id: int, target: int) -> list[Output]:
        r = self.replica
        n = r.number(owner)  # type: ignore[arg-type]
        r.propose(["u", n, wire(Unsubscribe(request_id, target))])
        return []

    def cancel(
        self, owner: Hashable, request_id: int, target: int, *, now: float, trust: float
    ) -> list[Output]:
        r = self.replica
        n = r.number(owner)  # type: ignore[arg-type]
        r.propose(["c", n, wire(Cancel(request_id, target))])
        return []

    def owner_gone(self, owner: Hashable, *, now: float, trust: float) -> list[Output]:
        n = self.replica.forget(owner)  # type: ignore[arg-type]
        if n is not None:
            self.replica.propose(["g", n])
        return []

    def advance(self, now: float, *, trust: float) -> list[Output]:
        r = self.replica
        due = r.state.core.next_deadline()
        if due is not None and due <= now + r.offset and not r.tick_pending and r.rid:
            r.tick_pending = True
            r.propose(["t"])
        return []

    def next_deadline(self) -> float | None:
        r = self.replica
        if r.tick_pending:
            return None
        due = r.state.core.next_deadline()
        return None if due is None else due - r.offset

    def uptime(self, now: float) -> float:
        r = self.replica
        return r.state.core.uptime(max(r.state.now, now + r.offset))

    def visible_counts(self, visible: Visibility) -> VisibleCounts:
        return self.replica.state.core.visible_counts(visible)

    def statistics(self, now: float, *, trust: float) -> tuple[CoreStatistics, list[Output]]:
        # As of the applied time: taking the counts changes nothing (every replica's state
        # stays what the log made it).
        state = self.replica.state
        stats, _ = state.core.statistics(state.now, trust=state.trust)
        return stats, []
