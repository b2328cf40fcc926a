"""``--profile``: sample the SERVER's Python stacks with py-spy while the load runs, and say
which functions the time goes to.

Why: when a target is missed the useful answer is "where does the server spend its CPU", in
function names and percentages. py-spy attaches to the server's pid from outside (no change
to the server), records collapsed stacks (``--format raw``: ``frame;frame;... count`` per
line), and :func:`summarize` turns them into self and inclusive percentages (samples
waiting in epoll are set apart as idle). ``--nonblocking`` keeps the sampled process running
between samples. A profiled run is not a measurement: py-spy itself costs CPU on a 2-core
machine.
py-spy is not a dependency: ``pip install py-spy``; without it, profiling is refused clearly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import attrs

__all__ = [
    "ProfileLine",
    "format_summary",
    "profile_report",
    "profiled",
    "py_spy_path",
    "summarize",
]


def py_spy_path() -> str | None:
    """The py-spy executable (on PATH or beside this Python), or None."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


@contextlib.contextmanager
def profiled(pid: int, raw_path: str | os.PathLike[str], rate: int = 250) -> Iterator[None]:
    """Record the stacks of process ``pid`` into ``raw_path`` while the block runs."""
    exe = py_spy_path()
    if exe is None:
        raise RuntimeError("--profile needs py-spy: pip install py-spy")
    Path(raw_path).parent.mkdir(parents=True, exist_ok=True)
    cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate)]
    # Samples are wall-clock stacks of the running (or runnable) server. A syscall such as
    # the socket send is charged to the Python line that made it, including moments the
    # server sat preempted inside it (2 cores shared with the client): read the kernel's
    # share from the exact user/kernel CPU split of the results, not from here. (--gil does
    # not help: a single-threaded process stays the GIL's "last holder" inside syscalls.)
    cmd += ["--function", "--nonblocking", "--output", str(raw_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode not in (0, -signal.SIGINT) and not Path(raw_path).exists():
            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")


# Leaf frames that mean "waiting for the network" (py-spy samples a thread blocked in epoll as
# if it were running): counted apart as idle, and left out of the percentages.
IDLE_LEAVES = (("get_events (", "trio/_core/_io_epoll.py"),)


def _is_idle(frame: str) -> bool:
    return any(name in frame and where in frame for name, where in IDLE_LEAVES)


@attrs.frozen
class ProfileLine:
    """One function: share of samples where it was running (self) or on the stack (total)."""

    function: str
    self_pct: float
    total_pct: float


def summarize(
    raw_path: str | os.PathLike[str], top: int = 30, by_file: bool = False
) -> tuple[float, list[ProfileLine]]:
    """(idle %, the ``top`` functions — or source files, ``by_file`` — by self time) from a
    py-spy raw (collapsed) file. A frame reads ``function (path:line)``. Idle samples (waiting
    in epoll) are counted apart; the percentages are shares of the *busy* samples, i.e. of the
    server's CPU time."""
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    busy = idle = 0
    for line in Path(raw_path).read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if _is_idle(frames[-1]):
            idle += count
            continue
        busy += count
        if by_file:
            frames = [_file_of(f) for f in frames]
        self_counts[frames[-1]] += count
        for frame in set(frames):
            total_counts[frame] += count
    idle_pct = round(100 * idle / (idle + busy), 1) if idle + busy else 0.0
    if busy == 0:
        return idle_pct, []
    return idle_pct, [
        ProfileLine(fn, round(100 * n / busy, 1), round(100 * total_counts[fn] / busy, 1))
        for fn, n in self_counts.most_common(top)
    ]


def profile_report(raw_path: str | os.PathLike[str], title: str) -> str:
    """The text report of one profile: idle share, top functions, top source files."""
    idle, functions = summarize(raw_path, top=30)
    _, files = summarize(raw_path, top=12, by_file=True)
    return (
        f"{title}\nshares of the busy samples ({idle}% were waiting in epoll and are left "
        "out); a syscall's time, preemption included, goes to the line that made it\n"
        + format_summary(functions)
        + "\n\n"
        + format_summary(files, "source file")
    )


def _file_of(frame: str) -> str:
    """``fn (path/to/file.py:12)`` -> ``path/to/file.py``."""
    _, _, where = frame.rpartition(" (")
    return where.rstrip(")").rpartition(":")[0] or frame


def format_summary(lines: list[ProfileLine], what: str = "function (file:line)") -> str:
    """A plain-text table: self %, total %, function."""
    out = [f"  self%  total%  {what}"]
    out += [f"  {p.self_pct:5.1f}  {p.total_pct:6.1f}  {p.function}" for p in lines]
    return "\n".join(out)
