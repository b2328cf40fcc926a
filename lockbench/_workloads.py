"""Seeded, reproducible workloads: each one is an endless stream of abstract operations.

Why: the same workload must drive two very different servers (lockserver transactions and
Redis Lua scripts), so a workload only says *what* to lock, never *how*: it yields :class:`Op`
values (a kind, the keys, a ticket) and each backend maps an op kind to its own requests.

Determinism: the stream of task ``i`` is a pure function of ``(workload, seed, i, params)``. Every
task owns a ``random.Random`` seeded with a string built from those (string seeds are hashed
with SHA-512 by ``random``, so they are stable across runs and platforms). The same seed gives
the same key/op sequence; a different seed gives a different one. Tickets are ``t<task>.<n>``, so
they are unique per acquire and reproducible too.

One op is one *cycle*: acquire (try once, never wait), hold for ``hold`` seconds when it
succeeded, release. ``ping`` has no lock at all. Throughput figures count cycles ("pairs").
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator

import attrs

__all__ = [
    "MDS_PATIENTS",
    "WORKLOADS",
    "Op",
    "OpKind",
    "WorkloadParams",
    "WorkloadSpec",
    "op_stream",
    "take",
]

MDS_PATIENTS = 200  # patients per facility in the mds workload
MULTI_SIZE = 4  # locks per multilock set


class OpKind(enum.Enum):
    """What one cycle does. Backends dispatch on this."""

    PING = "ping"  # a round trip that locks nothing
    MUTEX = "mutex"  # exclusive lock on keys[0]
    READ = "read"  # shared (reader) lock on keys[0]
    WRITE = "write"  # exclusive (writer) lock on keys[0], excluded by readers
    MULTI = "multi"  # all of keys, or none
    SESSION = "session"  # open a fresh session, lock keys[0], end the session
    MDS_ENTRY = "mds-entry"  # keys = (facility, patient)
    MDS_REVIEW = "mds-review"  # keys = (facility, patient)
    MDS_MONTH_END = "mds-month-end"  # keys = (facility,)


@attrs.frozen
class Op:
    """One cycle of a workload."""

    kind: OpKind
    keys: tuple[str, ...]
    ticket: str


@attrs.frozen
class WorkloadParams:
    """Knobs shared by the workloads. ``keys`` None means the workload's default."""

    seed: int = 1
    keys: int | None = None
    write_ratio: float = 0.2  # rwlock: fraction of writers

    def __attrs_post_init__(self) -> None:
        if self.keys is not None and self.keys < 1:
            raise ValueError(f"--keys must be >= 1, got {self.keys}")
        if not 0.0 <= self.write_ratio <= 1.0:
            raise ValueError(f"--write-ratio must be in 0..1, got {self.write_ratio}")


@attrs.frozen
class WorkloadSpec:
    """A named workload: what it means, its default key count, its generator."""

    name: str
    summary: str
    default_keys: int
    generator: Callable[[random.Random, int, int, WorkloadParams], Iterator[Op]]
    min_keys: int = 1


def _ticket(task: int, n: int) -> str:
    return f"t{task}.{n}"


def _ping(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
    n = 0
    while True:
        yield Op(OpKind.PING, (), _ticket(task, n))
        n += 1


def _private_keys(
    kind: OpKind, prefix: str
) -> Callable[[random.Random, int, int, WorkloadParams], Iterator[Op]]:
    """Keys private to the task, walked in a seeded permutation: any window of up to ``keys``
    consecutive ops has distinct keys, so pipelined batches never collide with themselves."""

    def generate(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
        order = list(range(keys))
        rng.shuffle(order)
        n = 0
        while True:
            yield Op(kind, (f"{prefix}{task}:{order[n % keys]}",), _ticket(task, n))
            n += 1

    return generate


def _contended(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
    n = 0
    while True:
        yield Op(OpKind.MUTEX, (f"hot:{rng.randrange(keys)}",), _ticket(task, n))
        n += 1


def _rwlock(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
    n = 0
    while True:
        kind = OpKind.WRITE if rng.random() < p.write_ratio else OpKind.READ
        yield Op(kind, (f"rw:{rng.randrange(keys)}",), _ticket(task, n))
        n += 1


def _multilock(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
    n = 0
    while True:
        chosen = sorted(rng.sample(range(keys), MULTI_SIZE))
        yield Op(OpKind.MULTI, tuple(f"ml:{k}" for k in chosen), _ticket(task, n))
        n += 1


# Entry/review/month-end mix of the seed's clinical example (SEMANTICS.md): most work is data
# entry, some is review, and a month-end close of a facility is rare.
MDS_MIX = ((OpKind.MDS_ENTRY, 0.80), (OpKind.MDS_REVIEW, 0.18), (OpKind.MDS_MONTH_END, 0.02))


def _mds(rng: random.Random, task: int, keys: int, p: WorkloadParams) -> Iterator[Op]:
    kinds = [k for k, _ in MDS_MIX]
    weights = [w for _, w in MDS_MIX]
    n = 0
    while True:
        kind = rng.choices(kinds, weights)[0]
        facility = f"F{rng.randrange(keys)}"
        patient = f"P{rng.randrange(MDS_PATIENTS)}"
        op_keys = (facility,) if kind is OpKind.MDS_MONTH_END else (facility, patient)
        yield Op(kind, op_keys, _ticket(task, n))
        n += 1


WORKLOADS: dict[str, WorkloadSpec] = {
    spec.name: spec
    for spec in (
        WorkloadSpec(
            "mutex-uncontended",
            "acquire + release of a mutex on keys private to each task (never contended)",
            1000,
            _private_keys(OpKind.MUTEX, "u"),
        ),
        WorkloadSpec(
            "mutex-contended",
            "every task try-locks one of K hot keys (no waiting), holds it --hold s, releases",
            4,
            _contended,
        ),
        WorkloadSpec(
            "rwlock",
            "readers-writer lock on K keys: shared readers, exclusive writers (--write-ratio)",
            16,
            _rwlock,
        ),
        WorkloadSpec(
            "multilock",
            f"sets of {MULTI_SIZE} distinct locks out of K, taken all or nothing, then released",
            64,
            _multilock,
            min_keys=MULTI_SIZE,
        ),
        WorkloadSpec(
            "session-churn",
            "open a fresh session, lock one private key, end the session (Redis: fresh uid)",
            1000,
            _private_keys(OpKind.SESSION, "s"),
        ),
        WorkloadSpec(
            "mds",
            "the seed's clinical example: 80% MDS entry, 18% review, 2% month-end over K "
            f"facilities x {MDS_PATIENTS} patients, each lock released after use",
            8,
            _mds,
        ),
        WorkloadSpec("ping", "a round trip that touches no lock", 1, _ping),
    )
}


def op_stream(workload: str, params: WorkloadParams, task: int) -> Iterator[Op]:
    """The endless, reproducible op stream of task ``task``."""
    spec = WORKLOADS.get(workload)
    if spec is None:
        raise ValueError(f"unknown workload {workload!r} (known: {', '.join(WORKLOADS)})")
    keys = spec.default_keys if params.keys is None else params.keys
    if keys < spec.min_keys:
        raise ValueError(f"{workload} needs --keys >= {spec.min_keys}, got {keys}")
    rng = random.Random(f"lockbench:{workload}:{params.seed}:{task}")
    return spec.generator(rng, task, keys, params)


def take(stream: Iterator[Op], count: int) -> list[Op]:
    """The next ``count`` ops of a stream."""
    return [next(stream) for _ in range(count)]
