"""tooz's own conformance suite against the driver: ``TestAPI`` of tooz's
``tooz/tests/test_coordination.py`` (shipped in tooz's wheel), the tests every tooz driver is
held to, run unchanged against a real server (``TOOZ_TEST_URL``, as tooz's CI sets it).

Two adjustments, neither of the driver: the module imports three other drivers of tooz for
``isinstance`` checks (etcd3gw, memcached, ipc), whose client libraries are not installed
here, so empty stand-ins take their place (no test of ours uses them); and the two tests that
take the lock from a child process are left out, because the child imports tooz's test
module anew without those stand-ins (``test_tooz_locks`` and ``test_tooz_replicated`` cover
coordinators in other clients). One test skips itself: it is for drivers that can destroy a
group under its members. ``test_timeout`` sleeps 6 s (tooz's own, real time): a member that
does not beat leaves."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator

import pytest
import tooz.drivers
from support import ThreadedServer
from tooz_support import url_of

from lockserver import RunningServer

for _name, _cls in (
    ("etcd3gw", "Etcd3Driver"),
    ("memcached", "MemcachedDriver"),
    ("ipc", "IPCDriver"),
):
    try:
        __import__(f"tooz.drivers.{_name}")
    except ImportError:  # its client library is not installed: an empty stand-in
        _stand_in = types.ModuleType(f"tooz.drivers.{_name}")
        setattr(_stand_in, _cls, type(_cls, (), {}))
        sys.modules[f"tooz.drivers.{_name}"] = _stand_in
        setattr(tooz.drivers, _name, _stand_in)

from tooz.tests.test_coordination import TestAPI  # noqa: E402


@pytest.fixture(autouse=True)
def _tooz_test_url(
    threaded_server: ThreadedServer[RunningServer], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """tooz's tests find their driver's URL in ``TOOZ_TEST_URL``."""
    monkeypatch.setenv("TOOZ_TEST_URL", url_of(threaded_server.port))
    yield


class TestToozConformance(TestAPI):
    """tooz's ``TestAPI``, less the two tests that lock from a child process."""

    test_get_lock_concurrency_locking_two_lock_process = None  # type: ignore[assignment]
    test_get_lock_serial_locking_two_lock_process = None  # type: ignore[assignment]


del TestAPI  # collected once, as the subclass
