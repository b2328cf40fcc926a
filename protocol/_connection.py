"""Sans-I/O protocol state for one side of a connection (h11's shape).

Why: both the server shell and the client need "bytes in -> messages out, messages in ->
bytes out" with the same framing and limits. ``receive_data`` buffers, ``next_message`` pulls
one decoded message or None when more bytes are needed, ``send`` returns the framed bytes.
No sockets, no clock, no trio.

Error model: a framing or msgpack error (``ErrorCode`` 1xx) poisons the stream: every later
``next_message`` raises it again. A well-framed but invalid request (2xx/3xx) raises once with
the offending ``request_id`` and the stream carries on with the next frame.

Before the handshake (server role with ``require_hello``, as the server runs it): until the
server calls :meth:`Connection.handshake_done` a frame may be at most ``MAX_HELLO_FRAME`` bytes,
and only a ``hello`` is decoded past its ``type``: any other request is HANDSHAKE_REQUIRED
without its tree or fields being looked at, so a peer that has not authenticated can make the
server do almost nothing. On the server side a frame also may hold at most
``max_frame // 16`` arrays and maps (``unpack``).
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
from ._errors import ErrorCode, ProtocolError
from ._framing import DEFAULT_MAX_FRAME, MAX_HELLO_FRAME, FrameBuffer, frame
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

    __slots__ = (
        "_broken",
        "_buffer",
        "_greeted",
        "_max_containers",
        "_max_frame",
        "limits",
        "role",
    )

    def __init__(
        self,
        role: Role,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        limits: TreeLimits = DEFAULT_TREE_LIMITS,
        require_hello: bool = False,
    ) -> None:
        self.role = role
        self.limits = limits
        self._max_frame = max_frame
        server = role is Role.SERVER
        gated = server and require_hello
        self._greeted = not gated
        self._buffer = FrameBuffer(min(max_frame, MAX_HELLO_FRAME) if gated else max_frame)
        self._max_containers = max(1024, max_frame // 16) if server else None
        # The error that broke the stream, kept as (code, message, request id): every later
        # call raises a fresh ProtocolError from it. Keeping the raised exception itself would
        # tie its traceback's frames (the caller's connection objects among them) into a
        # reference cycle through this attribute, freed only by a full collection (measured:
        # ~40 objects per connection closed after a framing error).
        self._broken: tuple[ErrorCode, str, int | None] | None = None

    @property
    def max_frame(self) -> int:
        """The largest accepted frame payload, in bytes (once the handshake is done)."""
        return self._max_frame

    @property
    def greeted(self) -> bool:
        """Whether requests other than hello are decoded (True unless ``require_hello`` was
        asked and :meth:`handshake_done` not called yet)."""
        return self._greeted

    def handshake_done(self) -> None:
        """The hello was accepted (``require_hello``): from now on frames up to ``max_frame``
        are read and every request is decoded."""
        self._greeted = True
        self._buffer.max_frame = self._max_frame

    @property
    def buffered(self) -> int:
        """Bytes received but not yet decoded."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed received bytes. Raises ProtocolError (FRAME_TOO_LARGE) as soon as a header
        announces an oversized frame."""
        if self._broken is not None:
            raise self._broken_error()
        try:
            self._buffer.feed(data)
        except ProtocolError as exc:
            self._break(exc)
            raise

    def next_frame(self) -> bytes | None:
        """The next whole frame payload (undecoded), or None. For callers that count or
        forward frames without decoding them."""
        if self._broken is not None:
            raise self._broken_error()
        try:
            return self._buffer.next_frame()
        except ProtocolError as exc:
            self._break(exc)
            raise

    def next_message(self) -> Request | ServerMessage | None:
        """Decode the next complete message, or return None when more bytes are needed."""
        payload = self.next_frame()
        if payload is None:
            return None
        try:
            wire = unpack(payload, self._max_containers)
        except ProtocolError as exc:
            if exc.code.closes_connection:
                self._break(exc)
            raise
        return self.decode(wire)

    def _break(self, exc: ProtocolError) -> None:
        self._broken = (exc.code, exc.message, exc.request_id)

    def _broken_error(self) -> ProtocolError:
        assert self._broken is not None
        code, message, request_id = self._broken
        return ProtocolError(code, message, request_id=request_id)

    def decode(self, wire: Any) -> Request | ServerMessage:
        """Decode one already-unpacked wire structure for this role."""
        if self.role is Role.SERVER:
            if not self._greeted and not (type(wire) is dict and wire.get("type") == "hello"):
                raise _handshake_required(wire)
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


def _handshake_required(wire: Any) -> ProtocolError:
    """The refusal of a request before the handshake: its id when it has a valid one, its
    type when it has a known one; nothing else of it is looked at."""
    rid = wire.get("id") if type(wire) is dict else None
    if type(rid) is not int or not 0 <= rid <= 2**64 - 1:
        rid = None
    kind = wire.get("type") if type(wire) is dict else None
    what = kind if type(kind) is str and len(kind) <= 16 else "a request"
    return ProtocolError(
        ErrorCode.HANDSHAKE_REQUIRED,
        f"{what}: the first request on a connection must be hello",
        request_id=rid,
    )
