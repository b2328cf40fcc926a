"""When the poller keeps polling instead of sleeping: the busy-poll policy, which spins only
as much as its spins pay for.

Why: on an idle CPU every request pays for waking the server up (the kernel's wake-up of a
sleeping thread, a cold cache, and one trio run-loop pass that re-arms its one-shot epoll
registration). Measured on the 2-vCPU benchmark machine with one connection in strict
request/response: 10.8k tx/s, p99 177 us when the server sleeps between requests; 17.3k tx/s,
p99 120 us when it keeps polling for 50 us after each batch (``lockbench blast --connections 1
--pipeline 1``). The same trick as Linux's ``SO_BUSY_POLL``, Seastar's or DPDK's poll loops,
but bounded and adaptive. Spinning through every close gap would make a server at half its
capacity spin through all of its idle time (issue 19 measured 1.3-1.9 s of every 3.7 s), so
the spinning is bounded by what it saves and by the load:

- after a batch the poller polls again (yielding to trio between polls, so timers and other
  tasks run) instead of sleeping, only while traffic is dense: at least 70% of recent batches
  (a moving average) came within ``window`` of the batch before. A server receiving a request
  every few milliseconds never spins.
- and only as long as its **budget** allows. A spin that finds the next request (a *hit*)
  costs its gap and saves one sleep and wake-up of the poller, whose CPU the shell measures
  (its thread's CPU time around the wait, :meth:`BusyPoll.slept`): the hit is credited with
  that. A spin that finds nothing (a *miss*) costs its length and saves nothing. On top,
  every batch adds ``SPIN_SHARE`` (15%) of its serving time. The budget holds at most
  ``window``. A spin may run up to the budget plus one sleep (the saving of the hit it hopes
  for), never past ``window``; it starts only when that covers the expected gap (a moving
  average of the close gaps), so it is likely to end in a hit.

So the CPU spun beyond the sleeps it saved is at most ``SPIN_SHARE`` of the time spent serving,
plus one window (the debt one miss may leave, paid back before the next spin can start; a spin
is billed at most one window, whatever stopped the process meanwhile):
within 15% of the server's CPU without busy polling, at any load. Where a sleep costs more
than the gap (a virtual machine: the benchmark machine measures 60-90 us of poller CPU per
sleep) spinning through a dense stream pays for itself and the poller spins as it always did,
straight back after a miss; where sleeping is cheap it spins on the share alone, at the gaps
it can afford. A lull costs one miss (at most ``window``), after which the server sleeps until
traffic is dense again. Measured on that machine, pinned, 64 connections paced at 10%, 50% and
65% of their capacity (``python -m benchmarks.busypoll_cost``, benchmarks/README.md): server
CPU within 10% of busy_poll 0 at each (spinning 0, 0.18 and 0.28 s per s); at 65% p50 190 ->
166 us and p99 24 -> 5 ms; one connection in strict request/response 4.7k -> 6.0k tx/s, p50
200 -> 156 us.

What it spun and saved is reported (statistics ``server``: ``busy_poll_hits``,
``busy_poll_misses``, ``busy_poll_seconds``, ``busy_poll_wake_seconds``). ``window == 0``
turns it off (and the shell then measures nothing).

Theory of operation: a pure object fed with times and CPU costs (the shell reads
``time.perf_counter``: spinning is about real time even under trio's MockClock, whose clock
may stand still; and ``time.thread_time`` around a sleep).
"""

from __future__ import annotations

from typing import Final

__all__ = ["SPIN_SHARE", "BusyPoll"]

# The share of close gaps (an EMA with this weight for the newest) needed to spin. 0.7 with a
# weight of 1/4: a steady stream starts spinning at its fifth close batch (0.76), keeps
# spinning through one late request (~1 -> 0.75) and stops after two (0.56); traffic that
# alternates close and far gaps (a client's bursts on a millisecond timer) settles between
# 0.43 and 0.57 and never spins, where spinning after every close gap would miss every
# other time.
_ALPHA: Final = 0.25
_DENSE: Final = 0.7
#: Spinning allowed beyond what the spins save, as a share of the time spent serving.
#: Serving is part of the server's CPU, so this bounds the extra CPU at 15% of it.
SPIN_SHARE: Final = 0.15
# The weight of the newest sample in the moving average of a sleep's CPU cost: 1/8, so a
# stray sample (a timer's work during the wait) moves it by an eighth at most.
_WAKE_ALPHA: Final = 0.125


class BusyPoll:
    """The spin decisions of one poller. Times are seconds of one monotonic clock."""

    __slots__ = (
        "_since",
        "budget",
        "density",
        "gap",
        "hits",
        "misses",
        "seconds",
        "spinning",
        "wake",
        "window",
    )

    def __init__(self, window: float) -> None:
        #: Longest spin after a batch; 0: never spin.
        self.window = window
        #: True while the poller should poll again instead of sleeping.
        self.spinning = False
        #: Moving share of recent batches that came within ``window`` of the one before.
        self.density = 0.0
        #: Seconds of spinning paid for, at most ``window``: a hit adds the sleep it saved
        #: (``wake``) and spends its gap, a miss spends its length, a batch adds
        #: ``SPIN_SHARE`` of its serving time. A spin may run ``wake`` past it (to be paid
        #: back by the hit it hopes for; a miss leaves that debt, plus at most one poll).
        self.budget = 0.0
        #: Moving average of the close gaps (those within ``window``): what a hit costs.
        self.gap = 0.0
        #: Moving average of the CPU a sleep and its wake-up cost the poller's thread (each
        #: sample at most ``window``): what a hit saves. 0 until measured.
        self.wake = 0.0
        self._since = float("-inf")  # when the last batch ended
        self.hits = 0  # spins that found a request
        self.misses = 0  # spins that ran out and found nothing
        self.seconds = 0.0  # time spent spinning (hits and misses): the CPU it cost

    def served(self, start: float, end: float) -> None:
        """A batch was served from ``start`` to ``end``: decide whether to spin after it."""
        gap = start - self._since
        if self.spinning:
            self.hits += 1
            spun = min(gap, self.window)  # see idle
            self.seconds += spun
            self.budget += self.wake - spun
        if gap <= self.window:
            self.density += (1.0 - self.density) * _ALPHA
            self.gap += (gap - self.gap) * _ALPHA
        else:
            self.density -= self.density * _ALPHA
        self.budget = min(self.budget + (end - start) * SPIN_SHARE, self.window)
        # A spin that ends in a hit gives back a sleep: it may reach that far into debt.
        afford = self.budget + self.wake
        self.spinning = self.density >= _DENSE and afford >= self.gap and afford > 0
        self._since = end

    def slept(self, cpu: float) -> None:
        """The poller slept until a connection was readable, and that cost its thread ``cpu``
        seconds of CPU (from just before the wait to just after: the run loop's pass, the
        blocking ``epoll_wait``, the wake-up; any task that ran meanwhile too, hence the cap)."""
        self.wake += (min(cpu, self.window) - self.wake) * _WAKE_ALPHA

    def idle(self, now: float) -> bool:
        """A poll found nothing at ``now``; True: keep spinning, False: go to sleep."""
        spun = now - self._since
        if spun < min(self.budget + self.wake, self.window):
            return True
        # A spin is never meant to run past the window: time beyond it was not spent polling
        # (the process was stopped or descheduled, or a long task ran) and is not billed, so
        # a SIGSTOP or a collector pause while spinning cannot leave a debt of seconds.
        spun = min(spun, self.window)
        self.spinning = False
        self.misses += 1
        self.seconds += spun
        self.budget -= spun
        return False

    def to_wire(self) -> dict[str, float | int]:
        """The figures of the statistics ``server`` section."""
        return {
            "busy_poll_hits": self.hits,
            "busy_poll_misses": self.misses,
            "busy_poll_seconds": self.seconds,
            "busy_poll_wake_seconds": self.wake,
        }
