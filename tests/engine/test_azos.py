"""The Azos Sky seed example (SEMANTICS.md "Seed example"): MDS entry, review, month-end and
review unlock in namespace "Clinical", played by several sessions with explicit times."""

from __future__ import annotations

from lockserver.engine import Engine
from protocol import (
    AnywayContinueAfter,
    Assert,
    Cause,
    DeleteVar,
    Exists,
    Not,
    SessionSpec,
    SetVar,
    Status,
    Transaction,
    TransactionResult,
)

from ._helpers import START, holders, make_engine

FACILITY = "CGROVE-35"
PATIENT = "R-45899"
OTHER_PATIENT = "R-10001"


def mds_enter(facility: str = FACILITY, patient: str = PATIENT) -> Transaction:
    """The seed's mdsEnter transaction."""
    return Transaction(
        "Clinical",
        [
            Assert(Not(Exists("Month-End", facility))),
            Assert(Not(Exists("MDS-Review", facility, patient))),
            Assert(SetVar("MDS-Entry", facility, patient, allow_duplicates=True)),
        ],
        description="MDS Entry for Zak Pak@'Cherry Grove'",
        min_uptime=0,
        min_trust=0.5,
    )


def mds_review(facility: str = FACILITY, patient: str = PATIENT) -> Transaction:
    """The seed's mdsReview transaction."""
    return Transaction(
        "Clinical",
        [
            Assert(Not(Exists("Month-End", facility))),
            Assert(Not(Exists("MDS-Entry", facility, patient))),
            Assert(SetVar("MDS-Review", facility, patient, allow_duplicates=False)),
        ],
        description="MDS Review for Zak Pak@'Cherry Grove'",
        min_uptime=0,
        min_trust=0.5,
    )


def mds_review_unlock(facility: str = FACILITY, patient: str = PATIENT) -> Transaction:
    """The seed's mdsReviewUnlock transaction."""
    return Transaction(
        "Clinical",
        [AnywayContinueAfter(DeleteVar("MDS-Review", facility, patient))],
        description="MDS Review for Zak Pak@'Cherry Grove' is done",
        min_uptime=0,
        min_trust=0.5,
    )


def mds_entry_done(facility: str = FACILITY, patient: str = PATIENT) -> Transaction:
    """A user's MDS entry is finished: drop that user's own entry."""
    return Transaction("Clinical", [AnywayContinueAfter(DeleteVar("MDS-Entry", facility, patient))])


def month_end(facility: str = FACILITY) -> Transaction:
    """The financial month-end procedure takes the facility (exclusively)."""
    return Transaction("Clinical", [Assert(SetVar("Month-End", facility, "closing"))])


def month_end_done(facility: str = FACILITY) -> Transaction:
    """The month-end procedure is over."""
    return Transaction("Clinical", [AnywayContinueAfter(DeleteVar("Month-End", facility))])


USER = {name: SessionSpec(name, description=f"{name}@Cherry Grove") for name in "1234"}


def ex(engine: Engine, user: str, tx: Transaction, now: float = START + 1) -> TransactionResult:
    """Run ``tx`` as user ``user`` with a healthy server (trust 0.8 >= the seed's 0.5)."""
    return engine.execute(USER[user], tx, now=now, trust=0.8)


def assert_ok(result: TransactionResult) -> None:
    assert result.status is Status.TRANSACTION_OK, result
    assert result.cause is Cause.UNSPECIFIED
    assert result.failed_statement is None


def assert_fails_at(result: TransactionResult, path: str) -> None:
    assert result.status is Status.TRANSACTION_ERROR, result
    assert result.cause is Cause.STATEMENT
    assert result.failed_statement == path


def test_seed_story_two_entries_then_review_fails_at_second_assert() -> None:
    """The seed's unit test: user1 and user2 enter (OK, OK); user3's review fails with
    TransactionError and failed statement "1:/AssertOp/" because someone is entering."""
    engine = make_engine()
    assert_ok(ex(engine, "1", mds_enter()))
    assert_ok(ex(engine, "2", mds_enter()))
    result = ex(engine, "3", mds_review())
    assert result.status == 1  # TransactionError on the wire
    assert_fails_at(result, "1:/AssertOp/")
    assert holders(engine, "MDS-Entry", FACILITY) == [("1", PATIENT), ("2", PATIENT)]
    assert holders(engine, "MDS-Review", FACILITY) == []


def test_review_succeeds_once_both_entries_are_deleted() -> None:
    """After user1 and user2 each delete their own entry the review of the patient succeeds;
    deleting only one of them is not enough."""
    engine = make_engine()
    ex(engine, "1", mds_enter())
    ex(engine, "2", mds_enter())
    assert_ok(ex(engine, "1", mds_entry_done()))
    assert_fails_at(ex(engine, "3", mds_review()), "1:/AssertOp/")
    assert_ok(ex(engine, "2", mds_entry_done()))
    assert holders(engine, "MDS-Entry", FACILITY) == []
    assert_ok(ex(engine, "3", mds_review()))
    assert holders(engine, "MDS-Review", FACILITY) == [("3", PATIENT)]


def test_entry_is_refused_while_the_patient_is_under_review() -> None:
    """Entry and review are mutually exclusive: with a review of the patient held, an entry
    for that patient fails at its second assert and stores nothing."""
    engine = make_engine()
    assert_ok(ex(engine, "3", mds_review()))
    assert_fails_at(ex(engine, "1", mds_enter()), "1:/AssertOp/")
    assert holders(engine, "MDS-Entry", FACILITY) == []


def test_only_one_review_at_a_time_for_the_facility_variable() -> None:
    """The review SetVar is exclusive: a second reviewer (and the reviewer itself, whose own
    entry also blocks) fails at the third assert, "2:/AssertOp/"."""
    engine = make_engine()
    assert_ok(ex(engine, "3", mds_review()))
    assert_fails_at(ex(engine, "4", mds_review()), "2:/AssertOp/")
    assert_fails_at(ex(engine, "3", mds_review()), "2:/AssertOp/")
    assert holders(engine, "MDS-Review", FACILITY) == [("3", PATIENT)]


def test_exists_with_a_value_scopes_the_conflict_to_the_patient() -> None:
    """Exists with a value makes "review of THIS patient" precise: entries for another patient
    do not block a review, and a review of another patient does not block an entry."""
    engine = make_engine()
    assert_ok(ex(engine, "1", mds_enter(patient=OTHER_PATIENT)))
    assert_ok(ex(engine, "3", mds_review(patient=PATIENT)))
    assert_ok(ex(engine, "2", mds_enter(patient=OTHER_PATIENT)))
    assert holders(engine, "MDS-Entry", FACILITY) == [("1", OTHER_PATIENT), ("2", OTHER_PATIENT)]
    assert_fails_at(ex(engine, "4", mds_enter(patient=PATIENT)), "1:/AssertOp/")


def test_month_end_blocks_every_mds_activity_of_the_facility() -> None:
    """While month-end holds the facility, entries and reviews of any patient fail at the
    first assert, "0:/AssertOp/"; another facility is unaffected; after month-end is done
    the activity proceeds."""
    engine = make_engine()
    assert_ok(ex(engine, "4", month_end()))
    assert_fails_at(ex(engine, "1", mds_enter()), "0:/AssertOp/")
    assert_fails_at(ex(engine, "2", mds_enter(patient=OTHER_PATIENT)), "0:/AssertOp/")
    assert_fails_at(ex(engine, "3", mds_review()), "0:/AssertOp/")
    assert_ok(ex(engine, "1", mds_enter(facility="OAKS-7")))
    assert_ok(ex(engine, "4", month_end_done()))
    assert_ok(ex(engine, "1", mds_enter()))
    assert holders(engine, "MDS-Entry", FACILITY) == [("1", PATIENT)]


def test_month_end_holder_is_not_blocked_by_its_own_entry() -> None:
    """Exists ignores the caller's own entries by default, so the session that runs month-end
    could itself still enter MDS data (a consequence of the seed's defaults, kept as is)."""
    engine = make_engine()
    assert_ok(ex(engine, "4", month_end()))
    assert_ok(ex(engine, "4", mds_enter()))


def test_month_end_waits_for_nothing_but_itself() -> None:
    """Month-end is an exclusive SetVar on its own table: it does not look at MDS entries, and a
    second month-end for the same facility fails at "0:/AssertOp/"."""
    engine = make_engine()
    assert_ok(ex(engine, "1", mds_enter()))
    assert_ok(ex(engine, "4", month_end()))
    assert_fails_at(ex(engine, "3", month_end()), "0:/AssertOp/")


def test_review_unlock_with_anyway_continue_after() -> None:
    """The unlock always succeeds (AnywayContinueAfter ignores the DeleteVar result) but only
    the reviewer's own unlock releases the review; after it, entries are possible again."""
    engine = make_engine()
    assert_ok(ex(engine, "3", mds_review()))
    assert_ok(ex(engine, "4", mds_review_unlock()))  # not the holder: OK, nothing removed
    assert holders(engine, "MDS-Review", FACILITY) == [("3", PATIENT)]
    assert_ok(ex(engine, "3", mds_review_unlock()))
    assert holders(engine, "MDS-Review", FACILITY) == []
    assert_ok(ex(engine, "3", mds_review_unlock()))  # again: still OK
    assert_ok(ex(engine, "1", mds_enter()))


def test_unlock_with_another_patient_value_keeps_the_review() -> None:
    """The unlock's DeleteVar carries the patient: unlocking a different patient does not
    release the review that is held."""
    engine = make_engine()
    assert_ok(ex(engine, "3", mds_review()))
    assert_ok(ex(engine, "3", mds_review_unlock(patient=OTHER_PATIENT)))
    assert holders(engine, "MDS-Review", FACILITY) == [("3", PATIENT)]


def test_ending_an_entering_session_releases_its_entry() -> None:
    """Each user is its own session; ending user1's session removes exactly user1's entry."""
    engine = make_engine()
    ex(engine, "1", mds_enter())
    ex(engine, "2", mds_enter())
    assert engine.end_session("1", now=START + 2)
    assert holders(engine, "MDS-Entry", FACILITY) == [("2", PATIENT)]
    assert engine.end_session("2", now=START + 3)
    assert_ok(ex(engine, "3", mds_review(), now=START + 4))


def test_seed_story_refused_by_an_untrusted_server() -> None:
    """The seed's transactions demand trust 0.5: a server at trust 0.4 refuses them for
    MinimumRequirements and nothing is stored."""
    engine = make_engine()
    result = engine.execute(USER["1"], mds_enter(), now=START + 1, trust=0.4)
    assert (result.status, result.cause) == (
        Status.TRANSACTION_ERROR,
        Cause.MINIMUM_REQUIREMENTS,
    )
    assert engine.namespaces == {}
    assert engine.sessions == {}


def test_result_carries_transaction_id_host_uptime_and_trust() -> None:
    """A result echoes the client's transaction id, the server host, its uptime and trust."""
    engine = make_engine()
    tx = Transaction("Clinical", mds_enter().statements, transaction_id="tx-42")
    result = engine.execute(USER["1"], tx, now=START + 7.5, trust=0.75)
    assert result.ok
    assert result.transaction_id == "tx-42"
    assert result.host == "test-host"
    assert result.uptime == 7.5
    assert result.trust == 0.75
    assert result.data == ()
