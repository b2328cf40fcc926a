"""Fixtures of the tooz driver's tests: a real server in a thread (tooz is a blocking API) and
coordinators made the way a tooz user makes them, ``tooz.coordination.get_coordinator(url,
member_id)``, through tooz's ``tooz.backends`` entry point (so the tests also show that the
install registered it), stopped after the test.

tooz is in the ``test`` extra (and the ``tooz`` extra), like every other test dependency."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import ThreadedServer
from tooz import coordination
from tooz_support import Make, member, url_of

from lockserver import RunningServer


@pytest.fixture
def url(threaded_server: ThreadedServer[RunningServer]) -> str:
    """The URL of a real server (port 0) in a thread of its own."""
    return url_of(threaded_server.port)


@pytest.fixture
def coordinators(url: str) -> Iterator[Make]:
    """``make(member_id=None, url=None, start=True)``: a coordinator of ``url`` (a fresh
    member id unless given), started unless asked not to; every one still started is
    stopped after the test."""
    made: list[coordination.CoordinationDriver] = []

    def make(
        member_id: bytes | None = None, url_: str | None = None, *, start: bool = True
    ) -> coordination.CoordinationDriver:
        c = coordination.get_coordinator(url_ or url, member_id or member())
        made.append(c)
        if start:
            c.start()
        return c

    yield make
    for c in made:
        if c.is_started:
            c.stop()
