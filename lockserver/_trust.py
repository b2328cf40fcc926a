"""The trust monitor: how much the server believes its own state, from its call rate alone.

Why this module exists
======================
Every transaction states a reliability contract: a minimum server uptime and a minimum TRUST in
[0, 1]. TRUST is the QoS guess of the original Sky locking design (see docs/trust.md): a server
that suddenly receives far fewer calls than it is used to may be cut off from some of its
callers, who then cannot publish their locks to it, so its tables are probably stale. The server
learns a NORM (the call rate it is used to) and reports ``TRUST = current load / NORM``, capped at
1. It costs no extra network call; it is a speculation, and the docs say so.

Trust is meant to detect a network problem, not to be steerable by one peer, so calls are
attributed to *sources* (the shell passes the connection's number, or the principal's name
when tokens are configured) and no source counts more than the typical one (see "Sources" below).

Rules it keeps
==============
- Pure and deterministic: every method takes ``now`` (seconds, any monotonic origin). No clock,
  no I/O, no trio. Same inputs, same outputs; the outputs depend on how many calls each source
  made in each tick, never on which object a source is or in which order sources first called.
- ``record_call`` is the hot path (once per transaction): one comparison and one increment of a
  per-source counter (a dict entry), except on the first call after a tick boundary, which
  closes the elapsed ticks.
- Closing a tick costs O(sources present in the last ``spike_window`` ticks) (a few dict merges
  and sorts, all in C: ~3 ms for 10,000 connections). A gap of any length costs at most
  ``spike_window + 1`` tick steps; the idle remainder is applied in closed form.
- Trust is always in [0, 1]; NORM and the rates are never negative.
- A source alone on the server counts fully, and so do sources calling at equal rates: for
  them the monitor behaves exactly as if every call came from one source.

Theory of operation
===================
Time is cut into ticks of ``tick`` seconds counted from ``started_at``. Calls are counted, per
source, into the tick that contains their ``now``. When a tick closes, its *counted* calls
(below) become a rate ``r = counted / tick`` (calls/s) and feed two estimates:

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

Sources: no one peer steers the norm
====================================
Counting raw calls let one peer set the norm for everyone: 928k empty executes in 8 s, then
silence, put NORM near 116,000 calls/s and trust at 0.00, and a client at 20 calls/s demanding
0.3 was refused for over 30 s. So a closed tick's calls are counted like this:

- A source is *active* in a tick if it made calls in it, *present* if it was active in any of
  the last ``spike_window`` ticks (this one included); its *level* is its call count in the
  latest tick in which it was active.
- ``M`` = the lower median of the levels of the present sources (0 in a tick without calls).
- The *typical level* ``H = max(median of the last spike_window M, H * 2 ** (-tick /
  norm_half_life))``: held the way NORM is, so a rise must fill a majority of the window and a
  fall sinks no faster than NORM's half-life.
- Each active source counts ``min(its calls, source_cap * max(M, H))``; the tick's counted
  calls are the sum. ``calls_total`` keeps the raw count.

What that guarantees, with the default ``source_cap = 1``: a lone source is its own median and
counts fully, and so do sources with equal counts. A lower median is at most the level of some
other source unless one peer holds more than half of the present sources, so one peer's source
counts no more than a typical other source: a flood moves trust no more than an equal honest
client leaving would. Beside one client steady at ``r`` calls/s, whatever the peer sends, every
tick counts at most ``2 r`` (NORM never exceeds it); when the peer floods and then stops, the
client counts in full throughout, so its trust stays at least ``L / 2r``, i.e. about 0.5.
*Present* rather than active sources, so that a peer calling in a tick where the others happen
to be silent is still capped by their levels. The held ``H``, because with two sources the lower
median is the smaller one: a peer that floods and then drops to 1 call/s would, with this tick's
median alone, clip the other client to 1 call/s while NORM still remembered the flood (trust
0.07); ``H`` lets the clip sink no faster than NORM does. An adversarial search over per-tick
attack sequences beside a steady 20 calls/s client found no trust below 0.44 (0.40 with
``source_cap = 2``).

What it does not protect against, and what it costs: a peer holding most of the present
sources (without tokens a peer can open many connections; with tokens it needs most of the
active principals); a peer that is the only caller for most of a spike window is the server's
traffic; a peer can make trust *less* sensitive by lowering the typical level (trickling beside
a bigger client, or many small sources), which can hide a real drop but never causes a refusal.
And the rule cannot tell a dominant honest client from an attacker: a client doing most of the
traffic counts as a typical one, so losing it lowers trust less than its share of the calls
(``source_cap = inf`` restores the raw count).

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
    exactly where it was). The price is that a genuine rise reaches NORM two ticks late. The
    same window says for how long a source stays present and filters the typical level.
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
``source_cap = 1.0``
    One source counts at most as much as the typical one: the strongest setting that still
    counts a lone source, or equal sources, in full, and the one under which a flood beside one
    client does what an equal client leaving does (trust about 0.5; 0.44 at worst over the
    attack sequences searched). Sources calling at uneven rates are clipped towards the
    typical level: ten Poisson clients at 2 calls/s read as ~15 calls/s (2: ~19), while trust,
    a ratio of two counts clipped alike, is as steady as before. 2 keeps more of a skewed load
    but lets a flood beside one client push trust to 1/3, too close to the 0.3 the issue's
    client demanded. ``inf`` counts every call (the behaviour before sources).

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
Capping each source at a multiple of the median source is the robust-statistics answer to one
contributor dominating a sum (a winsorised total, with the median as the breakdown-point-1/2
reference); fair queueing's per-flow share is the same idea applied to service.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import defaultdict, deque
from collections.abc import Hashable

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


def _source_cap(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (_is_number(value) and value >= 1):  # inf is allowed: it caps nothing
        raise ValueError(
            f"TrustSettings.{attribute.name} must be a number >= 1 (inf: no cap), got {value!r}"
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

    # Each field's "help" is its one line in ``lockserver --help`` (as --trust-<name>).
    tick: float = attrs.field(
        default=1.0, validator=_positive_finite, metadata={"help": "seconds per measurement tick"}
    )
    load_alpha: float = attrs.field(
        default=0.6,
        validator=_alpha,
        metadata={"help": "EMA coefficient of the current load (1: the last tick's rate alone)"},
    )
    # A burst must fill a majority of the window to count.
    spike_window: int = attrs.field(
        default=5,
        validator=_odd_window,
        metadata={"help": "ticks in the median spike filter in front of NORM (odd)"},
    )
    norm_alpha: float = attrs.field(
        default=0.6,
        validator=_alpha,
        metadata={"help": "EMA coefficient of the filtered rate before it can raise NORM"},
    )
    norm_half_life: float = attrs.field(
        default=10.0,
        validator=_positive_finite,
        metadata={"help": "seconds for NORM to halve when traffic falls below it"},
    )
    norm_floor: float = attrs.field(
        default=1.0,
        validator=_non_negative_finite,
        metadata={"help": "calls/s below which NORM is too small to judge by: trust is 1"},
    )
    # >= 1 so that a lone source counts fully; inf counts every call.
    source_cap: float = attrs.field(
        default=1.0,
        validator=_source_cap,
        metadata={"help": "in one tick, a source counts at most this many typical sources' calls"},
    )


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
    #: The rate of the last closed tick as counted (each source capped), calls/s.
    last_tick_rate: float
    #: Every call recorded so far, including those of the tick in progress.
    calls_total: int


class TrustMonitor:
    """Turns a stream of ``record_call(now, source=...)`` into TRUST, NORM and current load.

    Not thread-safe; the server shell owns one per process and calls it from its event loop.
    """

    # Plain slotted class, not attrs: record_call runs once per transaction.
    __slots__ = (
        "_calls_closed",
        "_counts",
        "_decay",
        "_last_tick_rate",
        "_load",
        "_medians",
        "_next_tick_at",
        "_norm",
        "_rates",
        "_recent",
        "_settings",
        "_smooth",
        "_started_at",
        "_ticks_done",
        "_trust",
        "_typical",
    )

    def __init__(self, settings: TrustSettings | None = None, *, started_at: float) -> None:
        if not math.isfinite(started_at):
            raise ValueError(f"started_at must be a finite time, got {started_at!r}")
        self._settings = TrustSettings() if settings is None else settings
        self._started_at = started_at
        # float ** float is typed Any (a negative base would give a complex); this one is real.
        self._decay: float = 2.0 ** (-self._settings.tick / self._settings.norm_half_life)
        self._ticks_done = 0
        self._next_tick_at = started_at + self._settings.tick
        # Calls in the tick in progress, per source. A defaultdict: a source's first call in a
        # tick costs no more than the others (a try/except KeyError would raise once per
        # source per tick, ~10x an ordinary call).
        self._counts: defaultdict[Hashable, int] = defaultdict(int)
        self._calls_closed = 0  # calls in ticks already closed
        self._rates: deque[float] = deque(
            [0.0] * self._settings.spike_window, maxlen=self._settings.spike_window
        )
        # The per-source counts of the last spike_window closed ticks (who is present), the
        # typical level of each of those ticks (0: a tick without calls), and the typical
        # level they hold up (follow up, decay down).
        self._recent: deque[dict[Hashable, int]] = deque(maxlen=self._settings.spike_window)
        self._medians: deque[int] = deque(
            [0] * self._settings.spike_window, maxlen=self._settings.spike_window
        )
        self._typical = 0.0
        self._last_tick_rate = 0.0
        self._load = 0.0
        self._smooth = 0.0
        self._norm = 0.0
        self._trust = 1.0

    @property
    def settings(self) -> TrustSettings:
        """The constants this monitor runs with."""
        return self._settings

    def record_call(self, now: float, n: int = 1, source: Hashable = None) -> None:
        """Count ``n >= 0`` calls from ``source`` at time ``now``.

        ``source`` is whoever the calls are attributed to (the shell passes the connection's
        number, or the principal's name when tokens are configured); calls without one share
        the source ``None``. A source is kept for a few ticks after its last call, so pass a
        small value, not an object that should be freed when its owner goes. The hot path:
        O(1), no validation of ``n`` or ``source``.
        """
        if now >= self._next_tick_at:
            self._catch_up(now)
        self._counts[source] += n

    def tick(self, now: float) -> None:
        """Close every whole tick elapsed up to ``now``. Idempotent; any gap costs at most
        ``spike_window + 1`` tick closes."""
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
            calls_total=self._calls_closed + sum(self._counts.values()),
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
        counts = self._counts
        self._counts = defaultdict(int)
        self._step(self._close_sources(counts) / settings.tick)
        # Idle ticks: step through enough of them to fill every window with zeros; after that
        # every stage is a plain geometric decay and the rest is applied in closed form.
        idle = due - 1
        stepped = min(idle, settings.spike_window)
        for _ in range(stepped):
            self._close_sources({})
            self._step(0.0)
        remaining = idle - stepped
        if remaining:
            self._decay_idle(remaining)
        self._ticks_done += due
        self._next_tick_at = self._started_at + (self._ticks_done + 1) * settings.tick

    def _close_sources(self, counts: dict[Hashable, int]) -> float:
        # The closed tick's calls as counted (module docstring, "Sources"). Only sorted values
        # are used, so the result does not depend on which objects the sources are or on the
        # order in which they first called; the sums are of ints, plus one float term.
        settings = self._settings
        if not all(counts.values()):
            counts = {source: n for source, n in counts.items() if n}  # n = 0: not active
        recent = self._recent
        recent.append(counts)
        active = sorted(counts.values())
        median = 0  # M: the lower median of the present sources' levels
        if active:
            self._calls_closed += sum(active)
            levels: dict[Hashable, int] = {}
            for earlier in recent:  # oldest first: each source's latest active tick wins
                levels.update(earlier)
            present = sorted(levels.values())
            median = present[(len(present) - 1) // 2]
        medians = self._medians
        medians.append(median)
        held = sorted(medians)[settings.spike_window // 2]
        self._typical = typical = max(float(held), self._typical * self._decay)
        if not active:
            return 0.0
        cap = settings.source_cap * max(median, typical)
        if active[-1] <= cap:  # nobody capped: the usual case, and always for a lone source
            return float(sum(active))
        under = bisect_right(active, cap)
        return sum(active[:under]) + cap * (len(active) - under)

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
        self._typical *= d**ticks
        self._last_tick_rate = 0.0
        self._update_trust()

    def _update_trust(self) -> None:
        floor = self._settings.norm_floor
        norm = max(self._norm, floor)
        if norm <= 0.0:  # floor 0 and no traffic yet
            self._trust = 1.0
        else:
            self._trust = min(1.0, max(self._load, floor) / norm)
