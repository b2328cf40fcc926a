"""A tiny lock server for client tests: the real engine behind protocol.Connection(SERVER)
over trio sockets, plus knobs the real server does not have (hold requests unanswered, answer
a batch in reverse order, drop connections).

Why: the client must be tested for behaviours that are hard to provoke on a correct server
(a request genuinely in flight when the connection dies, replies out of order). The end-to-end
tests use the real server (``lockserver.serve``); these use this one.
"""

from __future__ import annotations

import contextlib
from typing import Any

import trio

from lockserver.engine import Engine, EngineError
from protocol import (
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
    Ping,
    Pong,
    ProtocolError,
    Reply,
    Role,
    ServerMessage,
    SessionEnded,
    Statistics,
    Welcome,
)


class FakeServer:
    """Serve with ``await nursery.start(fake.serve)``; ``fake.port`` then holds the port."""

    def __init__(self) -> None:
        self.engine = Engine(started_at=trio.current_time(), host="fake")
        self.host = "127.0.0.1"
        self.port = 0
        self.hold = False  # read requests but answer none (they stay "in flight")
        # Answer this many more requests, then hold the rest (as ``hold``): a batch that is
        # partly answered when the connection drops. None: no limit.
        self.hold_after: int | None = None
        self.reverse = False  # answer each received batch in reverse order
        self.hello_error: ErrorCode | None = None  # refuse the handshake with this code
        self.held: list[tuple[Any, trio.SocketStream]] = []  # (request, its connection)
        self.received: list[Any] = []
        self.streams: set[trio.SocketStream] = set()
        self.users: dict[str, set[trio.SocketStream]] = {}  # session id -> connections
        # One send at a time per connection: replies, released replies and the sweeper's
        # events may be sent from different tasks.
        self.send_locks: dict[trio.SocketStream, trio.Lock] = {}
        self.cancel_scope = trio.CancelScope()

    async def serve(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        with self.cancel_scope:
            listeners = await trio.open_tcp_listeners(0, host=self.host)
            self.port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sweeper)
                await nursery.start(trio.serve_listeners, self._handle, listeners)
                task_status.started(self)

    def stop(self) -> None:
        """Stop serving: every connection is closed."""
        self.cancel_scope.cancel()

    async def drop_connections(self) -> None:
        """Close every client connection (the server keeps running)."""
        for stream in list(self.streams):
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await stream.aclose()

    async def release(self) -> None:
        """Answer the held requests now (late), and stop holding."""
        self.hold = False
        held, self.held = self.held, []
        for msg, stream in held:
            await self._send(stream, [self._answer(msg, stream)])

    async def _sweeper(self) -> None:
        while True:
            await trio.sleep(0.05)
            self.engine.sweep(trio.current_time())
            await self._push_lost(None)

    async def _push_lost(self, exclude: trio.SocketStream | None) -> None:
        for event in self.engine.drain_lost():
            for stream in list(self.users.get(event.session_id, ())):
                if stream is not exclude:
                    await self._send(stream, [event])

    async def _send(self, stream: trio.SocketStream, messages: list[ServerMessage]) -> None:
        conn = Connection(Role.SERVER)
        data = b"".join(conn.send(m) for m in messages)
        lock = self.send_locks.setdefault(stream, trio.Lock())
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            async with lock:
                await stream.send_all(data)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.streams.add(stream)
        conn = Connection(Role.SERVER)
        try:
            while True:
                try:
                    data = await stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                conn.receive_data(data)
                replies: list[ServerMessage] = []
                while True:
                    try:
                        msg = conn.next_message()
                    except ProtocolError as exc:
                        replies.append(ErrorReply(exc.request_id, exc.code, exc.message))
                        if exc.code.closes_connection:
                            break
                        continue
                    if msg is None:
                        break
                    self.received.append(msg)
                    if self.hold_after is not None:
                        if self.hold_after == 0:
                            self.hold, self.hold_after = True, None
                        else:
                            self.hold_after -= 1
                    if self.hold:
                        self.held.append((msg, stream))
                        continue
                    replies.append(self._answer(msg, stream))
                if self.reverse:
                    replies.reverse()
                await self._send(stream, replies)
                await self._push_lost(stream)
        finally:
            self.streams.discard(stream)
            self.send_locks.pop(stream, None)
            for users in self.users.values():
                users.discard(stream)
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                await stream.aclose()

    def _answer(self, msg: Any, stream: trio.SocketStream) -> ServerMessage:
        now = trio.current_time()
        rid = msg.request_id
        t = type(msg)
        try:
            if t is Hello:
                if self.hello_error is not None:
                    return ErrorReply(rid, self.hello_error, "refused by the fake")
                return Reply(rid, Welcome(PROTOCOL_VERSION, "fake", "fake", {"max_depth": 32}))
            if t is Execute:
                self.users.setdefault(msg.session.session_id, set()).add(stream)
                return Reply(rid, self.engine.execute(msg.session, msg.transaction, now=now))
            if t is EndSession:
                return Reply(
                    rid, SessionEnded(self.engine.end_session(msg.session_id, now=now, notify=True))
                )
            if t is GetStatistics:
                return Reply(rid, Statistics(self.engine.statistics(now).to_wire()))
            if t is Ping:
                return Reply(rid, Pong(self.engine.uptime(now), 1.0))
            assert t is Cancel
            return Reply(rid, Cancelled(False))
        except EngineError as exc:
            return ErrorReply(rid, exc.code, str(exc))
