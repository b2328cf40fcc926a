"""Helpers of the tooz driver's tests (importable as ``tooz_support`` from tests/tooz)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from tooz import coordination

#: ``coordinators(member_id=None, url_=None, *, start=True)``: the fixture's factory.
Make = Callable[..., coordination.CoordinationDriver]


def url_of(port: int, query: str = "") -> str:
    """The URL of a local server, with ``query`` (``a=1&b=2``) when given."""
    return f"lockserver://127.0.0.1:{port}" + (f"?{query}" if query else "")


def member() -> bytes:
    """A fresh member id, as tooz users make them (text as bytes)."""
    return f"member-{uuid.uuid4().hex[:12]}".encode()
