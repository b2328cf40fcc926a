"""The per-connection half of the socket-free core: request kinds, the table of requests in
flight, decoding replies into resolutions, batches.

Split from ``_core.py``, which keeps the per-client half (request ids, building frames,
sessions, counters) and says why the core has no sockets: this module changes with the reply
side of the protocol (a new reply body, a retry rule, how a batch settles), ``_core`` with
the request side and the session model. ``Wire.feed`` is the reader's hot path; it moved here
as is (the same module globals, looked up the same way). ``Wire`` names ``ClientCore`` only in
annotations, so neither module imports the other at run time.

Theory of operation:
- :class:`Wire` (one per TCP connection) owns a ``protocol.Connection(Role.CLIENT)`` and the
  table of requests in flight: request id -> (kind, waiter). ``feed(bytes)`` decodes whatever
  is complete and returns the *resolutions* (waiter, value-or-exception) for the face to hand
  out, plus the ``LockLost`` events. A reply whose id is not in the table (its caller was
  cancelled or timed out) is dropped: that is what keeps a connection in sync after a caller
  gives up. ``fail_all`` resolves everything in flight when the connection dies: idempotent
  requests (ping, statistics, a keepalive Execute with no statements, ending a session) get
  :data:`RETRY`, the rest :class:`ConnectionLost` (their outcome is unknown; an Execute with
  statements is never retried silently).
- The end of a connection can be announced in the stream: a connection-level error reply (no
  request id) whose code closes the connection, or bytes that do not decode. ``feed`` then
  still returns everything it resolved before, and sets ``closing``: the face breaks the
  connection at once (``fail_all``), so no request is risked on a connection the server no
  longer reads. ``SHUTTING_DOWN`` is the one such error that says what happened to the rest:
  the server answers every request it read before it stopped reading, so a request still
  unanswered was **not executed** (a :class:`ServerError` with that code, not "outcome
  unknown").
- Replies may arrive in any order (the server parks waiting transactions): matching is by id
  only, never by position.
- A batch (``execute_many``) is one :class:`Batch` waiter for all its calls: each call keeps
  its own request id and table entry (kind ``BATCH``), the batch collects the outcomes (a
  Result, or the call's exception) and resolves **once**, when its last call is settled, with
  the list in call order. One wake-up per batch, not one task or one reschedule per call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from protocol import (
    Cancelled,
    ErrorCode,
    ErrorReply,
    FeedEvent,
    HoldersPage,
    LockLost,
    Pong,
    ProtocolError,
    Released,
    Reply,
    SessionEnded,
    SessionsPage,
    Statistics,
    Subscribed,
    TransactionResult,
    Unsubscribed,
    WaitersPage,
    Welcome,
)
from protocol import Connection as _ProtocolConnection
from protocol import Role as _Role
from protocol import State as _State

from ._errors import BatchError, ConnectionLost, LockClientError, ServerError, server_error
from ._result import Result

if TYPE_CHECKING:
    from ._core import ClientCore

__all__ = [
    "HELLO",
    "EXECUTE",
    "KEEPALIVE",
    "END",
    "STATS",
    "PING",
    "CANCEL",
    "BATCH",
    "HOLDERS",
    "SESSIONS",
    "WAITERS",
    "RELEASE",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "RETRY",
    "Batch",
    "Wire",
    "batch_results",
]

# Request kinds: how to read the reply body, and whether a lost connection may retry it.
HELLO = 0
EXECUTE = 1
KEEPALIVE = 2  # an Execute with no statements: only touches the session (idempotent)
END = 3
STATS = 4
PING = 5
CANCEL = 6
BATCH = 7  # an Execute of an execute_many batch: its table entry's waiter is the Batch
# The operator's requests (client/_inspect.py builds them).
HOLDERS = 8
SESSIONS = 9
WAITERS = 10
RELEASE = 11
SUBSCRIBE = 12
UNSUBSCRIBE = 13

_KIND_NAMES = (
    "hello",
    "execute",
    "keepalive",
    "end_session",
    "statistics",
    "ping",
    "cancel",
    "execute",
    "holders",
    "sessions",
    "waiters",
    "release",
    "subscribe",
    "unsubscribe",
)
_EXPECTED_BODY: tuple[type, ...] = (
    Welcome,
    TransactionResult,
    TransactionResult,
    SessionEnded,
    Statistics,
    Pong,
    Cancelled,
    TransactionResult,
    HoldersPage,
    SessionsPage,
    WaitersPage,
    Released,
    Subscribed,
    Unsubscribed,
)
# Requests that may be re-sent on a new connection when the old one dropped with them in flight:
# they change nothing (ping, statistics, listings, a keepalive only touches the session) or end
# in the same state when repeated (ending a session; the retry may then answer False, see
# Session.end). A force-release is not: it may have removed a later holder's entry.
#: Change-feed events a connection keeps until the application takes them (``feed_events()``);
#: past it they are dropped and counted (``local_statistics().feed_dropped``), never held
#: without bound.
FEED_BUFFER = 10_000

_RETRIABLE = frozenset({KEEPALIVE, END, STATS, PING, HOLDERS, SESSIONS, WAITERS})


class _Retry:
    """The resolution of an idempotent request whose connection dropped: send it again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RETRY"


RETRY: Any = _Retry()

W = TypeVar("W")


def _same(body: Any) -> Any:
    return body


# kind -> the client value of a reply body of the expected type.
_CONVERT: tuple[Callable[[Any], Any], ...] = (
    _same,  # Welcome
    Result,
    Result,
    lambda body: body.existed,
    lambda body: dict(body.values),
    _same,  # Pong
    lambda body: body.found,
    Result,
    _same,  # HoldersPage
    _same,  # SessionsPage
    _same,  # WaitersPage
    _same,  # Released
    lambda body: body.subscription,
    lambda body: body.found,
)


class Batch(Generic[W]):
    """The one waiter of an ``execute_many`` batch: every call's table entry points here.

    ``settle`` records a call's outcome (a Result or the call's exception); the last one
    appends the batch's resolution ``(waiter, outcomes in call order, None)``. A per-request
    internal on the hot path, hence a slotted plain class (STYLE.md 7).
    """

    __slots__ = ("outcomes", "remaining", "rids", "waiter")

    def __init__(self, rids: list[int], waiter: W) -> None:
        self.rids = rids  # call order
        self.waiter = waiter
        self.outcomes: dict[int, Any] = {}  # request id -> Result | LockClientError
        self.remaining = len(rids)

    def settle(
        self, rid: int, outcome: Any, resolved: list[tuple[W, Any, BaseException | None]]
    ) -> None:
        outcomes = self.outcomes
        outcomes[rid] = outcome
        self.remaining -= 1
        if not self.remaining:
            resolved.append((self.waiter, [outcomes[r] for r in self.rids], None))


class Wire(Generic[W]):
    """One connection's protocol state and its table of requests in flight.

    Not thread-safe by itself: the sync face calls it under its condition's lock, the async
    face from its event loop's thread.
    """

    __slots__ = ("_broken", "_proto", "closing_error", "core", "feed_events", "pending")

    def __init__(self, core: ClientCore) -> None:
        self.core = core
        self._proto = _ProtocolConnection(_Role.CLIENT)
        # request id -> (kind, waiter); the waiter of a BATCH entry is its Batch[W].
        # Dict order = send order.
        self.pending: dict[int, tuple[int, Any]] = {}
        # A connection-level error reply (no request id) or a fatal decoding error: the reason
        # to quote when the connection then drops.
        self.closing_error: LockClientError | None = None
        # True once received bytes did not decode: the stream cannot be trusted any more.
        self._broken = False
        # Change-feed events received (subscriptions, client/_inspect.py), in arrival order,
        # for the face to take (``take_feed``); kept apart so ``feed``'s results stay as they
        # were.
        self.feed_events: list[FeedEvent] = []

    @property
    def closing(self) -> bool:
        """The connection is at its end and the face must break it now: the server sent a
        closing error (the protocol's lifecycle is CLOSED: it reads nothing more), or
        received bytes did not decode."""
        return self._broken or self._proto.state is _State.CLOSED

    def register(self, rid: int, kind: int, waiter: W) -> None:
        """Record a request about to be sent (before its bytes go out)."""
        self.pending[rid] = (kind, waiter)
        self.core.requests_sent += 1

    def register_batch(self, batch: Batch[W]) -> None:
        """Record the calls of a batch about to be sent (before its bytes go out)."""
        pending = self.pending
        entry = (BATCH, batch)
        for rid in batch.rids:
            pending[rid] = entry
        self.core.requests_sent += len(batch.rids)

    def abandon(self, rid: int) -> bool:
        """Forget a request whose caller gave up; its reply, if any, will be dropped.
        True when it was still in flight."""
        return self.pending.pop(rid, None) is not None

    def abandon_batch(self, batch: Batch[W]) -> bool:
        """Forget every call of a batch whose caller gave up (late replies are dropped).
        True when some were still in flight."""
        pending = self.pending
        found = False
        for rid in batch.rids:
            if pending.pop(rid, None) is not None:
                found = True
        return found

    def feed(self, data: bytes) -> tuple[list[tuple[W, Any, BaseException | None]], list[LockLost]]:
        """Decode received bytes. Returns the resolved requests as (waiter, value, error) with
        exactly one of value/error meaningful, and the LockLost events, in arrival order.

        When the stream announces the connection's end (a closing connection-level error) or
        cannot be trusted any more (a framing or decoding error), what was resolved before is
        still returned and ``closing`` is set: the caller must then break the connection
        (``fail_all``) before sending anything more on it.
        """
        proto = self._proto
        pending = self.pending
        resolved: list[tuple[W, Any, BaseException | None]] = []
        events: list[LockLost] = []
        try:
            proto.receive_data(data)
            while True:
                msg = proto.next_message()
                if msg is None:
                    break
                t = type(msg)
                if t is Reply:
                    rid = msg.request_id  # type: ignore[union-attr]
                    entry = pending.pop(rid, None)  # type: ignore[arg-type]
                    if entry is None:
                        self.core.replies_dropped += 1
                        continue
                    kind, waiter = entry
                    body = msg.body  # type: ignore[union-attr]
                    if type(body) is not _EXPECTED_BODY[kind]:
                        error = LockClientError(
                            f"server answered a {_KIND_NAMES[kind]} request with "
                            f"{type(body).__name__}"
                        )
                        if kind == BATCH:
                            waiter.settle(rid, error, resolved)
                        else:
                            resolved.append((waiter, None, error))
                    elif kind == BATCH:
                        waiter.settle(rid, Result(body), resolved)  # type: ignore[arg-type]
                    else:
                        resolved.append((waiter, _CONVERT[kind](body), None))
                elif t is LockLost:
                    events.append(msg)  # type: ignore[arg-type]
                elif t is FeedEvent:
                    sink = self.core.feed_sinks.get(msg.subscription)  # type: ignore[union-attr]
                    if sink is not None:
                        sink.put(msg)  # type: ignore[arg-type]
                    elif len(self.feed_events) < FEED_BUFFER:
                        self.feed_events.append(msg)  # type: ignore[arg-type]
                    else:  # nobody takes them: keep the oldest, count the rest
                        self.core.feed_dropped += 1
                else:
                    self._error_reply(msg, resolved)  # type: ignore[arg-type]
        except ProtocolError as exc:
            error = ConnectionLost(f"the server sent an invalid message: {exc}")
            error.__cause__ = exc
            self.closing_error = error
            self._broken = True
        self.core.events += len(events)
        return resolved, events

    def take_feed(self) -> list[FeedEvent]:
        """The change-feed events received since the last call, in arrival order."""
        events, self.feed_events = self.feed_events, []
        return events

    def _error_reply(
        self, msg: ErrorReply, resolved: list[tuple[W, Any, BaseException | None]]
    ) -> None:
        exc = server_error(msg)
        rid = msg.request_id
        entry = None if rid is None else self.pending.pop(rid, None)
        if entry is not None:
            if entry[0] == BATCH:
                entry[1].settle(rid, exc, resolved)
            else:
                resolved.append((entry[1], None, exc))
        elif msg.request_id is None:
            # About the connection as a whole (e.g. SHUTTING_DOWN): remember why for whatever
            # is in flight (a closing code has moved the lifecycle to CLOSED: ``closing``).
            self.closing_error = exc
        else:
            self.core.replies_dropped += 1

    def fail_all(self, reason: str) -> list[tuple[W, Any, BaseException | None]]:
        """Resolve everything in flight because the connection is gone: RETRY for idempotent
        requests; for the others ServerError(SHUTTING_DOWN) "not executed" when the server
        announced its shutdown, else ConnectionLost (outcome unknown)."""
        out: list[tuple[W, Any, BaseException | None]] = []
        for sink in list(self.core.feed_sinks.values()):
            sink.connection_lost()
        closing_error = self.closing_error
        shutdown = (
            closing_error
            if isinstance(closing_error, ServerError)
            and closing_error.code is ErrorCode.SHUTTING_DOWN
            else None
        )
        why = reason if closing_error is None else f"{reason} ({closing_error})"
        for rid, (kind, waiter) in self.pending.items():
            if kind in _RETRIABLE:
                out.append((waiter, RETRY, None))
                continue
            exc: LockClientError
            if shutdown is not None:
                exc = ServerError(
                    ErrorCode.SHUTTING_DOWN,
                    f"{_KIND_NAMES[kind]} request {rid} was not executed: the server is "
                    "shutting down (it answered every request it had read before it stopped "
                    f"reading; this one came later): {shutdown.message}",
                    rid,
                )
            else:
                exc = ConnectionLost(
                    f"connection lost with {_KIND_NAMES[kind]} request {rid} in flight: {why}; "
                    "its outcome is unknown (the server may or may not have executed it)"
                )
            if closing_error is not None:
                exc.__cause__ = closing_error
            if kind == BATCH:
                waiter.settle(rid, exc, out)
            else:
                out.append((waiter, None, exc))
        self.pending.clear()
        return out


def batch_results(outcomes: list[Any]) -> list[Result]:
    """The Results of a resolved batch, or BatchError when some call failed."""
    for outcome in outcomes:
        if type(outcome) is not Result:
            error = BatchError(outcomes)
            raise error from error.failures[0][1]
    return outcomes
