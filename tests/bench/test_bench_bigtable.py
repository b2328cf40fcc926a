"""``lockbench blast --bigtable`` (issue 19's stall shape) scaled down: the acquire frames
match the codec, the prefill's limits are checked, a small run (2,000 entries, a 1 s window)
reports its figures and they agree with the server's store; the largest gap between replies
of the ordinary blast; the CLI's options and errors. Bounded in time and count; no timing
assertions."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from lockbench import main
from lockbench._bigtable import (
    BIG_BATCH,
    BIG_CONNECTIONS,
    BIG_PREFILL,
    BIG_SESSIONS,
    BIG_TABLE,
    PER_SESSION_LIMIT,
    AcquireFrames,
    Arrivals,
    check_limits,
    server_args,
)
from lockbench._blast import BlastConfig, run_blast
from lockbench._blaster import NAMESPACE, ReplyGaps, connect, lockserver_handshake
from lockbench._cli import build_parser
from lockbench._layout import UNPINNED
from lockbench._results import read_document
from lockbench._spawn import ServerProcess, spawned
from lockbench._targets import Backend, Target
from lockbench._worker import WorkerReport
from protocol import Assert, Execute, SetVar, request_from_wire, unpack

PREFILL = 2000  # 8 executes of 250: 8 sessions


@pytest.fixture(scope="module")
def lockserver() -> Iterator[ServerProcess]:
    with spawned(Backend.LOCKSERVER, args=server_args()) as server:
        yield server


def _decode(frame: bytes | bytearray) -> Execute:
    request = request_from_wire(unpack(bytes(frame[4:])))
    assert isinstance(request, Execute)
    return request


@pytest.mark.parametrize("conn", [0, 7, 12345])
def test_acquire_frames_are_the_codecs(conn: int) -> None:
    """Every frame written into the template equals the codec's encoding of the same
    request, and decodes to a unique-var exclusive SetVar in table Big with the id
    ``request_id(k)`` in the connection's own session."""
    frames = AcquireFrames(conn, "r1")
    seen = set()
    for k in [*range(300), 65_535, 65_536, 10**9, 10**10 - 1, 10**10 + 777, 5 * 2**32]:
        frame = frames.frame(k)
        assert bytes(frame) == frames.encoded(k)
        request = _decode(frame)
        assert request.request_id == frames.request_id(k)
        assert request.session.session_id == f"big-r1-a{conn}"
        assert request.transaction.namespace == NAMESPACE
        (statement,) = request.transaction.statements
        assert statement == Assert(SetVar(BIG_TABLE, frames.var(k)))
        seen.add(frames.var(k))
    assert len(seen) == 306  # unique (10**10 + 777 wraps to 777, which no other k here has)
    assert frames.request_id(0) != frames.request_id(1)


def test_check_limits_names_the_option() -> None:
    """A server whose limits cannot hold the prefill is refused, naming the option to
    raise; the default server holds 1,000,000 (62,500 per session)."""
    check_limits({"max_entries_per_session": 100_000, "max_entries": 10**7}, BIG_PREFILL)
    with pytest.raises(ValueError, match="--max-entries-per-session 10000000"):
        check_limits({"max_entries_per_session": 50_000}, BIG_PREFILL)
    with pytest.raises(ValueError, match="--max-entries"):
        check_limits({"max_entries": 10}, PREFILL)
    with pytest.raises(ValueError, match="--max-ops"):
        check_limits({"max_ops": 100}, PREFILL)
    check_limits({}, PREFILL)  # a server that does not say: the prefill will tell


def test_spawned_server_gets_the_raised_limit(lockserver: ServerProcess) -> None:
    """The phase's server is started with --max-entries-per-session raised (its welcome
    says so)."""
    assert server_args() == ("--max-entries-per-session", str(PER_SESSION_LIMIT))
    sock = connect(lockserver.host, lockserver.port)
    try:
        welcome = lockserver_handshake(sock, bytearray())
    finally:
        sock.close()
    assert welcome["limits"]["max_entries_per_session"] == PER_SESSION_LIMIT


def _small(server: ServerProcess, rate: float | None = None) -> BlastConfig:
    """The scaled-down bigtable run of these tests: PREFILL entries, 4 connections, 1 s."""
    return BlastConfig(
        Target(Backend.LOCKSERVER, server.host, server.port),
        connections=4,
        pipeline=1,
        duration=1.0,
        warmup=0.2,
        count=200_000,
        prefill=PREFILL,
        bigtable=True,
        rate=rate,
    )


def test_bigtable_smoke(lockserver: ServerProcess) -> None:
    """2,000 entries through 8 sessions of 250-statement executes, then 4 connections of
    unique-var acquires for 1 s: every reply checked and successful, the figures present
    and consistent, and the store holds the prefill plus every acquire answered (plus at
    most the ones in flight when the window closed)."""
    before = _entries(lockserver)
    (r,) = run_blast(_small(lockserver))
    x = r.extra
    assert (r.name, r.kind, r.client) == ("bigtable", "blast", "raw")
    assert r.errors == 0, r.error_samples
    assert r.requests == r.ops == r.acquires == r.acquired > 0
    assert r.latency_us["count"] == r.requests
    lat = r.latency_us
    assert 0 < lat["p50"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert r.params["bigtable"] is True and r.params["prefill"] == PREFILL
    assert r.params["connections"] == 4 and r.params["pipeline"] == 1
    assert r.params["layout"] == UNPINNED  # found by port: the pid is this user's
    # The prefill: 8 sessions (2,000 / 250 executes, at most 16), all of it held.
    assert (x["prefill_sessions"], x["prefill_batch"], x["table"]) == (8, BIG_BATCH, "Big")
    assert x["entries_held"] == before + PREFILL
    assert x["prefill_entries"] == PREFILL
    # Every acquire answered OK is held; those unanswered at the end may have run.
    assert x["acquired_total"] >= r.acquired
    assert 0 <= x["unanswered_at_end"] <= 4
    grown = x["entries_held_after"] - x["entries_held"]
    assert x["acquired_total"] <= grown <= x["acquired_total"] + x["unanswered_at_end"]
    # The largest gap between two replies, somewhere in the window.
    assert x["reply_gap_max_us"] > 0
    assert 0 <= x["reply_gap_at_s"] <= 1.0
    assert x["reply_gap_max_us"] <= 1000 * r.elapsed_s * 1000
    assert x["server_gc"]["collections"] is not None
    # The server's read passes meanwhile: at least one per reply batch, none over its count
    # and the longer the bound the fewer.
    passes = x["server_passes"]
    assert passes["passes"] >= r.requests / 4  # 4 connections: at most 4 requests a pass
    over = passes["over_ms"]
    assert list(over) == ["2.5", "5", "10"]
    assert passes["passes"] >= over["2.5"] >= over["5"] >= over["10"] >= 0
    assert "phase" in x and "250 per execute" in x["phase"]
    if sys.platform == "linux":
        # Every reply's arrival in the kernel was stamped, or counted unstamped (the kernel
        # stamps for the whole host, turned on with a delay and off when no socket asks: a
        # parallel run left 1,359 of 14,221 unstamped, another all of its 1 s): a stamped
        # reply came before the blaster read it, so no arrival latency exceeds the latency
        # (HDR buckets: 1%).
        arrival = x.get("arrival_latency_us")
        stamped = 0 if arrival is None else arrival["count"]
        assert stamped + x["arrival_unstamped"] == r.requests
        if arrival is not None:
            assert stamped > 0
            assert arrival["p50"] <= lat["p50"] * 1.01 and arrival["max"] <= lat["max"] * 1.01
            assert 0 <= x["client_read_delay_max_us"] <= lat["max"] * 1.01


def test_a_reply_without_a_kernel_stamp_is_counted_not_measured() -> None:
    """A reply the kernel did not stamp (arrival 0) is counted in ``unstamped`` and neither
    enters the arrival histogram nor the read delay; replies before the window count not at
    all; a stamped one is measured from its send to its arrival, and read delay from its
    arrival to its read."""
    arrivals = Arrivals([])
    arrivals.record(0, 1_000, 5_000, True)
    arrivals.record(3_000, 1_000, 7_000, True)
    arrivals.record(0, 1_000, 5_000, False)
    arrivals.record(9_000, 1_000, 90_000, False)
    assert arrivals.unstamped == 1
    assert arrivals.hist.count == 1
    assert arrivals.read_delay_max_ns == 4_000


def test_paced_bigtable_keeps_to_its_rate(lockserver: ServerProcess) -> None:
    """--rate paces the bigtable load: every reply checked and successful, the phase says
    its rate, and no more replies come than the schedule allows (rate x window, plus one
    slot per connection); a closed loop on the same server answers far more."""
    config = _small(lockserver, rate=200.0)
    (r,) = run_blast(config)
    assert r.errors == 0, r.error_samples
    assert r.requests == r.acquired > 0
    assert r.name == "paced-bigtable"  # a phase of its own beside the closed loop's
    assert r.params["rate"] == 200.0
    assert "paced at 200/s" in r.extra["phase"]
    assert r.requests <= 200.0 * r.elapsed_s + 4
    (closed,) = run_blast(attrs.evolve(config, rate=None))
    assert closed.name == "bigtable"
    assert closed.errors == 0 and closed.requests > 2 * r.requests


def _entries(server: ServerProcess) -> int:
    from lockbench._blaster import server_entries

    held = server_entries(Backend.LOCKSERVER, server.host, server.port)
    assert held is not None
    return held


def test_a_server_with_a_low_limit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """A running server whose per-session limit is below the prefill's per-session share:
    exit 2 before any entry is sent, naming the option."""
    with spawned(Backend.LOCKSERVER, args=("--max-entries-per-session", "100")) as server:
        code = main(
            [
                *("blast", "--bigtable", "--target", f"lockserver://{server.host}:{server.port}"),
                *("--prefill", "20000", "--connections", "1", "--duration", "0.2"),
            ]
        )
        assert _entries(server) == 0
    assert code == 2
    err = capsys.readouterr().err
    assert "allows 100 entries per session" in err and "--max-entries-per-session" in err


def test_bigtable_cli_writes_json(tmp_path: Path) -> None:
    """`lockbench blast --spawn --bigtable` scaled down writes a result naming the phase,
    its layout and its gap."""
    out = tmp_path / "big.json"
    code = main(
        [
            *("blast", "--spawn", "--bigtable", "--prefill", "500", "--connections", "2"),
            *("--duration", "0.5", "--warmup", "0", "--json", str(out)),
        ]
    )
    assert code == 0
    (r,) = read_document(out).results
    assert r.name == "bigtable" and r.spawned and r.errors == 0
    assert r.label == "lockserver bigtable raw c2 unpinned"
    assert r.extra["prefill_sessions"] == 2 and r.extra["entries_held"] == 500
    assert r.server_cpu_s_per_1k_ops is not None
    assert json.loads(out.read_text())["results"][0]["params"]["layout"] == UNPINNED


def test_bigtable_defaults_parse() -> None:
    """--bigtable's defaults are the issue's shape: 1,000,000 prefilled, 64 connections,
    1 in flight; the plain blast keeps its own (1 connection, 64 in flight, no prefill)."""
    from lockbench._cli import _or

    args = build_parser().parse_args(["blast", "--spawn", "--bigtable"])
    assert args.bigtable and args.prefill is None and args.connections is None
    assert (_or(args.prefill, BIG_PREFILL), _or(args.connections, BIG_CONNECTIONS)) == (
        1_000_000,
        64,
    )
    assert BIG_SESSIONS == 16 and BIG_BATCH == 250
    args = build_parser().parse_args(["blast", "--spawn"])
    assert not args.bigtable and args.pipeline is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--pipeline", "4"], "one request in flight per connection: drop --pipeline"),
        (["--suite"], "--bigtable and --suite are two kinds of run"),
        (["--processes", "2", "--connections", "4"], "one blaster process"),
        (["--prefill", "0"], "--bigtable needs --prefill >= 1"),
        (["--shards", "2"], "--bigtable drives one server"),
    ],
)
def test_bigtable_refuses_other_shapes(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Options that would change the shape are refused: exit 2, one line naming why."""
    assert main(["blast", "--spawn", "--bigtable", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_bigtable_is_lockserver_only(capsys: pytest.CaptureFixture[str]) -> None:
    """The stall shape is lockserver's: a Redis target is refused before it is spawned."""
    assert main(["blast", "--target", "redis://", "--spawn", "--bigtable"]) == 2
    assert "--bigtable: lockserver only" in capsys.readouterr().err


def test_reply_gaps() -> None:
    """The longest time between two consecutive replies after the window opened, and when
    it began (seconds into the window); replies of the warm-up do not count."""
    gaps = ReplyGaps()
    gaps.reply(10)
    gaps.reply(5_000_000_000)  # warm-up: forgotten when the window opens
    gaps.open(1_000_000_000)
    assert gaps.report(_report()).reply_gap_ns == 0
    for t in (1_100_000_000, 1_150_000_000, 1_400_000_000, 1_410_000_000):
        gaps.reply(t)
    report = gaps.report(_report())
    assert report.reply_gap_ns == 250_000_000
    assert report.reply_gap_at == pytest.approx(0.15)


def _report() -> WorkerReport:
    return WorkerReport(0, 0, 0, 0, 0, (), "", 0.0, 0.0)


def test_plain_blast_reports_its_gap_with_one_blaster(lockserver: ServerProcess) -> None:
    """The ordinary blast phases report the largest reply gap when one process sent the
    load, and leave it out with several (each saw only its own replies)."""
    target = Target(Backend.LOCKSERVER, lockserver.host, lockserver.port)
    (r,) = run_blast(BlastConfig(target, connections=2, pipeline=4, count=500, warmup=0))
    assert r.extra["reply_gap_max_us"] > 0 and r.extra["reply_gap_at_s"] >= 0
    (r,) = run_blast(
        BlastConfig(target, connections=2, pipeline=4, count=500, warmup=0, processes=2)
    )
    assert "reply_gap_max_us" not in r.extra
