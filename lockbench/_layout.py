"""Where the server and the load run: the two layouts of a measurement, and what a result
says about them.

Why: on a small machine the same server gives different figures depending on whether the
scheduler may spread it over every core or it has one core to itself (issue 19: 37.6k tx/s
pinned against the README's 50k unpinned, at 64 connections). Both layouts are legitimate;
a figure that does not say which it is gets misquoted. So:

- ``pinned`` (``--pin``): the spawned server on one CPU — the first one lockbench may use,
  CPU 0 on an unrestricted machine — and lockbench's whole load (this process's threads,
  its worker processes, the sampler, py-spy) on the others. Refused with fewer than 2 CPUs.
- ``unpinned`` (the default): nothing bound; both may run anywhere.

Every result names its layout **as observed**, not as asked: after the server is up, its
CPUs (``os.sched_getaffinity`` of its pid) are compared with lockbench's own. Disjoint sets
are ``pinned``, equal sets ``unpinned``, anything else ``partial``; ``unknown`` when the
server's pid is not known (a server lockbench did not start, owned by another user). So a
server pinned by hand (``taskset -c 0 lockserver`` with ``taskset -c 1 lockbench blast
--target ...``) is recorded as pinned too.

Mechanism, no ``taskset`` needed: on Linux ``sched_setaffinity(0, ...)`` binds the calling
*thread*, and a child process starts with the mask of the thread that forked it (and keeps
it across ``exec``). :func:`thread_on` binds the calling thread for the moment of a
``Popen`` and restores it; :func:`load_on` binds every thread of this process
(``/proc/self/task``), and threads and processes started meanwhile inherit it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

__all__ = [
    "LAYOUTS",
    "PARTIAL",
    "PINNED",
    "UNKNOWN",
    "UNPINNED",
    "CpuPlan",
    "LayoutError",
    "available_cpus",
    "layout_of",
    "load_on",
    "observe",
    "pin_plan",
    "thread_on",
]

PINNED = "pinned"
UNPINNED = "unpinned"
PARTIAL = "partial"
UNKNOWN = "unknown"
LAYOUTS = (PINNED, UNPINNED)  # what can be asked for (the sitting's columns, in this order)


class LayoutError(ValueError):
    """A layout this machine cannot give (``--pin`` with one CPU)."""


@attrs.frozen
class CpuPlan:
    """The pinned layout's CPUs: the server's one and the load's rest (disjoint)."""

    server: frozenset[int]
    load: frozenset[int]


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    return frozenset(os.sched_getaffinity(0))


def pin_plan(available: Iterable[int] | None = None) -> CpuPlan:
    """The pinned layout on ``available`` CPUs (default: this process's): the lowest for the
    server, the others for the load. LayoutError with fewer than two."""
    cpus = sorted(available_cpus() if available is None else set(available))
    if len(cpus) < 2:
        have = ", ".join(map(str, cpus)) or "none"
        raise LayoutError(
            f"--pin needs 2 CPUs or more (the server on one, the load on the others); "
            f"lockbench may use {len(cpus)} (CPU {have}): drop --pin"
        )
    return CpuPlan(frozenset(cpus[:1]), frozenset(cpus[1:]))


@contextlib.contextmanager
def thread_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """The calling thread bound to ``cpus`` inside (nothing when None): a process it starts
    there inherits the binding. Restored on exit."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # no /proc: the calling thread at least


def _bind_all(cpus: Iterable[int]) -> None:
    for tid in _threads():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


@contextlib.contextmanager
def load_on(cpus: frozenset[int] | None) -> Iterator[None]:
    """Every thread of this process bound to ``cpus`` inside (nothing when None); threads and
    processes started inside inherit it. On exit every thread gets back the calling
    thread's mask from before."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    _bind_all(cpus)
    try:
        yield
    finally:
        _bind_all(before)


def layout_of(server: frozenset[int] | None, load: frozenset[int]) -> str:
    """The name of a layout: the server's CPUs (None: unknown) against the load's."""
    if server is None:
        return UNKNOWN
    if not server & load:
        return PINNED
    if server == load:
        return UNPINNED
    return PARTIAL


def observe(server_pids: Iterable[int | None]) -> dict[str, Any]:
    """The layout as it is now: ``{"layout": name, "server_cpus": [...] or None,
    "load_cpus": [...]}``; the servers' CPUs are the union over ``server_pids``."""
    load = available_cpus()
    server: set[int] | None = set()
    for pid in server_pids:
        if pid is None or server is None:
            server = None
            continue
        try:
            server |= os.sched_getaffinity(pid)
        except OSError:  # gone, or not ours to ask
            server = None
    if not server:
        server = None
    frozen = None if server is None else frozenset(server)
    return {
        "layout": layout_of(frozen, load),
        "server_cpus": None if frozen is None else sorted(frozen),
        "load_cpus": sorted(load),
    }
