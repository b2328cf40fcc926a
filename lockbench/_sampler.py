"""Watching a run from the side: server CPU and memory, trust and uptime, and throughput, sampled
every ``interval`` seconds by a thread of the parent process.

Why: the load generators must not pay for observation, and what the server reports about itself
(trust, uptime) should be read the way a client would read it. The sampler thread:

- reads the server's CPU seconds and RSS with psutil (spawned pid, or the pid listening on the
  target port) — the "server CPU per 1k ops" and memory figures come from here;
- for lockserver, pings on a *side connection* (our sync client) and keeps uptime and trust;
- reads the workers' running op counts (a callable: plain attributes in-process, a shared array
  across processes) to draw ops/s over time.

Ticks are aligned on the measurement window: once the gate opens, one tick falls exactly on
``measure_at`` (the CPU baseline of the window) and the rest every ``interval`` after it; a final
tick is taken when the run stops.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]

from ._spawn import ServerProcess
from ._targets import Backend

__all__ = ["Sample", "Sampler", "ServerProbe"]


@attrs.frozen
class Sample:
    """One observation (``at``: monotonic seconds)."""

    at: float
    ops: int
    requests: int
    cpu_s: float | None
    rss_bytes: int | None
    trust: float | None
    uptime: float | None
    server_sys_s: float | None = None  # the kernel-side part of cpu_s
    machine_busy_s: float | None = None  # all CPUs' non-idle seconds since boot
    client_cpu_s: float | None = None  # this process and its children, the server excepted


class ServerProbe:
    """Reads a server's process figures and (lockserver) its self-reported trust and uptime.
    Over several servers (shards, ``others``): CPU and RSS are their sums, trust and uptime
    the first server's, and :meth:`statistics_each` has every server's statistics."""

    def __init__(
        self,
        backend: Backend,
        host: str,
        port: int,
        server: ServerProcess | None,
        others: Sequence[ServerProcess] = (),
    ):
        self.backend = backend
        first = server.process() if server is not None else None
        self._procs = [first, *(o.process() for o in others)]
        self._clients: list[Any] = []
        if backend is Backend.LOCKSERVER:
            from client import LockClient

            for h, p in [(host, port), *((o.host, o.port) for o in others)]:
                client = None
                with contextlib.suppress(Exception):
                    client = LockClient(h, p, client_name="lockbench-probe", timeout=2.0)
                self._clients.append(client)
        self._client = self._clients[0] if self._clients else None

    @property
    def has_process(self) -> bool:
        """Whether CPU and RSS can be read (of every server)."""
        return all(p is not None for p in self._procs)

    def machine_figures(self) -> tuple[float | None, float | None]:
        """(machine busy CPU seconds, CPU seconds of lockbench's own processes): with the
        server's, they tell how much *else* ran on the machine during a measurement."""
        try:
            t = psutil.cpu_times()
            busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
            busy += getattr(t, "steal", 0.0)
            me = psutil.Process()
            server_pids = {p.pid for p in self._procs if p is not None}
            client = 0.0
            for proc in [me, *me.children(recursive=True)]:
                if proc.pid in server_pids:
                    continue
                with contextlib.suppress(psutil.Error):
                    c = proc.cpu_times()
                    client += c.user + c.system
            return float(busy), client
        except Exception:
            return None, None

    def process_figures(self) -> tuple[float | None, float | None, int | None]:
        """(CPU seconds, of which system, RSS bytes) of the server process (summed over the
        servers), or Nones when any is unknown."""
        cpu = sys_s = 0.0
        rss = 0
        for proc in self._procs:
            if proc is None:
                return None, None, None
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    rss += int(proc.memory_info().rss)
                    cpu += times.user + times.system
                    sys_s += times.system
            except Exception:
                return None, None, None
        return cpu, sys_s, rss

    def trust_uptime(self) -> tuple[float | None, float | None]:
        """(trust, uptime) from a ping on the side connection, or Nones."""
        if self._client is None:
            return None, None
        try:
            pong = self._client.ping()
        except Exception:
            return None, None
        return float(pong.trust), float(pong.uptime)

    def statistics(self) -> dict[str, Any] | None:
        """The server's own statistics (lockserver: GetStatistics; Redis: INFO figures)."""
        return self.statistics_each()[0] if self._client is not None else None

    def statistics_each(self) -> list[dict[str, Any] | None]:
        """Every server's statistics, in server order (None where there is no answer)."""
        out: list[dict[str, Any] | None] = []
        for client in self._clients:
            stats = None
            if client is not None:
                with contextlib.suppress(Exception):
                    stats = dict(client.statistics())
            out.append(stats)
        return out

    def close(self) -> None:
        """Close the side connections."""
        for client in self._clients:
            if client is not None:
                with contextlib.suppress(Exception):
                    client.close()


class Sampler(threading.Thread):
    """Samples every ``interval`` seconds until :meth:`stop`."""

    def __init__(
        self,
        probe: ServerProbe,
        totals: Callable[[], tuple[int, int]],
        interval: float = 0.5,
        on_sample: Callable[[Sample], None] | None = None,
    ) -> None:
        super().__init__(name="lockbench-sampler", daemon=True)
        self.probe = probe
        self.totals = totals
        self.interval = interval
        self.on_sample = on_sample
        self.samples: list[Sample] = []
        self.window_sample: Sample | None = None  # the tick at measure_at
        self._measure_at: float | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._aligned_now = False  # set_window took the window sample itself

    def set_window(self, measure_at: float) -> None:
        """The gate opened: align the ticks on ``measure_at``. Without a warm-up the window
        opens now: its baseline sample is taken at once, in the caller's thread (a short run
        could otherwise end before this thread is scheduled)."""
        if measure_at <= time.monotonic():
            sample = self._sample()
            with self._wake:
                self.window_sample = sample
                self.samples.append(sample)
                self._measure_at = measure_at
                self._aligned_now = True
                self._wake.notify()
            if self.on_sample is not None:
                self.on_sample(sample)
            return
        with self._wake:
            self._measure_at = measure_at
            self._wake.notify()

    def stop(self) -> Sample:
        """Stop ticking, take the final sample and return it."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self.join()
        if self.window_sample is None and self._measure_at is not None:
            # The run ended before the window's tick: the nearest earlier sample is the
            # best baseline there is.
            before = [x for x in self.samples if x.at <= self._measure_at]
            if before:
                self.window_sample = before[-1]
            elif self.samples:
                self.window_sample = self.samples[0]
        final = self._sample()
        self.samples.append(final)
        if self.on_sample is not None:
            self.on_sample(final)
        return final

    def _sample(self) -> Sample:
        at = time.monotonic()
        ops, requests = self.totals()
        cpu, sys_s, rss = self.probe.process_figures()
        trust, uptime = self.probe.trust_uptime()
        busy, client = self.probe.machine_figures()
        return Sample(at, ops, requests, cpu, rss, trust, uptime, sys_s, busy, client)

    def run(self) -> None:
        next_at = time.monotonic()
        aligned = False
        while True:
            with self._wake:
                while True:
                    if self._stopping:
                        return
                    if self._aligned_now and not aligned:
                        aligned = True
                        assert self._measure_at is not None
                        next_at = self._measure_at + self.interval
                    target = next_at
                    if not aligned and self._measure_at is not None:
                        target = min(next_at, self._measure_at)
                    delay = target - time.monotonic()
                    if delay <= 0:
                        break
                    self._wake.wait(delay)
                at_window = not aligned and target == self._measure_at
            sample = self._sample()
            self.samples.append(sample)
            if at_window:
                aligned = True
                self.window_sample = sample
                next_at = target + self.interval
            elif target >= next_at:
                next_at += self.interval
                now = time.monotonic()
                if next_at <= now:  # fell behind (a slow probe): skip, do not burst
                    next_at = now + self.interval
            if self.on_sample is not None:
                self.on_sample(sample)
