"""Helpers of the security tests: ``start_server`` (the suite's one helper, tests/support.py,
with this folder's base config bound), and a raw wire client (for what the client library
hides: the exact error and the server closing the connection)."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import support
import trio

from lockserver import RunningServer, ServerConfig
from protocol import Connection, Hello, Reply, Role

#: 127.0.0.1, port 0, the default log level; tests add TLS and tokens as overrides.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0)

#: ``await start_server(nursery, **overrides)``: TEST_CONFIG plus ``overrides``.
start_server = functools.partial(support.start_server, config=TEST_CONFIG)


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
