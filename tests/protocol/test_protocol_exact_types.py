"""Numbers keep their wire type through the codec, in the pure and the compiled build alike
(lockserver/_build.py: a compiled function converts an int it receives where ``float`` is
declared, so the codec's paths declare what they really carry). A request decoded and encoded
again is the same bytes; an int stays an int."""

from __future__ import annotations

from typing import Any

import pytest

from protocol import pack, request_from_wire, request_to_wire, unpack

BASE: dict[str, Any] = {
    "type": "execute",
    "id": 7,
    "session": "s",
    "namespace": "ns",
    "statements": [["Assert", ["SetVar", "t", "v"]]],
}


@pytest.mark.parametrize(
    "extra",
    [
        {"min_uptime": 5, "min_trust": 1},
        {"min_uptime": 5.0, "min_trust": 0.5},
        {"wait": 0},
        {"wait": 3},
        {"wait": 2.5},
        {"session_description": "d", "tx_id": "x", "description": "y", "wait": 1},
    ],
    ids=repr,
)
def test_a_decoded_execute_encodes_to_the_same_bytes(extra: dict[str, Any]) -> None:
    """An execute through the decoder's fast path and back: the same msgpack bytes, so the
    same type of every number (an int sent is an int echoed, never 5 -> 5.0). (``max_age``
    is not among them: a SessionSpec makes it a float in both builds.)"""
    wire = {**BASE, **extra}
    data = pack(wire)
    request = request_from_wire(unpack(data))
    again = request_to_wire(request)
    for key, value in extra.items():
        assert type(again[key]) is type(value), (key, again[key])
    assert pack(again) == data
