"""A feed event encoded once for all its subscribers (``protocol.FeedFrames``, issue 30): each
subscriber's frame decodes to exactly the event a whole encoding of its own event gives, the
length prefix is right, and the shared part is packed once whatever the number of frames."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st

from protocol import (
    Connection,
    FeedEvent,
    FeedFrames,
    FeedKind,
    Role,
    server_message_to_wire,
    unpack,
)

texts = st.text(max_size=8)
uint64 = st.integers(0, 2**64 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)
events = st.builds(
    FeedEvent,
    uint64,
    st.sampled_from(FeedKind),
    texts,
    texts,
    texts,
    texts,
    uint64,
    finite,
    st.none() | texts,
    uint64,
)


@given(events, uint64, uint64)
def test_a_subscribers_frame_is_its_own_event(event: FeedEvent, sub: int, dropped: int) -> None:
    """The frame of (subscription, dropped) unpacks to the wire map of the event with that
    subscription and count (its own two fields ignored), and a client decodes that event."""
    own = attrs.evolve(event, subscription=sub, dropped=dropped)
    data = FeedFrames(event).frame(sub, dropped)
    assert int.from_bytes(data[:4], "big") == len(data) - 4
    assert unpack(data[4:]) == server_message_to_wire(own)
    client = Connection(Role.CLIENT)
    client.receive_data(data)
    assert client.next_message() == own
    assert client.next_message() is None


def test_frames_of_one_event_share_its_packed_fields() -> None:
    """Frames for 1,000 subscriptions of one event: each differs from the others only in its
    own fields, the shared bytes are the same object (packed once), ``dropped`` defaults
    to 0."""
    event = FeedEvent(0, FeedKind.GRANTED, "ns", "t", "v", "s", 5, 1.5, None, 99)
    frames = FeedFrames(event)
    shared = frames._shared
    decoded = [unpack(frames.frame(i)[4:]) for i in range(1_000)]
    assert frames._shared is shared
    assert [w["subscription"] for w in decoded] == list(range(1_000))
    assert {w["dropped"] for w in decoded} == {0}
    for w in decoded:
        del w["subscription"]
    assert all(w == decoded[0] for w in decoded)
