"""Fixtures of the replication tests: real etcd clusters (lockbench/etcd.py).

- ``etcd1``: one member, started once per test module (about 0.5 s) and shared by its tests;
  before each test every key is deleted, and a member a previous test killed or stopped is
  restarted. Revisions keep growing across tests: a test reads the revisions it needs.
- ``etcd3``: three members, started fresh for each test (0.3-1.4 s), for the fault tests,
  which kill, stop and restart members at will.

Both skip, with the reason, only when the etcd binary is not installed; a cluster that is
installed but does not start is an error with the members' logs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started, wipe


@pytest.fixture(scope="module")
def etcd1_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A one-member cluster for the whole module (``etcd1`` hands it to each test)."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    yield from started(tmp_path_factory.mktemp("etcd1"), 1)


@pytest.fixture
def etcd1(etcd1_module: EtcdCluster) -> EtcdCluster:
    """The module's one-member cluster, healthy and holding no key."""
    if not etcd1_module.healthy(0):
        etcd1_module.restart(0)
    wipe(etcd1_module)
    return etcd1_module


@pytest.fixture
def etcd3(tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh three-member cluster, terminated after the test."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    yield from started(tmp_path, 3)
