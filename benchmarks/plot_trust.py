"""Draw the seed's drop scenario through the trust monitor into docs/trust-drop.png.

20 calls/s for 20 s, then 2 calls/s for 40 s, played with explicit ``now`` values (no real time,
no server): the picture shows NORM, the current load and TRUST over time, the 0.5 trust line a
typical client demands, and where trust recovers to it. Run from the repository root:

    python -m benchmarks.plot_trust [--output docs/trust-drop.png]

matplotlib (the ``bench`` extra) is imported inside ``main`` so this module imports without it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import attrs

# The shell's package does not re-export the monitor yet; switch to `from lockserver import ...`
# once lockserver/__init__.py does.
from lockserver._trust import TrustMonitor, TrustSettings, TrustStatistics

HIGH_RATE = 20.0  # calls/s before the drop
LOW_RATE = 2.0  # calls/s after it
DROP_AT = 20.0  # s
END_AT = 60.0  # s
SAMPLE_EVERY = 0.05  # s; trust changes only once per tick, so this draws clean steps
DEMANDED_TRUST = 0.5

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "docs" / "trust-drop.png"


@attrs.frozen
class Sample:
    """The monitor's statistics at one instant."""

    at: float
    stats: TrustStatistics


def call_times() -> list[float]:
    """Evenly spaced calls: HIGH_RATE until DROP_AT, then LOW_RATE until END_AT."""
    high = round(DROP_AT * HIGH_RATE)
    low = round((END_AT - DROP_AT) * LOW_RATE)
    return [(k + 0.5) / HIGH_RATE for k in range(high)] + [
        DROP_AT + (k + 0.5) / LOW_RATE for k in range(low)
    ]


def simulate(settings: TrustSettings | None = None) -> list[Sample]:
    """Play the scenario, sampling statistics every SAMPLE_EVERY seconds."""
    monitor = TrustMonitor(settings, started_at=0.0)
    calls = call_times()
    samples: list[Sample] = []
    next_call = 0
    steps = round(END_AT / SAMPLE_EVERY)
    for i in range(steps + 1):
        now = i * SAMPLE_EVERY
        while next_call < len(calls) and calls[next_call] < now:
            monitor.record_call(calls[next_call])
            next_call += 1
        samples.append(Sample(now, monitor.statistics(now)))
    return samples


def first_at_or_after(samples: list[Sample], start: float, threshold: float) -> float | None:
    """The first sample time >= start whose trust is >= threshold."""
    for sample in samples:
        if sample.at >= start and sample.stats.trust >= threshold - 1e-9:
            return sample.at
    return None


def main(argv: list[str] | None = None) -> None:
    """Simulate, report the recovery times, and write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    import matplotlib  # optional dependency (the bench extra), imported lazily

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = TrustSettings()
    samples = simulate(settings)
    recovered = first_at_or_after(samples, DROP_AT + 1.0, DEMANDED_TRUST)
    full = first_at_or_after(samples, DROP_AT + 1.0, 1.0)

    times = [s.at for s in samples]
    fig, (rates, trust) = plt.subplots(
        2, 1, sharex=True, figsize=(10, 7), height_ratios=(3, 2), constrained_layout=True
    )
    rates.plot(times, [s.stats.norm for s in samples], label="NORM", color="tab:red", lw=2)
    rates.plot(times, [s.stats.rate for s in samples], label="current load", color="tab:blue", lw=2)
    rates.plot(
        times,
        [s.stats.last_tick_rate for s in samples],
        label="last tick's raw rate",
        color="tab:gray",
        lw=1,
        ls=":",
    )
    rates.set_ylabel("calls / s")
    rates.set_ylim(0, HIGH_RATE * 1.15)
    rates.legend(loc="upper right")
    rates.grid(alpha=0.3)
    rates.set_title(
        f"Trust monitor, defaults: {HIGH_RATE:g} calls/s, then {LOW_RATE:g} calls/s from "
        f"t = {DROP_AT:g} s (half-life {settings.norm_half_life:g} s, "
        f"spike window {settings.spike_window} ticks, tick {settings.tick:g} s)"
    )

    trust.plot(times, [s.stats.trust for s in samples], label="TRUST", color="tab:green", lw=2)
    trust.axhline(
        DEMANDED_TRUST, color="black", lw=1, ls="--", label=f"min_trust {DEMANDED_TRUST:g}"
    )
    trust.set_ylabel("trust")
    trust.set_ylim(0, 1.05)
    trust.set_xlabel("time (s)")
    trust.grid(alpha=0.3)
    if recovered is not None:
        trust.axvspan(DROP_AT, recovered, color="tab:red", alpha=0.08)
        trust.annotate(
            f"trust < {DEMANDED_TRUST:g} until t = {recovered:g} s\n"
            f"({recovered - DROP_AT:g} s after the drop)",
            xy=(recovered, DEMANDED_TRUST),
            xytext=(DROP_AT + 3.0, 0.72),
            arrowprops={"arrowstyle": "->"},
        )
    trust.legend(loc="center left")
    for axis in (rates, trust):
        axis.axvline(DROP_AT, color="gray", lw=1)
        axis.set_xlim(0, END_AT)

    args.output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.output, dpi=110)
    plt.close(fig)
    print(f"drop at t = {DROP_AT:g} s: trust >= {DEMANDED_TRUST:g} again at t = {recovered} s,")
    print(f"trust = 1 again at t = {full} s; wrote {args.output}")


if __name__ == "__main__":
    main()
