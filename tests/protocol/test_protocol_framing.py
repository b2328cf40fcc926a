"""Framing: the 4-byte big-endian length prefix and the sans-I/O FrameBuffer."""

from __future__ import annotations

import pytest

from protocol import (
    DEFAULT_MAX_FRAME,
    HEADER_SIZE,
    ErrorCode,
    FrameBuffer,
    ProtocolError,
    frame,
)


def drain(buf: FrameBuffer) -> list[bytes]:
    """Pull every complete frame currently buffered."""
    out = []
    while (payload := buf.next_frame()) is not None:
        out.append(payload)
    return out


def test_frame_prefixes_big_endian_length() -> None:
    """frame() writes the payload length as 4 big-endian bytes, then the payload."""
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert frame(b"x" * 0x0102) == b"\x00\x00\x01\x02" + b"x" * 0x0102
    assert HEADER_SIZE == 4
    assert DEFAULT_MAX_FRAME == 1024 * 1024


@pytest.mark.pure_only("a bytes subclass's __len__: compiled code reads the bytes' own size")
def test_frame_refuses_payload_over_4_gib() -> None:
    """A payload whose length does not fit in 32 bits cannot be framed (ValueError)."""

    class Huge(bytes):
        def __len__(self) -> int:
            return 2**32

    with pytest.raises(ValueError, match="cannot be framed"):
        frame(Huge())


def test_max_frame_must_be_positive() -> None:
    """A FrameBuffer needs max_frame >= 1."""
    with pytest.raises(ValueError, match="max_frame must be >= 1"):
        FrameBuffer(0)
    assert FrameBuffer().max_frame == DEFAULT_MAX_FRAME


def test_whole_frame() -> None:
    """One whole frame fed at once comes out once, then the buffer is empty."""
    buf = FrameBuffer()
    buf.feed(frame(b"hello"))
    assert buf.next_frame() == b"hello"
    assert buf.next_frame() is None
    assert len(buf) == 0


def test_partial_frame_is_kept_until_complete() -> None:
    """A partial header or partial body yields None and stays buffered."""
    buf = FrameBuffer()
    data = frame(b"payload")
    buf.feed(data[:2])
    assert buf.next_frame() is None
    assert len(buf) == 2
    buf.feed(data[2:6])
    assert buf.next_frame() is None
    assert len(buf) == 6
    buf.feed(data[6:])
    assert buf.next_frame() == b"payload"
    assert len(buf) == 0


def test_many_frames_in_one_feed() -> None:
    """Several frames in one feed come out in order, the partial tail stays."""
    buf = FrameBuffer()
    payloads = [b"a", b"", b"bc" * 100, b"def"]
    tail = frame(b"next")[:5]
    buf.feed(b"".join(frame(p) for p in payloads) + tail)
    assert drain(buf) == payloads
    assert len(buf) == len(tail)
    buf.feed(frame(b"next")[5:])
    assert drain(buf) == [b"next"]


@pytest.mark.parametrize("payload", [b"", b"x", b"0123456789abcdef"])
def test_frame_split_at_every_byte_position(payload: bytes) -> None:
    """However two frames are split in two feeds, both come out intact and in order."""
    data = frame(payload) + frame(b"second")
    for cut in range(len(data) + 1):
        buf = FrameBuffer()
        got = []
        buf.feed(data[:cut])
        got += drain(buf)
        buf.feed(data[cut:])
        got += drain(buf)
        assert got == [payload, b"second"], cut
        assert len(buf) == 0


def test_one_byte_at_a_time() -> None:
    """Feeding single bytes yields each frame exactly when its last byte arrives."""
    payloads = [b"one", b"", b"three"]
    data = b"".join(frame(p) for p in payloads)
    buf = FrameBuffer()
    got = []
    for i in range(len(data)):
        buf.feed(data[i : i + 1])
        got += drain(buf)
    assert got == payloads


def test_oversized_header_rejected_before_body() -> None:
    """A header announcing more than max_frame raises FRAME_TOO_LARGE on feed, with only the
    header received: the body is never waited for."""
    buf = FrameBuffer(max_frame=100)
    with pytest.raises(ProtocolError) as info:
        buf.feed((101).to_bytes(4, "big"))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE
    assert "101 bytes" in info.value.message
    assert "100 bytes" in info.value.message
    assert info.value.request_id is None


def test_oversized_header_rejected_when_completed_byte_by_byte() -> None:
    """The check fires as soon as the 4th header byte arrives."""
    buf = FrameBuffer(max_frame=10)
    header = (2**32 - 1).to_bytes(4, "big")
    for b in header[:3]:
        buf.feed(bytes([b]))
    with pytest.raises(ProtocolError) as info:
        buf.feed(header[3:])
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_exactly_max_frame_accepted_and_one_more_rejected() -> None:
    """A payload of exactly max_frame bytes passes; max_frame + 1 is refused."""
    buf = FrameBuffer(max_frame=64)
    buf.feed(frame(b"z" * 64))
    assert buf.next_frame() == b"z" * 64
    with pytest.raises(ProtocolError) as info:
        buf.feed(frame(b"z" * 65))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_default_max_frame_boundary() -> None:
    """With the default limit, 1 MiB passes and 1 MiB + 1 is refused from its header alone."""
    buf = FrameBuffer()
    buf.feed(frame(bytes(DEFAULT_MAX_FRAME)))
    assert buf.next_frame() == bytes(DEFAULT_MAX_FRAME)
    with pytest.raises(ProtocolError) as info:
        buf.feed((DEFAULT_MAX_FRAME + 1).to_bytes(4, "big"))
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_oversized_frame_after_good_one_keeps_the_good_one() -> None:
    """A valid frame followed by an oversized header: the valid frame is still delivered, the
    next pull raises FRAME_TOO_LARGE (nothing received before the bad header is lost)."""
    buf = FrameBuffer(max_frame=10)
    buf.feed(frame(b"ok") + (11).to_bytes(4, "big"))
    assert buf.next_frame() == b"ok"
    with pytest.raises(ProtocolError) as info:
        buf.next_frame()
    assert info.value.code is ErrorCode.FRAME_TOO_LARGE


def test_oversized_header_behind_good_frame_rejected_on_next_feed() -> None:
    """Once the good frame is consumed, the next feed checks the pending oversized header
    even before its body arrives."""
    buf = FrameBuffer(max_frame=10)
    buf.feed(frame(b"ok") + (11).to_bytes(4, "big"))
    assert buf.next_frame() == b"ok"
    with pytest.raises(ProtocolError):
        buf.feed(b"")


def test_zero_length_frames() -> None:
    """Zero-length frames are valid and come out as empty payloads."""
    buf = FrameBuffer()
    buf.feed(frame(b"") * 3)
    assert drain(buf) == [b"", b"", b""]
    assert len(buf) == 0


def test_len_counts_unconsumed_bytes() -> None:
    """len(buffer) is the number of bytes received and not yet returned."""
    buf = FrameBuffer()
    buf.feed(frame(b"abc") + frame(b"de"))
    assert len(buf) == 7 + 6
    buf.next_frame()
    assert len(buf) == 6
    buf.next_frame()
    assert len(buf) == 0


def test_accepts_bytearray_and_memoryview() -> None:
    """feed() takes any bytes-like object."""
    buf = FrameBuffer()
    data = frame(b"abc")
    buf.feed(bytearray(data[:3]))
    buf.feed(memoryview(data)[3:])
    assert buf.next_frame() == b"abc"


def test_compaction_when_drained() -> None:
    """Feeding and draining many frames leaves nothing buffered, and the internal storage does
    not grow with the number of frames processed."""
    buf = FrameBuffer()
    chunk = b"".join(frame(bytes([i % 256]) * 50) for i in range(20))
    for _ in range(2000):
        buf.feed(chunk)
        assert len(drain(buf)) == 20
        assert len(buf) == 0
    assert len(buf._buf) <= len(chunk)  # white box: storage is bounded


def test_compaction_with_a_partial_frame_always_pending() -> None:
    """When every feed ends mid-frame (the buffer is never fully drained), the consumed prefix
    is still dropped once it dominates: storage stays bounded by a small multiple of what is
    pending, and every frame still comes out intact and in order."""
    buf = FrameBuffer()
    payloads = [i.to_bytes(4, "big") * 250 for i in range(3000)]  # 1000 bytes each
    stream = b"".join(frame(p) for p in payloads)
    step = 3001  # not a multiple of the frame size: feeds end mid-frame
    got: list[bytes] = []
    peak = 0
    for start in range(0, len(stream), step):
        buf.feed(stream[start : start + step])
        got += drain(buf)
        peak = max(peak, len(buf._buf))  # white box: storage is bounded
    assert got == payloads
    assert len(buf) == 0
    assert peak < 4 * 65536


def test_compaction_keeps_pending_bytes_intact() -> None:
    """After a compaction the pending partial frame is unchanged and completes normally."""
    buf = FrameBuffer()
    big = b"q" * 70000
    buf.feed(frame(big) + frame(b"tail")[:6])
    assert buf.next_frame() == big  # consumed prefix > 64 KiB and dominates: compacts
    assert len(buf) == 6
    buf.feed(frame(b"tail")[6:])
    assert buf.next_frame() == b"tail"
