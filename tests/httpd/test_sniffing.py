"""The first-byte rule that puts HTTP on the protocol's port (PROTOCOL.md section 1).

Pinned down: exactly the upper-case ASCII letters start HTTP; every such byte, read as the
first byte of a frame header, announces more than the pre-handshake frame limit (so no valid
protocol connection is ever taken for HTTP); every hello the reference codec writes starts
with 0x00.
"""

from __future__ import annotations

from lockserver.http._http import is_http
from protocol import MAX_HELLO_FRAME, Connection, Hello, Role


def test_exactly_the_upper_case_letters_are_http() -> None:
    """is_http holds for A..Z and for no other byte value."""
    assert [b for b in range(256) if is_http(b)] == list(range(ord("A"), ord("Z") + 1))


def test_no_first_frame_header_starts_with_a_letter() -> None:
    """A first byte of A..Z makes a length of at least 0x41000000, far above the 16 KiB a
    frame may have before the handshake; the hello frames the codec writes, the longest
    client name and token included, start with 0x00 0x00."""
    for b in range(256):
        if is_http(b):
            assert b << 24 > MAX_HELLO_FRAME
    client = Connection(Role.CLIENT)
    for name, token in (("", None), ("c" * 1024, "t" * 8000)):
        data = client.send(Hello(1, 1, name, token))
        assert data[:2] == b"\x00\x00"
        assert not is_http(data[0])
