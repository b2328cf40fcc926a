"""The records as JSON (``protocol.record_to_json``, ``json_value``, ``iso_utc``): the one
rendering the server's HTTP listings and the client's ``to_json`` share.

Pinned down: field names are the wire's; times become ISO 8601 UTC to the millisecond (None
stays None); tuples become lists; a user value becomes valid JSON whatever it holds
(binaries as ``{"base64": ...}``, non-finite floats as ``{"float": ...}``, nested too), so
``json.dumps(..., allow_nan=False)`` never fails on a record.
"""

from __future__ import annotations

import json
import math

import attrs

from protocol import (
    FeedEvent,
    FeedKind,
    HolderInfo,
    WaiterInfo,
    iso_utc,
    json_value,
    record_to_json,
)


def test_iso_utc_to_the_millisecond() -> None:
    """Unix seconds as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    assert iso_utc(0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1795780985.25) == "2026-11-27T12:03:05.250Z"


def test_user_values_become_valid_json() -> None:
    """Scalars, strings, lists and maps pass; bytes and non-finite floats are tagged, at any
    depth; tuples become lists."""
    assert json_value(None) is None and json_value(True) is True and json_value(2**64 - 1)
    assert json_value("é") == "é" and json_value(1.5) == 1.5
    assert json_value(b"\x00\xff") == {"base64": "AP8="}
    assert json_value(math.inf) == {"float": "Infinity"}
    assert json_value(-math.inf) == {"float": "-Infinity"}
    assert json_value(math.nan) == {"float": "NaN"}
    nested = {"a": [b"x", (1, math.inf)], "b": {"c": b""}}
    assert json_value(nested) == {
        "a": [{"base64": "eA=="}, [1, {"float": "Infinity"}]],
        "b": {"c": {"base64": ""}},
    }


def test_records_render_with_the_wire_field_names() -> None:
    """A holder with a binary value and a waiter: every attrs field by its name, times as
    ISO 8601 UTC, an absent expiry None, variables as lists; the whole dumps as strict JSON."""
    holder = HolderInfo("n", "t", "v", "s", "d", {"k": b"\x01"}, None, 1.0, None, 7)
    as_json = record_to_json(holder)
    assert list(as_json) == [f.name for f in attrs.fields(HolderInfo)]
    assert as_json["acquired_at"] == "1970-01-01T00:00:01.000Z"
    assert as_json["expires_at"] is None and as_json["value"] == {"k": {"base64": "AQ=="}}
    waiter = WaiterInfo("s", "n", "", (("t", "v", 0),), 2.0, 3.5)
    assert record_to_json(waiter)["variables"] == [["t", "v", 0]]
    assert record_to_json(waiter)["deadline"] == "1970-01-01T00:00:03.500Z"
    event = FeedEvent(1, FeedKind.GRANTED, "n", "t", "v", "s", 9, 4.0)
    assert record_to_json(event)["at"] == "1970-01-01T00:00:04.000Z"
    for record in (holder, waiter, event):
        json.dumps(record_to_json(record), allow_nan=False)
