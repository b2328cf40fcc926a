"""Sans-I/O protocol state for one side of a connection (h11's shape).

Why: both the server shell and the client need "bytes in -> messages out, messages in ->
bytes out" with the same framing and limits. ``receive_data`` buffers, ``next_message`` pulls
one decoded message or None when more bytes are needed, ``send`` returns the framed bytes.
No sockets, no clock, no trio.

Error model: a framing or msgpack error (``ErrorCode`` 1xx) poisons the stream: every later
``next_message`` raises it again. A well-framed but invalid request (2xx/3xx) raises once with
the offending ``request_id`` and the stream carries on with the next frame.
"""

from __future__ import annotations

import enum
from typing import Any

from ._codec import (
    pack,
    request_from_wire,
    request_to_wire,
    result_to_wire,
    server_message_from_wire,
    server_message_to_wire,
    unpack,
)
from ._errors import ProtocolError
from ._framing import DEFAULT_MAX_FRAME, FrameBuffer, frame
from ._messages import Request, ServerMessage, TransactionResult
from ._trees import DEFAULT_TREE_LIMITS, TreeLimits

__all__ = ["Role", "Connection"]


class Role(enum.Enum):
    """Which side this Connection speaks for."""

    CLIENT = "client"  # sends requests, receives server messages
    SERVER = "server"  # receives requests, sends server messages


class Connection:
    """One side of the protocol. ``next_message`` returns requests on the server side and
    server messages (Reply / ErrorReply / LockLost) on the client side."""

    __slots__ = ("_broken", "_buffer", "limits", "role")

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        limits: TreeLimits = DEFAULT_TREE_LIMITS,
    ) -> None:
        self.role = role
        self.limits = limits
        self._buffer = FrameBuffer(max_frame)
        self._broken: ProtocolError | None = None

    @property
    def max_frame(self) -> int:
        """The largest accepted frame payload, in bytes."""
        return self._buffer.max_frame

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes. Raises ProtocolError (FRAME_TOO_LARGE) as soon as a header
        announces an oversized frame."""
        if self._broken is not None:
            raise self._broken
        try:
            self._buffer.feed(data)
        except ProtocolError as exc:
            self._broken = exc
            raise

    def next_frame(self) -> bytes | None:
        """The next whole frame payload (undecoded), or None. For callers that count or
        forward frames without decoding them."""
        if self._broken is not None:
            raise self._broken
        try:
            return self._buffer.next_frame()
        except ProtocolError as exc:
            self._broken = exc
            raise

    def next_message(self) -> Request | ServerMessage | None:
        """Decode the next complete message, or return None when more bytes are needed."""
        payload = self.next_frame()
        if payload is None:
            return None
        try:
            wire = unpack(payload)
        except ProtocolError as exc:
            self._broken = exc
            raise
        return self.decode(wire)

    def decode(self, wire: Any) -> Request | ServerMessage:
        """Decode one already-unpacked wire structure for this role."""
        if self.role is Role.SERVER:
            return request_from_wire(wire, self.limits)
        return server_message_from_wire(wire)

    def send(self, message: Request | ServerMessage) -> bytes:
        """Return the framed bytes for ``message``."""
        if self.role is Role.SERVER:
            wire = server_message_to_wire(message)  # type: ignore[arg-type]
        else:
            wire = request_to_wire(message)  # type: ignore[arg-type]
        return frame(pack(wire))

    def send_result(self, request_id: int, body: TransactionResult) -> bytes:
        """The framed bytes of ``Reply(request_id, body)`` (server role), without building the
        Reply: the server's per-transaction path."""
        return frame(pack(result_to_wire(request_id, body)))
