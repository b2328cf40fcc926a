"""Length-prefixed framing: a 4-byte big-endian unsigned length, then that many bytes.

Why: msgpack documents are not self-delimiting cheaply, and a length prefix lets both sides
reject an oversized frame *before* buffering it (the header is read first, the limit checked,
and only then are bytes kept). :class:`FrameBuffer` is sans-I/O: feed it whatever the socket
gave, pull complete frames until it says it needs more. Partial frames stay buffered; nothing is
consumed until a whole frame is there (the consume/commit idea of wsproto's ``Buffer``).

Memory: only received bytes are stored, never the size a header announces. When the frames
handed out are followed by an incomplete one, they are dropped at that point (the "needs
more" answer), so what the buffer holds between feeds is what ``len()`` reports: a server
counts that against its budget for incomplete frames (issue 14), and 60 KiB of whole frames
followed by one byte of the next must not keep 60 KiB. That costs a copy of the incomplete
bytes, once per feed that ends mid-frame after whole frames; a feed that ends on a frame
boundary empties the buffer instead.
"""

from __future__ import annotations

from ._errors import ErrorCode, ProtocolError

__all__ = ["DEFAULT_MAX_FRAME", "HEADER_SIZE", "MAX_HELLO_FRAME", "FrameBuffer", "frame"]

HEADER_SIZE = 4
DEFAULT_MAX_FRAME = 1024 * 1024  # 1 MiB: a transaction tree never needs more
#: The largest frame a server reads before the handshake (a hello: a name and a token).
MAX_HELLO_FRAME = 16 * 1024
_MAX_ENCODABLE = 0xFFFFFFFF


def frame(payload: bytes) -> bytes:
    """Return ``payload`` with its 4-byte big-endian length prefix."""
    size = len(payload)
    if size > _MAX_ENCODABLE:
        raise ValueError(f"payload of {size} bytes cannot be framed (max {_MAX_ENCODABLE})")
    return size.to_bytes(4, "big") + payload


class FrameBuffer:
    """Accumulates received bytes and yields whole frame payloads.

    ``max_frame`` bounds one payload; a header announcing more raises
    :class:`ProtocolError` (``FRAME_TOO_LARGE``) without buffering the body. After such an error
    the stream cannot be resynchronised: the caller must close the connection.
    """

    __slots__ = ("_buf", "_pos", "max_frame")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if max_frame < 1:
            raise ValueError(f"max_frame must be >= 1, got {max_frame}")
        #: The largest payload accepted now (a server raises it after the handshake).
        self.max_frame = max_frame
        self._buf = bytearray()
        self._pos = 0  # start of the first unconsumed byte; compacted lazily

    def __len__(self) -> int:
        """Number of buffered, not yet consumed bytes."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append received bytes."""
        # (No "everything consumed" reset here: next_frame() already empties the buffer when
        # it hands out the last buffered byte.)
        self._buf += data
        if len(self._buf) - self._pos >= HEADER_SIZE:
            self._check_header()

    def _check_header(self) -> int:
        """Return the size announced by the pending header; raise if it is over the limit."""
        pos = self._pos
        size = int.from_bytes(self._buf[pos : pos + HEADER_SIZE], "big")
        if size > self.max_frame:
            before = " before the handshake" if self.max_frame == MAX_HELLO_FRAME else ""
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame of {size} bytes exceeds the limit of {self.max_frame} bytes{before}",
            )
        return size

    def next_frame(self) -> bytes | None:
        """Return the next complete payload, or None when more bytes are needed."""
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail < HEADER_SIZE:
            if pos:
                self._drop_consumed()
            return None
        size = self._check_header()
        end = pos + HEADER_SIZE + size
        if len(buf) < end:
            if pos:
                self._drop_consumed()
            return None
        payload = bytes(buf[pos + HEADER_SIZE : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > 65536 and end * 2 > len(buf):
            # Compact once the consumed prefix dominates, so memory stays bounded.
            del buf[:end]
            self._pos = 0
        else:
            # No header check of the next frame here: raising now would lose this payload.
            # The next feed() or next_frame() call checks it before any body is buffered.
            self._pos = end
        return payload

    def _drop_consumed(self) -> None:
        """Forget the frames handed out before the incomplete one (see the module's header)."""
        del self._buf[: self._pos]
        self._pos = 0
