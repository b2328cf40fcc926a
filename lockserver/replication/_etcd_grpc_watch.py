"""The reading end of one etcd watch over etcd's gRPC API: :class:`GrpcWatchStream` turns
the ``Watch`` call's stream of ``WatchResponse`` messages into batches of
:class:`WatchEvent`, with the same interface and rules as the gateway's
:class:`~lockserver.replication._etcd_watch.WatchStream` (``_etcd_watch.py``: one response
is one batch, fragments joined at revision boundaries, opening confirmed by "created",
bounded against a hostile server, never ending quietly, closing at once).

The differences are the transport's: each message is bounded by ``max_message`` from its
length prefix (``_etcd_grpc.py``), a message that has begun must arrive whole within
``timeout`` seconds, and a message protobuf cannot parse is a clear error naming the
endpoint (the stream is closed; the caller resumes from its last revision + 1).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from . import _etcd_rpc_pb2 as pb
from ._etcd_grpc import GrpcConnection, GrpcPool, GrpcStatus, MessageReader
from ._etcd_http import Endpoint, MaybeSent, NotSent
from ._etcd_json import (
    AuthRenew,
    Compacted,
    EtcdAuthError,
    EtcdUnavailable,
    WatchEvent,
    b64,
    error_of,
    malformed,
)
from ._etcd_watch import join_fragments, stream_broke, stream_ended

__all__ = ["GrpcWatchStream"]

_WATCH = "/etcdserverpb.Watch/Watch"


class GrpcWatchStream:
    """One open watch over gRPC: its own HTTP/2 connection, read into event batches."""

    def __init__(
        self, pool: GrpcPool, endpoint: Endpoint, *, timeout: float, max_message: int
    ) -> None:
        self.endpoint = endpoint
        self._pool = pool
        self._timeout = timeout
        self._max = max_message
        self._conn: GrpcConnection | None = None
        self._reader: MessageReader | None = None
        self._pending: list[list[WatchEvent]] = []
        self._held: list[WatchEvent] = []
        self._held_bytes = 0

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def open(self, create: dict[str, Any], metadata: list[tuple[str, str]]) -> None:
        """Send the create request (the gateway's JSON form, as ``_etcd.py`` builds it) and
        read up to etcd's "created" answer (the caller bounds the time). Raises
        :class:`NotSent` / :class:`MaybeSent` for the transport, an EtcdError for etcd's
        refusal."""
        c = create["create_request"]
        request = pb.WatchRequest(
            create_request=pb.WatchCreateRequest(
                key=b64(c["key"]),
                range_end=b64(c["range_end"]),
                start_revision=int(c["start_revision"]),
                fragment=bool(c.get("fragment", False)),
            )
        ).SerializeToString()
        self._conn, self._reader = await self._pool.open_stream(
            self.endpoint, _WATCH, request, metadata, self._max
        )
        self._reader.timeout = self._timeout
        while True:
            response = await self._next_response(opening=True)
            self._take(response)
            if response.created:
                return

    def __aiter__(self) -> GrpcWatchStream:
        return self

    async def __anext__(self) -> list[WatchEvent]:
        while not self._pending:
            self._take(await self._next_response(opening=False))
        return self._pending.pop(0)

    def _take(self, response: pb.WatchResponse) -> None:
        """Keep a response's events as batches cut at revision boundaries; raise for a
        cancelled watch."""
        if response.canceled:
            compact = response.compact_revision
            if compact:
                raise Compacted(
                    f"etcd at {self.url}: the watch's start revision is compacted "
                    f"(history starts at {compact})",
                    compact_revision=compact,
                    endpoint=self.url,
                )
            reason = (response.cancel_reason or "no reason given")[:1000]
            error = error_of(self.url, _WATCH, {"message": reason}, {})
            if isinstance(error, AuthRenew | EtcdAuthError):
                raise error
            raise EtcdUnavailable(
                f"etcd at {self.url} cancelled the watch: {reason}", endpoint=self.url
            )
        events = [
            WatchEvent(
                kind="delete" if e.type == pb.Event.DELETE else "put",
                key=e.kv.key,
                value=e.kv.value,
                mod_revision=e.kv.mod_revision,
            )
            for e in response.events
        ]
        events, self._held, self._held_bytes = join_fragments(
            self._held, events, response.fragment, self._max, self.url
        )
        if events:
            self._pending.append(events)

    async def _next_response(self, *, opening: bool) -> pb.WatchResponse:
        """The next message, parsed. A stream that ends, breaks, passes a bound or carries
        what is not a WatchResponse raises EtcdUnavailable (while opening: the transport's
        own NotSent / MaybeSent, or etcd's refusal as its EtcdError)."""
        assert self._reader is not None
        try:
            message = await self._reader.next()
        except GrpcStatus as e:
            raise error_of(self.url, _WATCH, {"code": e.code, "message": e.message}, {}) from None
        except (NotSent, MaybeSent) as e:
            raise stream_broke(self.url, e, opening) from None
        if message is None:
            raise stream_ended(self.url, opening)
        try:
            response: pb.WatchResponse = pb.WatchResponse.FromString(message)
        except DecodeError as e:
            raise malformed(self.url, _WATCH, f"not a WatchResponse ({e})") from None
        return response

    def close(self) -> None:
        """Close the stream's connection (at once; nothing is awaited)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool.close_stream(conn)
