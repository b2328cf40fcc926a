"""The socket-free client core shared by the sync and the async face.

Why: both faces must agree exactly on request ids, reply matching, error mapping, retry rules
and event dispatch; putting that here, with no sockets, threads or trio, leaves each face with
nothing but its I/O and its way of waking a waiter (the contrast to avoid: redis-py's
near-duplicate sync and async lock files).

Theory of operation:
- :class:`ClientCore` (one per client, lives across reconnects) numbers requests from one
  counter, builds their framed bytes through ``protocol`` (validation happens there: bad
  arguments raise TypeError/ValueError before anything is sent), keeps the registry of open
  sessions and counts what happened.
- :class:`Wire` (one per TCP connection) owns a ``protocol.Connection(Role.CLIENT)`` and the
  table of requests in flight: request id -> (kind, waiter). ``feed(bytes)`` decodes whatever
  is complete and returns the *resolutions* (waiter, value-or-exception) for the face to hand
  out, plus the ``LockLost`` events. A reply whose id is not in the table (its caller was
  cancelled or timed out) is dropped: that is what keeps a connection in sync after a caller
  gives up. ``fail_all`` resolves everything in flight when the connection dies: idempotent
  requests (ping, statistics, a keepalive Execute with no statements, ending a session) get
  :data:`RETRY`, the rest :class:`ConnectionLost` (their outcome is unknown; an Execute with
  statements is never retried silently).
- Replies may arrive in any order (the server parks waiting transactions): matching is by id
  only, never by position.
- A batch (``execute_many``) is one :class:`Batch` waiter for all its calls: each call keeps
  its own request id and table entry (kind ``BATCH``), the batch collects the outcomes (a
  Result, or the call's exception) and resolves **once**, when its last call is settled, with
  the list in call order. One wake-up per batch, not one task or one reschedule per call.
- :class:`SessionState` is the face-independent half of a session: its
  :class:`~protocol.SessionSpec`, lost-event listeners and the namespace of its last call (the
  keepalive pings there).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import attrs

from protocol import (
    Cancel,
    Cancelled,
    EndSession,
    ErrorReply,
    Execute,
    GetStatistics,
    Hello,
    LockLost,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Request,
    SessionEnded,
    SessionSpec,
    Statement,
    Statistics,
    Transaction,
    TransactionResult,
    Welcome,
    encode_execute,
    frame,
    pack,
    request_to_wire,
)
from protocol import Connection as _ProtocolConnection
from protocol import Role as _Role

from ._errors import (
    BatchError,
    ClientClosed,
    ConnectionLost,
    LockClientError,
    ServerError,
    ServerUnavailable,
    server_error,
)
from ._result import Result

__all__ = [
    "HELLO",
    "EXECUTE",
    "KEEPALIVE",
    "END",
    "STATS",
    "PING",
    "CANCEL",
    "BATCH",
    "RETRY",
    "Batch",
    "BatchCall",
    "ClientCore",
    "ClientStatistics",
    "LostListener",
    "SessionState",
    "Wire",
    "batch_results",
]

log = logging.getLogger("client")

# Request kinds: how to read the reply body, and whether a lost connection may retry it.
HELLO = 0
EXECUTE = 1
KEEPALIVE = 2  # an Execute with no statements: only touches the session (idempotent)
END = 3
STATS = 4
PING = 5
CANCEL = 6
BATCH = 7  # an Execute of an execute_many batch: its table entry's waiter is the Batch

_KIND_NAMES = (
    "hello",
    "execute",
    "keepalive",
    "end_session",
    "statistics",
    "ping",
    "cancel",
    "execute",
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
)
# Requests that may be re-sent on a new connection when the old one dropped with them in flight:
# they change nothing (ping, statistics, a keepalive only touches the session) or end in the same
# state when repeated (ending a session; the retry may then answer False, see Session.end).
_RETRIABLE = frozenset({KEEPALIVE, END, STATS, PING})


class _Retry:
    """The resolution of an idempotent request whose connection dropped: send it again."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RETRY"


RETRY: Any = _Retry()

LostListener = Callable[[LockLost], object]

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
)

BatchCall = tuple[str, Iterable[Statement]] | tuple[str, Iterable[Statement], str | None]
"""One call of ``execute_many``: ``(namespace, statements)`` or ``(namespace, statements,
transaction_id)``."""


@attrs.frozen
class ClientStatistics:
    """Client-side counters (``client.local_statistics()``)."""

    requests_sent: int
    in_flight: int
    # Late replies to callers that were cancelled or timed out (and the replies to the session
    # touches sent right after a reconnect, which nobody waits for).
    replies_dropped: int
    retries: int  # idempotent requests re-sent after a reconnect
    connections: int  # connections opened (1 + reconnects)
    events: int  # LockLost events received
    events_unclaimed: int  # ... for sessions this client does not know
    open_sessions: int


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
    face from one trio thread.
    """

    __slots__ = ("_proto", "closing_error", "core", "pending")

    def __init__(self, core: ClientCore) -> None:
        self.core = core
        self._proto = _ProtocolConnection(_Role.CLIENT)
        # request id -> (kind, waiter); the waiter of a BATCH entry is its Batch[W].
        # Dict order = send order.
        self.pending: dict[int, tuple[int, Any]] = {}
        # A connection-level error reply (no request id) or a fatal decoding error: the reason
        # to quote when the connection then drops.
        self.closing_error: LockClientError | None = None

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

        Raises ConnectionLost when the stream cannot be trusted any more (a framing or
        decoding error): the caller must close the connection and ``fail_all``.
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
                else:
                    self._error_reply(msg, resolved)  # type: ignore[arg-type]
        except ProtocolError as exc:
            self.closing_error = ConnectionLost(f"the server sent an invalid message: {exc}")
            raise self.closing_error from exc
        self.core.events += len(events)
        return resolved, events

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
            # About the connection as a whole (e.g. SHUTTING_DOWN): the server
            # closes next; remember why for the ConnectionLost of whatever is in flight.
            self.closing_error = exc
        else:
            self.core.replies_dropped += 1

    def fail_all(self, reason: str) -> list[tuple[W, Any, BaseException | None]]:
        """Resolve everything in flight because the connection is gone: RETRY for idempotent
        requests, ConnectionLost (outcome unknown) for the others."""
        out: list[tuple[W, Any, BaseException | None]] = []
        why = reason if self.closing_error is None else f"{reason} ({self.closing_error})"
        for rid, (kind, waiter) in self.pending.items():
            if kind in _RETRIABLE:
                out.append((waiter, RETRY, None))
            else:
                exc = ConnectionLost(
                    f"connection lost with {_KIND_NAMES[kind]} request {rid} in flight: {why}; "
                    "its outcome is unknown (the server may or may not have executed it)"
                )
                if self.closing_error is not None:
                    exc.__cause__ = self.closing_error
                if kind == BATCH:
                    waiter.settle(rid, exc, out)
                else:
                    out.append((waiter, None, exc))
        self.pending.clear()
        return out


class SessionState:
    """The face-independent half of a session: identity, lost-event listeners, keepalive
    bookkeeping. The faces add execute/end and the context manager."""

    def __init__(
        self,
        core: ClientCore,
        session_id: str | None,
        max_age: float,
        description: str,
        keepalive: bool,
    ) -> None:
        if session_id is None:
            session_id = uuid.uuid4().hex
        self._spec = SessionSpec(session_id, max_age, description)  # validates
        if type(keepalive) is not bool:
            raise TypeError(f"keepalive must be a bool, got {type(keepalive).__name__}")
        self._core = core
        self._keepalive = keepalive
        self._listeners: list[LostListener] = []
        self._lost: deque[LockLost] = deque(maxlen=256)
        self._lost_count = 0
        self._namespace: str | None = None  # namespace of the last call (keepalive pings there)
        self._ended = False
        core.register_session(self)

    @property
    def id(self) -> str:
        """The session id (a uuid4 hex unless one was given)."""
        return self._spec.session_id

    @property
    def max_age(self) -> float:
        """Seconds the server keeps the session when idle."""
        return self._spec.max_age

    @property
    def description(self) -> str:
        """The description sent with the session's calls."""
        return self._spec.description

    @property
    def spec(self) -> SessionSpec:
        """The protocol's SessionSpec sent with every Execute."""
        return self._spec

    @property
    def ended(self) -> bool:
        """True after ``end()`` (or leaving the ``with`` block)."""
        return self._ended

    @property
    def keepalive_interval(self) -> float | None:
        """Seconds between keepalive pings when idle (max_age / 3), None when disabled."""
        return self._spec.max_age / 3 if self._keepalive else None

    # --- lost events ----------------------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once a LockLost event arrived for this session."""
        return self._lost_count > 0

    @property
    def lost_events(self) -> tuple[LockLost, ...]:
        """The LockLost events received for this session (the latest 256), oldest first."""
        return tuple(self._lost)

    def add_lost_listener(self, callback: LostListener) -> None:
        """Call ``callback(event)`` for every LockLost event of this session.

        Sync face: called from whichever thread is reading the connection when the event
        arrives (a caller waiting for its reply, or the keepalive thread). Async face: called
        from the client's reader task. Either way it must return quickly and must not call the
        client (it would deadlock the sync face's reader, and stall the async one); hand the
        event to your own thread/task instead. Exceptions are logged and swallowed.
        """
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {type(callback).__name__}")
        self._listeners.append(callback)

    def remove_lost_listener(self, callback: LostListener) -> None:
        """Remove a listener added with ``add_lost_listener`` (ValueError if absent)."""
        self._listeners.remove(callback)

    def _deliver(self, event: LockLost) -> None:
        self._lost.append(event)
        self._lost_count += 1
        for callback in list(self._listeners):
            try:
                callback(event)
            except Exception:
                log.exception("lost-listener %r of session %s raised", callback, self.id)

    # --- request building -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._ended:
            raise _ended_error(self.id)

    def _build_execute(
        self,
        namespace: str,
        statements: Iterable[Statement],
        min_uptime: float,
        min_trust: float,
        description: str,
        transaction_id: str | None,
        wait: float | None,
    ) -> tuple[int, bytes]:
        self._check_open()
        rid = self._core.next_id()
        data = encode_execute(
            rid,
            self._spec,
            namespace,
            statements,
            transaction_id="" if transaction_id is None else transaction_id,
            description=description,
            min_uptime=min_uptime,
            min_trust=min_trust,
            wait=wait,
        )
        self._namespace = namespace
        return rid, data

    def _build_batch(
        self, calls: Iterable[BatchCall], min_uptime: float, min_trust: float
    ) -> tuple[list[int], bytes]:
        """The request ids (call order) and the frames of every call, concatenated for one
        write. Every call is validated before anything is sent (errors name the call)."""
        self._check_open()
        spec = self._spec
        next_id = self._core.next_id
        rids: list[int] = []
        frames: list[bytes] = []
        namespace = None
        for i, call in enumerate(calls):
            try:
                if type(call) is not tuple or not 2 <= len(call) <= 3:
                    raise TypeError(
                        "a call must be a tuple (namespace, statements) or "
                        f"(namespace, statements, transaction_id), got {call!r:.80}"
                    )
                tx_id = call[2] if len(call) == 3 else None
                rid = next_id()
                frames.append(
                    encode_execute(
                        rid,
                        spec,
                        call[0],
                        call[1],
                        transaction_id="" if tx_id is None else tx_id,
                        min_uptime=min_uptime,
                        min_trust=min_trust,
                    )
                )
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"calls[{i}]: {exc}") from exc
            rids.append(rid)
            namespace = call[0]
        if namespace is not None:
            self._namespace = namespace
        return rids, b"".join(frames)

    def _build_keepalive(self) -> tuple[int, bytes] | None:
        """A no-statement Execute in the last namespace used, or None before any call."""
        if self._namespace is None or self._ended:
            return None
        rid = self._core.next_id()
        return rid, _encode(Execute(rid, self._spec, Transaction(self._namespace, ())))

    def _build_end(self) -> tuple[int, bytes]:
        rid = self._core.next_id()
        return rid, _encode(EndSession(rid, self._spec.session_id))

    def _mark_ended(self) -> None:
        self._ended = True
        self._core.unregister_session(self)


def _ended_error(session_id: str) -> LockClientError:
    return ClientClosed(f"session {session_id} has ended; open a new one")


def batch_results(outcomes: list[Any]) -> list[Result]:
    """The Results of a resolved batch, or BatchError when some call failed."""
    for outcome in outcomes:
        if type(outcome) is not Result:
            error = BatchError(outcomes)
            raise error from error.failures[0][1]
    return outcomes


def _encode(request: Request) -> bytes:
    return frame(pack(request_to_wire(request)))


class ClientCore:
    """Per-client state that outlives connections: ids, sessions, counters."""

    def __init__(self, client_name: str, token: str | None = None) -> None:
        if type(client_name) is not str:
            raise TypeError(f"client_name must be a str, got {type(client_name).__name__}")
        if token is not None and type(token) is not str:
            raise TypeError(f"token must be a str or None, got {type(token).__name__}")
        self.client_name = client_name
        self.token = token
        self._ids = itertools.count(1)
        self.sessions: dict[str, list[SessionState]] = {}
        self.welcome: Welcome | None = None
        self.requests_sent = 0
        self.replies_dropped = 0
        self.retries = 0
        self.connections = 0
        self.events = 0
        self.events_unclaimed = 0

    def next_id(self) -> int:
        """A fresh request id (unique for the client's lifetime, so across reconnects too)."""
        return next(self._ids)

    # --- requests -------------------------------------------------------------------------------

    def hello(self) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, _encode(Hello(rid, client_name=self.client_name, token=self.token))

    def ping(self) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, _encode(Ping(rid))

    def get_statistics(self) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, _encode(GetStatistics(rid))

    def cancel(self, target: int) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, _encode(Cancel(rid, target))

    def end_session(self, session_id: str) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, _encode(EndSession(rid, session_id))

    def keepalives(self) -> list[bytes]:
        """Keepalive Executes for every open, used session: sent unregistered right after a
        reconnect, so the new connection is associated with them (LockLost events) and they are
        refreshed at once. Their replies are dropped."""
        out = []
        for states in self.sessions.values():
            for state in states:
                built = state._build_keepalive()
                if built is not None:
                    out.append(built[1])
                    break
        return out

    def handshake_done(self, welcome: Any) -> Welcome:
        if type(welcome) is not Welcome:  # pragma: no cover - Wire.feed checks the type
            raise LockClientError(f"expected a Welcome, got {welcome!r}")
        self.welcome = welcome
        self.connections += 1
        return welcome

    # --- sessions and events --------------------------------------------------------------------

    def register_session(self, state: SessionState) -> None:
        self.sessions.setdefault(state.id, []).append(state)

    def unregister_session(self, state: SessionState) -> None:
        states = self.sessions.get(state.id)
        if states is not None and state in states:
            states.remove(state)
            if not states:
                del self.sessions[state.id]

    def dispatch(self, events: list[LockLost]) -> None:
        """Hand each LockLost to the open sessions with its id (unclaimed ones are counted)."""
        for event in events:
            states = self.sessions.get(event.session_id)
            if not states:
                self.events_unclaimed += 1
                continue
            for state in list(states):
                state._deliver(event)

    def open_sessions(self) -> list[SessionState]:
        return [s for states in self.sessions.values() for s in states]

    def statistics(self, in_flight: int) -> ClientStatistics:
        return ClientStatistics(
            requests_sent=self.requests_sent,
            in_flight=in_flight,
            replies_dropped=self.replies_dropped,
            retries=self.retries,
            connections=self.connections,
            events=self.events,
            events_unclaimed=self.events_unclaimed,
            open_sessions=sum(len(s) for s in self.sessions.values()),
        )


def handshake_error(exc: BaseException) -> BaseException:
    """What to raise when the handshake fails: a ServerError as is (e.g. unsupported
    version), anything else as the cause of a ServerUnavailable."""
    if isinstance(exc, ServerError):
        return exc
    err = ServerUnavailable(f"the handshake with the server failed: {exc}")
    err.__cause__ = exc
    return err
