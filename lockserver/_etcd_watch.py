"""The reading end of one etcd watch over the HTTP/JSON gateway: :class:`WatchStream` turns
the gateway's stream of JSON lines into batches of :class:`WatchEvent`, and closes it without
leaving anything behind; :func:`transport_cause` says in a few words why a connection failed;
:class:`OneChunk` is the request body every etcd call sends (a watch's create request too).

Rules kept:
- **One gateway line is one watch response** (``{"result": ...}`` or ``{"error": {...}}``,
  newline-terminated). A response's events are one batch, so one revision's events (a
  transaction's) are never split: etcd itself cuts its batches at revision boundaries.
  Responses without events (the "created" answer, progress notifications) are skipped.
- **Opening is confirmed**: :meth:`WatchStream.open` returns once etcd has said "created", so
  a write made after it is on the stream.
- **A stream never ends quietly.** A cancelled watch raises :class:`Compacted` (with etcd's
  compact revision) or :class:`EtcdUnavailable` (etcd's reason); an ended or broken
  connection raises :class:`EtcdUnavailable`. The caller resumes from its last revision + 1.
- **Closing is bounded and complete** (:data:`CLOSE_BOUND`, shielded from cancellation):
  httpx reads a body through a stack of async generators (encode/httpx#3686), and one left
  half-read makes trio warn when it is collected. So after the response is closed, the chunks
  are read on until they end: the closed connection ends every layer at once with a read
  error, and no generator is left behind. Request bodies are :class:`OneChunk`, not httpx's
  own (an async generator too), for the same reason: a send cut off by a cancellation left
  one for the collector, and trio's warning failed a replica test now and then.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
import httpx

from ._etcd_json import Compacted, EtcdUnavailable, WatchEvent, decode, error_of, int64

__all__ = ["CLOSE_BOUND", "OneChunk", "WatchStream", "transport_cause"]

#: Seconds closing a watch stream may take (it is local: the connection is closed, not asked).
CLOSE_BOUND: Final = 1.0


class WatchStream:
    """One open watch: the HTTP response streaming JSON lines, read into event batches."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None
        self._buffer = bytearray()
        self._pending: list[list[WatchEvent]] = []

    async def open(self, http: httpx.AsyncClient, create: dict[str, Any], timeout: float) -> None:
        """Send the create request and read up to etcd's "created" answer (the caller bounds
        the time); the events that came with it are kept for the first reads."""
        data = json.dumps(create, separators=(",", ":")).encode()
        request = http.build_request(
            "POST",
            self.endpoint + "/v3/watch",
            content=data,  # sets Content-Length
            headers={"Content-Type": "application/json"},
            timeout=httpx.Timeout(timeout, read=None),
        )
        request.stream = OneChunk(data)
        self._response = await http.send(request, stream=True)
        if self._response.status_code != httpx.codes.OK:
            content = await self._response.aread()
            answer = decode(self.endpoint, "/v3/watch", self._response.status_code, content)
            raise error_of(self.endpoint, "/v3/watch", answer, create)
        self._chunks = self._response.aiter_raw()
        while True:
            result = await self._next_result()
            if result.get("created", False):
                self._take(result)
                return
            self._take(result)

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while not self._pending:
            self._take(await self._next_result())
        return self._pending.pop(0)

    def _take(self, result: dict[str, Any]) -> None:
        """Keep a result's events as one batch; raise for a cancelled watch."""
        if result.get("canceled", False):
            compact = int64(result, "compact_revision")
            if compact:
                raise Compacted(
                    f"etcd at {self.endpoint}: the watch's start revision is compacted "
                    f"(history starts at {compact})",
                    compact_revision=compact,
                    endpoint=self.endpoint,
                )
            reason = result.get("cancel_reason", "no reason given")
            raise EtcdUnavailable(f"etcd at {self.endpoint} cancelled the watch: {reason}")
        events = [WatchEvent.from_json(e) for e in result.get("events", [])]
        if events:
            self._pending.append(events)

    async def _next_result(self) -> dict[str, Any]:
        """The next line's ``result``; a stream that ends or breaks raises EtcdUnavailable."""
        assert self._chunks is not None
        while (newline := self._buffer.find(b"\n")) < 0:
            try:
                chunk = await self._chunks.__anext__()
            except StopAsyncIteration:
                raise EtcdUnavailable(
                    f"etcd at {self.endpoint} ended the watch stream", endpoint=self.endpoint
                ) from None
            except httpx.TransportError as e:
                raise EtcdUnavailable(
                    f"etcd at {self.endpoint}: the watch stream broke ({transport_cause(e)})",
                    endpoint=self.endpoint,
                ) from None
            self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        if not line.strip():
            return {}
        message = decode(self.endpoint, "/v3/watch", 200, line)
        if "result" not in message:
            raise error_of(self.endpoint, "/v3/watch", message.get("error", message), {})
        result: dict[str, Any] = message["result"]
        return result

    async def aclose(self) -> None:
        """Close the stream and its connection, within :data:`CLOSE_BOUND` seconds even when
        the caller is being cancelled.

        httpx reads a body through a stack of async generators (encode/httpx#3686); one left
        half-read makes trio warn when it is collected. So after the response is closed, the
        chunks are read on until they end: the closed connection ends every layer at once
        with a read error, and no generator is left behind."""
        chunks, self._chunks = self._chunks, None
        response, self._response = self._response, None
        with anyio.move_on_after(CLOSE_BOUND, shield=True):
            if response is not None:
                await response.aclose()
            if chunks is not None:
                with contextlib.suppress(Exception):  # StopAsyncIteration or httpx.ReadError
                    while True:
                        await chunks.__anext__()


def transport_cause(e: BaseException) -> str:
    """A transport failure in a few words: the operating system's reason when one is in the
    exception's chain (httpx wraps anyio's group of connection attempts), else httpx's
    message."""
    for inner in _chain(e):
        if isinstance(inner, ConnectionRefusedError):
            return "connection refused"
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror.lower()
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _chain(e: BaseException) -> list[BaseException]:
    """``e``, its causes and contexts, and the members of any exception group among them."""
    seen: list[BaseException] = []
    todo = [e]
    while todo and len(seen) < 20:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(x for x in (current.__cause__, current.__context__) if x is not None)
    return seen


class OneChunk(httpx.AsyncByteStream):
    """A request body of one chunk whose iterator is a plain object, not an async generator:
    a send cut off by a cancellation leaves nothing for the collector to warn about (httpx's
    own byte stream is an async generator, encode/httpx#3686)."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _Once(self._data)


class _Once:
    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data

    def __aiter__(self) -> _Once:
        return self

    async def __anext__(self) -> bytes:
        data, self._data = self._data, None
        if data is None:
            raise StopAsyncIteration
        return data
