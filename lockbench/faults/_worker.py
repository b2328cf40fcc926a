"""A lab client process: runs inside a client host's namespace (``python -m
lockbench.faults._worker CONFIG.json``), runs its workload threads until the stop time (or
SIGTERM), and writes what they did to its own history file.

The configuration is a :class:`WorkerConfig` as JSON, written by the lab controller. The
process exits 0 when its threads ended cleanly, 1 when one died of an error (a bug of the
lab, printed), 2 for a configuration it cannot read.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any, Final

import attrs

from ._history import HistoryWriter
from ._workloads import Context, WorkloadSettings, start_threads

__all__ = ["WorkerConfig", "main"]

#: Seconds the threads get to finish their operation in flight after the stop.
JOIN_GRACE: Final = 15.0


@attrs.frozen
class WorkerConfig:
    """Everything a worker needs: who it is, where the servers and the resource are, the lab
    clock's origin and the stop time on it, the seed, its history file, its workloads
    (``{name: threads}``) and their settings."""

    system: str
    name: str
    servers: list[str]
    etcd: list[str]
    resource: tuple[str, int]
    origin: float
    stop_at: float
    seed: int
    history: str
    workloads: dict[str, int]
    settings: WorkloadSettings

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["resource"] = list(self.resource)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerConfig:
        return cls(
            system=str(data["system"]),
            name=str(data["name"]),
            servers=[str(s) for s in data["servers"]],
            etcd=[str(e) for e in data["etcd"]],
            resource=(str(data["resource"][0]), int(data["resource"][1])),
            origin=float(data["origin"]),
            stop_at=float(data["stop_at"]),
            seed=int(data["seed"]),
            history=str(data["history"]),
            workloads={str(k): int(v) for k, v in data["workloads"].items()},
            settings=WorkloadSettings(**data["settings"]),
        )


def run(config: WorkerConfig) -> int:
    """Run the workloads of ``config``; the exit status."""
    errors: list[str] = []
    with HistoryWriter(config.history) as writer:
        ctx = Context(
            system=config.system,
            name=config.name,
            servers=config.servers,
            etcd=config.etcd,
            resource=config.resource,
            origin=config.origin,
            stop_at=config.stop_at,
            seed=config.seed,
            writer=writer,
            settings=config.settings,
        )
        signal.signal(signal.SIGTERM, lambda signum, frame: ctx.stop.set())
        threads = start_threads(ctx, config.workloads, errors)
        while not ctx.stopping():
            ctx.stop.wait(0.2)
        ctx.stop.set()
        deadline = time.monotonic() + JOIN_GRACE
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        ctx.flush_inflight("still in flight when the worker stopped")
    for error in errors:
        print(f"lab worker {config.name}: {error}", file=sys.stderr)
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m lockbench.faults._worker CONFIG.json", file=sys.stderr)
        return 2
    try:
        with open(args[0], encoding="utf-8") as f:
            config = WorkerConfig.from_json(json.load(f))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"lab worker: cannot read {args[0]}: {exc}", file=sys.stderr)
        return 2
    return run(config)


if __name__ == "__main__":
    sys.exit(main())
