"""The recipes' operations (``client.recipes._ops``) driven by hand, with no socket, thread or
event loop: the steps they yield, the outcomes they digest, their retry/wait loop, the cleanup
after a failure, and one whole acquire/release run by ``Run`` over an in-memory session."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest

from client import ClientTimeout, ErrorCode, Mutex, Result, ServerError
from client._core import ClientCore
from client._session_state import SessionState
from client.recipes import _ops
from client.recipes._base import (
    CANCELLED_TABLE,
    MAX_LATE_GRANTS,
    TOMBSTONE_LINGER,
    LockLostError,
    tombstone_ttl,
)
from protocol import (
    AnywayContinueAfter,
    Assert,
    Cause,
    Exists,
    Not,
    SetVar,
    Status,
    TransactionResult,
)


class _Welcome:
    limits: ClassVar[dict[str, float]] = {"max_wait": 30.0}


class _Client:
    welcome = _Welcome()


class FakeSession(SessionState):
    """A session of no client: only what the operations read (``welcome_for(ns).limits``,
    the lost listeners)."""

    client = _Client()

    def __init__(self) -> None:
        super().__init__(ClientCore("ops"), "s1", 60.0, "", True)

    def welcome_for(self, namespace: str) -> _Welcome:
        assert namespace == "ns"
        return self.client.welcome


def result(ok: bool, *, fence: int = 7, cause: Cause = Cause.STATEMENT, data: Any = ()) -> Result:
    return Result(
        TransactionResult(
            Status.TRANSACTION_OK if ok else Status.TRANSACTION_ERROR,
            Cause.UNSPECIFIED if ok else cause,
            "tx",
            "host",
            10.0,
            1.0,
            None if ok else "0:/AssertOp/",
            tuple(data),
            fence,
            40.0 if ok else None,
        )
    )


def released(*values: bool) -> Result:
    return result(True, data=[("released", v) for v in values])


def mutex() -> Mutex:
    return Mutex(FakeSession(), "ns", "m", min_uptime=2.0, min_trust=0.5)  # type: ignore[arg-type]


def first_execute(op: _ops.Op[Any], now: float) -> _ops.RunTx:
    """Start ``op`` and answer its clock steps with ``now`` until it wants a call."""
    step = next(op)
    while step is _ops.NOW or step is _ops.WELCOME:
        step = op.send(now if step is _ops.NOW else _Welcome())
    assert isinstance(step, _ops.RunTx)
    return step


def test_a_blocking_acquire_waits_on_the_server_and_asks_again_until_its_timeout() -> None:
    """Each attempt asks the server to wait for what is left of the timeout (capped by the
    welcome's max_wait) with the lock's contract; a busy answer before the deadline sends
    another attempt, a grant ends the operation with the fence recorded."""
    lock = mutex()
    op = _ops.acquire(lock, True, 5.0)
    step = first_execute(op, 100.0)
    assert (step.wait, step.min_uptime, step.min_trust, step.cleanup) == (5.0, 2.0, 0.5, False)
    assert op.send(result(False)) is _ops.NOW  # the time the answer came
    step = op.send(103.0)
    assert step is _ops.NOW  # the next attempt's send time
    step = op.send(103.0)
    assert isinstance(step, _ops.RunTx) and step.wait == 2.0
    assert op.send(result(True, fence=9)) is _ops.NOW
    with pytest.raises(StopIteration) as done:
        op.send(104.0)
    assert done.value.value is True
    assert lock.held and lock.fence == 9


def test_a_busy_answer_after_the_deadline_gives_up() -> None:
    """A busy answer that arrives after the caller's deadline returns False; nothing is
    held and nothing is being acquired (a new acquire is allowed)."""
    lock = mutex()
    op = _ops.acquire(lock, True, 1.0)
    first_execute(op, 100.0)
    op.send(result(False))
    with pytest.raises(StopIteration) as done:
        op.send(101.5)
    assert done.value.value is False and not lock.held
    first_execute(_ops.acquire(lock, False, None), 200.0)  # not "already being acquired"


def test_a_try_lock_asks_once_without_wait_and_a_refusal_is_a_result() -> None:
    """blocking=False: one attempt with no server wait; a refusal for the contract
    (MINIMUM_REQUIREMENTS) is False, never another attempt."""
    lock = mutex()
    op = _ops.acquire(lock, False, None)
    assert first_execute(op, 0.0).wait is None
    op.send(result(False, cause=Cause.MINIMUM_REQUIREMENTS))
    with pytest.raises(StopIteration) as done:
        op.send(0.5)
    assert done.value.value is False
    assert lock.last_result is not None and lock.last_result.cause is Cause.MINIMUM_REQUIREMENTS


def _key_of(attempt: _ops.RunTx) -> str:
    """The cancel key an acquire attempt asserts has no tombstone (its last statement)."""
    guard = attempt.statements[-1]
    assert isinstance(guard, Assert) and isinstance(guard.condition, Not)
    key = guard.condition.operand.var  # type: ignore[attr-defined]
    assert isinstance(key, str) and len(key) == 32
    assert guard == Assert(Not(Exists(CANCELLED_TABLE, key, ignore_this_session=False)))
    return key


def test_an_unknown_outcome_is_cancelled_before_the_error_propagates() -> None:
    """An attempt that failed with an unknown outcome (a timeout) yields one cancel step: the
    tombstone of the attempt's cancel key (which the attempt asserts absent), then the
    deletion of whatever its ticket may hold, in one transaction; the error then propagates."""
    lock = mutex()
    op = _ops.acquire(lock, True, None)
    attempt = first_execute(op, 0.0)
    timeout = ClientTimeout("no reply")
    cancel = op.throw(timeout)
    assert isinstance(cancel, _ops.RunTx) and cancel.cleanup and cancel.wait is None
    ticket = attempt.statements[0].condition.value  # type: ignore[attr-defined]
    key = _key_of(attempt)
    tombstone, *cleanup = cancel.statements
    assert tombstone == AnywayContinueAfter(SetVar(CANCELLED_TABLE, key, ticket))
    assert [s.operator.value for s in cleanup] == [ticket]  # type: ignore[attr-defined]
    with pytest.raises(ClientTimeout) as raised:
        op.send(released(False))
    assert raised.value is timeout and not getattr(timeout, "__notes__", None)
    assert not lock.held and not lock.session._deferred


class _TtlWelcome:
    """A server that advertises ``max_ttl`` (a real one does)."""

    def __init__(self, max_ttl: Any) -> None:
        self.limits = {"max_wait": 30.0, "max_ttl": max_ttl}


@pytest.mark.parametrize(
    ("max_ttl", "ttl"),
    [
        (30 * 86400.0, TOMBSTONE_LINGER + 30.0),  # the default max_ttl
        (TOMBSTONE_LINGER + 30.0, TOMBSTONE_LINGER + 30.0),  # at the bound
        (TOMBSTONE_LINGER + 29.0, None),  # past it: a ttl would refuse the whole cancel
        ("soon", None),  # not a number of seconds
        (-1.0, None),
    ],
)
def test_the_tombstone_expires_past_the_longest_wait_when_the_server_allows(
    max_ttl: Any, ttl: float | None
) -> None:
    """The cancel's tombstone carries a TTL of ``TOMBSTONE_LINGER`` past the server's
    ``max_wait``, so a long-lived session does not gather them; none when the server's
    ``max_ttl`` is lower or unreadable (it then ends with its session, as without a TTL)."""
    assert tombstone_ttl({"max_wait": 30.0, "max_ttl": max_ttl}) == ttl
    lock = mutex()
    op = _ops.acquire(lock, True, None)
    step = next(op)
    while step is _ops.NOW or step is _ops.WELCOME:
        step = op.send(0.0 if step is _ops.NOW else _TtlWelcome(max_ttl))
    assert isinstance(step, _ops.RunTx)
    cancel = op.throw(ClientTimeout("no reply"))
    assert isinstance(cancel, _ops.RunTx)
    tombstone = cancel.statements[0]
    assert isinstance(tombstone, AnywayContinueAfter)
    assert isinstance(tombstone.change, SetVar) and tombstone.change.ttl == ttl


def test_a_server_that_does_not_say_its_max_ttl_gets_a_tombstone_without_one() -> None:
    """No ``max_ttl`` in the Welcome: no TTL (the unit tests' Welcome says only max_wait)."""
    assert tombstone_ttl({"max_wait": 30.0}) is None


def test_a_cancel_that_runs_out_is_deferred_and_noted_on_the_error() -> None:
    """A cancel whose own outcome is unknown (the async face's bounded cleanup ran out: None
    comes back) is kept to be sent again before the session's next call, and the error the
    caller gets says the lock may be held until then."""
    lock = mutex()
    op = _ops.acquire(lock, True, None)
    first_execute(op, 0.0)
    timeout = ClientTimeout("no reply")
    cancel = op.throw(timeout)
    assert isinstance(cancel, _ops.RunTx)
    with pytest.raises(ClientTimeout) as raised:
        op.send(None)
    assert raised.value is timeout
    assert lock.session._deferred == [("ns", cancel.statements)]
    assert "may be held by this session" in " ".join(timeout.__notes__)


def test_every_acquire_call_has_its_own_cancel_key_and_keeps_it_across_attempts() -> None:
    """The attempts of one blocking acquire share one cancel key (a later attempt is the same
    call); the next call draws a new one, even with a caller-chosen ticket, so the tombstone
    of a cancelled call never refuses a later call."""
    lock = Mutex(FakeSession(), "ns", "m", ticket="mine")  # type: ignore[arg-type]
    op = _ops.acquire(lock, True, None)
    first = first_execute(op, 0.0)
    op.send(result(False))
    assert op.send(1.0) is _ops.NOW
    second = op.send(1.0)
    assert isinstance(second, _ops.RunTx) and second.statements == first.statements
    op.send(result(True))
    with pytest.raises(StopIteration):
        op.send(2.0)
    release = _ops.release(lock)
    assert isinstance(next(release), _ops.RunTx)
    with pytest.raises(StopIteration):
        release.send(released(True))
    later = first_execute(_ops.acquire(lock, True, None), 3.0)
    assert _key_of(later) != _key_of(first)
    assert later.statements[:-1] == first.statements[:-1]  # same ticket, same statements


def test_an_attempt_refused_by_its_own_tombstone_is_not_sent_again() -> None:
    """A blocking attempt that fails at its last statement (its call's tombstone exists: a
    cancel was applied first) gives up at once instead of asking again until the deadline."""
    lock = mutex()
    op = _ops.acquire(lock, True, None)
    attempt = first_execute(op, 0.0)
    refused = Result(
        TransactionResult(
            Status.TRANSACTION_ERROR, Cause.STATEMENT, "tx", "host", 10.0, 1.0,
            f"{len(attempt.statements) - 1}:/AssertOp/", (), 0, None,
        )
    )  # fmt: skip
    op.send(refused)
    with pytest.raises(StopIteration) as done:
        op.send(1.0)
    assert done.value.value is False and not lock.held


def test_a_server_error_needs_no_cleanup(caplog: pytest.LogCaptureFixture) -> None:
    """A ServerError says nothing ran: it propagates at once, without a cleanup step; a
    cleanup that fails itself is logged and the original error still propagates."""
    op = _ops.acquire(mutex(), True, None)
    first_execute(op, 0.0)
    refused = ServerError(ErrorCode.TOO_MANY_OPS, "no")
    with pytest.raises(ServerError) as raised:
        op.throw(refused)
    assert raised.value is refused

    lock = mutex()
    op = _ops.acquire(lock, True, None)
    first_execute(op, 0.0)
    op.throw(ClientTimeout("first"))
    with caplog.at_level(logging.WARNING, "client.recipes"), pytest.raises(ClientTimeout):
        op.throw(ClientTimeout("cleanup"))
    assert "cancelling a failed acquire" in caplog.text


def test_leaving_a_block_releases_and_reports_a_loss_unless_the_block_failed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """exit_block releases in a cleanup step; a release that finds the grant gone raises
    LockLostError after a clean block, and is only logged after a failed one."""
    for failed in (False, True):
        lock = mutex()
        acquire = _ops.acquire(lock, False, None)
        first_execute(acquire, 0.0)
        acquire.send(result(True))
        with pytest.raises(StopIteration):
            acquire.send(0.0)
        op = _ops.exit_block(lock, failed)
        step = next(op)
        assert isinstance(step, _ops.RunTx) and step.cleanup
        with caplog.at_level(logging.WARNING, "client.recipes"):
            if failed:
                with pytest.raises(StopIteration):
                    op.send(released(False))
                assert "releasing" in caplog.text
            else:
                with pytest.raises(LockLostError):
                    op.send(released(False))
        assert not lock.held


def test_run_drives_a_whole_acquire_and_release_in_memory() -> None:
    """``Run`` answers clock steps from its clock and hands out RunTx steps and the
    WELCOME step (which the driver answers from the session); an in-memory "server" is
    enough to acquire, probe, refresh and release a Mutex."""
    lock = mutex()
    clock = iter(float(t) for t in range(100))
    calls: list[_ops.RunTx] = []

    def drive(op: _ops.Op[Any], answer: Result) -> Any:
        run = _ops.Run(op, lambda: next(clock))
        while (step := run.next()) is not None:
            if isinstance(step, _ops.RunTx):
                calls.append(step)
                run.value = answer
            else:
                assert step is _ops.WELCOME
                run.value = step.run(lock.session, lock.namespace)
        return run.result

    assert drive(_ops.acquire(lock, True, None), result(True, fence=3)) is True
    assert lock.fence == 3 and calls[-1].wait == 30.0  # the welcome's max_wait
    assert drive(_ops.locked(lock), result(False)) is True  # fails at the first assert
    assert drive(_ops.refresh(lock), result(True)) is None
    assert drive(_ops.release(lock), released(True)) is True
    assert not lock.held
    assert drive(_ops.release(lock), released(True)) is False  # not held: no call
    assert len(calls) == 4


def test_run_throws_a_call_error_into_the_operation() -> None:
    """An error the driver reports (``run.error``) is raised inside the operation, which
    runs its cleanup step and re-raises it out of ``next()``."""
    run = _ops.Run(_ops.acquire(mutex(), True, None), lambda: 0.0)
    assert run.next() is _ops.WELCOME
    run.value = _Welcome()
    assert isinstance(run.next(), _ops.RunTx)
    run.error = ClientTimeout("x")
    cleanup = run.next()
    assert cleanup is not None and cleanup.cleanup
    with pytest.raises(ClientTimeout):
        run.next()


def test_an_error_fetching_the_welcome_abandons_the_acquire_without_a_call() -> None:
    """The WELCOME step fails (a client of several servers could not reach the lock's
    server): nothing was sent, so no cleanup step; the error propagates and the lock can be
    acquired again."""
    from client import ServerUnavailable

    lock = mutex()
    run = _ops.Run(_ops.acquire(lock, True, None), lambda: 0.0)
    assert run.next() is _ops.WELCOME
    run.error = ServerUnavailable("server 127.0.0.1:1: cannot connect")
    with pytest.raises(ServerUnavailable):
        run.next()
    assert not lock.held
    first_execute(_ops.acquire(lock, False, None), 1.0)  # not "already being acquired"


# --- grants that arrive after their session's guarantee ran out ---------------------------------


def _late_round(op: _ops.Op[Any], lock: Mutex, now: float) -> _ops.RunTx:
    """Answer the pending attempt with a grant that arrives at ``now``, past the session's
    guarantee; return the cleanup step the operation sends for it."""
    assert op.send(result(True, fence=3)) is _ops.NOW
    cleanup = op.send(now)
    assert isinstance(cleanup, _ops.RunTx) and cleanup.cleanup and cleanup.wait is None
    assert not lock.held
    return cleanup


def test_a_grant_arriving_after_the_session_guarantee_is_removed_and_asked_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A grant whose reply came after every guarantee of its session had run out (a paused
    replica answered late: the session may have expired and the lock gone to another
    meanwhile) is not taken: its ticket's entries are removed and the same statements are
    sent again; a grant within the session's guarantee then ends the acquire."""
    lock = mutex()
    session = lock.session
    op = _ops.acquire(lock, True, None)
    attempt = first_execute(op, 100.0)
    session._valid_deadline = 160.0  # what the late reply itself guarantees: sent_at + 60
    with caplog.at_level(logging.WARNING, logger="client.recipes"):
        cleanup = _late_round(op, lock, 170.0)
    assert "after its session's guarantee ran out" in caplog.text
    ticket = attempt.statements[0].condition.value  # type: ignore[attr-defined]
    assert [s.operator.value for s in cleanup.statements] == [ticket]  # type: ignore[attr-defined]
    assert op.send(result(True, data=[("released", True)])) is _ops.NOW
    again = op.send(171.0)
    assert isinstance(again, _ops.RunTx) and again.statements == attempt.statements
    session._valid_deadline = 231.0  # the new reply's guarantee
    assert op.send(result(True, fence=11)) is _ops.NOW
    with pytest.raises(StopIteration) as done:
        op.send(171.5)
    assert done.value.value is True
    assert lock.held and lock.fence == 11


def test_a_long_server_wait_kept_alive_by_keepalives_is_not_late() -> None:
    """The guarantee is the session's latest (keepalives count): a grant after a server-side
    wait longer than max_age, with the session kept alive meanwhile, is taken at once."""
    lock = mutex()
    op = _ops.acquire(lock, True, None)
    first_execute(op, 100.0)
    lock.session._valid_deadline = 520.0  # a keepalive answered at ~460
    assert op.send(result(True, fence=5)) is _ops.NOW
    with pytest.raises(StopIteration) as done:
        op.send(500.0)  # 400 s after sending, far past sent_at + max_age
    assert done.value.value is True and lock.fence == 5


def test_late_grants_in_a_row_end_in_client_timeout_after_a_cleanup() -> None:
    """After MAX_LATE_GRANTS late grants in one acquire the next one raises ClientTimeout,
    once the failure's cleanup step has been sent (replies keep coming too late to trust)."""
    lock = mutex()
    lock.session._valid_deadline = 10.0
    op = _ops.acquire(lock, True, None)
    first_execute(op, 100.0)
    for _ in range(MAX_LATE_GRANTS):
        _late_round(op, lock, 200.0)
        assert op.send(result(True, data=[("released", True)])) is _ops.NOW
        assert isinstance(op.send(200.0), _ops.RunTx)
    assert op.send(result(True)) is _ops.NOW
    final = op.send(300.0)
    assert isinstance(final, _ops.RunTx) and final.cleanup
    with pytest.raises(ClientTimeout, match="grants in a row arrived after"):
        op.send(result(True, data=[("released", True)]))
    assert not lock.held


def test_a_late_reply_never_shortens_the_session_guarantee() -> None:
    """A reply to an earlier request, arriving after a later one, keeps the later (longer)
    guarantee: a guarantee once given holds."""
    session = FakeSession()
    session._note_reply(200.0, result(True))  # valid_until 40 at uptime 10: until 230
    session._note_reply(100.0, result(True))  # an earlier request answered late: 130
    assert session._guaranteed_until("ns") == 230.0
