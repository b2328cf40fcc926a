"""The nemesis: which faults the lab injects, when, on which nodes, and how each is applied
and healed.

A run's faults are planned up front from the seed (:func:`plan`): after a quiet warm-up, one
fault at a time for a random while, then a quiet spell, until the cool-down at the end (so
every heal is followed by time to recover). The kinds asked for are drawn in shuffled rounds,
so each appears once before any appears twice. Each fault is logged as a
:class:`~lockbench.faults.Fault` with the time it was applied and the time it was healed.

Kinds (:data:`KINDS`; hosts move with their node: a client host sits on its node's side):

- network (nftables inside the hosts' namespaces): ``isolate`` (one node alone),
  ``majority`` (a minority of nodes cut from the majority), ``bridge`` (two halves that
  cannot see each other, both seeing one middle node), ``etcd-cut`` (one replica's own
  connections to etcd dropped while its clients still reach it, and its etcd member stays in
  the cluster), ``loss`` (one node no longer hears the others: their packets to it dropped
  with ``loss_percent`` probability, its own still delivered: one-way);
- processes: ``kill`` (the node crashes: its replica and etcd member SIGKILLed, restarted at
  the heal), ``kill-replica``, ``kill-etcd``, ``pause`` (SIGSTOP of both, SIGCONT at the
  heal; the fault lasts longer than the replica's lease), ``pause-replica``, ``pause-etcd``;
- clocks (libfaketime, replicas only): ``clock-step`` (one replica's wall clock stepped by
  ``±clock_offset`` while it runs, stepped back at the heal) and ``clock-skew`` (the replica
  restarted with its clock off by that much, restarted with a true clock at the heal).

Against etcd (no replicas) the replica-only kinds are left out of the plan, and said so.
There is no delay or jitter: this kernel has no netem, and the lab has no userspace relay.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Final

import attrs

from ._cluster import ETCD_CLIENT_PORT, Cluster, Proc
from ._history import Fault
from ._netns import Host, Lab, Rules

__all__ = ["KINDS", "REPLICA_ONLY", "Nemesis", "PlannedFault", "plan"]

KINDS: Final = (
    "isolate",
    "majority",
    "bridge",
    "etcd-cut",
    "loss",
    "kill",
    "kill-replica",
    "kill-etcd",
    "pause",
    "pause-replica",
    "pause-etcd",
    "clock-step",
    "clock-skew",
)
#: Kinds that need lockserver replicas (left out against etcd).
REPLICA_ONLY: Final = frozenset(
    {"etcd-cut", "kill-replica", "pause-replica", "clock-step", "clock-skew"}
)
#: Seconds a restarting replica gets for a graceful shutdown before SIGKILL.
GRACE: Final = 5.0


@attrs.frozen
class PlannedFault:
    """One fault of the plan: ``kind`` from ``start`` to ``end`` (lab time) on ``targets``;
    ``groups`` for partitions (the node sets; a bridge's middle node is the last group);
    ``offset`` for clock faults (seconds)."""

    kind: str
    start: float
    end: float
    targets: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...] = ()
    offset: float = 0.0

    @property
    def detail(self) -> str:
        if self.kind == "bridge":
            *halves, middle = self.groups
            return " | ".join(" ".join(h) for h in halves) + f" (bridged by {' '.join(middle)})"
        if self.groups:
            return " | ".join(" ".join(g) for g in self.groups)
        if self.kind.startswith("clock"):
            return f"{' '.join(self.targets)} {self.offset:+.0f} s"
        return " ".join(self.targets)


def expand(kinds: Sequence[str], system: str) -> tuple[list[str], list[str]]:
    """The kinds asked for (``all`` means every kind), unknown names refused (ValueError);
    returns ``(kinds that apply to system, kinds left out for it)``."""
    asked: list[str] = []
    for kind in kinds:
        if kind == "all":
            asked.extend(KINDS)
        elif kind in KINDS:
            asked.append(kind)
        else:
            raise ValueError(f"unknown nemesis {kind!r} (known: all, {', '.join(KINDS)})")
    asked = list(dict.fromkeys(asked))
    if system == "etcd":
        return [k for k in asked if k not in REPLICA_ONLY], [k for k in asked if k in REPLICA_ONLY]
    return asked, []


def plan(
    kinds: Sequence[str],
    nodes: Sequence[str],
    duration: float,
    seed: int,
    *,
    warmup: float = 5.0,
    cooldown: float = 10.0,
    fault_time: tuple[float, float] = (8.0, 14.0),
    quiet_time: tuple[float, float] = (6.0, 10.0),
    clock_offset: float = 3600.0,
    clock_sign: int = 0,
) -> list[PlannedFault]:
    """The faults of a run, one at a time between ``warmup`` and ``duration - cooldown``,
    deterministic for a seed. Every kind appears once per round (rounds shuffled). At least
    one fault when any fits; none when ``kinds`` is empty. Clock faults move a clock by
    ``clock_offset`` seconds, forward or back as drawn (``clock_sign`` 0) or as told (+1, -1)."""
    if not kinds:
        return []
    if len(nodes) < 2:
        raise ValueError("faults need at least 2 nodes")
    rng = random.Random(seed)
    out: list[PlannedFault] = []
    t = warmup
    end = duration - cooldown
    queue: list[str] = []
    while True:
        length = rng.uniform(*fault_time)
        if t + length > end:
            if out:
                break
            length = max(1.0, end - t)  # a short run still gets its one fault
            if length <= 0:
                break
        if not queue:
            queue = list(kinds)
            rng.shuffle(queue)
        kind = queue.pop(0)
        out.append(_one(kind, list(nodes), t, t + length, rng, clock_offset, clock_sign))
        t += length + rng.uniform(*quiet_time)
        if t >= end:
            break
    return out


def _one(
    kind: str,
    nodes: list[str],
    start: float,
    end: float,
    rng: random.Random,
    offset: float,
    sign: int,
) -> PlannedFault:
    shuffled = nodes[:]
    rng.shuffle(shuffled)
    if kind == "isolate":
        alone = shuffled[0]
        rest = tuple(sorted(shuffled[1:]))
        return PlannedFault(kind, start, end, (alone,), ((alone,), rest))
    if kind == "majority":
        k = (len(nodes) - 1) // 2
        minority, majority = tuple(sorted(shuffled[:k])), tuple(sorted(shuffled[k:]))
        return PlannedFault(kind, start, end, minority, (minority, majority))
    if kind == "bridge":
        middle = shuffled[0]
        others = shuffled[1:]
        half = len(others) // 2
        a, b = tuple(sorted(others[:half])), tuple(sorted(others[half:]))
        return PlannedFault(kind, start, end, (middle,), (a, b, (middle,)))
    if kind.startswith("clock"):
        drawn = rng.choice((1, -1))
        return PlannedFault(kind, start, end, (shuffled[0],), offset=(sign or drawn) * offset)
    return PlannedFault(kind, start, end, (shuffled[0],))


class Nemesis:
    """Applies a plan to a running lab, logging each fault through ``record`` once it is
    healed (a ``Fault`` with the times it was applied and healed); ``clock``
    is the lab clock. :meth:`run` blocks until the plan is done or :attr:`stop` is set;
    :meth:`heal_all` undoes whatever is in force (called on every exit)."""

    def __init__(
        self,
        lab: Lab,
        cluster: Cluster,
        clock: Callable[[], float],
        record: Callable[[Fault], None],
        *,
        loss_percent: int = 100,
        target_watched: bool = False,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.lab = lab
        self.cluster = cluster
        self.clock = clock
        self.record = record
        self.loss_percent = loss_percent
        self.target_watched = target_watched
        self.log = log
        self.stop = threading.Event()
        self.applied: list[Fault] = []
        self._active: tuple[PlannedFault, Fault] | None = None

    def run(self, faults: Sequence[PlannedFault]) -> None:
        for planned in faults:
            if not self._wait_until(planned.start):
                return
            self._apply(planned)
            if not self._wait_until(planned.end):
                return
            self.heal_all()

    def _wait_until(self, t: float) -> bool:
        delay = t - self.clock()
        if delay > 0:
            self.stop.wait(delay)
        return not self.stop.is_set()

    # --- applying ----------------------------------------------------------------------------

    def _apply(self, p: PlannedFault) -> None:
        if self.target_watched and p.kind in ("pause-etcd", "kill-etcd"):
            # The member the replicas' watches are on now, wherever failovers moved them:
            # the fault that tests a watch's own bound (issue 31).
            watched = self.cluster.watched_member()
            if watched is not None:
                p = attrs.evolve(p, targets=(watched,))
        start = self.clock()
        fault = Fault(p.kind, p.targets, start, None, p.detail)
        self._active = (p, fault)
        self.log(f"{start:7.1f} s  {p.kind} {p.detail}")
        kind = p.kind
        if kind in ("isolate", "majority", "bridge"):
            self._partition(p.groups, bridge=kind == "bridge")
        elif kind == "loss":
            self._loss(p.targets[0])
        elif kind == "etcd-cut":
            node = self.lab.host(p.targets[0])
            uid = self.cluster.replica_uid(node)
            self.lab.apply(node, Rules(cut_uid=uid, cut_port=ETCD_CLIENT_PORT))
        elif kind in ("kill", "kill-replica", "kill-etcd"):
            for proc in self._procs(kind, p.targets[0]):
                proc.kill()
        elif kind in ("pause", "pause-replica", "pause-etcd"):
            for proc in self._procs(kind, p.targets[0]):
                proc.stop()
        elif kind == "clock-step":
            self.cluster.set_clock(self.lab.host(p.targets[0]), p.offset)
        elif kind == "clock-skew":
            node = self.lab.host(p.targets[0])
            self.cluster.set_clock(node, p.offset)
            self._restart_replica(p.targets[0])
        else:  # plan() only makes known kinds
            raise ValueError(f"unknown fault kind {kind!r}")

    def _procs(self, kind: str, node: str) -> list[Proc]:
        procs: list[Proc] = []
        if not kind.endswith("-etcd") and node in self.cluster.replicas:
            procs.append(self.cluster.replicas[node])
        if not kind.endswith("-replica"):
            procs.append(self.cluster.etcd[node])
        return procs

    def _groups_of(self, groups: tuple[tuple[str, ...], ...], bridge: bool) -> dict[str, set[str]]:
        """For each node, the nodes it must not reach."""
        nodes = [n.name for n in self.lab.nodes]
        blocked: dict[str, set[str]] = {n: set() for n in nodes}
        if bridge:
            *halves, _middle = groups
            a, b = halves
            for x in a:
                blocked[x].update(b)
            for y in b:
                blocked[y].update(a)
            return blocked
        for group in groups:
            others = set(nodes) - set(group)
            for x in group:
                blocked[x].update(others)
        return blocked

    def _side(self, node: str) -> list[Host]:
        """The hosts that move with node ``node``: itself and its homed client host."""
        return [h for h in self.lab.hosts if node in (h.name, h.home)]

    def _addresses(self, nodes: set[str]) -> frozenset[str]:
        return frozenset(h.address for n in nodes for h in self.lab.hosts if n in (h.name, h.home))

    def _partition(self, groups: tuple[tuple[str, ...], ...], bridge: bool) -> None:
        for node, unreachable in self._groups_of(groups, bridge).items():
            rules = Rules(blocked=self._addresses(unreachable))
            for host in self._side(node):
                self.lab.apply(host, rules)

    def _loss(self, node: str) -> None:
        others = {n.name for n in self.lab.nodes} - {node}
        rules = Rules(lossy=self._addresses(others), loss_percent=self.loss_percent)
        for host in self._side(node):
            self.lab.apply(host, rules)

    def _restart_replica(self, node: str) -> None:
        proc = self.cluster.replicas[node]
        if proc.running and proc.process is not None:
            proc.cont()
            proc.process.terminate()  # graceful: SHUTTING_DOWN to its clients
            try:
                proc.process.wait(timeout=GRACE)
            except Exception:
                proc.kill()
            proc.process = None
        proc.start()

    # --- healing -----------------------------------------------------------------------------

    def heal_all(self) -> None:
        """Undo the fault in force, if any: rules cleared, processes continued or restarted,
        clocks true again; its ``Fault`` is recorded again with its end."""
        active, self._active = self._active, None
        for host in self.lab.hosts:
            self.lab.apply(host, Rules())
        for proc in [*self.cluster.replicas.values(), *self.cluster.etcd.values()]:
            if proc.stopped:
                proc.cont()
        skewed = active is not None and active[0].kind == "clock-skew"
        for name in self.cluster.clock_files:
            self.cluster.set_clock(self.lab.host(name), 0)
        if skewed:
            assert active is not None
            self._restart_replica(active[0].targets[0])
        for proc in [*self.cluster.etcd.values(), *self.cluster.replicas.values()]:
            if not proc.running:
                proc.start()
        if active is not None:
            fault = attrs.evolve(active[1], end=max(self.clock(), active[1].start))
            self.record(fault)
            self.applied.append(fault)
            self.log(f"{fault.end:7.1f} s  healed {fault.kind}")
