"""The trust monitor: how much the server believes its own state, from its call rate alone.

Why this module exists
======================
Every transaction states a reliability contract: a minimum server uptime and a minimum TRUST in
[0, 1]. TRUST is the QoS guess of the original Sky locking design (see docs/trust.md): a server
that suddenly receives far fewer calls than it is used to may be cut off from some of its
callers, who then cannot publish their locks to it, so its tables are probably stale. The server
learns a NORM (the call rate it is used to) and reports ``TRUST = current load / NORM``, capped at
1. It costs no extra network call; it is a speculation, and the docs say so.

Rules it keeps
==============
- Pure and deterministic: every method takes ``now`` (seconds, any monotonic origin). No clock,
  no I/O, no trio. Same inputs, same outputs.
- ``record_call`` is the hot path (once per transaction): one comparison and one integer add,
  except on the first call after a tick boundary, which closes the elapsed ticks.
- Work per catch-up is bounded: a gap of any length costs at most ``spike_window + 1`` tick
  steps; the idle remainder is applied in closed form.
- Trust is always in [0, 1]; NORM and the rates are never negative.

Theory of operation
===================
Time is cut into ticks of ``tick`` seconds counted from ``started_at``. Calls are counted into
the tick that contains their ``now``. When a tick closes, its count becomes a rate
``r = count / tick`` (calls/s) and feeds two estimates:

1. **Current load** ``L``: a fast EMA, ``L += load_alpha * (r - L)``. It answers "what is the
   traffic now" and takes 84% of a step within two ticks at the default 0.6.
2. **NORM** ``N``, in three stages:

   a. *Spike filter*: ``m = median of the last spike_window tick rates`` (the window starts
      full of zeros). A burst shorter than one tick touches at most two ticks, so with a
      window of five it never reaches the median at all; a rise must hold for three ticks to
      pass. This is what "does not feel split-second spikes" means here.
   b. *EMA* (the seed's filter): ``S += norm_alpha * (m - S)``, smoothing the tick-to-tick
      noise that is left.
   c. *Follow up, decay down*: ``N = max(S, N * 2 ** (-tick / norm_half_life))``. NORM rises
      as fast as the smoothed rate, but when traffic falls it sinks no faster than the
      half-life: the server keeps expecting its old traffic for a while, which is exactly the
      window in which trust is low. An idle server's expectation eventually sinks to nothing.

3. **TRUST** ``= min(1, max(L, floor) / max(N, floor))``. Whenever NORM is below ``norm_floor``
   (a near-idle server) this is 1. Whenever the load is above the floor it is the plain
   ``L / N`` capped at 1. Clamping the load to the floor as well keeps trust continuous as NORM
   crosses the floor: after a total outage (load 0) trust climbs smoothly to 1 as NORM decays,
   instead of sitting at 0 and then jumping to 1 in one tick.

Trust, NORM and load change only when a tick closes; between ticks they are constant, so
``trust()`` is a comparison and an attribute read once the tick is processed.

Defaults, and what each one makes the monitor feel
=================================================
``tick = 1.0`` s
    The measurement resolution. One second is the unit the seed speaks in ("20 req/sec"), and
    the shell's timer wakes once per tick at most. Below ~1 call per tick a rate is mostly
    quantisation noise, which is why ``norm_floor`` is tied to it.
``load_alpha = 0.6``
    Current load reacts within 1-2 ticks (60% of a step after one tick, 84% after two), fast
    enough that a 20 -> 2 calls/s drop takes trust below 0.3 within 2 s (0.24 at the defaults),
    slow enough that one unlucky tick does not halve it.
``spike_window = 5`` ticks
    The median of five ticks ignores anything that touches at most two ticks, i.e. every burst
    shorter than one tick, however large (1,000 calls in 0.2 s on top of 5 calls/s leaves NORM
    exactly where it was). The price is that a genuine rise reaches NORM two ticks late.
``norm_alpha = 0.6``
    After the median lets a sustained rise through, NORM reaches 94% of it within three more
    ticks: 20 calls/s held from an idle start gives NORM 18.7 after 5 s and 19.5 after 6 s
    ("if this rate sustains for a few seconds, the NORM jumps to around 20/sec"). A smaller
    alpha smooths more but makes a freshly loaded server take longer to learn its norm.
``norm_half_life = 10.0`` s
    How long the server stays suspicious after its traffic falls. A 20 -> 2 calls/s drop
    refuses clients demanding trust 0.5 for about 25 s (see below): long enough to outlast the
    reconnect/backoff cycle of callers cut off by a switch or network blip, short enough that a
    real fall in demand (a batch job ending) stops refusing calls within half a minute. Trust
    under a drop by a factor ``k`` recovers to ``t`` after about ``2 + 10 * log2(k * t)`` s.
``norm_floor = 1.0`` calls/s
    Below one call per second (one call per tick) the measured rate is 0 or 1 from tick to tick
    and a ratio of two such numbers says nothing; such a server has trust 1. It also bounds how
    long an idle server takes to forget: NORM 20 sinks below it 2 + 10 * log2(20) = 45.2 s after
    the calls stop (trust climbs back to 1 smoothly meanwhile).

Recovery time after the seed's drop (defaults)
==============================================
20 calls/s held long enough for NORM to settle at 20, then 2 calls/s from a tick boundary T:
the median keeps NORM at 20 for two ticks, then NORM halves every 10 s. Trust = 2 / NORM, so it
is below 0.3 from T + 2 s, and reaches 0.5 when NORM <= 4, i.e. 10 * log2(5) = 23.2 s into the
decay: trust first reads >= 0.5 at the tick T + 26 s (it is 0.49 at T + 25 s). It is back to 1
when NORM has decayed to the new rate, 10 * log2(10) = 33.2 s into the decay, at T + 36 s.
``benchmarks/plot_trust.py`` draws this scenario into ``docs/trust-drop.png``.

Prior art
=========
Azos Sky ``LockManager``'s call-norm QoS (the seed, which describes an EMA with decay; the
original code jumped NORM to the instant rate, which a split-second spike collapses). Median
pre-filters in front of an EMA are the standard de-spiking trick of signal processing (Tukey);
"rise with the signal, decay by a half-life" is a peak meter's release, as in audio VU meters.
"""

from __future__ import annotations

import math
from collections import deque

import attrs

__all__ = ["TrustMonitor", "TrustSettings", "TrustStatistics"]


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _positive_finite(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (_is_number(value) and math.isfinite(value) and value > 0):
        raise ValueError(
            f"TrustSettings.{attribute.name} must be a finite number > 0, got {value!r}"
        )


def _non_negative_finite(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (_is_number(value) and math.isfinite(value) and value >= 0):
        raise ValueError(
            f"TrustSettings.{attribute.name} must be a finite number >= 0, got {value!r}"
        )


def _alpha(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (_is_number(value) and 0 < value <= 1):
        raise ValueError(
            f"TrustSettings.{attribute.name} must be an EMA coefficient in (0, 1], got {value!r}"
        )


def _odd_window(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1 and value % 2):
        raise ValueError(
            f"TrustSettings.{attribute.name} must be an odd whole number of ticks >= 1 "
            f"(1 disables the spike filter), got {value!r}"
        )


@attrs.frozen
class TrustSettings:
    """The monitor's constants. The module docstring says why each default is what it is."""

    #: Seconds per measurement tick.
    tick: float = attrs.field(default=1.0, validator=_positive_finite)
    #: EMA coefficient of the current-load estimate (1 = the last tick's rate alone).
    load_alpha: float = attrs.field(default=0.6, validator=_alpha)
    #: Ticks in the median spike filter in front of NORM; a burst must fill a majority to count.
    spike_window: int = attrs.field(default=5, validator=_odd_window)
    #: EMA coefficient applied to the median-filtered rate before it can raise NORM.
    norm_alpha: float = attrs.field(default=0.6, validator=_alpha)
    #: Seconds for NORM to halve when traffic falls below it.
    norm_half_life: float = attrs.field(default=10.0, validator=_positive_finite)
    #: Calls/s below which NORM is too small to judge by: trust is 1.
    norm_floor: float = attrs.field(default=1.0, validator=_non_negative_finite)


@attrs.frozen
class TrustStatistics:
    """A snapshot of the monitor at one instant (trio's ``statistics()`` habit)."""

    #: Seconds since the monitor started, never negative.
    uptime: float
    #: Current load / NORM, capped at 1; 1 when NORM is below the floor.
    trust: float
    #: The call rate the server is used to, calls/s.
    norm: float
    #: The current load estimate, calls/s.
    rate: float
    #: The raw rate of the last closed tick, calls/s.
    last_tick_rate: float
    #: Every call recorded so far, including those of the tick in progress.
    calls_total: int


class TrustMonitor:
    """Turns a stream of ``record_call(now)`` into TRUST, NORM and current load.

    Not thread-safe; the server shell owns one per process and calls it from its event loop.
    """

    # Plain slotted class, not attrs: record_call runs once per transaction.
    __slots__ = (
        "_calls_closed",
        "_count",
        "_decay",
        "_last_tick_rate",
        "_load",
        "_next_tick_at",
        "_norm",
        "_rates",
        "_settings",
        "_smooth",
        "_started_at",
        "_ticks_done",
        "_trust",
    )

    def __init__(self, settings: TrustSettings | None = None, *, started_at: float) -> None:
        if not math.isfinite(started_at):
            raise ValueError(f"started_at must be a finite time, got {started_at!r}")
        self._settings = TrustSettings() if settings is None else settings
        self._started_at = started_at
        self._decay = 2.0 ** (-self._settings.tick / self._settings.norm_half_life)
        self._ticks_done = 0
        self._next_tick_at = started_at + self._settings.tick
        self._count = 0  # calls in the tick in progress
        self._calls_closed = 0  # calls in ticks already closed
        self._rates: deque[float] = deque(
            [0.0] * self._settings.spike_window, maxlen=self._settings.spike_window
        )
        self._last_tick_rate = 0.0
        self._load = 0.0
        self._smooth = 0.0
        self._norm = 0.0
        self._trust = 1.0

    @property
    def settings(self) -> TrustSettings:
        """The constants this monitor runs with."""
        return self._settings

    def record_call(self, now: float, n: int = 1) -> None:
        """Count ``n >= 0`` calls at time ``now``. The hot path: O(1), no validation of ``n``."""
        if now >= self._next_tick_at:
            self._catch_up(now)
        self._count += n

    def tick(self, now: float) -> None:
        """Close every whole tick elapsed up to ``now``. Idempotent; any gap costs O(window)."""
        if now >= self._next_tick_at:
            self._catch_up(now)

    def trust(self, now: float) -> float:
        """TRUST in [0, 1] as of the last tick closed by ``now``."""
        if now >= self._next_tick_at:
            self._catch_up(now)
        return self._trust

    def uptime(self, now: float) -> float:
        """Seconds since ``started_at``; 0 for a ``now`` before it."""
        return max(0.0, now - self._started_at)

    def statistics(self, now: float) -> TrustStatistics:
        """A frozen snapshot as of ``now`` (closes elapsed ticks first)."""
        if now >= self._next_tick_at:
            self._catch_up(now)
        return TrustStatistics(
            uptime=self.uptime(now),
            trust=self._trust,
            norm=self._norm,
            rate=self._load,
            last_tick_rate=self._last_tick_rate,
            calls_total=self._calls_closed + self._count,
        )

    # -- internals ---------------------------------------------------------------------------

    def _catch_up(self, now: float) -> None:
        settings = self._settings
        if not math.isfinite(now):
            raise ValueError(f"now must be a finite time, got {now!r}")
        # Tick boundaries are computed from an integer index, so no error accumulates.
        due = math.floor((now - self._started_at) / settings.tick) - self._ticks_done
        if due <= 0:  # float rounding right at a boundary
            return
        self._step(self._count / settings.tick)
        self._calls_closed += self._count
        self._count = 0
        # Idle ticks: step through enough of them to fill the median window with zeros; after
        # that every stage is a plain geometric decay and the rest is applied in closed form.
        idle = due - 1
        stepped = min(idle, settings.spike_window)
        for _ in range(stepped):
            self._step(0.0)
        remaining = idle - stepped
        if remaining:
            self._decay_idle(remaining)
        self._ticks_done += due
        self._next_tick_at = self._started_at + (self._ticks_done + 1) * settings.tick

    def _step(self, rate: float) -> None:
        settings = self._settings
        self._last_tick_rate = rate
        self._load += settings.load_alpha * (rate - self._load)
        self._rates.append(rate)
        median = sorted(self._rates)[settings.spike_window // 2]
        self._smooth += settings.norm_alpha * (median - self._smooth)
        self._norm = max(self._smooth, self._norm * self._decay)
        self._update_trust()

    def _decay_idle(self, ticks: int) -> None:
        # With the window all zeros, per tick: L *= ql, S *= qs, N = max(S, N * d). Unrolled,
        # N_m = max(N_0 d^m, max over 1 <= j <= m of S_0 qs^j d^(m-j)); the inner maximum is
        # geometric in j, so it sits at j = 1 or j = m.
        settings = self._settings
        q_load = 1.0 - settings.load_alpha
        q_smooth = 1.0 - settings.norm_alpha
        d = self._decay
        s0 = self._smooth
        self._norm = max(
            self._norm * d**ticks,
            s0 * q_smooth * d ** (ticks - 1),
            s0 * q_smooth**ticks,
        )
        self._smooth = s0 * q_smooth**ticks
        self._load *= q_load**ticks
        self._last_tick_rate = 0.0
        self._update_trust()

    def _update_trust(self) -> None:
        floor = self._settings.norm_floor
        norm = max(self._norm, floor)
        if norm <= 0.0:  # floor 0 and no traffic yet
            self._trust = 1.0
        else:
            self._trust = min(1.0, max(self._load, floor) / norm)
