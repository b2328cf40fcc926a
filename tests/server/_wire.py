"""A minimal protocol client for the server tests (the real client library lives elsewhere).

It speaks through ``protocol.Connection(Role.CLIENT)`` over a real trio TCP stream, keeps
events (LockLost) and replies that arrived out of turn, and matches replies by request id.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import trio

from lockserver import RunningServer
from protocol import (
    Connection,
    EndSession,
    ErrorReply,
    Execute,
    Hello,
    LockLost,
    Ping,
    Reply,
    ReplyBody,
    Request,
    Role,
    SelectConstantValue,
    ServerMessage,
    SessionSpec,
    Statement,
    Transaction,
    TransactionResult,
    Welcome,
    frame,
    pack,
    request_to_wire,
)

#: Generous: a test client accepts any reply the server may send.
CLIENT_MAX_FRAME = 64 * 1024 * 1024


class ServerClosed(Exception):
    """The server closed the connection (EOF) while a reply was awaited."""


class WireClient:
    """One raw protocol connection to a test server."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT, max_frame=CLIENT_MAX_FRAME)
        self.inbox: list[ServerMessage] = []  # received, not yet claimed, in arrival order
        self.closed = False
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, server: RunningServer | int, *, hello: bool = True) -> WireClient:
        port = server if isinstance(server, int) else server.port
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        if hello:
            await client.hello()
        return client

    async def __aenter__(self) -> WireClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.stream.aclose()

    def rid(self) -> int:
        return next(self._ids)

    # --- sending ------------------------------------------------------------------------------

    async def send(self, *messages: Request) -> None:
        """Encode all messages and send them in ONE write."""
        await self.send_raw(b"".join(self.proto.send(m) for m in messages))

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    # --- receiving ----------------------------------------------------------------------------

    async def _fill(self) -> None:
        """Receive once and decode whatever is complete into the inbox."""
        if self.closed:
            raise ServerClosed("the server closed the connection")
        data = await self.stream.receive_some(1 << 16)
        if not data:
            self.closed = True
            raise ServerClosed("the server closed the connection")
        self.proto.receive_data(data)
        while (msg := self.proto.next_message()) is not None:
            self.inbox.append(msg)  # type: ignore[arg-type]

    async def receive(self) -> ServerMessage:
        """The next message of any kind, in arrival order."""
        while not self.inbox:
            await self._fill()
        return self.inbox.pop(0)

    async def reply(self, request_id: int | None) -> Reply | ErrorReply:
        """The reply (or error reply) to ``request_id``; other messages stay in the inbox."""
        while True:
            for i, msg in enumerate(self.inbox):
                if isinstance(msg, (Reply, ErrorReply)) and msg.request_id == request_id:
                    del self.inbox[i]
                    return msg
            await self._fill()

    async def event(self) -> LockLost:
        """The next LockLost event; replies stay in the inbox."""
        while True:
            for i, msg in enumerate(self.inbox):
                if isinstance(msg, LockLost):
                    del self.inbox[i]
                    return msg
            await self._fill()

    def events(self) -> list[LockLost]:
        """Take the LockLost events already received."""
        found = [m for m in self.inbox if isinstance(m, LockLost)]
        self.inbox = [m for m in self.inbox if not isinstance(m, LockLost)]
        return found

    async def read_until_closed(self) -> list[ServerMessage]:
        """Every message until the server's EOF (raises on a reset: a clean close is
        part of the contract)."""
        while not self.closed:
            try:
                await self._fill()
            except ServerClosed:
                break
        messages, self.inbox = self.inbox, []
        return messages

    # --- request helpers ----------------------------------------------------------------------

    async def request(self, message: Request) -> Reply | ErrorReply:
        await self.send(message)
        return await self.reply(message.request_id)

    async def call(self, message: Request) -> ReplyBody:
        """Send, and return the reply body (fails the test on an ErrorReply)."""
        answer = await self.request(message)
        assert isinstance(answer, Reply), answer
        return answer.body

    async def error(self, message: Request) -> ErrorReply:
        """Send, and return the error reply (fails the test on a Reply)."""
        answer = await self.request(message)
        assert isinstance(answer, ErrorReply), answer
        return answer

    async def hello(self, version: int | None = None) -> Welcome:
        msg = (
            Hello(self.rid(), client_name="tests")
            if version is None
            else Hello(self.rid(), version, "tests")
        )
        body = await self.call(msg)
        assert isinstance(body, Welcome)
        return body

    def execute_message(
        self,
        session: str,
        statements: Iterable[Statement],
        *,
        namespace: str = "ns",
        max_age: float = 60.0,
        wait: float | None = None,
        **tx: Any,
    ) -> Execute:
        return Execute(
            self.rid(),
            SessionSpec(session, max_age),
            Transaction(namespace, tuple(statements), **tx),
            wait,
        )

    async def execute(
        self, session: str, *statements: Statement, **kwargs: Any
    ) -> TransactionResult:
        body = await self.call(self.execute_message(session, statements, **kwargs))
        assert isinstance(body, TransactionResult)
        return body

    async def end_session(self, session: str) -> bool:
        body = await self.call(EndSession(self.rid(), session))
        return body.existed  # type: ignore[union-attr]

    async def ping(self) -> None:
        await self.call(Ping(self.rid()))


async def wait_for(condition: Callable[[], bool], *, interval: float = 0.005) -> None:
    """Poll ``condition`` until it holds (for server-side effects of a client's action that
    no reply reports, e.g. noticing a closed connection). Callers bound it with fail_after."""
    while not condition():
        await trio.sleep(interval)


def frame_of_size(c: WireClient, size: int) -> tuple[bytes, int]:
    """A framed, valid Execute whose payload is exactly ``size`` bytes, and its request id."""
    msg = c.execute_message("s", [SelectConstantValue("pad", "")])
    base = len(pack(request_to_wire(msg)))
    pad = "x" * (size - base - 2)  # the str header grows from 1 to 3 bytes past 31 chars
    msg = c.execute_message("s", [SelectConstantValue("pad", pad)])
    payload = pack(request_to_wire(msg))
    assert len(payload) == size, (len(payload), size)
    return frame(payload), msg.request_id


BIG = "y" * 60_000  # each flooding request and its reply carry this value


async def flood(c: WireClient, count: int) -> None:
    """Send ``count`` big requests without reading; stop quietly when the server hangs up."""
    try:
        for _ in range(count):
            await c.send(c.execute_message("flood", [SelectConstantValue("v", BIG)]))
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
