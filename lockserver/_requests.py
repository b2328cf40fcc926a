"""Serving requests: check a decoded batch, call the engine, queue the replies, route events.

The request half of the trio shell (``_server.py``). It changes for its own reasons (the
request set, its checks, authorization, session bookkeeping); the rest of the shell changes
with the I/O machinery. ``Requests`` is a mixin of the shell's ``_Shell``, not an object the shell
calls: the hot path (``_read_ready`` -> ``_process`` -> ``_execute`` -> engine) keeps exactly
the calls, attribute lookups and allocations it had when all of this was one class (the
server is benchmarked per microsecond). The state lives on the shell, set up in
``_Shell.__init__``; the annotations on ``Requests`` declare what this half uses.

Why / rules kept (issue #3, STYLE.md):
- The engine is called synchronously; nothing awaits between reading a batch of requests and
  queueing their replies, so transactions are serializable without a lock.
- A malformed frame (1xx, or any ``closes_connection`` code) is answered and the connection
  closed; a well-framed invalid request is answered and the connection stays usable; an
  ``EngineError`` (a limit) is answered, nothing changed; an unexpected exception while serving
  one request answers INTERNAL_ERROR, is logged with its traceback, closes that connection
  only.

Theory of operation
===================
**Sessions and LockLost.** ``users`` maps each session id to the connections that executed in
it (and each connection keeps the ids it used), cleaned when a connection closes or a session
ends or expires. After every batch of requests and every sweep, ``engine.drain_lost()`` is
routed through this map to the connections' outboxes. Sessions outlive connections: a client
that reconnects can keep using its session id, and one connection may use many sessions.

**Security** (issue #8, docs/security.md, ``_auth.py``). With tokens configured the hello
must carry a valid one (else UNAUTHORIZED, closed) and sets the connection's principal; an
Execute is checked against the principal's namespaces (FORBIDDEN) and the session's owner
(the principal that first used the session, kept by the engine as the session's opaque tag,
so it ends with the session; SESSION_CONFLICT), before the engine sees it. Without tokens all
of it is one ``is None`` test per Execute. (TLS is the shell's: see ``_server.py``.)

Prior art: h11/wsproto's sans-I/O split (the protocol package).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs
import trio

from protocol import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    PROTOCOL_VERSION,
    Cancel,
    Cancelled,
    Connection,
    EndSession,
    ErrorCode,
    ErrorReply,
    Execute,
    GetStatistics,
    Hello,
    LockLost,
    LostReason,
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Request,
    SessionEnded,
    Statistics,
    TransactionResult,
    Welcome,
)

from ._auth import Authenticator
from ._client import Client
from ._config import ServerConfig
from ._trust import TrustMonitor
from .engine import Engine, EngineError, ShardedDict, WaitQueue

log = logging.getLogger("lockserver")

# Replies of a long batch go out as soon as this many bytes are ready (~22 results), not at
# the batch's end: the client decodes the first replies while the rest are being served.
# Measured with one connection, 64 transactions per write (lockbench run mutex-uncontended
# --connections 1 --pipeline 64): 24k -> 30k acquire+release pairs/s; server CPU per request
# unchanged within noise (one more send per ~22 replies).
_EARLY_FLUSH: Final = 3072


class Requests:
    """The request-serving half of ``_Shell`` (a mixin: the shell owns and sets the state)."""

    # Set up by _Shell.__init__ (see there).
    config: ServerConfig
    max_session_age: float
    max_wait: float
    auth: Authenticator | None
    engine: Engine
    trust: TrustMonitor
    waits: WaitQueue
    wait_scope: trio.CancelScope | None
    welcome: Welcome
    encoder: Connection
    users: ShardedDict[set[Client]]
    requests_total: int
    protocol_errors: int
    internal_errors: int
    events_sent: int
    statistics: Callable[[float], dict[str, Any]]  # the shell's (GetStatistics)

    def _process(self, c: Client, data: memoryview) -> bool:
        """Decode and serve every complete frame in ``data``; False: close the connection.

        Synchronous on purpose: the whole batch runs without an await.
        """
        now = trio.current_time()
        c.last_recv = now
        proto = c.proto
        out = c.outbox
        keep = True
        try:
            proto.receive_data(data)
        except ProtocolError as exc:
            self.protocol_errors += 1
            out += proto.send(ErrorReply(exc.request_id, exc.code, exc.message))
            keep = False
        else:
            execute = self._execute
            other = self._request
            while True:
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
                    if type(msg) is Execute and c.greeted:
                        out += execute(c, msg, now)
                        if len(out) >= _EARLY_FLUSH:
                            c.flush()
                    else:
                        out += other(c, msg, now)
                        if self.engine.lost_queue:  # e.g. stats expired a session: route now
                            self._dispatch_lost()
                except EngineError as exc:
                    out += proto.send(ErrorReply(msg.request_id, exc.code, exc.message))
                except Exception:
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
                if c.closing:
                    keep = False
                    break
        self._dispatch_lost()
        c.send_pending()
        return keep and not c.dead

    def _execute(self, c: Client, msg: Execute, now: float) -> bytes:
        session = msg.session
        if session.max_age > self.max_session_age:
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.INVALID_MESSAGE,
                f"execute: session max_age {session.max_age:g} s exceeds the server's "
                f"max_session_age of {self.config.max_session_age:g} s",
            )
        wait = msg.wait
        if wait is not None and wait > self.max_wait:
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.INVALID_MESSAGE,
                f"execute: wait {wait:g} s exceeds the server's max_wait of "
                f"{self.config.max_wait:g} s",
            )
        if self.auth is not None:
            refusal = self._authorize(c, msg, now)
            if refusal is not None:
                return refusal
        trust = self.trust
        trust.record_call(now, source=c.principal.name if self.auth is not None else c)
        sid = session.session_id
        rid = msg.request_id
        token = (c, rid)
        engine = self.engine
        answers = self.waits.submit(
            c,
            token,
            session,
            msg.transaction,
            now=now,
            trust=trust.trust(now),
            wait=wait,
            principal=c.principal.name,
        )
        # Losses this call caused (it may have expired the session it then re-created) go to
        # the connections of the session that was lost, before this connection is counted
        # among the users of the session it uses now.
        if engine.lost_queue:
            self._dispatch_lost()
        # First use of a session on this connection: remember it for LockLost routing if the
        # session exists now (a refused call may have created nothing).
        if sid not in c.sessions and sid in engine.sessions:
            self._use(c, sid)
        if self.auth is not None:
            engine.tag_session(sid, c.principal.name)  # the first principal owns it
        if len(answers) == 1:
            answer = answers[0][1]
            if type(answer) is TransactionResult:  # the common case: answered, nothing parked
                return c.proto.send_result(rid, answer)
        own = bytearray()
        if wait is not None and wait > 0 and self.wait_scope is not None:
            deadline = now + wait
            self.wait_scope.deadline = min(self.wait_scope.deadline, deadline)
        for answered, result in answers:
            conn: Client
            conn_rid: int
            conn, conn_rid = answered  # type: ignore[misc]
            if conn is not c:
                self._answer(conn, conn_rid, result)
            elif type(result) is TransactionResult:
                own += c.proto.send_result(conn_rid, result)
            else:
                own += self._refusal(c, conn_rid, result)  # type: ignore[arg-type]
        return bytes(own)

    def _refusal(self, c: Client, rid: int, err: EngineError) -> bytes:
        """The error reply of a request the engine refused (a limit), or that hit a bug
        (INTERNAL_ERROR: logged, the connection is closed after it)."""
        if err.code is ErrorCode.INTERNAL_ERROR:
            self.internal_errors += 1
            log.error(
                "connection %s: internal error serving request %d",
                c.name,
                rid,
                exc_info=err.__cause__,
            )
            c.closing = True
        return c.proto.send(ErrorReply(rid, err.code, err.message))

    def _answer(self, c: Client, rid: int, answer: TransactionResult | EngineError) -> None:
        """Send a (parked) request's answer to its connection, whenever it comes."""
        if c.dead:
            return
        if type(answer) is TransactionResult:
            c.push(c.proto.send_result(rid, answer))
            return
        c.push(self._refusal(c, rid, answer))  # type: ignore[arg-type]
        if c.closing:
            c.stop(None, "")

    def _answer_all(self, answers: list[tuple[Any, TransactionResult | EngineError]]) -> None:
        for token, result in answers:
            conn, rid = token
            self._answer(conn, rid, result)
        if self.engine.lost_queue:
            self._dispatch_lost()

    def _request(self, c: Client, msg: Request, now: float) -> bytes:
        """Every request but a greeted Execute."""
        send = c.proto.send
        rid = msg.request_id
        t = type(msg)
        if t is Hello:
            hello: Any = msg
            if c.greeted:
                return self._invalid(
                    c, rid, ErrorCode.INVALID_MESSAGE, "hello: the handshake is already done"
                )
            if hello.version != PROTOCOL_VERSION:
                c.closing = True
                return self._invalid(
                    c,
                    rid,
                    ErrorCode.UNSUPPORTED_VERSION,
                    f"hello: protocol version {hello.version} is not supported, this "
                    f"server speaks version {PROTOCOL_VERSION}",
                )
            if self.auth is not None:
                principal = self.auth.authenticate(hello.token)
                if principal is None:
                    # Never log or echo the presented token.
                    log.info(
                        "connection %s: authentication failed (%s token), closing",
                        c.name,
                        "no" if hello.token is None else "invalid",
                    )
                    c.closing = True
                    return self._invalid(
                        c,
                        rid,
                        ErrorCode.UNAUTHORIZED,
                        "hello: a valid token is required"
                        if hello.token is None
                        else "hello: the token is not valid",
                    )
                c.principal = principal
            c.greeted = True
            c.proto.handshake_done()
            c.client_name = hello.client_name
            log.debug(
                "connection %s: hello from %r (principal %r)",
                c.name,
                hello.client_name,
                c.principal.name,
            )
            return send(Reply(rid, self.welcome))
        if not c.greeted:
            return self._invalid(
                c,
                rid,
                ErrorCode.HANDSHAKE_REQUIRED,
                f"{t.__name__}: the first request on a connection must be hello",
            )
        if t is Ping:
            return send(Reply(rid, Pong(self.engine.uptime(now), self.trust.trust(now))))
        if t is EndSession:
            if self.auth is not None:
                owner = self._owner_conflict(c, msg.session_id, now)  # type: ignore[union-attr]
                if owner is not None:
                    return self._invalid(c, rid, ErrorCode.SESSION_CONFLICT, owner)
            return send(Reply(rid, SessionEnded(self._end_session(c, msg.session_id, now))))  # type: ignore[union-attr]
        if t is GetStatistics:
            return send(Reply(rid, Statistics(self.statistics(now))))
        if t is Cancel:
            target = msg.target_id  # type: ignore[union-attr]
            last = self.waits.cancel((c, target))
            if last is None:
                return send(Reply(rid, Cancelled(False)))
            # The cancelled request is answered first, with its last failure; then waiters
            # that gave way to it (Waiting) get their chance.
            out = send(Reply(target, last)) + send(Reply(rid, Cancelled(True)))
            self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
            return out
        raise TypeError(f"no handler for {t.__name__}")

    # --- authorization (only with tokens configured) -------------------------------------------

    def _authorize(self, c: Client, msg: Execute, now: float) -> bytes | None:
        """The refusal of an Execute this principal may not run; None: allowed."""
        principal = c.principal
        namespace = msg.transaction.namespace
        if not principal.allows(namespace):
            return self._invalid(
                c,
                msg.request_id,
                ErrorCode.FORBIDDEN,
                f"execute: token {principal.name!r} may not use namespace {namespace!r}",
            )
        conflict = self._owner_conflict(c, msg.session.session_id, now)
        if conflict is not None:
            return self._invalid(c, msg.request_id, ErrorCode.SESSION_CONFLICT, conflict)
        return None

    def _owner_conflict(self, c: Client, sid: str, now: float) -> str | None:
        """The refusal message when session ``sid`` belongs to another principal, else None.
        The owner is the engine's tag of the session: it ends when the session does."""
        owner = self.engine.session_tag(sid, now)
        if owner is None or owner == c.principal.name:
            return None
        return f"session {sid!r} belongs to another principal"

    def _invalid(self, c: Client, rid: int, code: ErrorCode, message: str) -> bytes:
        """An invalid request the codec could not see (it depends on connection or server
        state): counted with the protocol errors, answered with ``code``."""
        self.protocol_errors += 1
        return c.proto.send(ErrorReply(rid, code, message))

    def _end_session(self, c: Client, sid: str, now: float) -> bool:
        users = self.users.get(sid)
        # Tell the session's other connections; the one ending it gets SessionEnded instead.
        notify = users is not None and any(u is not c for u in users)
        if users is not None and c in users:
            users.discard(c)
            c.sessions.discard(sid)
            if not users:
                del self.users[sid]
        existed = self.engine.end_session(sid, now=now, notify=notify)
        if existed and len(self.waits):
            self._answer_all(self.waits.process(now=now, trust=self.trust.trust(now)))
        # Route now, before a later request of this batch can reuse the id in a new session.
        self._dispatch_lost()
        return existed

    # --- sessions and events ------------------------------------------------------------------

    def _use(self, c: Client, sid: str) -> None:
        users = self.users.get(sid)
        if users is None:
            self.users[sid] = {c}
        else:
            users.add(c)
        c.sessions.add(sid)

    def _dispatch_lost(self) -> None:
        """Route the engine's LockLost events to the connections that used each session, as
        soon as the engine queued them (before a later request can re-create the session):
        with tokens, only to connections of the principal that owned the session. A loss
        that ends the session (expired, ended) ends its routing: those connections used a
        session that is gone, whatever reuses the id next."""
        lost = self.engine.drain_lost_tagged()
        if not lost:
            return
        users_by_session = self.users
        authenticated = self.auth is not None
        for event, owner in lost:
            sid = event.session_id
            users = users_by_session.get(sid)
            if not users:
                continue
            frames = self._lost_frames(event)
            for u in list(users):
                if authenticated and owner is not None and u.principal.name != owner:
                    continue  # never another principal's loss
                for data in frames:
                    self.events_sent += 1
                    u.push(data)
            if event.reason is not LostReason.TTL:
                del users_by_session[sid]
                for u in users:
                    u.sessions.discard(sid)

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
