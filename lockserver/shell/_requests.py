"""Serving requests: decode a received batch, check each request, one call through the lock
core's door, deliver what comes back.

``RequestHandler`` is the request half of the trio shell (``_server.py`` composes it with the
reader, ``_reading.py``). It changes for its own reasons (the request set, the checks that
depend on configuration, authentication, encoding replies); the lock state and every decision
about it live behind the door (``engine.LockCore``), the sockets in ``_peer.py``.

Why / rules kept (issue #3, STYLE.md):
- The door is called synchronously; nothing awaits between reading a batch of requests and
  queueing their replies, so transactions are serializable without a lock.
- A malformed frame (1xx, or any ``closes_connection`` code) is answered and the connection
  closed; a well-framed invalid request is answered and the connection stays usable; an
  ``EngineError`` (a limit) is answered, nothing changed; an unexpected exception while serving
  one request answers INTERNAL_ERROR, is logged with its traceback, closes that connection
  only.

Theory of operation
===================
**One request, one door call.** An ``execute`` passes the configuration's checks here
(``max_session_age``, ``max_wait``, the principal's namespaces), is counted by the trust
monitor, then goes through ``LockCore.execute`` once; ``end``, ``cancel`` and ``stats`` make
one call each; ``hello`` and ``ping`` need no lock state. What a call returns is an ordered
list of (address, payload) pairs: :meth:`RequestHandler.deliver` encodes each and appends it to
its peer's outbox (the batch's own peer) or pushes it (any other peer). The common answer --
one result for the requesting peer -- is encoded straight into its outbox.

**Security** (issue #8, docs/security.md, ``_auth.py``). With tokens configured the hello must
carry a valid one (else UNAUTHORIZED, closed) and sets the connection's principal; an execute
is checked against the principal's namespaces here (FORBIDDEN); the session's owner
(SESSION_CONFLICT) is lock state, checked by the door. Without tokens all of it is one
``is None`` test per execute. (TLS is the shell's: see ``_server.py``.)

**The operator's requests** (issue 16, PROTOCOL.md "Inspection"): listings, force-release
and (un)subscribing make one door call each, after the checks that are configuration: with
tokens, a listing or subscription naming a namespace the token may not use is FORBIDDEN (an
unnamed one is filtered to what it may use), force-release and ending another principal's
session need an ``admin`` token (FORBIDDEN otherwise), and every such admin action is logged,
one line naming the principal (logger ``lockserver.admin``). A sessions page comes back with
the owners that used each session; the shell names them (``clients``: their addresses).

**The feed never blocks the server.** A feed event for a connection whose unsent bytes are
past :data:`FEED_BUFFER` is dropped and counted on that connection; the next event it is sent
carries the count (``dropped``), and the statistics count them all (``feed_events_dropped``).
Replies are never dropped: a connection that does not read its replies is still a slow
consumer (``max_send_buffer``), and the feed's bound is below that one. **Fan-out costs what
it must, once** (issue 30): the door gives one FeedEvent per change, shared by an output per
subscription that hears it (addressed ``(connection, subscription id)``); it is encoded once
(``protocol.FeedFrames``: each subscriber's frame is its own two fields and the shared
bytes), a subscriber past the bound costs a counter, and :meth:`RequestHandler.deliver` sends
each connection what it got with one send, however many events (measured with 100
connections x 64 never-read subscriptions: 27-30 ms per transaction in their namespace
before, see benchmarks/README.md "Fairness" for after).

**Turns** (issue 30). :meth:`RequestHandler.process` serves one *turn* of a connection: the
requests it has buffered until ``TURN_SECONDS`` of work have passed (the clock is read after
each request), then it leaves the rest buffered and sets ``Peer.backlog``: the reader gives
it its next turn after every other ready connection (``_reading.py``). Costly reads cost once
per turn, not once per pipelined copy: the ``stats`` requests of one turn of a connection
share the figures the first one took (:meth:`RequestHandler._statistics`); a later one of the
turn may not count what the requests pipelined before it in that turn changed.

Prior art: h11/wsproto's sans-I/O split (the protocol package).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any, Final

import attrs
import trio

from lockserver._auth import Authenticator, Principal
from lockserver._config import ServerConfig
from lockserver._peer import TURN_SECONDS, Peer
from lockserver._trust import TrustMonitor
from lockserver.engine import Door, EngineError, Listed, Output, SessionsListing
from protocol import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    Cancel,
    Connection,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    FeedEvent,
    FeedFrames,
    ForceRelease,
    GetStatistics,
    Hello,
    ListHolders,
    ListQuery,
    ListSessions,
    ListWaiters,
    LockLost,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Role,
    SessionsPage,
    State,
    Statistics,
    Subscribe,
    TransactionResult,
    Unsubscribe,
    Welcome,
)

from ._statistics import ServerStatistics

__all__ = ["FEED_BUFFER", "Alarm", "RequestHandler", "sessions_page"]

log = logging.getLogger("lockserver")
admin_log = logging.getLogger("lockserver.admin")

#: Unsent bytes past which a connection's feed events are dropped (and counted), at most half
#: its ``max_send_buffer``: a subscriber that does not read loses events, never its replies.
FEED_BUFFER: Final = 1024 * 1024
_LISTINGS: Final = {ListHolders: "holders", ListSessions: "sessions", ListWaiters: "waiters"}

# Replies of a long batch go out as soon as this many bytes are ready (~22 results), not at
# the batch's end: the client decodes the first replies while the rest are being served.
# Measured with one connection, 64 transactions per write (lockbench run mutex-uncontended
# --connections 1 --pipeline 64): 24k -> 30k acquire+release pairs/s; server CPU per request
# unchanged within noise (one more send per ~22 replies).
_EARLY_FLUSH: Final = 3072
_CLOSED: Final = State.CLOSED


class Alarm:
    """The shell's timer, as far as serving requests needs it: ``scope`` is the cancel scope
    the timer sleeps in (None while it runs); a request that parks moves its deadline
    earlier, so the wait ends on time."""

    __slots__ = ("scope",)

    def __init__(self) -> None:
        self.scope: trio.CancelScope | None = None

    def wake_by(self, deadline: float) -> None:
        scope = self.scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline


class RequestHandler:
    """Serves the requests of every peer: checks, one door call each, delivery.

    ``statistics(now, scope)`` is the shell's record (``stats`` answers its wire map; with
    ``scope``, the counts a principal may see: :meth:`scope`); ``alarm`` its timer. The
    counters are read by the shell's statistics.
    """

    def __init__(
        self,
        config: ServerConfig,
        core: Door[Peer],
        trust: TrustMonitor,
        auth: Authenticator | None,
        welcome: Welcome,
        alarm: Alarm,
        statistics: Callable[[float, Principal | None], ServerStatistics],
    ) -> None:
        self.config = config
        self.max_session_age = config.max_session_age  # read per execute
        self.max_wait = config.max_wait
        self.core = core
        self.trust = trust
        self.auth = auth
        self.welcome = welcome
        self.alarm = alarm
        self.statistics = statistics
        # Encodes what belongs to no one connection's conversation: events, and the shell's
        # last words to a connection it refuses or stops.
        self.encoder = Connection(Role.SERVER)
        self.requests_total = 0
        self.protocol_errors = 0
        self.internal_errors = 0
        self.events_sent = 0
        self.feed_sent = 0
        self.feed_dropped = 0
        self.feed_buffer = min(FEED_BUFFER, config.max_send_buffer // 2)
        # Turns served (one per ``process`` call), and the statistics the last ``stats`` of
        # a turn answered: (turn, connection number, the figures), shared by the ``stats``
        # requests pipelined behind it in the same turn of the same connection (the number,
        # not the Peer: a closed connection is freed at once).
        self.turn = 0
        self._turn_statistics: tuple[int, int, dict[str, Any]] | None = None

    def process(self, c: Peer, data: memoryview, send: bool = True) -> bool:
        """Decode and serve every complete frame in ``data``; False: close the connection.
        ``send``: send the replies now; False when the caller sends them (``c.send_pending``)
        once it has served every connection of its pass (the poller, ``_reading.py``).

        Synchronous on purpose: the whole batch runs without an await.
        """
        now = trio.current_time()
        c.last_recv = now
        proto = c.proto
        out = c.outbox
        keep = True
        self.turn += 1  # what a turn may share (the statistics): this call's requests
        try:
            proto.receive_data(data)
        except ProtocolError as exc:
            self.protocol_errors += 1
            out += proto.send(ErrorReply(exc.request_id, exc.code, exc.message))
            keep = False
        else:
            execute = self._execute
            other = self._request
            clock = perf_counter
            ends = clock() + TURN_SECONDS
            served = False
            while True:
                if served and clock() >= ends:
                    # The turn is over: what is buffered waits for the reader's next pass,
                    # after every other ready connection (module header: fairness).
                    c.backlog = proto.buffered > 0
                    break
                served = True
                try:
                    msg: Any = proto.next_message()  # a Request on the server side
                except ProtocolError as exc:
                    self.requests_total += 1
                    self.protocol_errors += 1
                    out += proto.send(ErrorReply(exc.request_id, exc.code, exc.message))
                    if exc.code.closes_connection:
                        keep = False
                        break
                    continue
                if msg is None:
                    break
                self.requests_total += 1
                try:
                    if type(msg) is Execute:  # decoded only once the hello is done
                        if execute(c, msg, now):
                            keep = False
                            break
                        if len(out) >= _EARLY_FLUSH:
                            c.flush()
                        continue
                    other(c, msg, now)
                except Exception:  # the door answers refusals as values: this is a bug
                    self.internal_errors += 1
                    # A hello's repr hides its token already; say "hello" anyway, to be sure.
                    what = "hello" if type(msg) is Hello else repr(msg)
                    log.exception("connection %s: internal error serving %s", c.name, what)
                    out += proto.send(
                        ErrorReply(
                            msg.request_id,
                            ErrorCode.INTERNAL_ERROR,
                            "internal server error (logged); the connection is closed",
                        )
                    )
                    keep = False
                    break
                if proto.state is _CLOSED:  # a closing error was sent: read nothing more
                    keep = False
                    break
        if send:
            c.send_pending()
        return keep and not c.dead

    def _execute(self, c: Peer, msg: Execute, now: float) -> bool:
        """Serve one execute; True: a closing error went out (an INTERNAL_ERROR), the
        connection closes after it."""
        session = msg.session
        rid = msg.request_id
        if session.max_age > self.max_session_age:
            self._invalid(
                c,
                rid,
                ErrorCode.INVALID_MESSAGE,
                f"execute: session max_age {session.max_age:g} s exceeds the server's "
                f"max_session_age of {self.config.max_session_age:g} s",
            )
            return False
        wait = msg.wait
        if wait is not None and wait > self.max_wait:
            self._invalid(
                c,
                rid,
                ErrorCode.INVALID_MESSAGE,
                f"execute: wait {wait:g} s exceeds the server's max_wait of "
                f"{self.config.max_wait:g} s",
            )
            return False
        principal = c.principal
        if self.auth is not None:
            namespace = msg.transaction.namespace
            if not principal.allows(namespace):
                self._invalid(
                    c,
                    rid,
                    ErrorCode.FORBIDDEN,
                    f"execute: token {principal.name!r} may not use namespace {namespace!r}",
                )
                return False
            source: object = principal.name
        else:
            source = c.number  # not the Peer: a closed connection is freed at once (_peer.py)
        trust = self.trust
        trust.record_call(now, source=source)
        # Positional: the hot path's one door call (owner, request id, session, transaction,
        # wait, now, trust, principal).
        outs = self.core.execute(
            c, rid, session, msg.transaction, wait, now, trust.trust(now), principal.name
        )
        if len(outs) == 1:
            (peer, answered), answer = outs[0]
            if peer is c and type(answer) is TransactionResult:
                # The common case: this request answered at once, nothing else to send.
                c.outbox += c.proto.send_result(answered, answer)  # type: ignore[arg-type]
                return False
        if wait is not None and wait > 0:
            # It may have parked: the timer must wake by its deadline, and by any earlier
            # expiry it may be waiting on (a holder's TTL or session created while the timer
            # slept), not sweep_interval later.
            due = self.core.next_deadline()
            if due is not None:
                self.alarm.wake_by(due)
        self.deliver(outs, c)
        return c.proto.state is _CLOSED

    def _request(self, c: Peer, msg: Any, now: float) -> None:
        """Every request but an Execute (the protocol's Connection decodes nothing but a
        hello before the handshake: the lifecycle table, ``protocol.LIFECYCLE``)."""
        proto = c.proto
        rid = msg.request_id
        t = type(msg)
        if t is Hello:
            self._hello(c, msg)
            return
        core = self.core
        if t is Ping:
            c.outbox += proto.send(Reply(rid, Pong(core.uptime(now), self.trust.trust(now))))
        elif t is EndSession:
            self._end(c, msg, now)
        elif t is GetStatistics:
            c.outbox += proto.send(Reply(rid, Statistics(self._statistics(c, now))))
        elif t is Cancel:
            self.deliver(
                core.cancel(c, rid, msg.target_id, now=now, trust=self.trust.trust(now)), c
            )
        elif t in _LISTINGS:
            self._listing(c, msg, now)
        elif t is ForceRelease:
            self._release(c, msg, now)
        elif t is Subscribe:
            if self._forbidden(c, rid, "subscribe", msg.namespace):
                return
            self.deliver(core.subscribe(c, rid, msg.namespace, msg.table, c.principal.name), c)
        elif t is Unsubscribe:
            self.deliver(core.unsubscribe(c, rid, msg.target), c)
        else:
            raise TypeError(f"no handler for {t.__name__}")

    def _statistics(self, c: Peer, now: float) -> dict[str, Any]:
        """What a ``stats`` request of ``c`` answers: the figures taken by the first ``stats``
        of this turn of ``c``, else taken now. Why: 3,000 pipelined ``stats`` cost one
        snapshot per turn, not 3,000 (a later one of a turn may miss what the requests
        pipelined before it in that turn changed: a turn lasts at most TURN_SECONDS)."""
        shared = self._turn_statistics
        if shared is not None and shared[0] == self.turn and shared[1] == c.number:
            return shared[2]
        values = self.statistics(now, self.scope(c.principal)).to_wire()
        self._turn_statistics = (self.turn, c.number, values)
        return values

    def scope(self, principal: Principal) -> Principal | None:
        """Whose counts ``principal``'s statistics show: None (the whole server) without
        tokens, for an admin token and for one that may use every namespace; else its own
        (docs/security.md)."""
        if self.auth is None or principal.sees_the_server:
            return None
        return principal

    # --- the operator's requests --------------------------------------------------------------

    def _forbidden(self, c: Peer, rid: int, what: str, namespace: str | None) -> bool:
        """With tokens, refuse (FORBIDDEN) a request naming a namespace the connection's
        token may not use; True when refused."""
        if self.auth is None or namespace is None or c.principal.allows(namespace):
            return False
        self._invalid(
            c,
            rid,
            ErrorCode.FORBIDDEN,
            f"{what}: token {c.principal.name!r} may not use namespace {namespace!r}",
        )
        return True

    def visible(self, principal: Principal) -> Principal | None:
        """What a listing may show ``principal`` (None: everything)."""
        if self.auth is None or principal.sees_everything:
            return None
        return principal

    def _not_admin(self, c: Peer, rid: int, what: str) -> bool:
        """With tokens, refuse (FORBIDDEN) an admin action of a token without ``admin``; True
        when refused."""
        if self.auth is None or c.principal.admin:
            return False
        self._invalid(
            c,
            rid,
            ErrorCode.FORBIDDEN,
            f"{what}: token {c.principal.name!r} is not an admin token (admin = true)",
        )
        return True

    def _listing(self, c: Peer, msg: Any, now: float) -> None:
        rid = msg.request_id
        kind = _LISTINGS[type(msg)]
        query: ListQuery = msg.query
        refusal = self._listing_refusal(kind, query, c.principal)
        if refusal is not None:
            self.deliver([((c, rid), refusal)], c)
            return
        outs = self.core.listing(
            c,
            rid,
            kind,
            query,
            now=now,
            trust=self.trust.trust(now),
            visible=self.visible(c.principal),
        )
        self.deliver(outs, c)

    def page_at(self, kind: str, query: ListQuery, principal: Principal, now: float) -> Listed:
        """A listing page for the HTTP face asking as ``principal`` at ``now`` (one door call,
        ``page_at``): a page, a :class:`SessionsListing`, or an ``EngineError`` (FORBIDDEN
        when, with tokens, the query names a namespace ``principal`` may not use; a bad
        cursor). What the door returns beside it (the losses of sessions that expired first)
        is delivered to the connections it is for. Protocol and HTTP listings are checked by
        the same rule (``_listing_refusal``) and read by the same door code."""
        refusal = self._listing_refusal(kind, query, principal)
        if refusal is not None:
            return refusal
        page, outs = self.core.page_at(
            kind, query, now=now, trust=self.trust.trust(now), visible=self.visible(principal)
        )
        self.deliver(outs)
        return page

    def _listing_refusal(
        self, kind: str, query: ListQuery, principal: Principal
    ) -> EngineError | None:
        """FORBIDDEN when, with tokens, ``query`` names a namespace ``principal`` may not use."""
        namespace = query.namespace
        if self.auth is None or namespace is None or principal.allows(namespace):
            return None
        return EngineError(
            ErrorCode.FORBIDDEN,
            f"{kind}: token {principal.name!r} may not use namespace {namespace!r}",
        )

    def _release(self, c: Peer, msg: ForceRelease, now: float) -> None:
        rid = msg.request_id
        if self._not_admin(c, rid, "release") or self._forbidden(c, rid, "release", msg.namespace):
            return
        outs = self.core.release(
            c,
            rid,
            msg.namespace,
            msg.table,
            msg.var,
            msg.session,
            now=now,
            trust=self.trust.trust(now),
        )
        # A replica answers once the log is applied: then the count is not known here.
        released = outs[-1][1] if outs else None
        admin_log.info(
            "admin %r (connection %s): release %s/%s/%s%s: %s",
            c.principal.name,
            c.name,
            msg.namespace,
            msg.table,
            msg.var,
            "" if msg.session is None else f" of session {msg.session!r}",
            "proposed to the group"
            if released is None
            else f"{getattr(released, 'entries', '?')} entries removed",
        )
        self.deliver(outs, c)

    def _end(self, c: Peer, msg: EndSession, now: float) -> None:
        sid = msg.session_id
        principal = c.principal
        # Whose session it is, read for the log line only (the door decides).
        owner = self.core.session_principal(sid) if self.auth is not None else None
        foreign = owner is not None and owner != principal.name
        if foreign and principal.admin:
            admin_log.info(
                "admin %r (connection %s): end session %r of principal %r",
                principal.name,
                c.name,
                sid,
                owner,
            )
        outs = self.core.end_session(
            c,
            msg.request_id,
            sid,
            now=now,
            trust=self.trust.trust(now),
            principal=principal.name,
            admin=principal.admin,
        )
        self.deliver(outs, c)

    def _hello(self, c: Peer, hello: Hello) -> None:
        rid = hello.request_id
        if c.proto.state is State.READY:
            self._invalid(c, rid, ErrorCode.INVALID_MESSAGE, "hello: the handshake is already done")
            return
        if hello.version != PROTOCOL_VERSION:  # a closing code: the connection closes
            self._invalid(
                c,
                rid,
                ErrorCode.UNSUPPORTED_VERSION,
                f"hello: protocol version {hello.version} is not supported, this "
                f"server speaks version {PROTOCOL_VERSION}",
            )
            return
        if self.auth is not None:
            principal = self.auth.authenticate(hello.token)
            if principal is None:
                # Never log or echo the presented token.
                log.info(
                    "connection %s: authentication failed (%s token), closing",
                    c.name,
                    "no" if hello.token is None else "invalid",
                )
                self._invalid(  # a closing code: the connection closes
                    c,
                    rid,
                    ErrorCode.UNAUTHORIZED,
                    "hello: a valid token is required"
                    if hello.token is None
                    else "hello: the token is not valid",
                )
                return
            c.principal = principal
        c.proto.handshake_done()  # -> READY: every request is decoded from now on
        c.client_name = hello.client_name
        log.debug(
            "connection %s: hello from %r (principal %r)",
            c.name,
            hello.client_name,
            c.principal.name,
        )
        c.outbox += c.proto.send(Reply(rid, self.welcome))

    def _invalid(self, c: Peer, rid: int, code: ErrorCode, message: str) -> None:
        """An invalid request the codec could not see (it depends on connection or server
        state): counted with the protocol errors, answered with ``code``."""
        self.protocol_errors += 1
        c.outbox += c.proto.send(ErrorReply(rid, code, message))

    # --- delivering what the door returned ----------------------------------------------------

    def deliver(self, outs: list[Output[Peer]], current: Peer | None = None) -> None:
        """Send every output to its peer, in order: appended to its outbox; ``current``'s
        (the peer whose batch is being served) goes out with the batch, every other peer's
        is sent once all are appended (one send per peer, however many outputs it got). A
        peer that is gone is sent nothing.

        Feed events (module header): each change's one FeedEvent is encoded once for all
        its subscribers (``protocol.FeedFrames``); a subscriber past ``feed_buffer`` unsent
        bytes costs a counter increment."""
        touched: dict[Peer, None] = {}
        shared: FeedEvent | None = None
        frames: FeedFrames | None = None
        feed_buffer = self.feed_buffer
        for (peer, rid), payload in outs:
            p: Any = peer
            t = type(payload)
            if t is FeedEvent:  # addressed (peer, subscription id)
                if p.dead:
                    continue
                if len(p.outbox) > feed_buffer:
                    p.feed_dropped += 1
                    self.feed_dropped += 1
                    continue
                if payload is not shared:
                    shared = payload  # type: ignore[assignment]
                    frames = FeedFrames(shared)  # type: ignore[arg-type]
                assert frames is not None and rid is not None
                p.outbox += frames.frame(rid, p.feed_dropped)
                p.feed_dropped = 0
                self.feed_sent += 1
            elif t is LockLost:
                for data in self._lost_frames(payload):  # type: ignore[arg-type]
                    self.events_sent += 1
                    if not p.dead:
                        p.outbox += data
            else:
                assert rid is not None
                if t is TransactionResult:
                    data = p.proto.send_result(rid, payload)
                elif t is EngineError:
                    data = self._refusal(p, rid, payload)  # type: ignore[arg-type]
                elif t is SessionsListing:
                    data = p.proto.send(Reply(rid, sessions_page(payload)))  # type: ignore[arg-type]
                else:  # SessionEnded, Cancelled, the operator's answers
                    data = p.proto.send(Reply(rid, payload))  # type: ignore[arg-type]
                if not p.dead:
                    p.outbox += data
            if p is not current and not p.dead:
                touched[p] = None
        for p in touched:
            p.send_pending()
            if p.proto.state is _CLOSED:  # an INTERNAL_ERROR went out: close it
                p.stop(None, "")

    def _refusal(self, c: Peer, rid: int, err: EngineError) -> bytes:
        """The error reply of a request the door refused (a limit, another principal's
        session), or that hit a bug (INTERNAL_ERROR: logged, the connection is closed after
        it: the code closes the connection)."""
        code = err.code
        if code is ErrorCode.INTERNAL_ERROR:
            self.internal_errors += 1
            log.error(
                "connection %s: internal error serving request %d",
                c.name,
                rid,
                exc_info=err.__cause__,
            )
        elif code is ErrorCode.SESSION_CONFLICT or code is ErrorCode.FORBIDDEN:
            self.protocol_errors += 1  # an invalid request, like the shell's FORBIDDEN
        return c.proto.send(ErrorReply(rid, code, err.message))

    def _lost_frames(self, event: LockLost) -> list[bytes]:
        """The frames of one LockLost event: one, or the entries split over several events
        when one frame would pass the 1 MiB a client accepts (a session of 30,000 entries)."""
        data = self.encoder.send(event)
        if len(data) - HEADER_SIZE <= DEFAULT_MAX_FRAME or len(event.entries) < 2:
            return [data]
        half = len(event.entries) // 2
        first = attrs.evolve(event, entries=event.entries[:half])
        second = attrs.evolve(event, entries=event.entries[half:])
        return self._lost_frames(first) + self._lost_frames(second)


def sessions_page(listing: SessionsListing) -> SessionsPage:
    """A sessions page with each record's ``clients``: the addresses of the open connections
    that used the session."""
    records = tuple(
        attrs.evolve(record, clients=tuple(o.address for o in owners if not o.dead))  # type: ignore[attr-defined]
        for record, owners in zip(listing.page.sessions, listing.owners, strict=True)
    )
    return attrs.evolve(listing.page, sessions=records)
