"""A minimal HTTP/1.1 client for the HTTP tests: raw bytes out, responses parsed by h11.

Raw on purpose: the tests send what no polite client library would (garbage after a method,
oversized heads, requests that never end) and need to see exactly what comes back, and
whether the connection stays open.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import h11
import trio


@attrs.frozen
class Response:
    """One parsed response."""

    status: int
    headers: dict[str, str]  # names lower-case
    body: bytes

    def json(self) -> Any:
        assert self.headers["content-type"] == "application/json", self.headers
        return json.loads(self.body)


class HttpClient:
    """One HTTP connection to a test server."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> HttpClient:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def request(
        self, method: str, path: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> Response:
        """Send one well-formed request and read its response."""
        await self.send_raw(request_bytes(method, path, headers))
        return await self.response(head=method == "HEAD")

    async def response(self, *, head: bool = False) -> Response:
        """Read the next response (``head``: it answers a HEAD, so it has no body)."""
        conn = self.h11
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        if conn.our_state is h11.IDLE:
            # The request went out raw: tell h11 what was asked, so it frames the response.
            conn.send(
                h11.Request(method="HEAD" if head else "GET", target="/", headers=[("Host", "t")])
            )
            conn.send(h11.EndOfMessage())
        status = 0
        headers: dict[str, str] = {}
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await self.stream.receive_some(65536))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {n.decode(): v.decode() for n, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return Response(status, headers, body)
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def closed(self) -> bool:
        """True when the server closed the connection (EOF) with nothing more to read."""
        return await self.stream.receive_some(65536) == b""


def request_bytes(method: str, path: str, headers: tuple[tuple[str, str], ...] = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: lockserver.test"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def get(port: int, path: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """One GET on a fresh connection."""
    client = await HttpClient.connect(port)
    try:
        return await client.request("GET", path, headers)
    finally:
        await client.aclose()
