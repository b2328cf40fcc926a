"""The JSON result file: what a run measured, how, and on which machine.

Why: results are compared across runs and machines (``lockbench compare``), drawn
(``lockbench plot``) and quoted in the README, so they are written in one documented, validated
shape. A file is a :class:`ResultDocument`: the schema tag, when, the machine, and one or more
:class:`Result` records (a ``run`` writes one; a blast suite writes one per phase). Reading
validates every key and type and names the first one at fault.

Layouts: ``params.layout`` says where the server and the load ran (``pinned``, ``unpinned``,
``partial`` or ``unknown``, as :mod:`._layout` observed them) and ``extra.cpus`` which CPUs
each had; results written before layouts existed have neither.

Units: seconds (``*_s``), microseconds (``latency_us``), bytes (``*_bytes``). Throughput counts
*ops* (workload cycles: one acquire+release pair, one ping...) and *requests* (transactions or
commands on the wire).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ._hdr import PERCENTILES
from ._spawn import server_root

__all__ = [
    "SCHEMA",
    "Result",
    "ResultDocument",
    "SchemaError",
    "machine_info",
    "read_document",
    "write_document",
]

SCHEMA = "lockbench/1"
LATENCY_KEYS = ("count", "min", "mean", *(f"p{p:g}" for p in PERCENTILES), "max")
_PACKAGES = ("trio", "msgpack", "attrs", "redis", "hdrhistogram", "rich", "psutil", "matplotlib")


class SchemaError(ValueError):
    """A result file that does not have the documented shape."""


@attrs.frozen
class Result:
    """One measurement."""

    name: str  # the workload, or the blast phase
    kind: str  # "run" or "blast"
    backend: str  # "lockserver" or "redis"
    target: str  # the target URL
    spawned: bool  # whether lockbench started the server itself
    client: str  # "sync", "async" (our client / redis-py) or "raw" (the blaster)
    params: Mapping[str, Any]  # the command-line knobs that shaped the load
    elapsed_s: float  # measured window (after warm-up)
    ops: int
    requests: int
    ops_per_s: float
    requests_per_s: float
    acquires: int  # acquire attempts
    acquired: int  # ... that succeeded
    errors: int  # requests that raised (connection trouble, protocol errors)
    error_samples: Sequence[str]
    latency_us: Mapping[str, float]  # LATENCY_KEYS; one request's round trip
    latency_hdr: str  # the whole histogram, encoded (see _hdr.LatencyHistogram.encode)
    server_cpu_s: float | None  # server CPU seconds over the window, when the pid was known
    server_cpu_s_per_1k_ops: float | None
    server_rss_bytes: int | None  # at the end of the window
    timeline: Sequence[Mapping[str, Any]]  # samples every ~0.5 s: t, ops_per_s, trust, uptime...
    extra: Mapping[str, Any] = attrs.field(factory=dict)  # kind-specific figures

    @property
    def acquire_success_ratio(self) -> float | None:
        """acquired / acquires, None when nothing tried to lock."""
        return self.acquired / self.acquires if self.acquires else None

    @property
    def label(self) -> str:
        """A short human label: backend, name, the shape of the load and its layout
        (``pinned``, ``unpinned``...: see :mod:`._layout`)."""
        p = self.params
        shape = f"c{p.get('connections', '?')}"
        if p.get("concurrency") not in (None, p.get("connections")):
            shape += f"/t{p['concurrency']}"
        if p.get("pipeline", 1) != 1:
            shape += f"/p{p['pipeline']}"
        if p.get("processes", 1) != 1:
            shape += f"/P{p['processes']}"
        if p.get("servers", 1) != 1:
            shape += f"/S{p['servers']}"
        layout = f" {p['layout']}" if "layout" in p else ""  # results before layouts: none
        return f"{self.backend} {self.name} {self.client} {shape}{layout}"

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (with the derived success ratio)."""
        out = attrs.asdict(self, recurse=False)
        out["params"] = dict(self.params)
        out["error_samples"] = list(self.error_samples)
        out["latency_us"] = dict(self.latency_us)
        out["timeline"] = [dict(s) for s in self.timeline]
        out["extra"] = dict(self.extra)
        out["acquire_success_ratio"] = self.acquire_success_ratio
        return out

    @classmethod
    def from_json(cls, data: Any, where: str = "result") -> Result:
        """Validate and build a record; raises SchemaError naming the offending key."""
        if not isinstance(data, dict):
            raise SchemaError(f"{where}: expected an object, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for key, types in _FIELD_TYPES.items():
            if key not in data:
                if key == "extra":
                    continue
                raise SchemaError(f"{where}: missing key {key!r}")
            value = data[key]
            if isinstance(value, bool) and bool not in types:
                raise SchemaError(f"{where}.{key}: expected {_names(types)}, got bool")
            if not isinstance(value, types):
                raise SchemaError(f"{where}.{key}: expected {_names(types)}, got {_tname(value)}")
            kwargs[key] = value
        if kwargs["kind"] not in ("run", "blast"):
            raise SchemaError(f"{where}.kind: expected 'run' or 'blast', got {kwargs['kind']!r}")
        for k in LATENCY_KEYS:
            v = kwargs["latency_us"].get(k)
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise SchemaError(f"{where}.latency_us.{k}: expected a number, got {_tname(v)}")
        for i, s in enumerate(kwargs["timeline"]):
            if not isinstance(s, dict) or not isinstance(s.get("t"), int | float):
                raise SchemaError(f"{where}.timeline[{i}]: expected an object with a number 't'")
        if not all(isinstance(s, str) for s in kwargs["error_samples"]):
            raise SchemaError(f"{where}.error_samples: expected a list of strings")
        for key in ("elapsed_s", "ops_per_s", "requests_per_s"):
            kwargs[key] = float(kwargs[key])
        for key in ("server_cpu_s", "server_cpu_s_per_1k_ops"):
            if kwargs[key] is not None:
                kwargs[key] = float(kwargs[key])
        return cls(**kwargs)


_NUM = (int, float)
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "kind": (str,),
    "backend": (str,),
    "target": (str,),
    "spawned": (bool,),
    "client": (str,),
    "params": (dict,),
    "elapsed_s": _NUM,
    "ops": (int,),
    "requests": (int,),
    "ops_per_s": _NUM,
    "requests_per_s": _NUM,
    "acquires": (int,),
    "acquired": (int,),
    "errors": (int,),
    "error_samples": (list,),
    "latency_us": (dict,),
    "latency_hdr": (str,),
    "server_cpu_s": (*_NUM, type(None)),
    "server_cpu_s_per_1k_ops": (*_NUM, type(None)),
    "server_rss_bytes": (int, type(None)),
    "timeline": (list,),
    "extra": (dict,),
}


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _names(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


@attrs.frozen
class ResultDocument:
    """A result file: schema tag, creation time, machine, results."""

    results: tuple[Result, ...]
    machine: Mapping[str, Any] = attrs.field(factory=dict)
    created: str = attrs.field(
        factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    )

    def to_json(self) -> dict[str, Any]:
        """JSON-ready data."""
        return {
            "schema": SCHEMA,
            "created": self.created,
            "machine": dict(self.machine),
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, data: Any) -> ResultDocument:
        """Validate and build a document."""
        if not isinstance(data, dict):
            raise SchemaError(f"a result file holds an object, got {_tname(data)}")
        if data.get("schema") != SCHEMA:
            raise SchemaError(f"unknown schema {data.get('schema')!r} (expected {SCHEMA!r})")
        results = data.get("results")
        if not isinstance(results, list) or not results:
            raise SchemaError("'results' must be a non-empty list")
        machine = data.get("machine", {})
        created = data.get("created", "")
        if not isinstance(machine, dict) or not isinstance(created, str):
            raise SchemaError("'machine' must be an object and 'created' a string")
        return cls(
            tuple(Result.from_json(r, f"results[{i}]") for i, r in enumerate(results)),
            machine,
            created,
        )


def write_document(path: str | os.PathLike[str], doc: ResultDocument) -> None:
    """Write ``doc`` as indented JSON (parent directories are created)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(doc.to_json(), indent=1) + "\n", encoding="utf-8")


def read_document(path: str | os.PathLike[str]) -> ResultDocument:
    """Read and validate a result file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: not JSON ({exc})") from None
    try:
        return ResultDocument.from_json(data)
    except SchemaError as exc:
        raise SchemaError(f"{path}: {exc}") from None


def machine_info() -> dict[str, Any]:
    """The machine a result was measured on: cores, CPU model, Python, package versions, the
    git commit of the tree, the directory and commit of the code a spawned lockserver runs
    (``$LOCKBENCH_SERVER_ROOT`` names another checkout), and redis-server's version when
    installed."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    packages: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    root = server_root()
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "packages": packages,
        "commit": _run(["git", "rev-parse", "--short", "HEAD"]),
        "server_root": str(root),
        "server_commit": _run(["git", "rev-parse", "--short", "HEAD"], root),
        "redis_server": _run(["redis-server", "--version"]),
    }


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=cwd or Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None
