"""The fuzz tests' server: a real one in a background thread (its own trio run), shared by the
module. Hypothesis runs each example synchronously with blocking sockets; the server keeps
running across examples, so its counters and memory can be checked at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import ThreadedServer

from lockserver import RunningServer


@pytest.fixture(scope="module")
def thread_server() -> Iterator[ThreadedServer[RunningServer]]:
    server: ThreadedServer[RunningServer] = ThreadedServer().start()
    try:
        yield server
    finally:
        server.stop()
