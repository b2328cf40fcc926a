"""The countdown latch: wait until N count-downs have been made; written once for both faces.

Why: a latch counts *events*, which must outlive the party that made them: a worker counts
down and exits, and the latch must still open when the last worker is done. Every entry of
the server belongs to a session and goes with it, so a count-down written in the worker's own
session would be taken back when the worker's session ends. The count therefore lives in a
session of **the latch itself**: its id is derived from the namespace and the name
(``recipes.latch:<digest>``), every party's client uses it for the count-downs, and it lives
as long as the latch is used: each count-down and each wait keeps it alive (a waiter touches
it once per server-side wait, at most every ``max_age / 2``), and it expires ``max_age``
(default: the server's largest session max age, 3600 s by default) after the last use, which
resets the latch.

The count is one entry (table ``recipes.latch``, variable = the latch's name) whose value is
how many count-downs were made, at most ``count`` (a count-down at zero has no effect, as in
Java). A count-down is a compare-and-set in one transaction: "if the value is still k, make it
k+1", answered with the value now; a party that lost a race retries with the value it was
told, so every count-down counts once and nobody waits for anybody. ``wait`` is one
transaction parked on the server until the value is ``count``: it opens for every waiter in
the same step as the last count-down, and stays open (a late waiter passes at once).

Dead parties: a count-down belongs to the latch, not to the party, so a party that counts
down and then dies (or simply ends its session) still counted. A party that dies **before**
counting down is one the latch never hears from: no latch can tell a slow party from a dead
one without knowing its parties (etcd, ZooKeeper, Redisson and Hazelcast latches do not), so a
waiter bounds its wait (``wait(timeout=)``) or watches its workers (a
:class:`~client.recipes.Group`: a member whose session dies leaves, and the watchers hear it).
Every party must pass the same ``count``.
"""

from __future__ import annotations

import hashlib
from typing import Any, Generic, cast

from client._errors import ClientTimeout
from client._result import Result
from client._session_state import SessionState
from protocol import (
    AnywayContinueAfter,
    Assert,
    Block,
    Cause,
    DeleteVar,
    Exists,
    If,
    Not,
    Operator,
    SelectConstantValue,
    SelectVarValue,
    SetVar,
    Statement,
)

from ._base import S, check_name, max_wait_of, seconds
from ._kinds import UNLIMITED
from ._ops import NOW, WELCOME, Op, RunTx

__all__ = [
    "LATCH_TABLE",
    "MAX_RACES",
    "LatchCore",
    "count_down",
    "latch_count",
    "latch_session_id",
    "latch_wait",
]

LATCH_TABLE = "recipes.latch"
#: Count-downs one call may lose to others before it gives up (ClientTimeout): each race
#: lost is a count-down someone else made, so this bounds nothing a healthy latch reaches.
MAX_RACES = 10_000
#: The latch session's max age when the server's Welcome does not say its largest.
DEFAULT_LATCH_AGE = 3600.0


def latch_session_id(namespace: str, name: str) -> str:
    """The id of the session that holds a latch's count (the same for every party)."""
    digest = hashlib.sha256(f"{namespace}\0{name}".encode()).hexdigest()[:32]
    return f"recipes.latch:{digest}"


class LatchCore(Generic[S]):
    """A countdown latch of ``count``: the state both faces share. The face supplies the
    latch's own session (``_latch_session``)."""

    KIND = "latch"

    def __init__(
        self,
        session: S,
        namespace: str,
        name: str,
        *,
        count: int,
        max_age: float | None = None,
        description: str = "",
    ) -> None:
        if not isinstance(session, SessionState):
            raise TypeError(f"session must be a client session, got {type(session).__name__}")
        if type(count) is not int or not 1 <= count < UNLIMITED:
            raise ValueError(f"count must be an integer >= 1, got {count!r}")
        if type(description) is not str:
            raise TypeError(f"description must be a str, got {type(description).__name__}")
        self._session = session
        self.namespace = check_name("namespace", namespace)
        self.name = check_name("name", name)
        self.total = count
        self.max_age = None if max_age is None else seconds("max_age", max_age, positive=True)
        self.description = description
        self._known = 0  # count-downs made, as last seen (a guess for the next one)
        self._own: Any = None  # the latch's session object, made at first use

    @property
    def session(self) -> S:
        """The caller's session (waits run in it)."""
        return self._session

    @property
    def session_id(self) -> str:
        """The id of the latch's own session, which holds the count."""
        return latch_session_id(self.namespace, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.namespace}/{self.name} of {self.total}>"

    def _latch_age(self, limits: Any) -> float:
        if self.max_age is not None:
            return self.max_age
        value = limits.get("max_session_age") if hasattr(limits, "get") else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        return DEFAULT_LATCH_AGE

    def _latch_session(self, max_age: float) -> Any:
        """The latch's own session (no keepalive: the count-downs expire with it), opened on
        the client of the party's session (either face's ``session()``: no I/O)."""
        client: Any = cast(Any, self._session).client
        return client.session(
            max_age=max_age, description=self._what, session_id=self.session_id, keepalive=False
        )

    def _count_down_statements(self, made: int) -> list[Statement]:
        name = self.name
        unchanged: Operator = (
            Not(Exists(LATCH_TABLE, name, ignore_this_session=False))
            if made == 0
            else Exists(LATCH_TABLE, name, made, ignore_this_session=False)
        )
        return [
            If(
                unchanged,
                Block(
                    AnywayContinueAfter(DeleteVar(LATCH_TABLE, name)),
                    Assert(SetVar(LATCH_TABLE, name, made + 1, description=self._what)),
                    SelectConstantValue("done", made + 1),
                ),
            ),
            SelectVarValue("now", LATCH_TABLE, name, ignore_this_session=False),
        ]

    @property
    def _what(self) -> str:
        return self.description or f"latch {self.name} of {self.total}"

    def _open_statements(self) -> list[Statement]:
        return [Assert(Exists(LATCH_TABLE, self.name, self.total, ignore_this_session=False))]

    def _read_statements(self) -> list[Statement]:
        return [SelectVarValue("now", LATCH_TABLE, self.name, ignore_this_session=False)]


def _made(result: Result) -> int:
    """Count-downs made, from a reply's ``now`` record (0 when there is none)."""
    record = result.get("now")
    value = record.get("value") if isinstance(record, dict) else None
    return value if type(value) is int and value >= 0 else 0


def _own_session(latch: LatchCore[Any]) -> Op[Any]:
    if latch._own is None:
        welcome = yield WELCOME
        latch._own = latch._latch_session(latch._latch_age(welcome.limits))
    return latch._own


def count_down(latch: LatchCore[Any]) -> Op[int]:
    """Count down once; the count left after it (0: open; a count-down of
    an open latch changes nothing)."""
    own = yield from _own_session(latch)
    made = latch._known
    for _ in range(MAX_RACES):
        if made >= latch.total:
            latch._known = made
            return 0
        result: Result = yield RunTx(latch._count_down_statements(made), session=own)
        done = result.get("done")
        if type(done) is int:
            latch._known = done
            return latch.total - done
        made = _made(result)  # someone else counted down first: try again from there
    raise ClientTimeout(f"{latch!r}: {MAX_RACES} count-downs in a row lost their race")


def latch_count(latch: LatchCore[Any]) -> Op[int]:
    """The count-downs still missing (0: open); one read."""
    result: Result = yield RunTx(latch._read_statements())
    latch._known = min(_made(result), latch.total)
    return latch.total - latch._known


def latch_wait(latch: LatchCore[Any], timeout: float | None = None) -> Op[bool]:
    """Wait until the latch is open: True (at once when it is); False when ``timeout`` ran
    out first. Waits on the server, touching the latch's session before each
    server-side wait so that it outlives the wait."""
    if timeout is not None:
        timeout = seconds("timeout", timeout)
    statements = latch._open_statements()
    result: Result = yield RunTx(statements)
    if result.ok:
        return True
    welcome = yield WELCOME
    max_wait = max_wait_of(welcome.limits)
    own = yield from _own_session(latch)
    age = latch._latch_age(welcome.limits)
    start = yield NOW
    deadline = None if timeout is None else start + timeout
    while result.cause is Cause.STATEMENT:
        now = yield NOW
        if deadline is not None and now >= deadline:
            return False
        yield RunTx([], session=own)  # keep the count alive while we wait for it
        wait = min(max_wait, age / 2)
        if deadline is not None:
            wait = min(wait, deadline - now)
        result = yield RunTx(statements, wait=wait)
        if result.ok:
            return True
    return False
