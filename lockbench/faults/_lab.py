"""One lab run, start to verdict: build the hosts, start the system under test, start the
fenced resource and the client workers, inject the planned faults, stop, gather the
history, judge it and write the report.

The controller runs on the machine's own network namespace only to create the lab; for
the run it enters the lab's outer namespace (:func:`~lockbench.faults._netns.inside`), where
it reaches every host at its address and serves the fenced resource on the bridge. Client
workers are processes inside the client hosts, each writing its own history file; the
controller writes the meta record, the resource's writes and the faults to its own, and the
files are merged into ``history.jsonl`` in the output directory at the end.

Teardown is unconditional: a ``finally`` heals the fault in force, stops the workers and the
cluster, and deletes the namespaces, on a normal end, an error, Ctrl-C and SIGTERM (the
command turns it into SystemExit). A controller killed outright leaves namespaces behind; the
next run removes them before it starts (``_netns.remove_leftovers``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import attrs

from ._cluster import Cluster, faketime_library
from ._history import History, HistoryWriter, Meta, read_history
from ._nemesis import Nemesis, PlannedFault, expand, plan
from ._netns import BRIDGE_ADDRESS, Lab, inside, refusal
from ._resource import FencedResource
from ._worker import JOIN_GRACE, WorkerConfig
from ._workloads import ETCD_WORKLOADS, LOCKSERVER_WORKLOADS, WorkloadSettings

__all__ = ["LabConfig", "LabRun", "lab_refusal", "run_lab"]

#: Threads per client host for each workload, by system.
DEFAULT_WORKLOADS: Final = {
    "lockserver": {"register": 2, "mutex": 2, "rw": 2, "semaphore": 1},
    "etcd": {"register": 2, "mutex": 2},
}
HISTORY: Final = "history.jsonl"


@attrs.frozen
class LabConfig:
    """A run: the system (``lockserver`` or ``etcd``), nodes (3 or 5 ...), seconds, the
    nemeses, the seed, the output directory, the schedule's shape and the workloads."""

    out: Path
    system: str = "lockserver"
    nodes: int = 3
    duration: float = 90.0
    nemesis: tuple[str, ...] = ("isolate", "kill", "clock-step")
    seed: int = 1
    warmup: float = 5.0
    cooldown: float = 10.0
    fault_time: tuple[float, float] = (8.0, 14.0)
    quiet_time: tuple[float, float] = (6.0, 10.0)
    clock_offset: float = 3600.0
    clock_sign: int = 0  # 0: each clock fault's direction drawn; +1 / -1: always that way
    loss_percent: int = 100
    lease_ttl: int = 2
    #: pause-etcd / kill-etcd stop the member the replicas watch at the fault's start.
    target_watched: bool = False
    workloads: dict[str, int] | None = None
    settings: WorkloadSettings = attrs.field(factory=WorkloadSettings)

    def validate(self) -> None:
        """ValueError for what cannot run."""
        if self.system not in DEFAULT_WORKLOADS:
            raise ValueError(f"--system must be lockserver or etcd, not {self.system!r}")
        if not 2 <= self.nodes <= 9:
            raise ValueError(f"--nodes must be 2..9, not {self.nodes}")
        if self.duration <= self.warmup + self.cooldown:
            raise ValueError(
                f"--duration {self.duration} leaves no time for faults after the warm-up "
                f"({self.warmup} s) and before the cool-down ({self.cooldown} s)"
            )
        if not 1 <= self.loss_percent <= 100:
            raise ValueError(f"--loss-percent must be 1..100, not {self.loss_percent}")
        allowed = LOCKSERVER_WORKLOADS if self.system == "lockserver" else ETCD_WORKLOADS
        for name, count in self.chosen_workloads().items():
            if name not in allowed:
                raise ValueError(f"{self.system} has no workload {name!r} ({', '.join(allowed)})")
            if count < 0:
                raise ValueError(f"workload {name}: a negative number of threads")
        expand(self.nemesis, self.system)

    def chosen_workloads(self) -> dict[str, int]:
        return (
            dict(self.workloads)
            if self.workloads is not None
            else dict(DEFAULT_WORKLOADS[self.system])
        )

    def plan(self, nodes: list[str]) -> tuple[list[PlannedFault], list[str]]:
        """The faults of this run, and the nemeses left out for this system."""
        kinds, left_out = expand(self.nemesis, self.system)
        faults = plan(
            kinds,
            nodes,
            self.duration,
            self.seed,
            warmup=self.warmup,
            cooldown=self.cooldown,
            fault_time=self.fault_time,
            quiet_time=self.quiet_time,
            clock_offset=self.clock_offset,
            clock_sign=self.clock_sign,
        )
        return faults, left_out


@attrs.frozen
class LabRun:
    """What a run produced: the merged history's path, the history, the faults planned, the
    nemeses left out, and the workers' exit statuses (non-zero: a worker's bug)."""

    history_path: Path
    history: History
    planned: tuple[PlannedFault, ...]
    left_out: tuple[str, ...]
    worker_status: dict[str, int | None]


def lab_refusal(system: str) -> str | None:
    """Why this machine cannot run a lab of ``system`` (one line), or None."""
    why = refusal()
    if why is not None:
        return why
    if shutil.which("etcd") is None:
        return "the fault lab needs etcd (Debian package etcd-server), which is missing"
    if system == "lockserver" and faketime_library() is None:
        return "the fault lab's clock faults need libfaketime (Debian package faketime)"
    if shutil.which("setpriv") is None:
        return "the fault lab needs setpriv (Debian package util-linux)"
    return None


def _default_log(line: str) -> None:
    print(line, flush=True)


def run_lab(config: LabConfig, log: Callable[[str], None] = _default_log) -> LabRun:
    """Run the lab of ``config`` and return what it recorded (the history is also at
    ``config.out / history.jsonl``). PermissionError when the lab cannot run here (the
    reason in one line); RuntimeError when the system under test does not come up."""
    config.validate()
    why = lab_refusal(config.system)
    if why is not None:
        raise PermissionError(why)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    parts = out / "parts"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir()
    (out / HISTORY).unlink(missing_ok=True)
    lab = Lab(config.nodes)
    planned, left_out = config.plan([n.name for n in lab.nodes])
    if left_out:
        log(f"left out against {config.system} (they need replicas): {', '.join(left_out)}")
    data_dir = Path(tempfile.mkdtemp(prefix=f"{lab.prefix}{lab.run_id}-"))
    statuses: dict[str, int | None] = {}
    try:
        with lab, inside(lab.outer_path):
            cluster = Cluster(
                lab,
                config.system,
                data_dir,
                out / "logs",
                lease_ttl=config.lease_ttl,
            )
            try:
                log(f"lab {lab.run_id}: {config.nodes} nodes, {config.system}; starting")
                cluster.start()
                statuses = _run_inside(config, lab, cluster, planned, left_out, parts, log)
            finally:
                cluster.terminate()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    history_path = _merge(parts, out / HISTORY)
    shutil.rmtree(parts, ignore_errors=True)
    history = read_history(history_path)
    return LabRun(history_path, history, tuple(planned), tuple(left_out), statuses)


def _run_inside(
    config: LabConfig,
    lab: Lab,
    cluster: Cluster,
    planned: list[PlannedFault],
    left_out: list[str],
    parts: Path,
    log: Callable[[str], None],
) -> dict[str, int | None]:
    origin = time.monotonic()
    origin_wall = time.time()

    def clock() -> float:
        return time.monotonic() - origin

    workloads = config.chosen_workloads()
    meta = Meta(
        system=config.system,
        nodes=tuple(n.name for n in lab.nodes),
        seed=config.seed,
        origin_monotonic=origin,
        origin_wall=origin_wall,
        settings={
            "duration": config.duration,
            "nemesis": list(config.nemesis),
            "left_out": left_out,
            "planned": [attrs.asdict(p) for p in planned],
            "workloads": workloads,
            "workload_settings": config.settings.to_json(),
            "clock_offset": config.clock_offset,
            "clock_sign": config.clock_sign,
            "loss_percent": config.loss_percent,
            "replica_lease_ttl": config.lease_ttl,
            "lab": lab.run_id,
            "load_average": list(os.getloadavg()),
            "cpus": os.cpu_count(),
        },
    )
    with HistoryWriter(parts / "0-controller.jsonl") as writer:
        writer.write(meta)
        resource = FencedResource(BRIDGE_ADDRESS, clock, writer.write).start()
        nemesis = Nemesis(
            lab,
            cluster,
            clock,
            writer.write,
            loss_percent=config.loss_percent,
            target_watched=config.target_watched,
            log=log,
        )
        workers: dict[str, Any] = {}
        try:
            for i, host in enumerate(lab.clients):
                workers[host.name] = _start_worker(
                    config, lab, cluster, host, i, origin, resource.address, workloads, parts
                )
            log(f"{len(workers)} client hosts running {workloads}; {len(planned)} faults planned")
            nemesis.run(planned)
            _wait_clock(clock, config.duration)
        finally:
            nemesis.stop.set()
            nemesis.heal_all()
            statuses = _stop_workers(workers, clock, config.duration)
            resource.close()
        log(
            f"done: resource accepted {resource.accepted}, refused {resource.refused}; "
            f"workers {statuses}"
        )
    return statuses


def _start_worker(
    config: LabConfig,
    lab: Lab,
    cluster: Cluster,
    host: Any,
    index: int,
    origin: float,
    resource: tuple[str, int],
    workloads: dict[str, int],
    parts: Path,
) -> Any:
    def home_first(items: list[str]) -> list[str]:
        return items[index:] + items[:index]

    worker = WorkerConfig(
        system=config.system,
        name=host.name,
        servers=home_first(cluster.replica_addresses) if cluster.replicas else [],
        etcd=home_first(cluster.etcd_endpoints),
        resource=resource,
        origin=origin,
        stop_at=config.duration,
        seed=config.seed,
        history=str(parts / f"1-{host.name}.jsonl"),
        workloads=workloads,
        settings=config.settings,
    )
    path = parts / f"{host.name}.config.json"
    path.write_text(json.dumps(worker.to_json()))
    log_file = open(parts.parent / "logs" / f"worker-{host.name}.log", "ab")  # noqa: SIM115
    try:
        return lab.popen(
            host, [sys.executable, "-m", "lockbench.faults._worker", str(path)], log=log_file
        )
    finally:
        log_file.close()


def _wait_clock(clock: Callable[[], float], t: float) -> None:
    while clock() < t:
        time.sleep(min(0.5, max(0.0, t - clock())))


def _stop_workers(
    workers: dict[str, Any], clock: Callable[[], float], duration: float
) -> dict[str, int | None]:
    """Let the workers end by themselves at the stop time (SIGTERM when the run ends early),
    bounded; SIGKILL a worker that does not."""
    early = clock() < duration
    for p in workers.values():
        if early and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    deadline = time.monotonic() + JOIN_GRACE + 10.0
    statuses: dict[str, int | None] = {}
    for name, p in workers.items():
        try:
            statuses[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except Exception:
            p.kill()
            p.wait(timeout=5)
            statuses[name] = None
    return statuses


def _merge(parts: Path, target: Path) -> Path:
    """Concatenate the parts (controller first: its meta leads) into ``target``; a worker's
    torn last line (it was killed mid-write) is dropped."""
    with open(target, "w", encoding="utf-8") as out:
        for part in sorted(parts.glob("*.jsonl")):
            text = part.read_text(encoding="utf-8")
            if text and not text.endswith("\n"):
                text = text[: text.rfind("\n") + 1]
            out.write(text)
    return target
