"""Hypothesis-driven fuzzing of a running server with random and mutated frames (issue #8).

Pinned down: whatever a peer sends (a valid request with one field wrong, missing or extra,
unknown types and ops, deep and wide trees, extreme numbers, huge strings, non-UTF-8 names,
truncated, trailing, empty, oversized or random frames), the server answers each frame with a
right error code in order (or a normal reply where the mutation happens to be valid), closes
the connection exactly after a closing code, never counts an internal error, keeps serving a
well-behaved client on another connection with correct answers, and keeps no entries and no
more sessions than valid requests created. The generator (``lockbench.fuzz``) is shared with
the long run, ``benchmarks/fuzz_server.py``; here Hypothesis controls its Random (so failures
shrink).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ThreadedServer

from client import Assert, DeleteVar, LockClient, SetVar
from lockbench.fuzz import Case, Conversation, check_replies, frame, make_case
from lockserver import RunningServer

pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")

PING_ID = 2**64 - 1  # the largest id is a valid one


class Tally:
    """What the examples did, for the end-of-run checks."""

    examples = 0
    successes = 0
    closes = 0
    codes: set[int] = set()  # noqa: RUF012 - one module-wide tally
    last_fence = 0


def _good_client_round(port: int) -> None:
    """A well-behaved client on its own connection: a lock, a conflicting lock, a release,
    with the right answers and a fence that only grows."""
    with LockClient("127.0.0.1", port, timeout=5.0) as c:
        a = c.session(max_age=5.0, keepalive=False)
        b = c.session(max_age=5.0, keepalive=False)
        got = a.execute("good", [Assert(SetVar("t", "v", 1))])
        assert got.ok and got.fence > Tally.last_fence
        Tally.last_fence = got.fence
        assert not b.execute("good", [Assert(SetVar("t", "v", 2))]).ok
        assert a.execute("good", [Assert(DeleteVar("t", "v"))]).ok
        assert a.end() and b.end()  # a failed call creates its session too


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(rng=st.randoms(use_true_random=False), count=st.integers(1, 6))
def test_mutated_frames_get_the_right_errors(
    thread_server: ThreadedServer[RunningServer], rng: random.Random, count: int
) -> None:
    """Each example: a fresh connection, ``count`` mutated frames and a ping in one write;
    every reply is checked in order against its case."""
    port = thread_server.port
    cases: list[Case] = []
    for i in range(count):
        case = make_case(rng, 1000 + i, huge=rng.random() < 0.02)
        cases.append(case)
        if case.closes:
            break
    conv = Conversation(port)
    try:
        conv.send(b"".join(c.data for c in cases) + frame(_ping(PING_ID)))
        codes, closed = check_replies(conv, cases, PING_ID)
    finally:
        conv.close()
    Tally.examples += 1
    Tally.closes += closed
    Tally.codes.update(codes)
    Tally.successes += len(cases) - len(codes)
    if Tally.examples % 25 == 0:
        _good_client_round(port)


def _ping(rid: int) -> bytes:
    import msgpack

    return msgpack.packb({"type": "ping", "id": rid})  # type: ignore[no-any-return]


def test_after_the_fuzzing_the_server_is_healthy(
    thread_server: ThreadedServer[RunningServer],
) -> None:
    """Run after the fuzzing (same module server): no internal error, the well-behaved client
    still served, no entries kept and no more sessions than valid requests could create."""
    _good_client_round(thread_server.port)
    stats = thread_server.call(thread_server.server.statistics)
    assert stats["server"]["internal_errors"] == 0
    assert stats["engine"]["entries"] == 0
    assert stats["engine"]["sessions"] <= Tally.successes + 1
    if Tally.examples:  # the fuzz test ran first in this module
        assert stats["server"]["protocol_errors"] > 0
        assert {101, 102, 201, 203} <= Tally.codes, Tally.codes
