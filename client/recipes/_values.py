"""The recipes' values and checks: their errors, argument checks, constants and the plan of
one acquire; no state, no I/O (``_base``'s :class:`~._base.RecipeCore` and the kinds use them,
``_base`` re-exports them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from client._errors import LockClientError
from client._inspect import describe_holders
from client._result import Result
from client._session_state import CANCELLED_TABLE, SessionState
from protocol import Assert, Exists, LockLost, Not, Statement

__all__ = [
    "CANCELLED_TABLE",
    "CLEANUP_TIMEOUT",
    "DEFAULT_MAX_WAIT",
    "MAX_LATE_GRANTS",
    "TOMBSTONE_LINGER",
    "AcquirePlan",
    "LockLostError",
    "NotAcquired",
    "OnLost",
    "S",
    "UnknownStamp",
    "check_name",
    "local_deadline",
    "max_wait_of",
    "not_cancelled",
    "tombstone_ttl",
    "same_value",
    "seconds",
]

#: The wait asked of a server whose Welcome does not say its ``max_wait``.
DEFAULT_MAX_WAIT = 300.0
#: Bound on the shielded cleanup after a cancelled or failed acquire, and on releases at exit.
CLEANUP_TIMEOUT = 10.0
#: How long a cancel's tombstone outlives the longest wait an attempt may park for: longer
#: than an attempt can still be applied after the cancel (its bytes on a connection the client
#: gave up on, which the kernel retransmits for ~15 minutes by default; a replicated group's
#: puts, retried for seconds). Then the tombstone expires by itself, so a long-lived session
#: whose acquires are often cancelled does not gather them (docs/recipes.md, "Unknown
#: outcomes"). ``CANCELLED_TABLE`` is the tombstones' table: variable = the call's cancel key,
#: owned by the session that gave up.
TOMBSTONE_LINGER = 3600.0
#: Grants in one acquire that may arrive after their session's guarantee ran out (each is
#: removed and asked again) before the acquire fails with ClientTimeout.
MAX_LATE_GRANTS = 3

OnLost = Callable[[LockLost], object]
S = TypeVar("S", bound=SessionState)


class LockLostError(LockClientError):
    """The lock was lost while held: its session expired or was ended, its entry's time to
    live ran out, or the server restarted. ``event`` is the ``LockLost`` notice (the server's,
    or the one the client made at a reconnect: reason ``RESTARTED`` or ``EXPIRED`` with no
    entries; None when the loss was found by a call rather than announced). Named
    ``LockLostError`` because ``client.LockLost`` is the event itself."""

    def __init__(self, lock: object, event: LockLost | None) -> None:
        why = "no longer held on the server" if event is None else f"lost ({event.reason.value})"
        super().__init__(f"{lock!r} was {why}")
        self.lock = lock
        self.event = event


class NotAcquired(LockClientError):
    """``with lock:`` / ``async with lock:`` could not acquire the lock (e.g. the server
    refused the reliability contract). ``result`` is the last reply, for its ``cause``."""

    def __init__(self, lock: object, result: Result | None) -> None:
        detail = "" if result is None else f": {result!r}"
        if result is not None and result.holders:
            detail += f" ({describe_holders(result.holders)})"
        super().__init__(f"{lock!r} was not acquired{detail}")
        self.lock = lock
        self.result = result


class UnknownStamp(LockClientError):
    """``release_locks(stamp)`` with a stamp that this MultiLock did not hand out (or has
    already released)."""


def check_name(what: str, value: object) -> str:
    """A non-blank str, else TypeError/ValueError naming ``what``."""
    if type(value) is not str:
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"{what} must not be blank")
    return value


def seconds(what: str, value: object, *, positive: bool = False) -> float:
    """A finite number of seconds (>= 0, or > 0 when ``positive``), else ValueError."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{what} must be a finite number of seconds {bound}, got {value!r}")
    return float(value)


class AcquirePlan:
    """One ``acquire`` call: its statements and how long it may keep asking the server.

    ``key`` is the call's cancel key (a fresh uuid4 hex, unlike the ticket, which a caller
    may fix): the last of ``statements`` asserts that no tombstone of it exists, so an
    attempt that is applied after the call was cancelled changes nothing."""

    __slots__ = ("blocking", "deadline", "key", "late", "statements", "ticket", "tombstone_ttl")

    def __init__(
        self,
        ticket: str,
        statements: list[Statement],
        blocking: bool,
        deadline: float | None,
        key: str,
    ) -> None:
        self.ticket = ticket
        self.statements = statements
        self.key = key
        self.blocking = blocking
        self.deadline = deadline  # local time; None: until granted
        self.late = 0  # grants that arrived after their own guarantee had run out
        self.tombstone_ttl: float | None = None  # the cancel's (``tombstone_ttl``), once known

    def cancelled(self, result: Result) -> bool:
        """True when ``result`` failed at the last statement: this call's tombstone exists
        (its cancel was applied first); asking again can never succeed."""
        return result.failed_statement == f"{len(self.statements) - 1}:/AssertOp/"

    def wait(self, now: float, max_wait: float) -> float | None:
        """The ``wait`` of the next attempt (None: answer at once)."""
        if not self.blocking:
            return None
        if self.deadline is None:
            return max_wait
        return min(max_wait, max(0.0, self.deadline - now))


def same_value(a: Any, b: Any) -> bool:
    """Wire-value equality, as the server compares values: types must match (1, 1.0 and
    True are different values)."""
    if type(a) is not type(b):
        return False
    if type(a) is list or type(a) is tuple:
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same_value(v, b[k]) for k, v in a.items())
    return bool(a == b)


def max_wait_of(limits: Mapping[str, Any]) -> float:
    """The longest ``wait`` the server accepts, from its Welcome limits."""
    value = limits.get("max_wait")
    try:
        return seconds("max_wait", value, positive=True)
    except ValueError:
        return DEFAULT_MAX_WAIT


def tombstone_ttl(limits: Mapping[str, Any]) -> float | None:
    """The TTL of a cancel's tombstone on a server with these Welcome limits:
    :data:`TOMBSTONE_LINGER` past its ``max_wait``. None (the tombstone then lives as long as
    its session) when the server's ``max_ttl`` is lower, or not said: a SetVar whose ttl is
    over it would refuse the whole cancel."""
    ttl = TOMBSTONE_LINGER + max_wait_of(limits)
    try:
        max_ttl = seconds("max_ttl", limits.get("max_ttl"), positive=True)
    except ValueError:
        return None
    return ttl if ttl <= max_ttl else None


def not_cancelled(key: str) -> Statement:
    """The last statement of every acquire: no tombstone of its cancel key exists (in any
    session: the key is unique, and only the cancelling session writes it)."""
    return Assert(Not(Exists(CANCELLED_TABLE, key, ignore_this_session=False)))


def local_deadline(result: Result, sent_at: float, until: float | None) -> float | None:
    """Local time before which ``until`` (a server uptime) cannot have passed: the reply was
    produced after the request was sent, so ``sent_at + (until - uptime)`` is early."""
    if until is None:
        return None
    return sent_at + (until - result.server_uptime)
