"""The reading end of one etcd watch over the HTTP/JSON gateway: :class:`WatchStream` turns
the gateway's stream of JSON lines into batches of :class:`WatchEvent`.

Rules kept:
- **One gateway line is one watch response** (``{"result": ...}`` or ``{"error": {...}}``,
  newline-terminated). A response's events are one batch, so one revision's events (a
  transaction's) are never split. Responses without events (the "created" answer, progress
  notifications) are skipped.
- **Fragments are joined at revision boundaries.** The watch is created with ``fragment``:
  etcd then cuts a response larger than its request limit (1.5 MiB by default) into pieces,
  all but the last marked ``fragment``, so no line is larger than about that limit however
  far behind the watch starts. The events of a fragment's last revision are held back until
  the next piece, so a batch still never splits a revision, and memory stays one piece plus
  one revision.
- **Opening is confirmed**: :meth:`WatchStream.open` returns once etcd has said "created", so
  a write made after it is on the stream.
- **Bounded against a hostile or broken server**: a line longer than ``max_line`` bytes, a
  line that has begun but does not end within ``timeout`` seconds, held-back events past
  ``max_line`` bytes, or a line that is not a watch response raise (the stream is closed).
  Waiting for the *next* line has no bound here: a quiet group writes nothing (the replica's
  watch guard tells a quiet group from a silent member: ``_replica.py``).
- **A stream never ends quietly.** A cancelled watch raises :class:`Compacted` (with etcd's
  compact revision) or :class:`EtcdUnavailable` (etcd's reason); an ended or broken
  connection raises :class:`EtcdUnavailable`. The caller resumes from its last revision + 1.
- **Closing is immediate and complete**: the connection is closed; nothing is left for the
  collector (the stream is read with plain calls, no async generators).
"""

from __future__ import annotations

import json
from typing import Any

import trio

from ._etcd_http import Connection, Endpoint, MaybeSent, NotSent, Pool
from ._etcd_json import (
    AuthRenew,
    Compacted,
    EtcdAuthError,
    EtcdUnavailable,
    WatchEvent,
    decode,
    error_of,
    int64,
    malformed,
)

__all__ = ["WatchStream", "join_fragments", "stream_broke", "stream_ended"]


def stream_broke(url: str, cause: NotSent | MaybeSent, opening: bool) -> Exception:
    """What a watch stream raises when its transport failed: the transport's own error while
    the watch is being opened (the caller's not-sent / maybe-sent rule), else
    EtcdUnavailable (the replica reopens the watch)."""
    if opening:
        return cause
    return EtcdUnavailable(f"etcd at {url}: the watch stream broke ({cause})", endpoint=url)


def stream_ended(url: str, opening: bool) -> Exception:
    """What a watch stream raises when etcd ended it (before the watch was created: a
    maybe-sent request)."""
    if opening:
        return MaybeSent("the stream ended before etcd created the watch")
    return EtcdUnavailable(f"etcd at {url} ended the watch stream", endpoint=url)


def join_fragments(
    held: list[WatchEvent], events: list[WatchEvent], fragment: bool, bound: int, url: str
) -> tuple[list[WatchEvent], list[WatchEvent], int]:
    """A watch response's ``events`` after those ``held`` back from the previous fragment:
    ``(events to deliver now, events to hold, their bytes)``. While more of a response
    follows (``fragment``), its last revision may continue there, so its events are held;
    held events past ``bound`` bytes raise EtcdUnavailable."""
    if held:
        events = held + events
    if not (events and fragment):
        return events, [], 0
    last = events[-1].mod_revision
    cut = len(events)
    while cut and events[cut - 1].mod_revision == last:
        cut -= 1
    held = events[cut:]
    held_bytes = sum(len(e.key) + len(e.value) for e in held)
    if held_bytes > bound:
        raise EtcdUnavailable(
            f"etcd at {url}: one revision of the watch passes {bound} bytes across fragments",
            endpoint=url,
        )
    return events[:cut], held, held_bytes


class WatchStream:
    """One open watch: the HTTP answer streaming JSON lines, read into event batches."""

    def __init__(self, pool: Pool, endpoint: Endpoint, *, timeout: float, max_line: int) -> None:
        self.endpoint = endpoint
        self._pool = pool
        self._timeout = timeout
        self._max_line = max_line
        self._conn: Connection | None = None
        self._buffer = bytearray()
        self._pending: list[list[WatchEvent]] = []
        self._held: list[WatchEvent] = []
        self._held_bytes = 0

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def open(self, create: dict[str, Any], headers: list[tuple[str, str]]) -> None:
        """Send the create request and read up to etcd's "created" answer (the caller bounds
        the time); the events that came with it are kept for the first reads. Raises
        :class:`NotSent` / :class:`MaybeSent` for the transport, an EtcdError for etcd's
        refusal."""
        data = json.dumps(create, separators=(",", ":")).encode()
        self._conn, status = await self._pool.open_stream(self.endpoint, "/v3/watch", data, headers)
        if status != 200:
            parts = []
            size = 0
            while (piece := await self._conn.read_body()) is not None:
                size += len(piece)
                if size > self._max_line:
                    raise MaybeSent(f"the answer is larger than {self._max_line} bytes")
                parts.append(piece)
            answer = decode(self.url, "/v3/watch", status, b"".join(parts))
            raise error_of(self.url, "/v3/watch", answer, create)
        while True:
            result = await self._next_result(opening=True)
            self._take(result)
            if result.get("created", False):
                return

    def __aiter__(self) -> WatchStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while not self._pending:
            self._take(await self._next_result(opening=False))
        return self._pending.pop(0)

    def _take(self, result: dict[str, Any]) -> None:
        """Keep a result's events as batches cut at revision boundaries; raise for a
        cancelled watch."""
        if result.get("canceled", False):
            compact = int64(result, "compact_revision")
            if compact:
                raise Compacted(
                    f"etcd at {self.url}: the watch's start revision is compacted "
                    f"(history starts at {compact})",
                    compact_revision=compact,
                    endpoint=self.url,
                )
            reason = str(result.get("cancel_reason", "no reason given"))[:1000]
            error = error_of(self.url, "/v3/watch", {"message": reason}, {})
            if isinstance(error, AuthRenew | EtcdAuthError):  # a token to renew, or refused
                raise error
            raise EtcdUnavailable(
                f"etcd at {self.url} cancelled the watch: {reason}", endpoint=self.url
            )
        raw = result.get("events", [])
        if not isinstance(raw, list):
            raise malformed(self.url, "/v3/watch", "events is not a list")
        try:
            events = [WatchEvent.from_json(e) for e in raw]
        except (TypeError, ValueError, AttributeError) as e:
            raise malformed(self.url, "/v3/watch", str(e)) from None
        events, self._held, self._held_bytes = join_fragments(
            self._held, events, bool(result.get("fragment", False)), self._max_line, self.url
        )
        if events:
            self._pending.append(events)

    async def _next_result(self, *, opening: bool) -> dict[str, Any]:
        """The next line's ``result``. A stream that ends, breaks or passes a bound raises
        EtcdUnavailable (while opening: the transport's own NotSent / MaybeSent)."""
        while (newline := self._buffer.find(b"\n")) < 0:
            if len(self._buffer) > self._max_line:
                raise EtcdUnavailable(
                    f"etcd at {self.url}: a watch answer is longer than {self._max_line} bytes",
                    endpoint=self.url,
                )
            piece = await self._read(started=bool(self._buffer), opening=opening)
            self._buffer += piece
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        if not line.strip():
            return {}
        message = decode(self.url, "/v3/watch", 200, line)
        if "result" not in message:
            error = message.get("error", message)
            raise error_of(self.url, "/v3/watch", error if isinstance(error, dict) else {}, {})
        result = message["result"]
        if not isinstance(result, dict):
            raise malformed(self.url, "/v3/watch", "result is not an object")
        return result

    async def _read(self, *, started: bool, opening: bool) -> bytes:
        assert self._conn is not None
        try:
            if started:
                # A line has begun: the rest of it comes promptly or the stream is broken.
                with trio.fail_after(self._timeout):
                    piece = await self._conn.read_body()
            else:
                piece = await self._conn.read_body()
        except trio.TooSlowError:
            raise EtcdUnavailable(
                f"etcd at {self.url}: a watch answer did not arrive whole within {self._timeout} s",
                endpoint=self.url,
            ) from None
        except (NotSent, MaybeSent) as e:
            raise stream_broke(self.url, e, opening) from None
        if piece is None:
            raise stream_ended(self.url, opening)
        return piece

    def close(self) -> None:
        """Close the stream's connection (at once; nothing is awaited)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.close_stream(conn)
