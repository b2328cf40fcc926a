"""The socket-free client core shared by the sync and the async face.

Why: both faces must agree exactly on request ids, reply matching, error mapping, retry rules
and event dispatch; putting that here, with no sockets, threads or trio, leaves each face with
nothing but its I/O and its way of waking a waiter (the contrast to avoid: redis-py's
near-duplicate sync and async lock files).

The core is split by reason to change. This module is the per-client half, which outlives
connections and changes with the request side: ids, frames, the session registry, counters.
``_session_state.py`` is the face-independent half of a session (its spec, listeners,
deadlines, the frames of its calls). ``_wire.py`` is the per-connection half, which changes
with the reply side: request kinds, the table of requests in flight, decoding replies, retry
rules, batches. ``_calls.py`` holds the calls both faces make, as steps they drive.

Theory of operation:
- :class:`ClientCore` (one per client, lives across reconnects) numbers requests from one
  counter, builds their framed bytes through ``protocol`` (validation happens there: bad
  arguments raise TypeError/ValueError before anything is sent), keeps the registry of open
  sessions and counts what happened.
- Each open session (:class:`~client._session_state.SessionState`) registers here, by id:
  ``dispatch`` hands it the LockLost events of that id.
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
from typing import Any, Protocol

import attrs

from protocol import (
    Cancel,
    EndSession,
    FeedEvent,
    GetStatistics,
    Hello,
    LockLost,
    LostReason,
    Ping,
    Request,
    Welcome,
    frame,
    pack,
    request_to_wire,
)

from ._errors import LockClientError, ServerError, ServerUnavailable
from ._failover import Members
from ._inspect import subscribe_request

__all__ = [
    "ClientCore",
    "ClientStatistics",
    "FailureLog",
    "FeedSink",
    "OpenSession",
    "encode_request",
    "handshake_error",
    "not_sent",
]

log = logging.getLogger("client")


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


class OpenSession(Protocol):
    """What the core asks of a session registered with it: the seam to
    :class:`~client._session_state.SessionState`, which implements it (named here so that
    this module does not import the session module, which imports this one)."""

    _namespace: str | None
    _valid_deadline: float | None

    @property
    def id(self) -> str: ...

    def _deliver(self, event: LockLost) -> None: ...

    def _build_keepalive(self) -> tuple[int, bytes] | None: ...

    def _stop_keepalive(self) -> None: ...


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


def encode_request(request: Request) -> bytes:
    """The framed bytes of a request."""
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
        self.sessions: dict[str, list[OpenSession]] = {}
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
        return rid, encode_request(Hello(rid, client_name=self.client_name, token=self.token))

    def ping(self) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, encode_request(Ping(rid))

    def get_statistics(self) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, encode_request(GetStatistics(rid))

    def cancel(self, target: int) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, encode_request(Cancel(rid, target))

    def end_session(self, session_id: str) -> tuple[int, bytes]:
        rid = self.next_id()
        return rid, encode_request(EndSession(rid, session_id))

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

    def register_session(self, state: OpenSession) -> None:
        self.sessions.setdefault(state.id, []).append(state)

    def unregister_session(self, state: OpenSession) -> None:
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

    def open_sessions(self) -> list[OpenSession]:
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
