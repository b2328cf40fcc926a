"""Helpers of the security tests: a real server, and a raw wire client (for what the client
library hides: the exact error and the server closing the connection)."""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import trio

from lockserver import RunningServer, ServerConfig, serve
from protocol import Connection, Hello, Reply, Role

TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0)


async def start_server(nursery: trio.Nursery, **overrides: Any) -> RunningServer:
    """``serve`` in ``nursery`` on 127.0.0.1, port 0, with ``overrides``."""
    running: RunningServer = await nursery.start(serve, attrs.evolve(TEST_CONFIG, **overrides))
    return running


class Raw:
    """A plain TCP connection speaking the protocol by hand."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.proto = Connection(Role.CLIENT)
        self.next_id = 0

    @classmethod
    async def connect(cls, server: RunningServer) -> Raw:
        return cls(await trio.open_tcp_stream(server.host, server.port))

    def rid(self) -> int:
        self.next_id += 1
        return self.next_id

    async def send(self, msg: Any) -> None:
        await self.stream.send_all(self.proto.send(msg))

    async def receive(self) -> Any:
        """The next message (a Reply's body, an ErrorReply, an event); None at EOF."""
        while True:
            msg = self.proto.next_message()
            if isinstance(msg, Reply):
                return msg.body
            if msg is not None:
                return msg
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.proto.receive_data(data)

    async def hello(self, token: str | None) -> Any:
        await self.send(Hello(self.rid(), client_name="raw", token=token))
        return await self.receive()

    async def send_hello_quietly(self) -> None:
        """Send a plain hello; a peer that already closed is fine."""
        with contextlib.suppress(trio.BrokenResourceError):
            await self.send(Hello(self.rid(), client_name="raw"))

    async def receive_raw(self) -> bytes:
        """Whatever bytes come next (b"" at EOF or reset)."""
        try:
            return bytes(await self.stream.receive_some(65536))
        except trio.BrokenResourceError:
            return b""

    async def aclose(self) -> None:
        await self.stream.aclose()
