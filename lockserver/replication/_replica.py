"""A replica of a replicated group: proposes its clients' requests to the group's log in etcd,
applies the log through the group's state machine, answers its own clients.

``Replica`` is the trio side of ``_group.py``; ``ReplicatedDoor`` stands where the shell's
lock core stands in a single server, with the same calls (``engine.Door``): each call that
would decide something becomes an op in the next proposal and returns nothing now; its answer
is delivered when the entry that carries it has been applied (``Replica.on_outputs``, the
shell's delivery). The shell, the request handler and the HTTP face are the single server's.

Theory of operation (docs/replication.md):

- **Keys** under ``/lockserver/<group>/``: ``genesis`` (the group's fixed settings,
  ``_group.Genesis``), ``log`` (one key, put once per entry: the entries are its revisions,
  in etcd's order), ``replicas/<id>`` (a replica's registration, held by its etcd lease),
  ``snapshot`` (the latest snapshot's revision and chunk count) and ``snapshot/<revision>/<i>``
  (its chunks).
- **The group secret** (``_groupauth``; issue 29): with one, the genesis, every registration,
  every entry and every snapshot's description are sealed; a replica joins only a genesis its
  keys open (and a group created without a secret only without one), applies only what opens,
  counts and warns of the rest (once per burst, naming the revision), and never stops for it.
- **Joining**: read or create the genesis; load the latest snapshot (or start empty at the
  genesis); register under a new id with a lease; watch the prefix from the snapshot's
  revision + 1 and apply everything in revision order; serve once the own registration has
  been applied -- unless a registered replica signs with a key this one does not hold, or
  does not hold this one's (a rotation done out of order): then it halts instead.
- **Proposing**: ops collect while one put is in flight, so a busy replica sends many per
  etcd write (group commit; bounded by ``batch_ops`` and by etcd's request size). A put that
  fails is retried with the same batch number (the state machine skips a batch it has
  applied) until ``commit_timeout``; then the connections whose requests it carried are
  closed with UNAVAILABLE: their effect, if the put did land, is seen after reconnecting.
  A put answered at the revision right after the last one applied is the log's next entry
  (etcd's revisions count every write): the proposer applies it from the answer, and the
  watch passes over its event. While a put is in flight, the replica polls instead of
  sleeping for up to ``commit_poll`` seconds, when the previous commit was that quick.
- **Time**: a replica's estimate of the group's time is its monotonic clock (``clock``, the
  one seam a test or the fault lab moves) plus an offset: set from the group's time when it
  joins, raised to the group's time whenever an applied entry is ahead of it, lowered to it
  when the estimate runs more than the window ahead (this replica's clock leapt, or time
  stood still while nothing could be committed). No wall clock counts. Each entry is stamped
  with the estimate; ticks are proposed when the applied state has a deadline due, and every
  ``HEARTBEAT`` (staggered by the replica's rank) while it has any. The replica that writes
  snapshots also anchors the **witness**: an etcd lease whose remaining TTL tells, by etcd's
  clock, how much time passed since the group's time was at its anchor; a replica that joins
  proposes a jump when the witness is ahead of the group's time (the whole group was down).
- **Watching** (issue 31): the watch asks for a leader (``_etcd``), and a guard reopens it
  at another member, from the last applied revision + 1, when it has not delivered within
  ``watch_bound`` a revision etcd is known to hold (this replica's committed put, or a read
  of the log key's revision made when the watch was quiet that long): a stopped member, or
  one cut off and not told, ends nothing. Puts and keepalives give up on a member after
  ``call_bound`` per attempt. Both bounds derive from the lease and commit timings. A jump
  of the group's time after such a stall spares the sessions served meanwhile (``_group``).
  A replica that nothing waits on (no client connection made a call, nothing proposed or
  being committed) lets the watch's entries gather for ``IDLE_GATHER`` (4 ms) after a light
  batch that drained the stream, then applies them in one wake-up: its state is up to 4 ms
  older, which only reads of the applied state as it is can show (``stats``, the HTTP
  listings); a proposal (a protocol listing is one) ends the pause at once.
- **Halting**: an authenticated entry of a format this version does not know (a newer
  replica wrote it), or keys that cannot read a registered replica's entries, halt the
  replica: it closes its connections, leaves the group (revokes its lease), refuses every
  request (UNAVAILABLE) and keeps answering ``stats`` and the HTTP endpoints, which say why.
  The way out is an upgrade, or ``--skip-revision`` given alike to every replica.
- **Leaving**: a replica whose lease lapsed (cut off, paused, dead) has its registration key
  deleted by etcd; applying that deletion drops its connections everywhere. When a replica
  sees its own departure (or its keepalive fails) it closes every client connection and
  registers again under a new id.
- **Snapshots**: the registered replica with the smallest id among those that proposed writes
  one every ``snapshot_every`` applied entries (and at most every ``snapshot_interval``
  seconds when something happened), then deletes older chunks and compacts etcd to its
  revision. The state is encoded by a forked child (``encode_snapshot``: the state at the
  snapshot's revision, while the replica goes on serving), and no replica watches the
  snapshot's keys (the watch ends before ``snapshot``). A replica whose watch falls behind a
  compaction loads the snapshot again (its connections are closed: answers in the skipped
  entries cannot be delivered).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import math
import os
import secrets
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any, Final, NamedTuple

import attrs
import trio

from lockserver._gcstats import POLICY
from lockserver._peer import Peer
from lockserver.engine import (
    BusyTable,
    CoreStatistics,
    Engine,
    Listed,
    Output,
    SessionsListing,
    Visibility,
    VisibleCounts,
)
from protocol import (
    Cancel,
    Cause,
    EndSession,
    ErrorCode,
    Execute,
    ForceRelease,
    ListQuery,
    ProtocolError,
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
from ._etcd_json import WatchEvent
from ._group import (
    CLOCK_WINDOW,
    HEARTBEAT,
    Barrier,
    EntryFormatError,
    EntryKeyError,
    Genesis,
    GroupState,
    Owner,
    SnapshotError,
    encode_entry,
    encode_ops,
    wire,
)
from ._groupauth import GroupKeys, Sealer, is_sealed

__all__ = [
    "GroupRefused",
    "ReplicatedDoor",
    "Replica",
    "ReplicationSettings",
    "group_prefix",
]

log = logging.getLogger("lockserver.replica")


class GroupRefused(Exception):
    """This replica cannot join its group as configured (a genesis or a snapshot its keys do
    not open, a secret the group was not created with, or none where it was). The
    ``lockserver`` command exits with status 1 and the message."""


#: Bytes of one etcd value this side writes at most (etcd refuses requests past ~1.5 MiB).
VALUE_LIMIT: Final = 1_000_000
#: Seconds the witness lease lives (a group down longer comes back without it: its time
#: does not count the outage, so sessions expire their max age after the restart).
WITNESS_TTL: Final = 86_400
#: Seconds of group time after which the writer anchors the witness again (etcd resets a
#: lease's countdown when its leader changes: a fresh anchor undoes that loss).
WITNESS_EVERY: Final = 60.0
#: Seconds a replica waits for a new group's first snapshot (its creator writes it at once).
FIRST_SNAPSHOT_WAIT: Final = 10.0
#: Seconds a snapshot's encoding (in a child process) may take before it is given up.
SNAPSHOT_ENCODE_TIMEOUT: Final = 300.0
#: Seconds a replica that nothing waits on lets the watch's entries gather before it reads
#: again (the module's "Watching"): one wake-up for several entries. Measured with a lone
#: client on another replica (benchmarks/group_probe.py, issue 29): such a replica's CPU per
#: entry 220-236 -> 145-151 µs, CPU the serving replica and etcd need on the same machine.
IDLE_GATHER: Final = 0.004
#: Seconds the watch must have waited for its last batch for the stream to count as drained
#: (a batch that came sooner was buffered already: a backlog is applied without pause).
GATHER_AFTER_WAIT: Final = 0.0001
#: Seconds of applying a batch below which the replica pauses after it: a wake-up is worth
#: saving next to a light batch (a lone client's entry: ~50 µs), not next to a heavy one,
#: where the pauses only gather bursts that every idle replica (receiving the same entries
#: at the same moment) then runs at once, against the serving replica (measured: pipelined
#: p99 +20 % without this bound).
GATHER_APPLY_BELOW: Final = 0.0005
#: Seconds between two warnings of one kind (rejected records, a clock re-anchored): one
#: warning per burst, naming the first revision of it.
WARN_EVERY: Final = 10.0


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
    #: Bytes of the snapshot per etcd value, and bytes per second it is written (store_snapshot).
    snapshot_chunk: int = 16_000
    snapshot_rate: int = 4_000_000
    compact: bool = True
    #: Longest the replica polls its sockets for a put's answer instead of sleeping (0: never).
    commit_poll: float = 0.002
    #: Log revisions whose entries are skipped, as the operator told every replica.
    skip_revisions: frozenset[int] = frozenset()


def group_prefix(group: str) -> bytes:
    """The etcd key prefix of ``group``'s keys."""
    return f"/lockserver/{group}/".encode()


class Replica:
    """One replica: its registration, proposals, the watch that applies the log, snapshots.

    Create with :meth:`join` (async: it reads etcd); run :meth:`run` in a nursery; the shell
    sets :attr:`on_outputs` (delivers outputs to this replica's peers) and :attr:`on_reset`
    (closes every client connection). :attr:`clock` is the monotonic clock the replica's
    estimate of the group's time runs on (trio's; a test moves it to make one replica's
    clock leap)."""

    def __init__(
        self,
        settings: ReplicationSettings,
        etcd: Etcd,
        address: str,
        genesis: Genesis,
        state: GroupState,
        keys: GroupKeys | None = None,
    ) -> None:
        self.settings = settings
        self.etcd = etcd
        self.address = address
        self.genesis = genesis
        self.state = state
        self.keys = keys
        self.prefix = group_prefix(settings.group)
        self.log_key = self.prefix + b"log"
        self.replicas_prefix = self.prefix + b"replicas/"
        context = pack([settings.group, genesis.instance])
        self._entries: Sealer | None = None
        self._registrations: Sealer | None = None
        self._snapshots: Sealer | None = None
        if keys is not None:
            self._entries = keys.sealer(b"entry", context)
            self._registrations = keys.sealer(b"replica", context)
            self._snapshots = keys.sealer(b"snapshot", context)
        self.rid = ""
        self.clock: Callable[[], float] = trio.current_time
        self.started = trio.current_time()  # this replica's own uptime counts from here
        # The estimate of the group's time: clock() + off (the module's "Time").
        self.off = state.now - self.clock()
        self._last_clock = self.clock()
        self.clock_resets = 0
        self.lease = 0
        self.batch = 0
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
        self._heartbeat = HEARTBEAT
        self._reads: dict[tuple[int, int], Callable[[], list[Output[Owner]]]] = {}
        self.registered = trio.Event()
        self.ready = trio.Event()  # registered, or halted: the shell may listen
        self.registered_at = 0  # the revision of this replica's registration
        self.joined_at = 0  # the revision of the state it started from (a snapshot's, or 0)
        self.trust: Callable[[float], float] = lambda now: 1.0
        self.on_outputs: Callable[[list[Output[Peer]]], None] = lambda outs: None
        self.on_reset: Callable[[str], None] = lambda why: None
        self.wake: Callable[[float], None] = lambda deadline: None
        self.on_replicas: Callable[[tuple[str, ...]], None] = lambda replicas: None
        self.applied_since_snapshot = 0
        self.snapshot_revision = state.revision  # of the latest snapshot this one knows
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
        self._keepalive_wake = trio.Event()
        self.puts = 0
        self.ops_proposed = 0
        #: Why this replica halted (None: it did not), and at which revision.
        self.halted: str | None = None
        self.halted_at = 0
        self._working: trio.CancelScope | None = None
        self._warned: dict[str, float] = {}
        self._jump_checked = False
        self._witness_leases: list[int] = []
        self._witness_asked = -math.inf
        # Bounds on etcd (the module's "Watching"), derived from the lease and commit timings:
        # one attempt of a put or a keepalive at one member, and how long the watch may fail
        # to deliver a revision etcd is known to have before it is reopened elsewhere.
        self.call_bound = max(0.5, min(settings.commit_timeout, settings.lease_ttl) / 3)
        self.watch_bound = max(1.0, settings.lease_ttl / 2)
        self._watch_scope: trio.CancelScope | None = None
        self._watch_url: str | None = None
        self._applied_at = trio.current_time()  # when the watch last delivered
        # The highest revision of the watched keys etcd is known to hold that is not applied
        # yet, and since when something is known unapplied (inf: nothing).
        self._evidence = 0
        self._evidence_at = math.inf
        self.watch_reopens = 0
        self._committing = False
        #: The last revision applied from this replica's own put answer (_put_entry), and
        #: how many entries were.
        self._early = 0
        self.applied_from_answer = 0
        self.gathers = 0
        # The commit poll (_commit_poll_loop): set when a put goes out and the last commit
        # took no longer than the window; and what the polls found and cost.
        self._poll_wanted = trio.Event()
        self._last_commit = 0.0
        self.commit_poll_hits = 0
        self.commit_poll_misses = 0
        self.commit_poll_seconds = 0.0

    # --- joining ------------------------------------------------------------------------------

    @classmethod
    async def join(
        cls,
        settings: ReplicationSettings,
        etcd: Etcd,
        address: str,
        genesis: Genesis,
        keys: GroupKeys | None = None,
    ) -> Replica:
        """Read (or create) the group's genesis and its latest state; not yet registered.
        GroupRefused when the genesis or the snapshot does not open with ``keys`` (or the
        group and this replica disagree on having a secret)."""
        prefix = group_prefix(settings.group)
        key = prefix + b"genesis"
        sealer = None if keys is None else keys.sealer(b"genesis", pack([settings.group]))
        mine = genesis.to_bytes() if sealer is None else sealer.seal_all(genesis.to_bytes())
        created, created_at = await etcd.put_if_absent(key, mine)
        kv = await etcd.get(key)
        assert kv is not None
        found = _open_genesis(kv.value, settings.group, sealer)
        if (
            sealer is not None
            and keys is not None
            and keys.signing_id not in Sealer.key_ids(kv.value)
        ):
            # A rotation: seal the genesis with this replica's keys as well, so a replica
            # that will hold only the new key can read it.
            await etcd.put_if_mod_revision(key, sealer.seal_all(found.to_bytes()), kv.mod_revision)
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
        if keys is None:
            log.warning(
                "GROUP %r HAS NO SECRET: its log is not authenticated; anyone who can write to "
                "its etcd can take, steal or release any lock. Set group_secret_file on every "
                "replica of a new group (docs/security.md, 'Replication')",
                settings.group,
            )
        else:
            log.info(
                "group %r: its log is authenticated; this replica signs with key %s%s",
                settings.group,
                keys.signing_id.hex(),
                "" if len(keys.ids) == 1 else f" (and verifies {len(keys.ids) - 1} more)",
            )
        snapshots = (
            None
            if keys is None
            else keys.sealer(b"snapshot", pack([settings.group, found.instance]))
        )
        if created and snapshots is not None:
            # With a secret the group starts from a sealed snapshot of its empty state, which
            # names the genesis's revision: the genesis key's own revisions can be moved by
            # anyone who deletes it and puts it back; a sealed record cannot. (Without a
            # secret anyone can rewrite the log anyway: it starts at the genesis key.)
            empty = GroupState(found)
            empty.revision = created_at
            await store_snapshot(etcd, prefix, empty, snapshots)
        try:
            state, from_snapshot = await load_state(
                etcd, prefix, found, kv.create_revision, snapshots
            )
        except SnapshotError as exc:
            raise GroupRefused(str(exc)) from None
        replica = cls(settings, etcd, address, found, state, keys)
        replica.joined_at = state.revision
        replica.snapshots_loaded = int(from_snapshot)
        return replica

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Register, apply the log, propose, keep the lease, write snapshots and anchor the
        witness; ``started`` once this replica's registration has been applied (it serves
        from then on) or it halted (it serves ``stats`` only). A halted replica leaves the
        group and stays up until cancelled."""
        started = False
        with trio.CancelScope() as self._working:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_loop)
                nursery.start_soon(self._watch_guard_loop)
                await self._register()
                nursery.start_soon(self._keepalive_loop)
                nursery.start_soon(self._propose_loop)
                nursery.start_soon(self._snapshot_loop)
                nursery.start_soon(self._witness_loop)
                nursery.start_soon(self._commit_poll_loop)
                await self.ready.wait()
                task_status.started()
                started = True
        # Only a halt cancels the work (_halt): leave the group, answer stats until stopped.
        if not started:
            task_status.started()
        with trio.move_on_after(5):
            try:
                await self.etcd.lease_revoke(self.lease)
            except EtcdError as exc:
                log.warning("replica %s: leaving the group failed: %s", self.rid, exc)
        await trio.sleep_forever()

    async def _register(self) -> None:
        self._unregistered()
        self.rid = secrets.token_hex(6)
        self.batch = 0
        self._jump_checked = False
        asked = trio.current_time()
        lease, _ = await self.etcd.lease_grant(self.settings.lease_ttl)
        self.lease = lease
        self._lease_from, self._withholding = asked, False
        if self._registrations is None or self.keys is None:
            value = self.address.encode()
        else:
            record = pack([self.rid, self.address, list(self.keys.ids)])
            value = self._registrations.seal_all(record)
        _, revision = await self.etcd.put_if_absent(
            self.replicas_prefix + self.rid.encode(), value, lease=lease
        )
        log.info(
            "replica %s of group %r registered (revision %d)",
            self.rid,
            self.settings.group,
            revision,
        )

    # --- the clock ----------------------------------------------------------------------------

    def group_now(self) -> float:
        """This replica's estimate of the group's time (never ahead of real time, given a
        monotonic clock that does not leap: the module's "Time")."""
        return self.clock() + self.off

    def to_trio(self, group_time: float) -> float:
        """When trio's clock reaches ``group_time`` of the estimate."""
        return trio.current_time() + (group_time - self.group_now())

    def next_tick(self) -> float | None:
        """The group time at which this replica proposes a tick: the applied state's next
        deadline, or a heartbeat after the group's time while it has any (None: nothing has a
        deadline)."""
        state = self.state
        due = state.core.next_deadline()
        if due is None:
            return None
        beat = state.now + self._heartbeat
        return due if due < beat else beat

    def _anchor(self) -> None:
        """After applying: raise the estimate to the group's time when it is behind, lower it
        when it runs more than the window ahead (the module's "Time")."""
        group = self.state.now
        at = self.clock()
        if at < self._last_clock:  # the monotonic clock went back (only a fake one does)
            self._keepalive_wake.set()
        self._last_clock = at
        ahead = at + self.off - group
        if ahead < 0:
            self.off = group - at
        elif ahead > CLOCK_WINDOW:
            self.off = group - at
            self.clock_resets += 1
            self._warn(
                "clock",
                "replica %s: its estimate of the group's time ran %.3f s ahead of the group's "
                "(its clock leapt, or nothing could be committed for that long): it follows "
                "the group's time again",
                self.rid,
                ahead,
            )

    def _warn(self, kind: str, message: str, *args: Any) -> None:
        """Log a warning of ``kind`` unless one was logged within WARN_EVERY (one per burst)."""
        now = trio.current_time()
        if now - self._warned.get(kind, -math.inf) >= WARN_EVERY:
            self._warned[kind] = now
            log.warning(message, *args)

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

    def read(
        self, peer: Peer, request_id: int, answer: Callable[[Owner], list[Output[Owner]]]
    ) -> None:
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
            self.rid,
            self.batch,
            self.group_now(),
            self.trust(trio.current_time()),
            packed,
            registration=self.registered_at,
            base=self.state.revision,
        )
        if self._entries is not None:
            data = self._entries.seal(data)
        self._committing = True  # the watch does not pause meanwhile (_unwatched)
        window = self.settings.commit_poll
        if 0 < self._last_commit <= window:
            self._poll_wanted.set()
        began = time.perf_counter()
        try:
            await self._put_entry(ops, data)
        finally:
            self._committing = False
            self._last_commit = time.perf_counter() - began

    async def _commit_poll_loop(self) -> None:
        """While this replica's put is in flight, keep the event loop polling instead of
        sleeping, for at most ``commit_poll`` seconds (the module's "Proposing"): the answer
        then finds it awake. Between polls every other task, and any other process that
        wants the CPU, runs first. Real time (``time.perf_counter``), as the shell's busy
        poll: a MockClock may stand still while tasks run."""
        window = self.settings.commit_poll
        if window <= 0:
            return
        checkpoint = trio.lowlevel.checkpoint
        clock = time.perf_counter
        while True:
            await self._poll_wanted.wait()
            self._poll_wanted = trio.Event()
            start = now = clock()
            while self._committing and now - start < window:
                await checkpoint()  # other tasks and timers run; cancellable
                # And other processes: etcd itself may be waiting for this CPU (without
                # this, the poll kept the p50 and raised the p99 by a fifth: 2.4 -> 2.9 ms).
                os.sched_yield()
                now = clock()
            self.commit_poll_seconds += min(now - start, window)
            if self._committing:
                self.commit_poll_misses += 1
            else:
                self.commit_poll_hits += 1

    async def _put_entry(self, ops: list[list[Any]], data: bytes) -> None:
        """Put ``data`` (the entry carrying ``ops``) until it commits or ``commit_timeout``
        passes; then the connections whose requests it carried are closed."""
        delay = 0.05
        with trio.move_on_after(self.settings.commit_timeout):
            while True:
                try:
                    revision = await self.etcd.put(self.log_key, data, timeout=self.call_bound)
                    self._known(revision)
                    if revision == self.state.revision + 1 and self.halted is None:
                        # Nothing lies between what was applied and this entry (revisions
                        # count every write to etcd): apply it now, from the put's answer,
                        # not a watch delivery later; its watch event is then passed over.
                        self._apply([WatchEvent("put", self.log_key, data, revision)])
                        self._early = revision
                        self.applied_from_answer += 1
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
            if op[0] in ("t", "k", "j"):
                self.tick_pending = self.tick_pending and op[0] != "t"
                continue
            peer = self._peers.get(int(op[1]))
            if peer is not None:
                peer.stop(ErrorCode.UNAVAILABLE, message)

    # --- applying -----------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        backoff = 0.05
        while True:
            try:
                # The keys a replica applies (genesis, log, replicas/) sort before
                # "snapshot": the snapshot's chunks (megabytes) never come down the watch;
                # a replica reads them only when it loads a snapshot.
                with trio.CancelScope() as scope:
                    async with self.etcd.watch(
                        self.prefix,
                        start_revision=self.state.revision + 1,
                        range_end=self.prefix + b"snapshot",
                        open_timeout=self.watch_bound,
                    ) as batches:
                        backoff = 0.05
                        self._watch_url = self.etcd.watching
                        self._watch_scope = scope
                        self._applied_at = trio.current_time()
                        waited_from = trio.current_time()
                        async for events in batches:
                            # What the guard checks is the watch, not the entries this
                            # replica applied from its puts' answers meanwhile.
                            came = self._applied_at = trio.current_time()
                            self._apply(events)
                            done = trio.current_time()
                            if (
                                came - waited_from > GATHER_AFTER_WAIT  # the stream drained
                                and done - came < GATHER_APPLY_BELOW  # a light load
                                and self._unwatched()
                            ):
                                # Nobody here waits on the log: let entries gather (the
                                # module's "Watching"); a proposal ends the pause.
                                self.gathers += 1
                                with trio.move_on_after(IDLE_GATHER):
                                    await self._have_ops.wait()
                                done = trio.current_time()
                            waited_from = done
                self._watch_scope = None
                if scope.cancelled_caught:
                    continue  # the guard found it stale: reopen at once, elsewhere
            except Compacted as exc:
                log.warning(
                    "replica %s: the log was compacted past what it applied (%d < %d): loading "
                    "the snapshot",
                    self.rid,
                    self.state.revision,
                    exc.compact_revision,
                )
                try:
                    self.state, from_snapshot = await load_state(
                        self.etcd, self.prefix, self.genesis, self.state.revision, self._snapshots
                    )
                except SnapshotError as error:
                    self._halt(str(error), self.state.revision)
                    return
                if not from_snapshot:
                    self._halt(
                        f"etcd's history was compacted past revision {self.state.revision} "
                        "before the group had a snapshot (another group or application "
                        "compacting the same etcd?): this replica cannot rebuild the group's "
                        "state",
                        exc.compact_revision,
                    )
                    return
                self.snapshots_loaded += 1
                self.snapshot_revision = self.state.revision
                self._reset("the replica reloaded the group's state from a snapshot")
                continue
            except EtcdError as exc:
                log.warning("replica %s: watching the log failed, resuming: %s", self.rid, exc)
            self._watch_scope = None
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _unwatched(self) -> bool:
        """Whether nothing of this replica waits on the log: it is registered (it waits for
        its registration otherwise), no client connection made a call, nothing is proposed
        or being committed."""
        return (
            not self._peers and not self._ops and not self._committing and self.registered.is_set()
        )

    def _known(self, revision: int) -> None:
        """etcd holds ``revision`` of the watched keys (this replica's put, or a read): the
        watch must deliver it within ``watch_bound``."""
        if revision > self.state.revision:
            self._evidence = max(self._evidence, revision)
            if self._evidence_at == math.inf:
                self._evidence_at = trio.current_time()

    async def _watch_guard_loop(self) -> None:
        """Reopen the watch elsewhere when it went silent while etcd moved on (the module's
        "Watching"): a member that is stopped, or cut off and not told, ends nothing."""
        bound = self.watch_bound
        while True:
            await trio.sleep(bound / 4)
            if self._watch_scope is None:
                continue  # being opened (bounded there), or failed and backing off
            now = trio.current_time()
            if self.state.revision >= self._evidence:
                self._evidence_at = math.inf
            if self._evidence_at == math.inf:
                if now - self._applied_at < bound:
                    continue
                # Quiet for the bound: is it the group, or the watch? One linearizable read
                # of the log key's revision (no value) tells.
                with contextlib.suppress(EtcdError):  # etcd itself down: nothing to reopen
                    found = await self.etcd.mod_revision(self.log_key, timeout=self.call_bound)
                    self._known(found)
                self._applied_at = max(self._applied_at, now)  # one read per quiet bound
                continue
            scope = self._watch_scope
            if now - self._evidence_at < bound or scope is None:
                continue
            self.watch_reopens += 1
            self._warn(
                "watch",
                "replica %s: its watch of the log at %s delivered nothing for %.1f s while etcd "
                "holds revision %d (it applied %d): reopening it at another member",
                self.rid,
                self._watch_url,
                now - self._evidence_at,
                self._evidence,
                self.state.revision,
            )
            if self._watch_url is not None:
                self.etcd.avoid(self._watch_url)
            self._evidence_at = now  # the new watch gets a bound of its own
            scope.cancel()

    def _apply(self, events: list[Any]) -> None:
        state = self.state
        outs: list[Output[Owner]] = []
        log_key = self.log_key
        replicas = self.replicas_prefix
        rejected = state.rejected
        early = self._early
        for ev in events:
            if ev.mod_revision <= early:
                continue  # applied from this replica's put answer (_put_entry)
            try:
                outs += self._apply_event(ev, log_key, replicas)
            except (EntryFormatError, EntryKeyError) as exc:
                # The replicas that know the format (hold the key) apply it: skipping it would
                # diverge. Nothing of the entry applied; its clients are told and fail over.
                self.apply_errors += 1
                self._halt(str(exc), ev.mod_revision)
            except Exception:  # a bug: every replica meets it alike (the log is the same)
                self.apply_errors += 1
                log.exception(
                    "replica %s: applying revision %d failed; skipped", self.rid, ev.mod_revision
                )
                state.revision = max(state.revision, ev.mod_revision)
            if state.rejected > rejected:
                rejected = state.rejected
                self._warn(
                    "rejected",
                    "replica %s: rejected what was put at revision %d (key %r): it is not "
                    "sealed by the group's secret -- forged, replayed, or written by a "
                    "replica given another secret; %d rejected so far (docs/security.md)",
                    self.rid,
                    ev.mod_revision,
                    ev.key.decode(errors="replace"),
                    rejected,
                )
            if self.halted is not None:
                return
        self._anchor()
        try:
            self._deliver(outs)
        except Exception:
            self.apply_errors += 1
            log.exception("replica %s: delivering answers failed", self.rid)
        self.tick_pending = False  # time moved with what was applied: a new tick if due
        due = self.next_tick()
        if due is not None:
            self.wake(self.to_trio(due))

    def _apply_event(self, ev: Any, log_key: bytes, replicas: bytes) -> list[Output[Owner]]:
        state = self.state
        outs: list[Output[Owner]] = []
        key = ev.key
        revision = ev.mod_revision
        if key == log_key:
            if ev.kind == "put":
                if revision in self.settings.skip_revisions:
                    log.warning(
                        "replica %s: skipping the log entry at revision %d, as told "
                        "(--skip-revision): nothing of it is applied",
                        self.rid,
                        revision,
                    )
                    return state.apply_skipped(revision)
                outs += state.apply_entry(ev.value, revision, self._held, self._entries)
                self.applied_since_snapshot += 1
            else:
                state.revision = max(state.revision, revision)
        elif key.startswith(replicas):
            rid = key[len(replicas) :].decode()
            if ev.kind == "put":
                outs += state.apply_registered(rid, ev.value, revision, self._registrations)
                if rid and rid == self.rid:  # fresh random: only this replica puts it first
                    self._registered(revision)
                elif self.keys is not None:
                    held = state.keysets.get(rid)
                    if held and held[0] not in self.keys.ids:
                        log.warning(
                            "replica %s: replica %s signs with key %s, which this replica does "
                            "not hold: it halts itself (a rotation out of order: "
                            "docs/replication.md)",
                            self.rid,
                            rid,
                            held[0].hex(),
                        )
            else:
                outs += state.apply_departed(rid, revision)
                if rid and rid == self.rid:
                    self._departed()
            self._replicas_changed()
        else:
            state.revision = max(state.revision, revision)
        return outs

    def _registered(self, revision: int) -> None:
        """This replica's registration was applied (at ``revision``, which its entries name;
        the watch may apply it before the put returns): it serves from now on, unless its keys
        and a registered replica's cannot read each other's entries."""
        state = self.state
        if state.registrations.get(self.rid) != revision:
            if self.registered.is_set():
                return  # its key put again (by someone else): nothing of it is this replica's
            self._halt(
                "its own registration was rejected: the group's replicas cannot open it",
                revision,
            )
            return
        self.registered_at = revision
        if self.keys is not None:
            conflict = state.key_conflict(self.rid, self.keys.ids)
            if conflict is not None:
                self._halt(
                    f"{conflict}: the group's secrets differ (a rotation done out of order: "
                    "every replica must hold the new secret before one signs with it; "
                    "docs/replication.md, 'Rotating the group secret')",
                    self.registered_at,
                )
                return
        self.registered.set()
        self.ready.set()

    def _replicas_changed(self) -> None:
        replicas = self.state.replicas
        rank = sorted(replicas).index(self.rid) if self.rid in replicas else 0
        self._heartbeat = HEARTBEAT * (1 + 0.25 * min(rank, 4))
        self.on_replicas(tuple(dict.fromkeys(replicas.values())))

    def _halt(self, why: str, revision: int) -> None:
        """Stop applying and serving (the module's "Halting")."""
        if self.halted is not None:
            return
        self.halted = f"replica {self.rid} halted at revision {revision}: {why}"
        self.halted_at = revision
        log.critical(
            "%s. It serves no request until it is restarted: upgrade it, or give every "
            "replica --skip-revision %d (docs/replication.md, 'Halted replicas')",
            self.halted,
            revision,
        )
        self._reset(self.halted)
        self._unregistered()
        self.ready.set()
        if self._working is not None:
            self._working.cancel()

    def lease_may_have_lapsed(self, now: float) -> bool:
        """True when no keepalive asked within the lease TTL before ``now`` has succeeded:
        the lease may have lapsed (this replica was paused, or cut off from etcd), and the
        group may have dropped its connections and expired their sessions in entries this
        replica has not applied yet."""
        return now - self._lease_from > self.settings.lease_ttl

    def _deliver(self, outs: list[Output[Owner]]) -> None:
        """Hand the outputs addressed to this replica's connections to the shell (their
        peers in place of their names); a read barrier of this replica runs its read now
        and its answer goes out in the same order.

        Nothing is delivered while the lease may have lapsed: an answer applied from a
        backlog after a pause (a grant at an old revision) can be one the group has undone
        since (the session expired, the lock went to another). The connections are closed
        instead (UNAVAILABLE), and their clients carry on through a replica in the group."""
        mine: list[Output[Peer]] = []
        rid = self.rid
        peers = self._peers
        queue = list(outs)
        i = 0
        while i < len(queue):
            (owner, request_id), payload = queue[i]
            i += 1
            if owner[0] != rid:
                continue
            produced: object = payload
            if type(produced) is Barrier:  # the group's own output, not the door's
                assert request_id is not None
                answer = self._reads.pop((owner[1], request_id), None)
                if answer is not None:
                    queue[i:i] = answer()
                continue
            peer = peers.get(owner[1])
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
        named: list[tuple[Peer, ...]] = []
        for owners in listing.owners:
            mine = []
            for owner in owners:
                name: Owner = owner  # type: ignore[assignment]  # the group's owners
                if name[0] == rid and name[1] in peers:
                    mine.append(peers[name[1]])
            named.append(tuple(mine))
        return SessionsListing(listing.page, tuple(named))

    def _departed(self) -> None:
        """This replica's registration is gone (its lease lapsed): every connection of it was
        dropped by the group. Close them and register again."""
        log.warning("replica %s: its registration lapsed; closing its connections", self.rid)
        self._reset("this replica lost its place in the group (its etcd lease lapsed)")
        self._unregistered()
        self.rid = ""  # nothing of the log is this replica's until it registered again
        self._reregister = True
        self._keepalive_wake.set()

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
            # Woken early by a departure, or by a clock that went back (a sleep would last
            # as long as it went back).
            with trio.move_on_after(self.settings.lease_ttl / 3):
                await self._keepalive_wake.wait()
            self._keepalive_wake = trio.Event()
            if not self._reregister:
                try:
                    asked = trio.current_time()
                    await self.etcd.lease_keepalive(self.lease, timeout=self.call_bound)
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
        """Whether this replica writes the group's snapshots and anchors the witness
        (``GroupState.writer``: every replica agrees, from the applied state)."""
        return bool(self.rid) and self.state.writer() == self.rid

    async def _snapshot_loop(self) -> None:
        settings = self.settings
        last = trio.current_time()
        while True:
            await trio.sleep(1.0)
            due = (
                self.applied_since_snapshot >= settings.snapshot_every
                or (
                    self.applied_since_snapshot > 0
                    and trio.current_time() - last >= settings.snapshot_interval
                )
                # after a rotation's second step: a snapshot past the last entry sealed with
                # the retired key, so a replica holding only the new one can replay the log
                or any(
                    rev > self.snapshot_revision for rev in self.state.retired_signers().values()
                )
            )
            if not due or not self.snapshot_writer():
                continue
            try:
                await self.write_snapshot()
            except (EtcdError, SnapshotError) as exc:
                log.warning("replica %s: writing a snapshot failed: %s", self.rid, exc)
            last = trio.current_time()

    async def write_snapshot(self) -> int:
        """Write the applied state as the group's snapshot; delete older chunks; compact etcd
        to its revision. Returns the revision. The state is encoded off the event loop
        (:func:`encode_snapshot`): exactly as it stood at that revision, while the replica
        goes on applying and serving."""
        revision = self.state.revision
        self.applied_since_snapshot = 0
        began = time.perf_counter()
        encoded = await encode_snapshot(self.state)
        encoded_at = time.perf_counter()
        size, chunks = await store_snapshot(
            self.etcd,
            self.prefix,
            encoded,
            self._snapshots,
            revision=revision,
            chunk=self.settings.snapshot_chunk,
            rate=self.settings.snapshot_rate,
        )
        stored_at = time.perf_counter()
        self.snapshot_revision = revision
        self.snapshots_written += 1
        if self.settings.compact:
            try:
                await self.etcd.compact(revision)
            except EtcdError as exc:  # compacted further already, by someone else
                log.info("replica %s: compaction at %d: %s", self.rid, revision, exc)
        # The phases' durations, so an operator (and group_latency's timeline) can line a
        # latency spike up with the part of the snapshot it fell on.
        log.info(
            "replica %s: snapshot at revision %d (%d bytes, %d chunks; fork %.1f ms, "
            "encoded in %.3f s, stored in %.3f s, compacted in %.3f s)",
            self.rid,
            revision,
            size,
            chunks,
            encoded.fork_s * 1000,
            encoded_at - began,
            stored_at - encoded_at,
            time.perf_counter() - stored_at,
        )
        return revision

    # --- the witness --------------------------------------------------------------------------

    async def _witness_loop(self) -> None:
        while True:
            if self.registered.is_set():
                try:
                    if not self._jump_checked:
                        self._jump_checked = True
                        await self._check_jump()
                    if self.snapshot_writer():
                        await self._anchor_witness()
                except EtcdError as exc:
                    log.warning("replica %s: the witness lease: %s", self.rid, exc)
            await trio.sleep(1.0)

    async def _check_jump(self) -> None:
        """Once registered: when etcd's count since the witness's anchor is ahead of the
        group's time by more than the window (the whole group was down), propose a jump."""
        state = self.state
        witness = state.witness
        if witness is None:
            return
        remaining, granted = await self.etcd.lease_time_to_live(witness[0])
        target = state.witness_time(remaining, granted)
        if target is None or target <= state.now + CLOCK_WINDOW:
            return
        log.warning(
            "replica %s: the group's time is %.1f s behind etcd's count since its witness "
            "(the whole group was down): it moves forward",
            self.rid,
            target - state.now,
        )
        self.propose(["j", target])

    async def _anchor_witness(self) -> None:
        """The writer's: anchor a new witness when there is none (or it was voided by a
        clamp) or it is older than WITNESS_EVERY; revoke this replica's older ones."""
        state = self.state
        witness = state.witness
        current = None if witness is None else witness[0]
        for lease in list(self._witness_leases[:-1]):  # the newest may not be applied yet
            if lease != current:
                self._witness_leases.remove(lease)
                await self.etcd.lease_revoke(lease)
        if witness is not None and state.now - witness[2] < WITNESS_EVERY:
            return
        now = trio.current_time()
        if now - self._witness_asked < 10.0:  # one in flight (its entry not applied yet)
            return
        self._witness_asked = now
        claim = state.now  # the group's time when asked: at most real time at the grant
        lease, ttl = await self.etcd.lease_grant(WITNESS_TTL)
        self._witness_leases.append(lease)
        self.propose(["k", lease, ttl, claim])

    def statistics(self) -> dict[str, Any]:
        state = self.state
        return {
            "group": self.settings.group,
            "replica": self.rid,
            "replicas": dict(state.replicas),
            "revision": state.revision,
            "entries_applied": state.entries,
            "entries_skipped": state.skipped,
            "puts": self.puts,
            "ops_proposed": self.ops_proposed,
            "commit_failures": self.commit_failures,
            "snapshots_written": self.snapshots_written,
            "snapshots_loaded": self.snapshots_loaded,
            "resets": self.resets,
            "late_deliveries_refused": self.late_deliveries_refused,
            "apply_errors": self.apply_errors,
            "authenticated": self.keys is not None,
            "keys": [] if self.keys is None else [k.hex() for k in self.keys.ids],
            "rejected_entries": state.rejected,
            "halted": (
                None if self.halted is None else {"revision": self.halted_at, "reason": self.halted}
            ),
            "skipped_revisions": state.skipped_revisions,
            "group_time": state.now,
            "clamped_stamps": state.clamped,
            "clock_ahead": round(self.group_now() - state.now, 6),
            "clock_resets": self.clock_resets,
            "time_jumps": state.jumps,
            "time_jumped": state.jumped,
            "watching": self.etcd.watching,
            "watch_reopens": self.watch_reopens,
            "watch_gathers": self.gathers,
            "applied_from_answer": self.applied_from_answer,
            "commit_poll_hits": self.commit_poll_hits,
            "commit_poll_misses": self.commit_poll_misses,
            "commit_poll_seconds": round(self.commit_poll_seconds, 6),
            "time_graced": state.graced,
            "witness": state.witness is not None,
            "signers": {kid.hex(): revision for kid, revision in state.signers.items()},
            "snapshot_revision": self.snapshot_revision,
        }


def _open_genesis(value: bytes, group: str, sealer: Sealer | None) -> Genesis:
    """The genesis in ``value``: GroupRefused when it is sealed and this replica has no
    secret, unsealed and it has one, or sealed with none of its keys."""
    if sealer is None:
        if is_sealed(value):
            raise GroupRefused(
                f"group {group!r} was created with a group secret: its log is authenticated; "
                "give this replica the group's secret (group_secret_file)"
            )
        return Genesis.from_bytes(value)
    if not is_sealed(value):
        raise GroupRefused(
            f"group {group!r} was created without a group secret (its log is not "
            "authenticated), so this replica, given one, does not join it: a group's secret "
            "is fixed when it is created (docs/replication.md, 'The group secret')"
        )
    body = sealer.open(value)
    if body is None:
        named = ", ".join(k.hex() for k in Sealer.key_ids(value)) or "none"
        raise GroupRefused(
            f"group {group!r}: its genesis is not sealed by any key this replica holds (it "
            f"names key {named}): a wrong group_secret_file, or a forged genesis"
        )
    return Genesis.from_bytes(body)


class EncodedSnapshot(NamedTuple):
    """A state's snapshot bytes (``GroupState.snapshot``) and their SHA-256, hex; ``fork_s``:
    the seconds the event loop stood still in ``os.fork`` (0 when encoded in process)."""

    data: bytes
    sha256: str
    fork_s: float = 0.0


def _encode(state: GroupState) -> EncodedSnapshot:
    data = state.snapshot()
    return EncodedSnapshot(data, hashlib.sha256(data).hexdigest())


async def encode_snapshot(state: GroupState) -> EncodedSnapshot:
    """``state`` encoded as it stands when called, without stopping the event loop for it.

    Pickling a large state takes the CPU for a long while (a 15 MB snapshot: hundreds of
    milliseconds), and every request of the replica would wait behind it: so a forked child
    process, whose memory is the parent's frozen at the fork (the kernel's copy-on-write,
    as Redis writes its snapshots), pickles it and sends the bytes and their digest back
    through a pipe, which the event loop reads as they come. The state the child encodes is
    exactly the state at the fork: the parent keeps applying entries to its own copy. The
    fork itself copies the process's page tables (milliseconds for hundreds of MB); the child
    copies the pages it touches, so memory may grow by up to the state's size meanwhile.
    The child runs at the lowest CPU priority (nice 19): the replicas and etcd go first.
    Where ``fork`` is missing, the state is encoded in the event loop. Raises SnapshotError
    when the child fails or takes longer than :data:`SNAPSHOT_ENCODE_TIMEOUT`."""
    if not hasattr(os, "fork"):
        return _encode(state)
    read_fd, write_fd = os.pipe()
    try:
        with warnings.catch_warnings():
            # Python 3.12 on warns that a child forked beside threads (trio's workers) may
            # deadlock on a lock one of them held: this child takes none (it pickles, writes
            # to a pipe and exits; glibc's malloc is fork-safe).
            warnings.simplefilter("ignore", DeprecationWarning)
            forking = time.perf_counter()
            pid = os.fork()
            fork_s = time.perf_counter() - forking
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:  # the child: encode, write, exit -- nothing of the parent's runs here
        code = 1
        try:
            os.close(read_fd)
            gc.disable()  # no finalizer of the parent's objects runs in the child
            # The lowest CPU priority: pickling takes a CPU for seconds, and on a small
            # machine the replicas and etcd need both; the serving processes go first, the
            # child takes what they leave (issue 29: no stall of the group for a snapshot).
            with contextlib.suppress(OSError):
                os.nice(19)
            encoded = _encode(state)
            head = b"%d %s\n" % (len(encoded.data), encoded.sha256.encode())
            view = memoryview(head + encoded.data)
            while view:
                view = view[os.write(write_fd, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    reaped = False
    try:
        with trio.fail_after(SNAPSHOT_ENCODE_TIMEOUT):
            async with trio.lowlevel.FdStream(read_fd) as stream:
                received = bytearray()
                while piece := await stream.receive_some(1 << 20):
                    received += piece
            _, status = await trio.to_thread.run_sync(os.waitpid, pid, 0)
            reaped = True
    except trio.TooSlowError:
        raise SnapshotError(
            f"encoding a snapshot took longer than {SNAPSHOT_ENCODE_TIMEOUT:g} s"
        ) from None
    finally:
        if not reaped:  # cancelled or timed out: the child is of no more use
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    # One copy of the body (the bytes a store puts), not two: this runs in the event loop.
    newline = received.find(b"\n")
    with memoryview(received) as view:
        head, body = bytes(view[: max(newline, 0)]), bytes(view[newline + 1 :])
    del received
    parts = head.split(b" ")
    if status != 0 or len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) != len(body):
        raise SnapshotError(f"encoding a snapshot failed in its child process (status {status})")
    return EncodedSnapshot(body, parts[1].decode(), fork_s)


class Step(NamedTuple):
    """One etcd write of a paced snapshot (:func:`snapshot_plan`): at ``at`` seconds after
    the writing began, put chunk ``first`` (``put``), or delete the previous snapshot's
    chunks ``first`` up to ``end`` (not ``put``)."""

    at: float
    put: bool
    first: int
    end: int


def snapshot_plan(size: int, old_chunks: int, chunk: int, rate: int) -> list[Step]:
    """The writes of a snapshot of ``size`` bytes in chunks of ``chunk`` bytes, then the
    deletion of the previous snapshot's ``old_chunks`` chunks (in runs of about a megabyte,
    counted at ``chunk`` bytes each), each step no earlier than its bytes allow at ``rate``
    bytes per second: a step's ``at`` is the bytes written before it divided by ``rate``.

    Why paced: etcd writes its database in one commit every 100 ms, and an apply waits for
    a commit in progress; a snapshot put at once (15 MB in a few hundred ms) makes commits of
    megabytes, and each log put queued behind one waits for it -- the group's worst latency
    (issue 29). Paced, each commit carries at most ``rate / 10`` bytes of snapshot. A
    deletion counts as the bytes it frees (etcd writes the freed pages back)."""
    if chunk < 1 or rate < 1 or size < 0 or old_chunks < 0:
        raise ValueError("chunk and rate are >= 1, size and old_chunks >= 0")
    steps: list[Step] = []
    done = 0
    count = max(1, -(-size // chunk))
    for i in range(count):
        steps.append(Step(done / rate, True, i, i + 1))
        done += min(chunk, size - i * chunk)
    run = max(1, VALUE_LIMIT // chunk)  # chunks deleted by one request: about a megabyte
    for i in range(0, old_chunks, run):
        steps.append(Step(done / rate, False, i, min(i + run, old_chunks)))
        done += (min(i + run, old_chunks) - i) * chunk
    return steps


async def store_snapshot(
    etcd: Etcd,
    prefix: bytes,
    state: GroupState | EncodedSnapshot,
    sealer: Sealer | None,
    *,
    revision: int | None = None,
    chunk: int = VALUE_LIMIT,
    rate: int | None = None,
) -> tuple[int, int]:
    """Write ``state`` (a state, or its snapshot encoded at ``revision``) as the group's
    snapshot (its chunks of at most ``chunk`` bytes, one put at a time, then its description,
    sealed with ``sealer`` when given) and delete the previous one's chunks; (bytes, chunks).
    With ``rate``, the writes follow :func:`snapshot_plan` (at most ``rate`` bytes per
    second, the log's puts going between them); without, as fast as etcd answers."""
    if not 1 <= chunk <= VALUE_LIMIT:
        raise ValueError(f"a snapshot chunk is 1..{VALUE_LIMIT} bytes, not {chunk}")
    if isinstance(state, GroupState):
        revision = state.revision
        state = _encode(state)
    assert revision is not None
    data = state.data
    old = await etcd.get(prefix + b"snapshot")
    previous = None if old is None else _snapshot_description(old.value, sealer)
    if previous is not None and previous[0] >= revision:
        previous = None  # not older than this one: not ours to delete
    old_chunks = 0 if previous is None else previous[1]
    steps = snapshot_plan(len(data), old_chunks, chunk, rate or 1)
    count = sum(step.put for step in steps)
    base = prefix + b"snapshot/%020d/" % revision
    began = trio.current_time()
    for step in steps:
        if rate is not None:
            await trio.sleep_until(began + step.at)
        if step.put:
            offset = step.first * chunk
            await etcd.put(base + b"%06d" % step.first, data[offset : offset + chunk])
            if step.first == count - 1:  # the last chunk: the description, before deleting
                await _describe(etcd, prefix, revision, count, state, sealer)
        else:
            assert previous is not None
            gone = prefix + b"snapshot/%020d/" % previous[0]
            await etcd.delete_range(gone + b"%06d" % step.first, gone + b"%06d" % step.end)
    if previous is not None:  # what a chunk count that lied left (nothing, as a rule)
        await etcd.delete_prefix(prefix + b"snapshot/%020d/" % previous[0])
    return len(data), count


async def _describe(
    etcd: Etcd,
    prefix: bytes,
    revision: int,
    chunks: int,
    state: EncodedSnapshot,
    sealer: Sealer | None,
) -> None:
    meta = pack(
        {
            "revision": revision,
            "chunks": chunks,
            "size": len(state.data),
            "sha256": state.sha256,
        }
    )
    if sealer is not None:
        meta = sealer.seal_all(meta)
    await etcd.put(prefix + b"snapshot", meta)


def _snapshot_description(value: bytes, sealer: Sealer | None) -> tuple[int, int] | None:
    """The revision and chunk count a snapshot description names (None when it does not
    open, or is not a description: in a group without a secret anyone who can write to etcd
    can put anything there, and the writer must not stop on it)."""
    body = value if sealer is None else sealer.open(value)
    if body is None:
        return None
    try:
        meta = unpack(body)
        return int(meta["revision"]), int(meta["chunks"])
    except (ProtocolError, ValueError, TypeError, KeyError):
        return None


async def load_state(
    etcd: Etcd, prefix: bytes, genesis: Genesis, at_least: int, sealer: Sealer | None = None
) -> tuple[GroupState, bool]:
    """The group's latest snapshot (True), or a fresh state at the genesis (revision
    ``at_least``; False). With ``sealer`` the snapshot's description must open with it;
    SnapshotError when it does not, or the chunks do not match it."""
    meta_kv = await etcd.get(prefix + b"snapshot")
    waited = 0.0
    while meta_kv is None and sealer is not None and waited < FIRST_SNAPSHOT_WAIT:
        # A group with a secret has one from its creation: its creator is writing it.
        await trio.sleep(0.2)
        waited += 0.2
        meta_kv = await etcd.get(prefix + b"snapshot")
    if meta_kv is None:
        if sealer is not None:
            raise SnapshotError(
                "the group's genesis exists but its snapshot does not: deleted by someone, or "
                "its creator stopped before writing the first one (then no replica ever "
                "joined: delete the genesis key to create the group anew)"
            )
        state = GroupState(genesis)
        state.revision = at_least
        return state, False
    body = meta_kv.value if sealer is None else sealer.open(meta_kv.value)
    if body is None:
        raise SnapshotError(
            f"the group's snapshot (put at revision {meta_kv.mod_revision}) is not sealed by "
            "the group's secret: forged, or written by a replica given another secret"
        )
    if sealer is not None and sealer.signing_id not in Sealer.key_ids(meta_kv.value):
        # A rotation: seal its description with this replica's keys as well, so a replica
        # that will hold only the new key can read it (as the genesis).
        await etcd.put_if_mod_revision(
            prefix + b"snapshot", sealer.seal_all(body), meta_kv.mod_revision
        )
    try:
        meta = unpack(body)
        revision, chunks, digest = int(meta["revision"]), int(meta["chunks"]), meta["sha256"]
    except (ProtocolError, ValueError, TypeError, KeyError):
        raise SnapshotError(
            f"the group's snapshot (put at revision {meta_kv.mod_revision}) is not a snapshot's "
            "description: written by something else than a replica"
        ) from None
    base = prefix + b"snapshot/%020d/" % revision
    kvs, _ = await etcd.get_prefix(base)
    data = b"".join(kv.value for kv in kvs)
    if len(kvs) != chunks or hashlib.sha256(data).hexdigest() != digest:
        raise SnapshotError(f"snapshot at revision {revision} is incomplete or corrupt")
    state = GroupState.restore(data)
    if POLICY.freeze_big_tables:
        # The lockserver command's collector policy (_gcstats): the state just restored is
        # long-lived, and the next collections of the older generations would walk every
        # object of it (hundreds of thousands for a large state: tens of ms of the loop).
        # Frozen, the collector never walks it; reference counting still frees it.
        gc.freeze()
    log.info("loaded the group's snapshot at revision %d (%d bytes)", revision, len(data))
    return state, True


def _fit(ops: list[list[Any]]) -> list[tuple[list[list[Any]], bytes]]:
    """Split ``ops`` into runs whose entry fits an etcd value, each with its encoded ops
    (an entry's header adds less than 200 bytes to them; VALUE_LIMIT leaves far more)."""
    packed = encode_ops(ops)
    if len(ops) <= 1 or len(packed) <= VALUE_LIMIT:
        return [(ops, packed)]
    half = len(ops) // 2
    return _fit(ops[:half]) + _fit(ops[half:])


class ReplicatedDoor:
    """The lock core's calls (``engine.Door[Peer]``), for the shell of a replica: requests
    become ops of the next proposal (nothing is returned now: answers come when their entry
    is applied); reads of the state (statistics, uptime, deadlines, the HTTP listings) read
    the applied state and change nothing. A halted replica refuses every request: the
    connection is closed with UNAVAILABLE, naming why."""

    def __init__(self, replica: Replica) -> None:
        self.replica = replica

    @property
    def engine(self) -> Engine:
        return self.replica.state.core.engine

    def _refused(self, owner: Peer) -> bool:
        """True (and the connection stopped) when this replica has halted."""
        why = self.replica.halted
        if why is None:
            return False
        owner.stop(
            ErrorCode.UNAVAILABLE,
            f"{why}; it serves no request: reconnect to another replica of the group",
        )
        return True

    def execute(
        self,
        owner: Peer,
        request_id: int,
        session: SessionSpec,
        tx: Transaction,
        wait: float | None,
        now: float,
        trust: float,
        principal: str,
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
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
        n = r.number(owner)
        request = Execute(request_id, session, tx, wait)
        r.propose(["x", n, principal, wire(request)], request)
        return []

    def end_session(
        self,
        owner: Peer,
        request_id: int,
        session_id: str,
        *,
        now: float,
        trust: float,
        principal: str,
        admin: bool = False,
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
        n = r.number(owner)
        r.propose(["e", n, principal, admin, wire(EndSession(request_id, session_id))])
        return []

    def release(
        self,
        owner: Peer,
        request_id: int,
        namespace: str,
        table: str,
        var: str,
        session_id: str | None,
        *,
        now: float,
        trust: float,
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
        n = r.number(owner)
        msg = ForceRelease(request_id, namespace, table, var, session_id)
        r.propose(["r", n, wire(msg)])
        return []

    def listing(
        self,
        owner: Peer,
        request_id: int,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []

        def answer(name: Owner) -> list[Output[Owner]]:
            return [((name, request_id), r.state.core.read_listing(kind, query, visible=visible))]

        r.read(owner, request_id, answer)
        return []

    def page_at(
        self,
        kind: str,
        query: ListQuery,
        *,
        now: float,
        trust: float,
        visible: Visibility | None = None,
    ) -> tuple[Listed, list[Output[Peer]]]:
        # The HTTP face: the applied state, as it stands (only the log may change it; what
        # is due expires at the group's next tick).
        r = self.replica
        page = r.state.core.read_listing(kind, query, visible=visible)
        return (r.local_owners(page) if type(page) is SessionsListing else page), []

    def busiest_tables(
        self, n: int, *, visible: Visibility | None = None
    ) -> tuple[list[BusyTable], int]:
        return self.replica.state.core.busiest_tables(n, visible=visible)

    def subscribe(
        self,
        owner: Peer,
        request_id: int,
        namespace: str,
        table: str | None,
        principal: str = "",
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
        n = r.number(owner)
        r.propose(["s", n, wire(Subscribe(request_id, namespace, table)), principal])
        return []

    def unsubscribe(self, owner: Peer, request_id: int, target: int) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
        n = r.number(owner)
        r.propose(["u", n, wire(Unsubscribe(request_id, target))])
        return []

    def cancel(
        self, owner: Peer, request_id: int, target: int, *, now: float, trust: float
    ) -> list[Output[Peer]]:
        r = self.replica
        if self._refused(owner):
            return []
        n = r.number(owner)
        r.propose(["c", n, wire(Cancel(request_id, target))])
        return []

    def owner_gone(self, owner: Peer, *, now: float, trust: float) -> list[Output[Peer]]:
        r = self.replica
        n = r.forget(owner)
        if n is not None and r.halted is None:
            r.propose(["g", n])
        return []

    def advance(self, now: float, *, trust: float) -> list[Output[Peer]]:
        r = self.replica
        if r.tick_pending or r.halted is not None or not r.registered.is_set():
            return []
        due = r.next_tick()
        if due is not None and due <= r.group_now():
            r.tick_pending = True
            r.propose(["t"])
        return []

    def next_deadline(self) -> float | None:
        r = self.replica
        if r.tick_pending or r.halted is not None:
            return None
        due = r.next_tick()
        return None if due is None else r.to_trio(due)

    def uptime(self, now: float) -> float:
        r = self.replica
        return r.state.core.uptime(max(r.state.now, r.group_now()))

    def session_principal(self, session_id: str) -> str | None:
        return self.replica.state.core.session_principal(session_id)

    def visible_counts(self, visible: Visibility) -> VisibleCounts:
        return self.replica.state.core.visible_counts(visible)

    def statistics(self, now: float, *, trust: float) -> tuple[CoreStatistics, list[Output[Peer]]]:
        # The applied state as it stands (a read: every replica's state stays what the log
        # made it), its uptime as the estimate of the group's time.
        r = self.replica
        return r.state.core.peek_statistics(max(r.state.now, r.group_now())), []
