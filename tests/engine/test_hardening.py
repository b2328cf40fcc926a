"""Issue 14 in the engine and the wait queue, driven with explicit ``now``: one bad waiter never
loses another's answer (item 1), the store budget and the retry memory's bounds (item 2),
memory freed on release, end and cancel (item 3), the weight of parked transactions (item 5),
and replies that can always be sent (item 6)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import pytest
from support import poisoned_setvar

from lockserver.engine import EngineError, EngineLimits, WaitLimits, WaitQueue
from lockserver.engine._engine import RETRY_BYTES
from lockserver.engine._eval import REPLY_DATA_LIMIT
from lockserver.engine._store import ENTRY_BASE, SESSION_BASE, entry_cost
from lockserver.engine._waiting import RUN_WEIGHT
from protocol import (
    TRUE,
    AnywayContinueAfter,
    Assert,
    DeleteVar,
    ErrorCode,
    Exists,
    Not,
    SelectConstantValue,
    SelectVarValue,
    SessionSpec,
    SetVar,
    Statement,
    Transaction,
    TransactionResult,
)

from ._helpers import NS, START, make_engine, run

LOCK = Assert(SetVar("locks", "printer", "ticket"))
UNLOCK = AnywayContinueAfter(DeleteVar("locks", "printer"))


class Queue:
    """A wait queue over a fresh engine; ``call`` returns every answer due, by token."""

    def __init__(self, limits: WaitLimits | None = None, **engine_kwargs: Any) -> None:
        self.engine = make_engine(**engine_kwargs)
        self.queue = WaitQueue(self.engine, limits)

    def call(
        self,
        token: Hashable,
        session: str,
        *statements: Statement,
        now: float = START,
        wait: float | None = None,
        principal: str = "",
    ) -> dict[Hashable, TransactionResult | EngineError]:
        answers = self.queue.submit(
            "conn",
            token,
            SessionSpec(session),
            Transaction(NS, statements),
            now=now,
            trust=1.0,
            wait=wait,
            principal=principal,
        )
        tokens = [t for t, _ in answers]
        assert len(tokens) == len(set(tokens))
        return dict(answers)


# --- item 1: one bad waiter never loses another's answer -----------------------------------


@pytest.mark.parametrize("bad_first", [True, False])
def test_a_waiter_that_crashes_loses_nobody_elses_answer(bad_first: bool) -> None:
    """The issue's poisoned variable: a waiter whose evaluation raises sat beside a good one.
    The release that wakes them is answered (it committed), the good waiter is granted and
    answered, the bad one gets INTERNAL_ERROR (its bug as the cause), and nothing is left
    half done: the lock is the good waiter's, the queue is empty."""
    q = Queue()
    holder = Assert(SetVar("locks", "printer", "h-ticket"))
    assert q.call("h1", "holder", holder)["h1"].ok  # type: ignore[union-attr]
    # It waits for the holder's entry to go, then sets another variable: with the bug.
    bad = [Assert(Not(Exists("locks", "printer", "h-ticket"))), Assert(poisoned_setvar())]
    good = [LOCK]
    order = [("bad", bad), ("good", good)] if bad_first else [("good", good), ("bad", bad)]
    for token, statements in order:
        assert q.call(token, token, *statements, wait=60) == {}  # parked
    answers = q.call("release", "holder", UNLOCK, now=START + 1)
    assert set(answers) == {"release", "good", "bad"}
    release, good, bad_answer = answers["release"], answers["good"], answers["bad"]
    assert isinstance(release, TransactionResult) and release.ok
    assert isinstance(good, TransactionResult) and good.ok
    assert isinstance(bad_answer, EngineError)
    assert bad_answer.code is ErrorCode.INTERNAL_ERROR
    assert isinstance(bad_answer.__cause__, Exception)
    assert len(q.queue) == 0
    assert q.engine.sessions["good"].held == 1
    # The variable is not poisoned: later releases and acquires are ordinary.
    assert q.call("r2", "good", UNLOCK, now=START + 2)["r2"].ok  # type: ignore[union-attr]
    assert q.call("a2", "other", LOCK, now=START + 2)["a2"].ok  # type: ignore[union-attr]


def test_a_request_that_crashes_still_returns_the_answers_due_before_it() -> None:
    """A newcomer runs after the expiries due hand the lock to older waiters: if the newcomer
    then fails (here: a bug), those grants are still in the answers, not lost with it."""
    q = Queue()
    run(q.engine, SessionSpec("holder", max_age=5), LOCK)
    assert q.call("w", "waiter", LOCK, wait=60) == {}
    answers = q.call("x", "x", Assert(poisoned_setvar()), now=START + 10)
    assert isinstance(answers["w"], TransactionResult) and answers["w"].ok
    assert isinstance(answers["x"], EngineError)
    assert answers["x"].code is ErrorCode.INTERNAL_ERROR


def test_a_refused_newcomer_keeps_the_answers_due_before_it() -> None:
    """Likewise for a limit: the newcomer's TOO_MANY_ENTRIES is its answer; the waiter
    granted by the expiry that ran first is answered too."""
    q = Queue()
    q.engine.limits = EngineLimits(max_entries=1)
    run(q.engine, SessionSpec("holder", max_age=5), LOCK)
    assert q.call("w", "waiter", LOCK, wait=60) == {}
    answers = q.call("x", "x", Assert(SetVar("t", "other")), now=START + 10)
    assert isinstance(answers["w"], TransactionResult) and answers["w"].ok
    assert isinstance(answers["x"], EngineError)
    assert answers["x"].code is ErrorCode.TOO_MANY_ENTRIES


# --- item 2: the store budget ---------------------------------------------------------------------


def test_the_store_budget_refuses_an_entry_past_it_and_changes_nothing() -> None:
    """An entry that would pass max_store_bytes fails the whole transaction (STORE_FULL):
    the session it would have created does not exist, the count is unchanged."""
    base = SESSION_BASE + 1 + ENTRY_BASE + 2 + 32 + 100  # a session "a" and its entry
    engine = make_engine(limits=EngineLimits(max_store_bytes=base + 50))
    assert run(engine, "a", Assert(SetVar("t", "v", "x" * 68))).ok
    stored = engine.stored
    with pytest.raises(EngineError) as info:
        run(engine, "b", Assert(SetVar("t", "w")))
    assert info.value.code is ErrorCode.STORE_FULL
    assert "max_store_bytes" in info.value.message
    assert "b" not in engine.sessions and engine.stored == stored
    # Releasing always passes, and frees what it counted.
    assert run(engine, "a", Assert(DeleteVar("t", "v"))).ok
    assert engine.stored == SESSION_BASE + 1


def test_a_replacement_that_grows_past_the_budget_is_refused_one_that_shrinks_passes() -> None:
    engine = make_engine(limits=EngineLimits(max_store_bytes=SESSION_BASE + ENTRY_BASE + 400))
    grow = SetVar("t", "v", "x" * 200, allow_duplicates=True)
    assert run(engine, "a", Assert(grow)).ok
    with pytest.raises(EngineError) as info:
        run(engine, "a", Assert(SetVar("t", "v", "x" * 500, allow_duplicates=True)))
    assert info.value.code is ErrorCode.STORE_FULL
    assert run(engine, "a", Assert(SetVar("t", "v", "x", allow_duplicates=True))).ok


def test_a_new_session_past_the_budget_is_refused() -> None:
    engine = make_engine(limits=EngineLimits(max_store_bytes=SESSION_BASE * 2 + 2))
    run(engine, "a")
    run(engine, "b")
    with pytest.raises(EngineError) as info:
        run(engine, "c")
    assert info.value.code is ErrorCode.STORE_FULL
    assert len(engine.sessions) == 2


def test_retry_memory_keeps_at_most_retry_bytes_of_data() -> None:
    """The issue's retry memory held 390 MB for 5 tx_ids. Remembered data is bounded per
    session: older results are forgotten first, and it counts in the store budget."""
    engine = make_engine()
    value = "x" * (RETRY_BYTES // 4)
    for i in range(8):
        r = run(engine, "s", SelectConstantValue("v", value), transaction_id=f"t{i}")
        assert r.ok
    s = engine.sessions["s"]
    assert s.retry_memory is not None
    assert 0 < s.retry_bytes <= RETRY_BYTES
    assert "t7" in s.retry_memory and "t0" not in s.retry_memory
    # A remembered one is answered from memory, data and all.
    again = run(engine, "s", SelectConstantValue("v", "other"), transaction_id="t7")
    assert again.data == (("v", value),)


def test_a_result_too_large_to_remember_is_not_run_again() -> None:
    """A result whose data alone passes RETRY_BYTES is remembered without it: a retry is
    refused with TOO_LARGE stating the outcome, never executed a second time."""
    engine = make_engine()
    big = "x" * (RETRY_BYTES + 1)
    first = run(
        engine, "s", Assert(SetVar("t", "v")), SelectConstantValue("v", big), transaction_id="t"
    )
    assert first.ok
    fence = engine.fence
    with pytest.raises(EngineError) as info:
        run(engine, "s", Assert(SetVar("t", "v")), transaction_id="t")
    assert info.value.code is ErrorCode.TOO_LARGE
    assert "already ran" in info.value.message and str(first.fence) in info.value.message
    assert engine.fence == fence  # not run again


def test_ending_a_session_frees_its_retry_memory_and_count() -> None:
    engine = make_engine()
    run(engine, "s", SelectConstantValue("v", "x" * 1000), transaction_id="t")
    assert engine.stored > SESSION_BASE + 1000
    assert engine.end_session("s", now=START)
    assert engine.stored == 0


# --- item 3: memory freed when a waiter is cancelled ----------------------------------------------


def test_cancelled_waiters_leave_the_deadline_queue_at_once() -> None:
    """Each round of 16,000 park-and-cancel waiters used to keep 28 MB until their waits ran
    out; now the queue holds nothing once they are cancelled."""
    q = Queue()
    q.call("h", "holder", LOCK)
    for round_ in range(3):
        for i in range(2_000):
            assert q.call((round_, i), f"w{i}", LOCK, wait=300, now=START + round_) == {}
        for i in range(2_000):
            assert q.queue.cancel((round_, i)) is not None
        assert len(q.queue._deadlines) == 0
    sessions = SESSION_BASE * 2_001 + len("holder") + sum(len(f"w{i}") for i in range(2_000))
    assert q.engine.stored == sessions + entry_cost("locks", "printer", "ticket", None)


# --- item 5: the work one change can trigger ------------------------------------------------------


def test_parked_weight_per_variable_is_bounded() -> None:
    """The issue's 10,000 waiters of 1,000 ops on one variable: past the weight bound of the
    variable the next one is refused (TOO_MANY_WAITERS, naming the variable and the setting),
    so one release re-runs at most that much."""
    heavy = [Assert(TRUE)] * 998 + [Assert(Not(Exists("locks", "printer")))]
    weight = 2 * 998 + 3 + RUN_WEIGHT  # its ops (each Assert(TRUE) is 2) plus the run
    per_variable = 10 * weight
    q = Queue(WaitLimits(max_waiting_ops_per_variable=per_variable))
    q.call("h", "holder", LOCK)
    for i in range(10):
        assert q.call(i, f"w{i}", *heavy, wait=60) == {}
    refused = q.call(10, "w10", *heavy, wait=60)[10]
    assert isinstance(refused, EngineError)
    assert refused.code is ErrorCode.TOO_MANY_WAITERS
    assert "max_waiting_ops_per_variable" in refused.message and "'printer'" in refused.message
    assert len(q.queue) == 10
    before = q.queue.statistics().reevaluations_total
    q.call("r", "holder", Assert(SetVar("locks", "printer", "t2", allow_duplicates=True)))
    assert q.queue.statistics().reevaluations_total - before == 10


def test_parked_weight_per_session_and_per_principal_are_bounded() -> None:
    wait_tx = [Assert(Not(Exists("locks", "printer")))]  # 3 ops
    weight = 3 + RUN_WEIGHT
    q = Queue(
        WaitLimits(max_waiting_ops_per_session=2 * weight, max_waiting_ops_per_principal=3 * weight)
    )
    q.call("h", "holder", LOCK)
    assert q.call(1, "s1", *wait_tx, wait=60, principal="p") == {}
    assert q.call(2, "s1", *wait_tx, wait=60, principal="p") == {}
    per_session = q.call(3, "s1", *wait_tx, wait=60, principal="p")[3]
    assert isinstance(per_session, EngineError)
    assert "max_waiting_ops_per_session" in per_session.message
    assert q.call(4, "s2", *wait_tx, wait=60, principal="p") == {}
    per_principal = q.call(5, "s3", *wait_tx, wait=60, principal="p")[5]
    assert isinstance(per_principal, EngineError)
    assert "max_waiting_ops_per_principal" in per_principal.message
    assert q.call(6, "s3", *wait_tx, wait=60, principal="other") == {}  # another principal
    # Weights are given back when waiters go.
    assert q.queue.cancel(1) is not None
    assert q.call(7, "s1", *wait_tx, wait=60, principal="other") == {}


def test_a_parked_transaction_counts_in_the_store_budget() -> None:
    q = Queue(limits=None)
    q.call("h", "holder", LOCK)
    before = q.engine.stored
    assert q.call(1, "w", LOCK, wait=60) == {}
    parked = q.engine.stored - before - (SESSION_BASE + 1)
    assert parked > 0
    q.queue.cancel(1)
    assert q.engine.stored == before + SESSION_BASE + 1  # the session "w" stays
    q.engine.limits = EngineLimits(max_store_bytes=q.engine.stored + parked - 1)
    refused = q.call(2, "w", LOCK, wait=60)[2]
    assert isinstance(refused, EngineError) and refused.code is ErrorCode.STORE_FULL
    assert len(q.queue) == 0


# --- item 6: replies that can always be sent ------------------------------------------------------


def test_selected_data_past_the_reply_limit_fails_the_transaction_whole() -> None:
    """The issue's StateLock: two 600 KB entries made every acquire's reply 1.2 MB, over the
    1 MiB a client accepts, and the client dropped the connection. Now the transaction that
    selects them fails whole with TOO_LARGE (its SetVar is rolled back), and one that
    selects less passes."""
    engine = make_engine()
    big = "x" * 600_000
    for sid in ("a", "b"):
        assert run(engine, sid, Assert(SetVar("task", "state", big, allow_duplicates=True))).ok
    with pytest.raises(EngineError) as info:
        run(
            engine,
            "c",
            Assert(SetVar("claims", "task")),
            SelectVarValue("state", "task", "state", select_many=True),
        )
    assert info.value.code is ErrorCode.TOO_LARGE
    assert str(REPLY_DATA_LIMIT) in info.value.message
    assert "c" not in engine.sessions  # rolled back, the session it created too
    one = run(engine, "c", Assert(SetVar("claims", "task")), SelectVarValue("s", "task", "state"))
    assert one.ok and one.data[0][1]["value"] == big


def test_selected_constants_count_too() -> None:
    engine = make_engine()
    chunk = "y" * 300_000
    with pytest.raises(EngineError) as info:
        run(engine, "c", *(SelectConstantValue(f"v{i}", chunk) for i in range(4)))
    assert info.value.code is ErrorCode.TOO_LARGE
    assert run(engine, "c", *(SelectConstantValue(f"v{i}", chunk) for i in range(3))).ok
