"""The fault lab's history: what every lab client did and what every fault was, one JSON object
per line, written while the lab runs and read back whole by the checkers.

A history file holds five kinds of record, each a JSON object with a ``"type"``:

- ``"meta"`` (:class:`Meta`): what ran -- the system under test, the nodes, the seed, the lab
  clock's origin as wall-clock time. One per file, first.
- ``"op"`` (:class:`Op`): one operation of one client, from the moment it was sent
  (``invoke``) to the moment its outcome came (``complete``), with that outcome: ``ok``
  (it took effect, and ``value`` is what it returned), ``fail`` (it certainly did not take
  effect) or ``unknown`` (the client never learned: a timeout, a lost connection; Jepsen's
  ``:info``). An unknown operation may have taken effect at any moment from its invocation
  on, or never: checkers treat its interval as ``[invoke, +inf)``; ``complete`` then says
  when the client gave up, for the timeline only. A lock workload's granted ``acquire``
  carries its ``fence`` and, in ``value``, ``{"mode": "w" | "r" | "s", "valid_until": t}``:
  the holder's guarantee deadline on the lab clock, computed from the grant's
  ``valid_until`` as the client recipes do (the checkers flag a conflicting grant made before
  ``t`` while the holder had not sent its release). A process whose operation ended unknown
  continues under a new name, ``name.1``, ``name.2``... (Jepsen retires such a process); the
  checkers count them as one client.
- ``"hold"``: one critical section as a client believed it held a lock: exactly
  :class:`lockbench.safety.Interval` (recorded after the grant arrived, before the release is
  sent, so an overlap is a real one).
- ``"write"`` (:class:`ResourceWrite`): one write offered to the lab's fenced resource, and
  whether the resource accepted it (a write is accepted only with a fence at least the
  highest the resource has seen).
- ``"fault"`` (:class:`Fault`): one fault the nemesis injected, from ``start`` to ``end``
  (``None`` while it lasts; a run that ends mid-fault heals it and records the end).

Times are seconds on the lab clock: ``time.monotonic()`` minus the lab's origin
(:attr:`Meta.origin_monotonic`). CLOCK_MONOTONIC is one clock for every process of the
machine, whichever network namespace it runs in, so the times of clients in different
namespaces compare. (A clock fault skews what the *lock servers* read, never this clock.)

Rules kept:
- **Append-only and crash-safe**: :class:`HistoryWriter` writes and flushes a whole line per
  record from any thread; a lab killed mid-run leaves a readable prefix (a torn last line is
  skipped by :func:`read_history` with ``tolerate_torn_tail``).
- **Strict reading**: a malformed record raises ValueError naming its file and line, so a
  checker never passes a history it could not read.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from typing import IO, Any, Final, Literal

import attrs

from lockbench.safety import Interval

__all__ = [
    "OUTCOMES",
    "Fault",
    "History",
    "HistoryWriter",
    "Meta",
    "Op",
    "ResourceWrite",
    "read_history",
]

OUTCOMES: Final = ("ok", "fail", "unknown")
Outcome = Literal["ok", "fail", "unknown"]


def _time(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def _optional_time(value: object, what: str) -> float | None:
    return None if value is None else _time(value, what)


def _fence(value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"fence must be an integer or null, got {value!r}")
    return value


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    return value


@attrs.frozen
class Meta:
    """What a history records: the system under test (``"lockserver"`` or ``"etcd"``), its
    nodes, the run's seed, the lab clock's origin (``time.monotonic()`` and ``time.time()``
    read together at the start), and anything else worth keeping (``settings``)."""

    system: str
    nodes: tuple[str, ...]
    seed: int
    origin_monotonic: float
    origin_wall: float
    settings: Mapping[str, Any] = attrs.field(factory=dict)

    def to_json(self) -> dict[str, Any]:
        """As one line's JSON map."""
        return {
            "type": "meta",
            "system": self.system,
            "nodes": list(self.nodes),
            "seed": self.seed,
            "origin_monotonic": self.origin_monotonic,
            "origin_wall": self.origin_wall,
            "settings": dict(self.settings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Meta:
        """From :meth:`to_json`'s map (ValueError/TypeError/KeyError when malformed)."""
        nodes = data["nodes"]
        if not isinstance(nodes, list):
            raise ValueError(f"nodes must be a list, got {nodes!r}")
        seed = data["seed"]
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        settings = data.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError(f"settings must be a map, got {settings!r}")
        return cls(
            system=_text(data["system"], "system"),
            nodes=tuple(_text(n, "a node") for n in nodes),
            seed=seed,
            origin_monotonic=_time(data["origin_monotonic"], "origin_monotonic"),
            origin_wall=_time(data["origin_wall"], "origin_wall"),
            settings=settings,
        )


@attrs.frozen
class Op:
    """One operation of one client (see the module header for the outcomes).

    ``process`` names the client (one operation at a time per process); ``workload`` the
    workload it belongs to (``"register"``, ``"mutex"``, ``"rw"``, ``"semaphore"``...);
    ``f`` what it did (``"read"``, ``"write"``, ``"cas"``, ``"acquire"``, ``"release"``...);
    ``key`` the register or lock. ``value``: a write's value, a cas's ``[expected, new]``, a
    read's result once ``ok`` (``None`` otherwise). ``fence``: the grant's fence when the
    operation returned one. ``node``: the node the client sent it to. ``error``: why it
    failed or is unknown.
    """

    process: str
    workload: str
    f: str
    key: str
    value: Any
    invoke: float
    complete: float | None
    outcome: Outcome
    fence: int | None = None
    node: str = ""
    error: str = ""

    def __attrs_post_init__(self) -> None:
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.outcome != "unknown" and self.complete is None:
            raise ValueError(f"an {self.outcome!r} operation needs its complete time")
        if self.complete is not None and self.complete < self.invoke:
            raise ValueError(f"complete {self.complete} is before invoke {self.invoke}")

    def to_json(self) -> dict[str, Any]:
        """As one line's JSON map."""
        return {"type": "op", **attrs.asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Op:
        """From :meth:`to_json`'s map (ValueError/TypeError/KeyError when malformed)."""
        return cls(
            process=_text(data["process"], "process"),
            workload=_text(data["workload"], "workload"),
            f=_text(data["f"], "f"),
            key=_text(data["key"], "key"),
            value=data.get("value"),
            invoke=_time(data["invoke"], "invoke"),
            complete=_optional_time(data.get("complete"), "complete"),
            outcome=data["outcome"],
            fence=_fence(data.get("fence")),
            node=_text(data.get("node", ""), "node"),
            error=_text(data.get("error", ""), "error"),
        )


@attrs.frozen
class ResourceWrite:
    """One write offered to the fenced resource guarding ``lock``: by ``holder`` with
    ``fence`` at ``time``; ``accepted`` unless ``fence`` was below ``highest``, the highest
    fence the resource had accepted before (``None``: none yet)."""

    lock: str
    holder: str
    fence: int | None
    time: float
    accepted: bool
    highest: int | None = None

    def to_json(self) -> dict[str, Any]:
        """As one line's JSON map."""
        return {"type": "write", **attrs.asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResourceWrite:
        """From :meth:`to_json`'s map (ValueError/TypeError/KeyError when malformed)."""
        accepted = data["accepted"]
        if not isinstance(accepted, bool):
            raise ValueError(f"accepted must be true or false, got {accepted!r}")
        return cls(
            lock=_text(data["lock"], "lock"),
            holder=_text(data["holder"], "holder"),
            fence=_fence(data.get("fence")),
            time=_time(data["time"], "time"),
            accepted=accepted,
            highest=_fence(data.get("highest")),
        )


@attrs.frozen
class Fault:
    """One fault: ``kind`` (``"isolate"``, ``"kill-replica"``, ``"clock-step"``...) on
    ``targets`` (node names) from ``start`` to ``end`` (``None`` while it lasts), with a
    human ``detail`` (``"n1 | n2 n3"``, ``"+3600 s"``)."""

    kind: str
    targets: tuple[str, ...]
    start: float
    end: float | None = None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        """As one line's JSON map."""
        return {
            "type": "fault",
            "kind": self.kind,
            "targets": list(self.targets),
            "start": self.start,
            "end": self.end,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fault:
        """From :meth:`to_json`'s map (ValueError/TypeError/KeyError when malformed)."""
        targets = data["targets"]
        if not isinstance(targets, list):
            raise ValueError(f"targets must be a list, got {targets!r}")
        start = _time(data["start"], "start")
        end = _optional_time(data.get("end"), "end")
        if end is not None and end < start:
            raise ValueError(f"end {end} is before start {start}")
        return cls(
            kind=_text(data["kind"], "kind"),
            targets=tuple(_text(t, "a target") for t in targets),
            start=start,
            end=end,
            detail=_text(data.get("detail", ""), "detail"),
        )


Record = Meta | Op | Interval | ResourceWrite | Fault


@attrs.frozen
class History:
    """A whole history, by kind, each list in file order."""

    meta: Meta | None
    ops: tuple[Op, ...]
    holds: tuple[Interval, ...]
    writes: tuple[ResourceWrite, ...]
    faults: tuple[Fault, ...]


def _to_line(record: Record) -> str:
    if isinstance(record, Interval):
        data: dict[str, Any] = {"type": "hold", **record.to_json()}
    else:
        data = record.to_json()
    return json.dumps(data, separators=(",", ":")) + "\n"


def _from_map(data: Any) -> Record:
    if not isinstance(data, dict):
        raise ValueError(f"a record must be a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    if kind == "op":
        return Op.from_json(data)
    if kind == "hold":
        return Interval.from_json(data)
    if kind == "write":
        return ResourceWrite.from_json(data)
    if kind == "fault":
        return Fault.from_json(data)
    if kind == "meta":
        return Meta.from_json(data)
    raise ValueError(f"unknown record type {kind!r}")


class HistoryWriter:
    """Appends records to a history file, one flushed line each, from any thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._mu = threading.Lock()
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, record: Record) -> None:
        """Append one record (ValueError once closed)."""
        line = _to_line(record)
        with self._mu:
            if self._file is None:
                raise ValueError(f"history {self.path} is closed")
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._mu:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_history(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    tolerate_torn_tail: bool = False,
) -> History:
    """Every record of the given files (blank lines skipped), by kind. A malformed line
    raises ValueError naming its file and line; with ``tolerate_torn_tail`` the last line of
    a file that does not end in a newline (a writer killed mid-line) is skipped instead."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    metas: list[Meta] = []
    ops: list[Op] = []
    holds: list[Interval] = []
    writes: list[ResourceWrite] = []
    faults: list[Fault] = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        torn = lines[-1] != ""  # the file does not end with a newline
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = _from_map(json.loads(line))
            except (ValueError, TypeError, KeyError) as exc:
                if tolerate_torn_tail and torn and number == len(lines):
                    break
                raise ValueError(f"{os.fspath(path)}:{number}: {exc}") from exc
            if isinstance(record, Meta):
                metas.append(record)
            elif isinstance(record, Op):
                ops.append(record)
            elif isinstance(record, Interval):
                holds.append(record)
            elif isinstance(record, ResourceWrite):
                writes.append(record)
            else:
                faults.append(record)
    if len(metas) > 1 and len({m.origin_monotonic for m in metas}) > 1:
        raise ValueError("the files come from different runs (their lab clocks differ)")
    return History(
        meta=metas[0] if metas else None,
        ops=tuple(ops),
        holds=tuple(holds),
        writes=tuple(writes),
        faults=tuple(faults),
    )
