"""The door is deterministic: the same sequence of calls with the same ``now`` values gives
the same outputs, in the same order, whatever the owner handles are (issue 15, item 2).
Replication applies one log of calls on every replica through this door, so an output that
depended on set order, object identity or a hash would split the replicas.

Hypothesis draws a sequence of door calls over a few owners, sessions (random max ages) and
variables: mutex acquires (some with ``wait``, some with a TTL) and releases, ends (some as an
admin), cancels of earlier request ids, owners going away (and coming back as new
connections), advances and statistics, and the operator's calls (issue 16): force-releases,
holders / sessions / waiters listings (holders and waiters paged by small limits, following
their cursors), feed subscriptions and unsubscriptions, with ``now`` moving by random steps
(0 included, and steps past expiries and wait deadlines). Each sequence is replayed into
fresh cores built alike:

- twice with string owners: every output and every statistics record is equal;
- with owner objects whose hash is random and differs between the runs (fresh instances per
  run, mapped back by position): equal again -- what catches routing or waking in set order
  (a crowded fixed scenario with eight owners catches it every time, the random sequences
  most of the time);
- across processes with different ``PYTHONHASHSEED`` (string hashes differ, as on two
  replicas): equal again -- except the order of a sessions listing, which is the sessions'
  hash order (documented): a sessions page is compared as the set of its records there, and
  the sequences list sessions in one page.

Every replay also checks what a request's life must be, which holds for any sequence:
answered at most once; ``execute`` without wait, ``end`` and ``cancel`` answered in their own
call; a parked request is answered later, cancelled, or dropped with its owner -- the queue
holds exactly the requests still open; ``Cancelled(True)`` exactly when the target was open;
nothing is ever sent to an owner after it is gone.
"""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockserver.engine import EngineError, LockCore, SessionsListing
from protocol import Cancelled, Cause, FeedEvent, ListQuery, LockLost, TransactionResult

from ._door import START, acquire, release, spec

OWNERS = 3
SESSIONS = ("s0", "s1", "s2")
VARS = ("a", "a", "a", "b")  # "a" contended most
STEPS = (0.0, 0.0, 0.25, 1.0, 2.5, 6.0, 40.0)  # 6 passes the short max age, 40 the others

# A call: (step of now, what). What: ("exec", owner, session, max_age, var, release?, wait,
# ttl) | ("end", owner, session) | ("cancel", owner, pick) | ("gone", owner) | ("advance",) |
# ("stats",). Owners are positions 0..OWNERS-1; the connection behind a position changes
# when it is gone.
Call = tuple[float, tuple[Any, ...]]

KINDS = ("exec",) * 7 + ("end", "cancel", "gone", "advance", "advance", "stats")
KINDS += ("release", "holders", "sessions", "waiters", "sub", "unsub")


def _call(
    step: float,
    kind: str,
    i: int,
    sid: str,
    max_age: float,
    var: str,
    is_release: bool,
    wait: float | None,
    ttl: float | None,
    pick: int,
) -> Call:
    if kind == "exec":
        return step, (kind, i, sid, max_age, var, is_release, wait, ttl)
    if kind == "end":
        return step, (kind, i, sid, pick % 2 == 0)
    if kind in ("cancel", "holders", "waiters", "sub", "unsub"):
        return step, (kind, i, pick)
    if kind == "release":
        return step, (kind, i, var, sid if pick % 2 else None)
    if kind in ("gone", "sessions"):
        return step, (kind, i)
    return step, (kind,)


_CALL = st.builds(
    _call,
    st.sampled_from(STEPS),
    st.sampled_from(KINDS),
    st.integers(0, OWNERS - 1),
    st.sampled_from(SESSIONS),
    st.sampled_from((3.0, 10.0, 100.0, 100.0)),
    st.sampled_from(VARS),
    st.sampled_from((False, False, True)),
    st.sampled_from((None, 0.0, 1.0, 5.0, 60.0, 60.0, 60.0)),
    st.sampled_from((None, None, None, 2.0)),
    st.integers(0, 7),
)
CALLS = st.lists(_CALL, min_size=10, max_size=60)


class Handle:
    """An owner handle as opaque as a connection: equal only to itself, hashed by a random
    number (so two runs put the same owners in sets in different orders)."""

    __slots__ = ("_hash", "label")

    def __init__(self, label: tuple[int, int], rng: random.Random) -> None:
        self.label = label
        self._hash = rng.getrandbits(61)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Handle{self.label}"


Factory = Callable[[tuple[int, int]], Hashable]


def strings(label: tuple[int, int]) -> Hashable:
    return f"o{label[0]}.{label[1]}"


def handles(seed: int) -> Factory:
    rng = random.Random(seed)
    return lambda label: Handle(label, rng)


def _norm(payload: object, labels: dict[Hashable, tuple[int, int]]) -> object:
    if isinstance(payload, EngineError):
        return ("EngineError", payload.code, payload.message)
    if isinstance(payload, SessionsListing):
        # Owners mapped back by position; the records as a set: their order is hash order.
        pairs = zip(payload.page.sessions, payload.owners, strict=True)
        return (
            "sessions",
            sorted((repr(r), [labels[o] for o in owners]) for r, owners in pairs),
            payload.page.cursor is None,
        )
    return payload  # attrs values: compared by ==


def replay(
    calls: list[Call], make_owner: Factory, *, authenticated: bool, n_owners: int = OWNERS
) -> list[Any]:
    """Run ``calls`` through a fresh core; return every call's outputs (owners mapped back to
    (position, generation), EngineError as (code, message)) and statistics records, checking
    the life of every request on the way (module docstring)."""
    core = LockCore(started_at=START, host="h", authenticated=authenticated)
    generation = [0] * n_owners
    owners: dict[int, Hashable] = {}  # position -> current handle
    labels: dict[Hashable, tuple[int, int]] = {}
    next_rid: dict[Hashable, int] = {}
    gone: set[Hashable] = set()
    answered: set[tuple[Hashable, int]] = set()
    parked: dict[tuple[Hashable, int], None] = {}  # open parked requests, in order
    subscriptions: dict[Hashable, list[int]] = {}
    record: list[Any] = []
    now = START

    def owner(i: int) -> Hashable:
        o = owners.get(i)
        if o is None:
            label = (i, generation[i])
            o = owners[i] = make_owner(label)
            labels[o] = label
            next_rid[o] = 1
        return o

    def rid_of(o: Hashable) -> int:
        rid = next_rid[o]
        next_rid[o] = rid + 1
        return rid

    for step, what in calls:
        now += step
        kind = what[0]
        own: tuple[Hashable, int] | None = None
        if kind == "exec":
            _, i, sid, max_age, var, is_release, wait, ttl = what
            o = owner(i)
            own = (o, rid_of(o))
            transaction = release(var) if is_release else acquire(var, ttl=ttl)
            outs = core.execute(
                o,
                own[1],
                spec(sid, max_age),
                transaction,
                wait=wait,
                now=now,
                trust=1.0,
                principal=f"p{i % 2}",
            )
        elif kind == "end":
            o = owner(what[1])
            own = (o, rid_of(o))
            outs = core.end_session(
                o,
                own[1],
                what[2],
                now=now,
                trust=1.0,
                principal=f"p{what[1] % 2}",
                admin=len(what) > 3 and what[3],
            )
        elif kind == "release":
            o = owner(what[1])
            own = (o, rid_of(o))
            outs = core.release(o, own[1], "ns", "L", what[2], what[3], now=now, trust=1.0)
        elif kind in ("holders", "waiters", "sessions"):
            o = owner(what[1])
            outs = []
            limit = None if kind == "sessions" else 1 + what[2] % 3
            cursor = None
            for _ in range(50):  # follow the cursors to the end (a few pages)
                own = (o, rid_of(o))
                query = ListQuery(limit=limit, cursor=cursor)
                page_outs = core.listing(o, own[1], kind, query, now=now, trust=1.0)
                outs += page_outs
                assert page_outs[-1][0] == own
                answered.add(own)
                page = page_outs[-1][1]
                cursor = page.page.cursor if kind == "sessions" else page.cursor
                if cursor is None:
                    break
            own = None
        elif kind == "sub":
            o = owner(what[1])
            own = (o, rid_of(o))
            outs = core.subscribe(o, own[1], "ns", "L" if what[2] % 2 else None)
            subscriptions.setdefault(o, []).append(own[1])
        elif kind == "unsub":
            o = owner(what[1])
            mine = subscriptions.get(o, [])
            target = mine[what[2] % len(mine)] if mine else 99
            own = (o, rid_of(o))
            outs = core.unsubscribe(o, own[1], target)
        elif kind == "cancel":
            o = owner(what[1])
            mine = [rid for (p, rid) in parked if p is o] + list(range(1, next_rid[o]))
            target = mine[what[2] % len(mine)] if mine else 99
            was_open = (o, target) in parked
            own = (o, rid_of(o))
            outs = core.cancel(o, own[1], target, now=now, trust=1.0)
            assert ((own, Cancelled(True)) in outs) is was_open
        elif kind == "gone":
            i = what[1]
            o = owners.pop(i, None)
            outs = [] if o is None else core.owner_gone(o, now=now, trust=1.0)
            if o is not None:
                gone.add(o)
                generation[i] += 1
                for request in [r for r in parked if r[0] is o]:
                    del parked[request]  # dropped unanswered
        elif kind == "advance":
            outs = core.advance(now, trust=1.0)
        else:
            stats, outs = core.statistics(now, trust=1.0)
            record.append(("stats", stats))
        # --- the life of requests ---
        for (o, rid), payload in outs:
            assert o not in gone, f"output for {labels[o]} after it was gone"
            if type(payload) is FeedEvent:  # addressed (owner, subscription id), no answer
                assert rid in subscriptions.get(o, ()), "a feed event of no subscription"
                continue
            if rid is not None and kind not in ("holders", "waiters", "sessions"):
                assert (o, rid) not in answered, f"{(labels[o], rid)} answered twice"
                answered.add((o, rid))
                parked.pop((o, rid), None)
            elif rid is not None:
                parked.pop((o, rid), None)
        if own is not None and own not in answered:
            assert kind == "exec" and what[6], f"{kind} not answered in its call"
            parked[own] = None
        assert len(core.waits) == len(parked)
        record.append(
            (kind, [((labels[o], rid), _norm(payload, labels)) for (o, rid), payload in outs])
        )
    return record


RELAXED = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@RELAXED
@given(calls=CALLS, authenticated=st.booleans(), seeds=st.tuples(st.integers(), st.integers()))
def test_same_calls_same_outputs_whatever_the_owner_handles(
    calls: list[Call], authenticated: bool, seeds: tuple[int, int]
) -> None:
    """Two fresh cores fed the same calls give equal outputs and statistics records; owner
    handles hashed differently in each run (fresh objects, random hashes, the collector run
    between) give the same outputs once mapped back by position."""
    first = replay(calls, strings, authenticated=authenticated)
    assert replay(calls, strings, authenticated=authenticated) == first
    assert replay(calls, handles(seeds[0]), authenticated=authenticated) == first
    gc.collect()
    assert replay(calls, handles(seeds[1] ^ 0x5A5A), authenticated=authenticated) == first


def test_the_generator_reaches_the_interesting_cases() -> None:
    """The replays are not vacuous: over a fixed batch of sequences there are grants of
    parked requests by another call, wait timeouts, SessionExpired answers, losses, cancels
    that found their target, and refusals (SESSION_CONFLICT)."""
    seen = dict.fromkeys(("granted later", "timed out", "session gone", "lost", "cancelled"), 0)
    seen["refused"] = 0
    seen["feed"] = 0
    seen["released"] = 0
    for seed in range(60):
        for kind, outs in replay(random_calls(seed), strings, authenticated=True):
            if kind == "stats":
                continue
            for (_, rid), payload in outs:
                if isinstance(payload, TransactionResult) and kind != "exec":
                    if payload.ok:
                        seen["granted later"] += 1
                    elif payload.cause is Cause.SESSION_EXPIRED:
                        seen["session gone"] += 1
                    elif kind == "advance":
                        seen["timed out"] += 1
                elif isinstance(payload, LockLost):
                    assert rid is None
                    seen["lost"] += 1
                    seen["released"] += payload.reason == "released"
                elif isinstance(payload, FeedEvent):
                    seen["feed"] += 1
                elif payload == Cancelled(True):
                    seen["cancelled"] += 1
                elif isinstance(payload, tuple):
                    seen["refused"] += 1
    assert all(seen.values()), seen


def random_calls(seed: int, n: int = 60) -> list[Call]:
    """A call sequence from a seeded generator (the same in every process)."""
    rng = random.Random(seed)
    calls: list[Call] = []
    for _ in range(n):
        step = rng.choice(STEPS)
        r = rng.random()
        i = rng.randrange(OWNERS)
        what: tuple[Any, ...]
        if r < 0.6:
            what = (
                "exec",
                i,
                rng.choice(SESSIONS),
                rng.choice((3.0, 10.0, 100.0)),
                rng.choice(VARS),
                rng.random() < 0.4,
                rng.choice((None, 0.0, 1.0, 5.0, 60.0)),
                rng.choice((None, None, 2.0)),
            )
        elif r < 0.65:
            what = ("end", i, rng.choice(SESSIONS), rng.random() < 0.5)
        elif r < 0.7:
            what = ("cancel", i, rng.randrange(8))
        elif r < 0.73:
            what = ("gone", i)
        elif r < 0.8:
            what = ("advance",)
        elif r < 0.82:
            what = ("stats",)
        elif r < 0.85:
            what = ("release", i, rng.choice(VARS), rng.choice((None, *SESSIONS)))
        elif r < 0.9:
            what = (rng.choice(("holders", "waiters")), i, rng.randrange(8))
        elif r < 0.93:
            what = ("sessions", i)
        elif r < 0.97:
            what = ("sub", i, rng.randrange(8))
        else:
            what = ("unsub", i, rng.randrange(8))
        calls.append((step, what))
    return calls


def digest(seeds: range) -> str:
    """The outputs of ``random_calls(seed)`` for each seed, authenticated or not, as text."""
    return repr([replay(random_calls(s), strings, authenticated=bool(s % 2)) for s in seeds])


def test_replicas_with_different_string_hashes_agree() -> None:
    """Two processes with different PYTHONHASHSEED (session ids, variable names and owners
    hash differently, as on two replicas) give the same outputs for the same calls."""
    tests_dir = Path(__file__).resolve().parent.parent
    code = "from core.test_core_determinism import digest; print(digest(range(40)))"
    outputs = []
    for hash_seed in ("1", "2"):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tests_dir,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) > 10_000  # real outputs, not an empty list


def test_many_owners_wake_and_hear_losses_in_the_same_order_whatever_their_hashes() -> None:
    """A crowded scenario (eight owners share a session and queue for one mutex; releases
    one by one, then the shared session's end) gives the same outputs with string owners and
    with five sets of randomly hashed handles: with eight owners, any waking or routing in
    hash order would show."""
    calls: list[Call] = [(0.0, ("exec", 0, "holder", 100.0, "a", False, None, None))]
    calls += [(0.0, ("exec", i, "shared", 100.0, "b", True, None, None)) for i in range(8)]
    calls += [(0.25, ("exec", i, f"w{i}", 100.0, "a", False, 60.0, None)) for i in range(1, 8)]
    calls += [(0.25, ("exec", 0, "holder", 100.0, "a", True, None, None))]
    calls += [(0.25, ("exec", i, f"w{i}", 100.0, "a", True, None, None)) for i in range(1, 7)]
    calls += [(0.25, ("end", 0, "shared")), (200.0, ("advance",))]
    first = replay(calls, strings, authenticated=False, n_owners=8)
    granted = [out[1][0] for kind, out in first if kind == "exec" and len(out) == 2]
    assert granted == [((i, 0), 2) for i in range(1, 8)]  # in arrival order
    (end,) = [out for kind, out in first if kind == "end"]
    assert [address for address, _ in end] == [((i, 0), None) for i in range(1, 8)] + [((0, 0), 4)]
    for seed in range(5):
        assert replay(calls, handles(seed), authenticated=False, n_owners=8) == first
