"""The operator's records as JSON: the one rendering every JSON face uses (the server's HTTP
listings, ``lockctl --json``, the client's ``to_json``).

Why in ``protocol``: JSON is a second encoding of the same records (``_inspect.py``), with the
same field names as the msgpack wire; the server may not import ``client`` and the client
may not import ``lockserver``, so the encoding both need lives with the records.

Rules kept:
- Field names are the wire's; wall-clock times (Unix seconds, UTC) become ISO 8601 UTC
  strings to the millisecond (``2026-11-27T12:03:05.250Z``); tuples become lists.
- The result is always valid JSON (RFC 8259), whatever a user value holds: a binary becomes
  ``{"base64": "..."}`` and a non-finite float ``{"float": "Infinity" | "-Infinity" |
  "NaN"}`` (JSON has neither). Strings, numbers, bools, nil, arrays and maps pass as they are.
- Pure: no clock is read (``datetime.fromtimestamp`` converts a given number).
"""

from __future__ import annotations

import base64
import datetime as _dt
import math
from typing import Any, Final

import attrs

__all__ = ["iso_utc", "json_value", "record_to_json"]

#: Record fields that are wall-clock times (rendered as ISO 8601 UTC).
_TIMES: Final = frozenset(
    {"acquired_at", "expires_at", "created", "last_touch", "valid_until", "since", "deadline", "at"}
)
_NON_FINITE: Final = {math.inf: "Infinity", -math.inf: "-Infinity"}


def iso_utc(seconds: float) -> str:
    """Wall-clock Unix seconds as ISO 8601 UTC, to the millisecond:
    ``2026-11-26T12:03:05.250Z``."""
    moment = _dt.datetime.fromtimestamp(seconds, _dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def json_value(value: Any) -> Any:
    """A user value (nil, bool, int, float, str, bytes, lists and str-keyed maps of those) as
    a value ``json.dumps(..., allow_nan=False)`` accepts: binaries as ``{"base64": ...}``,
    non-finite floats as ``{"float": ...}``, tuples as lists; everything else unchanged."""
    t = type(value)
    if t is bytes:
        return {"base64": base64.b64encode(value).decode("ascii")}
    if t is float and not math.isfinite(value):
        return {"float": _NON_FINITE.get(value, "NaN")}
    if t is list or t is tuple:
        return [json_value(item) for item in value]
    if t is dict:
        return {key: json_value(item) for key, item in value.items()}
    return value


def record_to_json(record: Any) -> dict[str, Any]:
    """A record (``HolderInfo``, ``SessionInfo``, ``WaiterInfo``) or ``FeedEvent`` as a
    JSON-ready map with the wire's field names; times as ISO 8601 UTC strings, tuples as
    lists, user values as :func:`json_value` renders them."""
    out: dict[str, Any] = {}
    for field in attrs.fields(type(record)):
        value = getattr(record, field.name)
        if field.name in _TIMES and value is not None:
            value = iso_utc(value)
        elif field.name == "value":
            value = json_value(value)
        elif type(value) is tuple:
            value = [list(v) if type(v) is tuple else v for v in value]
        out[field.name] = value
    return out
