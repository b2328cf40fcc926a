"""The socket-free client core shared by the sync and the async face.

Why: both faces must agree exactly on request ids, reply matching, error mapping, retry rules
and event dispatch; putting that here, with no sockets, threads or trio, leaves each face with
nothing but its I/O and its way of waking a waiter (the contrast to avoid: redis-py's
near-duplicate sync and async lock files).

The core is two modules, split by reason to change. This one is the per-client half, which
outlives connections and changes with the request side and the session model: ids, frames,
sessions, counters. ``_wire.py`` is the per-connection half, which changes with the reply
side: request kinds, the table of requests in flight, decoding replies, retry rules, batches
(its docstring has that part of the theory).

Theory of operation:
- :class:`ClientCore` (one per client, lives across reconnects) numbers requests from one
  counter, builds their framed bytes through ``protocol`` (validation happens there: bad
  arguments raise TypeError/ValueError before anything is sent), keeps the registry of open
  sessions and counts what happened.
- :class:`SessionState` is the face-independent half of a session: its
  :class:`~protocol.SessionSpec`, lost-event listeners, the namespace of its last call (the
  keepalive pings there) and the session's local deadline: the latest ``valid_until`` a reply
  carried, turned into the face's clock as PROTOCOL.md §8 says (``sent_at + (valid_until -
  uptime)``, early by construction).
- Which server a (re)connection goes to is ``_failover``'s :class:`~client._failover.Members`
  (held here as ``members``): a single server, or the members of a replicated group, whose
  welcomes all name the group's ``instance``, so reconnecting to another member is not a
  restart and the sessions carry on.
- Losses no connection could hear. A reconnect must not let the keepalive silently re-create
  a session whose entries are gone (PROTOCOL.md §2: sessions outlive connections, but not a
  server restart, nor their own expiry). So ``handshake_done`` remembers the server
  ``instance`` of every welcome, and ``reconnected(now)``, which each face calls after a
  reconnect's handshake and **before** the keepalives go out, hands every open, used session
  a :class:`~protocol.LockLost` with no entries: reason ``RESTARTED`` when the welcome names
  another instance (the server forgot every session), else ``EXPIRED`` for a session whose
  local deadline has passed (the server may have expired it while no connection of ours was
  there to hear the event). Recipes treat such an event as the loss of every grant of the
  session.
- Feed sinks. A recipe that watches the change feed (an election's ``observe``, a group's
  ``watch``) must not take the application's own feed events, nor lose its own to the
  application's ``feed_events()``: a subscription made with a :class:`FeedSink` (registered
  under the subscribe's request id, which is the subscription's id, *before* the request is
  sent) gets its events handed to the sink by whoever reads the connection, and the sink is
  told when the subscription was made again on a new connection (``gap``: the events of the
  reconnect were not seen) and when the connection was lost (``connection_lost``).
- :class:`FailureLog`: how a periodic task (the keepalive) reports failures without flooding
  the log: the first at WARNING, then at most one line a minute with the count.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import attrs

from protocol import (
    Cancel,
    EndSession,
    Execute,
    FeedEvent,
    GetStatistics,
    Hello,
    LockLost,
    LostReason,
    Ping,
    Request,
    SessionSpec,
    Statement,
    Transaction,
    Welcome,
    encode_execute,
    frame,
    pack,
    request_to_wire,
)

from ._errors import ClientClosed, LockClientError, ServerError, ServerUnavailable
from ._failover import Members
from ._inspect import subscribe_request
from ._result import Result

__all__ = [
    "BatchCall",
    "ClientCore",
    "ClientStatistics",
    "FailureLog",
    "FeedSink",
    "LostListener",
    "SessionState",
    "handshake_error",
    "not_sent",
]

log = logging.getLogger("client")

#: Most cleanups a session keeps to send again (``SessionState.defer_cleanup``).
MAX_DEFERRED = 64

LostListener = Callable[[LockLost], object]


class FeedSink(Protocol):
    """Where the events of one change-feed subscription go instead of the client's
    ``feed_events()`` buffer (see the module header). Its methods are called by the thread or
    task that reads the connection: they must be quick and never call the client."""

    def put(self, event: FeedEvent) -> None:
        """An event of the subscription arrived."""

    def gap(self) -> None:
        """The subscription was made again on a new connection: events in between were not
        seen (the server only knew the old connection)."""

    def connection_lost(self) -> None:
        """The connection the subscription was on is gone (it is made again by the next
        request, which reconnects)."""


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
    restarts: int = 0  # reconnects whose welcome named another server instance
    # LockLost events the client made itself at a reconnect (RESTARTED, or EXPIRED for a
    # session whose guarantee ran out while disconnected); not counted in ``events``.
    events_synthetic: int = 0
    # Change-feed events dropped because the application did not take them (FEED_BUFFER).
    feed_dropped: int = 0
    # The server (``host:port``) of the current connection, or of the last one; for a
    # replicated group the member in use. "" before any connection, and for a client of
    # several servers (each of its per-server clients says its own).
    server: str = ""
    # Connections made to another member of the group than the previous connection's.
    failovers: int = 0

    @classmethod
    def total(cls, parts: list[ClientStatistics], open_sessions: int) -> ClientStatistics:
        """The counters of a client of several servers: the sums of its per-server clients'
        counters, except ``open_sessions`` (its own sessions, each spanning servers) and
        ``server`` ("")."""
        sums = {
            f.name: sum(getattr(p, f.name) for p in parts)
            for f in attrs.fields(cls)
            if f.name not in ("open_sessions", "server")
        }
        return cls(open_sessions=open_sessions, **sums)


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
        # Local time (the face's clock) until which the last reply guarantees the session;
        # None before any such reply, and once the session is known to be gone.
        self._valid_deadline: float | None = None
        self._ended = False
        # Keepalive bookkeeping, on the face's clock (the face sets ``_last_activity`` to its
        # ``now`` when it creates the session and whenever it sends).
        self._last_activity = 0.0
        self._failures = FailureLog(f"keepalive of session {session_id}")
        self.keepalive_error: LockClientError | None = None  # the last keepalive failure
        # Cleanups (namespace, statements) whose outcome is unknown (a recipe's cleanup or
        # release that failed twice): sent again before this session's next call.
        self._deferred: list[tuple[str, list[Statement]]] = []
        core.register_session(self)

    def defer_cleanup(self, namespace: str, statements: list[Statement]) -> None:
        """Send ``statements`` (idempotent ones: a recipe's cleanup or release) again before
        this session's next call: their outcome is unknown, and a session that lives on (a
        replicated group) would otherwise keep what they remove. Kept at most
        ``MAX_DEFERRED``; the oldest go first."""
        self._deferred.append((namespace, statements))
        del self._deferred[:-MAX_DEFERRED]

    def _guaranteed_until(self, namespace: str) -> float | None:
        """The latest local time until which a reply has guaranteed this session (on
        ``namespace``'s server) stays alive; None when nothing guarantees it."""
        return self._valid_deadline

    def _take_deferred(self) -> list[tuple[str, list[Statement]]]:
        taken, self._deferred = self._deferred, []
        return taken

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

    def _note_reply(self, sent_at: float, result: Result) -> None:
        """Move the session's local deadline to what ``result`` (of a request sent at
        ``sent_at``, the face's clock) guarantees; a reply without ``valid_until`` (refused)
        leaves it. The faces' ``execute`` inline this (the hot path)."""
        raw = result.raw
        until = raw.valid_until
        if until is not None:
            deadline = sent_at + (until - raw.uptime)
            # A guarantee once given holds (a late reply to an earlier request must not
            # shorten it); a whole-session loss clears it.
            if self._valid_deadline is None or deadline > self._valid_deadline:
                self._valid_deadline = deadline

    def _batch_done(self, sent_at: float, outcomes: list[Any]) -> bool:
        """Digest the outcomes of a batch sent at ``sent_at``: the last call answered carries
        the latest ``valid_until``. True when the batch used the session (some call got a
        Result) and its keepalive should run."""
        for outcome in reversed(outcomes):
            if type(outcome) is Result and outcome.valid_until is not None:
                self._note_reply(sent_at, outcome)
                break
        return self._keepalive and not self._ended and any(type(o) is Result for o in outcomes)

    def _keepalive_done(self, sent_at: float, result: Result) -> None:
        """A keepalive sent at ``sent_at`` was answered."""
        self._note_reply(sent_at, result)
        self._failures.succeeded()

    def _keepalive_failed(self, error: LockClientError, now: float, interval: float) -> None:
        """A keepalive failed at ``now``: remember and log it (rate-limited), and make the
        next one due in a second rather than after a whole ``interval``."""
        self.keepalive_error = error
        self._failures.failed(error, now)
        self._last_activity = now - interval + min(interval, 1.0)

    def _start_end(self) -> tuple[int, bytes] | None:
        """The EndSession request of ``end()``, after stopping the keepalive; None when the
        session has ended already (``end()`` then answers False without a call). The face
        sends it and calls ``_mark_ended`` whatever happens."""
        if self._ended:
            return None
        self._stop_keepalive()
        return self._build_end()

    def _stop_keepalive(self) -> None:
        """Stop the face's keepalive (the faces override this)."""

    def __repr__(self) -> str:
        state = "ended" if self._ended else "open"
        return f"<{type(self).__name__} {self.id} max_age={self.max_age} {state}>"

    def _deliver(self, event: LockLost) -> None:
        if event.reason is not LostReason.TTL:
            # The whole session is gone (expired, ended, or the server restarted): nothing is
            # guaranteed until a later reply re-creates it, and no EXPIRED is made up for it
            # at the next reconnect.
            self._valid_deadline = None
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
        rids, frames = self._build_batch_frames(calls, min_uptime, min_trust)
        return rids, b"".join(frames)

    def _build_batch_frames(
        self, calls: Iterable[BatchCall], min_uptime: float, min_trust: float
    ) -> tuple[list[int], list[bytes]]:
        """The request ids (call order) and each call's frame. Every call is validated before
        anything is sent (errors name the call)."""
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
        return rids, frames

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


def _encode(request: Request) -> bytes:
    return frame(pack(request_to_wire(request)))


class ClientCore:
    """Per-client state that outlives connections: ids, sessions, counters."""

    def __init__(
        self, client_name: str, token: str | None = None, members: Members | None = None
    ) -> None:
        if type(client_name) is not str:
            raise TypeError(f"client_name must be a str, got {type(client_name).__name__}")
        if token is not None and type(token) is not str:
            raise TypeError(f"token must be a str or None, got {type(token).__name__}")
        self.client_name = client_name
        self.token = token
        # The servers a connection of this client may go to and the order to try them
        # (``_failover``); None for a client of several servers (its per-server clients
        # have theirs).
        self.members = members
        self._ids = itertools.count(1)
        self.sessions: dict[str, list[SessionState]] = {}
        self.welcome: Welcome | None = None
        # Change-feed subscriptions in force: id (the subscribe's request id) -> (namespace,
        # table); made again on every new connection (``resubscriptions``).
        self.subscriptions: dict[int, tuple[str, str | None]] = {}
        # Subscriptions whose events go to a sink instead of ``feed_events()``: id -> sink.
        self.feed_sinks: dict[int, FeedSink] = {}
        self.requests_sent = 0
        self.replies_dropped = 0
        self.retries = 0
        self.connections = 0
        self.events = 0
        self.events_unclaimed = 0
        self.events_synthetic = 0
        self.feed_dropped = 0
        self.restarts = 0
        # The server instance of the last welcome (None before the first); whether the last
        # handshake found another one (consumed by ``reconnected``).
        self.instance: str | None = None
        self._restarted = False

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

    def resubscriptions(self) -> list[bytes]:
        """Subscribe frames for every change-feed subscription of this client, under their
        own ids: sent unregistered right after a reconnect (with the keepalives), so a
        subscription outlives the connection it was made on and keeps its id (a request id
        may be used again on a new connection). The events of the gap are not sent: the
        server only knew the old connection. The replies are dropped. Their sinks are told
        (``FeedSink.gap``) first."""
        for rid in self.subscriptions:
            sink = self.feed_sinks.get(rid)
            if sink is not None:
                sink.gap()
        return [
            subscribe_request(rid, namespace, table)
            for rid, (namespace, table) in self.subscriptions.items()
        ]

    def handshake_done(self, welcome: Any) -> Welcome:
        """Record the welcome of a new connection; a non-empty ``instance`` other than the
        last welcome's means the server restarted (see ``reconnected``)."""
        if type(welcome) is not Welcome:  # pragma: no cover - Wire.feed checks the type
            raise LockClientError(f"expected a Welcome, got {welcome!r}")
        previous = self.instance
        instance = welcome.instance
        self._restarted = previous is not None and instance not in ("", previous)
        if self._restarted:
            self.restarts += 1
        self.instance = instance
        self.welcome = welcome
        self.connections += 1
        return welcome

    def reconnected(self, now: float) -> None:
        """Report the losses no connection could hear; call it after a handshake, before
        anything is sent on the new connection (its keepalives would re-create the sessions).

        Every open session that has been used gets ``LockLost(id, RESTARTED, ())`` when the
        handshake found another server instance; otherwise a session whose local deadline
        (``now`` is on the same clock) has passed gets ``LockLost(id, EXPIRED, ())``: the
        server may have expired it, and sent its event, while we were not connected. The
        listeners run here, in the reconnecting thread or task.
        """
        restarted = self._restarted
        self._restarted = False
        for state in self.open_sessions():
            if state._namespace is None:
                continue  # never used: it holds nothing
            if restarted:
                reason = LostReason.RESTARTED
            else:
                deadline = state._valid_deadline
                if deadline is None or deadline > now:
                    continue
                reason = LostReason.EXPIRED
            self.events_synthetic += 1
            state._deliver(LockLost(state.id, reason, ()))

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
        members = self.members
        return ClientStatistics(
            requests_sent=self.requests_sent,
            in_flight=in_flight,
            replies_dropped=self.replies_dropped,
            retries=self.retries,
            connections=self.connections,
            events=self.events,
            events_unclaimed=self.events_unclaimed,
            open_sessions=sum(len(s) for s in self.sessions.values()),
            restarts=self.restarts,
            events_synthetic=self.events_synthetic,
            feed_dropped=self.feed_dropped,
            server=members.current.id if members and members.connected_once else "",
            failovers=0 if members is None else members.failovers,
        )


class FailureLog:
    """How a periodic task reports its failures without flooding the log (logger
    ``client``): the first failure of a run of failures at WARNING, then at most one line
    every ``every`` seconds (WARNING, with the number of failures since the last line), and
    one INFO line when it works again. Time is passed in (the face's clock). Only the
    failure's text is logged, never the exception object: a log handler that keeps records
    must not keep the failing client's frames (and so the client) alive."""

    __slots__ = ("_failures", "_next", "_unreported", "every", "what")

    def __init__(self, what: str, every: float = 60.0) -> None:
        self.what = what
        self.every = every
        self._failures = 0  # in the current run of failures
        self._unreported = 0  # failures since the last line
        self._next = 0.0  # earliest time of the next line

    @property
    def failures(self) -> int:
        """Failures since the last success."""
        return self._failures

    def failed(self, error: BaseException, now: float) -> None:
        """Record one failure at ``now``; log it when the rate limit allows."""
        self._failures += 1
        self._unreported += 1
        if self._failures == 1:
            log.warning("%s failed: %s", self.what, str(error))
        elif now >= self._next:
            log.warning(
                "%s failed %d more time(s) (%d in a row), the last: %s",
                self.what,
                self._unreported,
                self._failures,
                str(error),
            )
        else:
            return
        self._unreported = 0
        self._next = now + self.every

    def succeeded(self) -> None:
        """Record a success: the end of a run of failures (logged at INFO)."""
        if self._failures:
            log.info("%s works again after %d failure(s)", self.what, self._failures)
            self._failures = 0
            self._unreported = 0


def not_sent(exc: ServerUnavailable) -> ServerUnavailable:
    """The ServerUnavailable of a call that needed a new connection and could not get one:
    the same text, saying that the call was not sent."""
    err = ServerUnavailable(f"the request was not sent: {exc}")
    err.__cause__ = exc
    return err


def handshake_error(exc: BaseException) -> BaseException:
    """What to raise when the handshake fails: a ServerError as is (e.g. unsupported
    version), anything else as the cause of a ServerUnavailable."""
    if isinstance(exc, ServerError):
        return exc
    err = ServerUnavailable(f"the handshake with the server failed: {exc}")
    err.__cause__ = exc
    return err
