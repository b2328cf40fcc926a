"""HTTP tests: their servers start from ``TEST_CONFIG`` (127.0.0.1, port 0), like the server
tests; ``start_server`` is the suite's helper (tests/support.py) with that base bound."""

from __future__ import annotations

import functools

import pytest
import support

from lockserver import ServerConfig

#: Settings every HTTP test's server gets unless a test overrides them.
TEST_CONFIG = ServerConfig(host="127.0.0.1", port=0)

#: ``await start_server(nursery, **overrides)``: TEST_CONFIG plus ``overrides``.
start_server = functools.partial(support.start_server, config=TEST_CONFIG)


@pytest.fixture
def server_config() -> ServerConfig:
    """The ``server`` fixture of these tests starts from TEST_CONFIG."""
    return TEST_CONFIG
