"""What a FrameBuffer holds in memory between feeds (issue 14, item 7): the received bytes of
the incomplete frame, as ``len()`` reports them, never the size a header announces and never
the whole frames handed out before it. (White box: ``sys.getsizeof`` of the storage, as the
compaction tests of test_protocol_framing.py look at ``_buf``.)"""

from __future__ import annotations

import sys

from protocol import FrameBuffer, frame

#: sys.getsizeof of a bytearray holding a few bytes, with room to spare.
SMALL = 1024


def _drain(buf: FrameBuffer) -> list[bytes]:
    out = []
    for _ in range(100_000):
        payload = buf.next_frame()
        if payload is None:
            return out
        out.append(payload)
    raise AssertionError("more frames than fed")


def test_a_header_announcing_a_megabyte_holds_only_what_arrived() -> None:
    """A 1 MiB header and 10 bytes: 14 bytes held, no storage for the announced size."""
    buf = FrameBuffer(max_frame=1024 * 1024)
    buf.feed((1024 * 1024).to_bytes(4, "big") + b"x" * 10)
    assert buf.next_frame() is None
    assert len(buf) == 14
    assert sys.getsizeof(buf._buf) < SMALL


def test_whole_frames_before_an_incomplete_one_are_not_kept() -> None:
    """60 KiB of whole frames and one byte of the next in one feed: once the frames are
    handed out, only that byte is held (it used to keep the 60 KiB until the next frame
    completed); the next frame then completes normally."""
    buf = FrameBuffer()
    frames = [bytes([i % 256]) * 36 for i in range(1500)]
    tail = frame(b"next")
    buf.feed(b"".join(frame(p) for p in frames) + tail[:1])
    assert _drain(buf) == frames
    assert len(buf) == 1
    assert sys.getsizeof(buf._buf) < SMALL
    buf.feed(tail[1:3])  # still no header: nothing to drop, nothing handed out
    assert _drain(buf) == []
    assert len(buf) == 3
    buf.feed(tail[3:])
    assert _drain(buf) == [b"next"]
    assert len(buf) == 0


def test_an_incomplete_body_after_whole_frames_is_kept_intact() -> None:
    """Whole frames followed by a header and part of a body: the partial frame is what is
    held, byte for byte, and completes across later feeds."""
    buf = FrameBuffer()
    body = bytes(range(256)) * 40
    data = frame(b"a" * 5000) + frame(b"b" * 5000) + frame(body)
    cut = 10_008 + 4 + 1000
    buf.feed(data[:cut])
    assert _drain(buf) == [b"a" * 5000, b"b" * 5000]
    assert len(buf) == 4 + 1000
    assert sys.getsizeof(buf._buf) < 4 * 1004
    buf.feed(data[cut:])
    assert _drain(buf) == [body]
