"""The etcd test harness itself (lockbench/etcd.py): members come up on
loopback, faults do what they say, a failed start explains itself, and nothing outlives
``terminate``."""

from __future__ import annotations

import base64
import json
import os
import stat
import urllib.request
from pathlib import Path

import pytest
import trio

from lockbench.etcd import (
    ETCD,
    SKIP_REASON,
    START_ATTEMPTS,
    EtcdCluster,
    free_ports,
    started,
)

needs_etcd = pytest.mark.skipif(ETCD is None, reason=SKIP_REASON)


def put(cluster: EtcdCluster, i: int, key: bytes, value: bytes) -> None:
    """A put through member ``i``'s gateway with the standard library."""
    body = json.dumps(
        {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()}
    ).encode()
    url = f"http://{cluster.endpoints[i]}/v3/kv/put"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as answer:
        assert answer.status == 200


def get(cluster: EtcdCluster, i: int, key: bytes) -> bytes | None:
    """The key's value read through member ``i``, or None."""
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    url = f"http://{cluster.endpoints[i]}/v3/kv/range"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as answer:
        kvs = json.loads(answer.read()).get("kvs", [])
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def test_the_skip_reason_says_how_to_install() -> None:
    """The fixtures' skip message names the Debian package."""
    assert SKIP_REASON == "etcd not installed: apt-get install etcd-server"
    with pytest.raises(FileNotFoundError, match="apt-get install etcd-server"):
        EtcdCluster(Path("."), binary=None)


def test_free_ports_are_distinct() -> None:
    """Ports handed out together never repeat."""
    ports = free_ports(6)
    assert len(set(ports)) == 6
    assert all(1024 <= p < 65536 for p in ports)


def test_a_start_that_fails_raises_with_the_members_log(tmp_path: Path) -> None:
    """A member that exits at once makes start try fresh ports START_ATTEMPTS times, then
    raise with the member's log in the message; no process is left."""
    fake = tmp_path / "fake-etcd"
    fake.write_text("#!/bin/sh\necho 'fake etcd: cannot start' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    cluster = EtcdCluster(tmp_path / "cluster", binary=str(fake))
    with pytest.raises(RuntimeError, match="fake etcd: cannot start") as caught:
        cluster.start(1)
    assert "exited during start" in str(caught.value)
    assert sorted(p.name for p in (tmp_path / "cluster").iterdir()) == [
        f"run{i}" for i in range(1, START_ATTEMPTS + 1)
    ]
    assert not cluster.running(0)


def test_only_one_or_three_members() -> None:
    """A test cluster has one or three members."""
    with pytest.raises(ValueError, match="1 or 3"):
        EtcdCluster(Path("."), binary="/bin/true").start(2)


@needs_etcd
def test_a_member_listens_on_loopback_and_terminate_leaves_nothing(tmp_path: Path) -> None:
    """A started member serves on 127.0.0.1; terminate kills it (stopped or not), removes
    its data directory and keeps its log."""
    gen = started(tmp_path, 1)
    cluster = next(gen)
    member = cluster.members[0]
    assert cluster.endpoints == [f"127.0.0.1:{member.client_port}"]
    assert member.peer_url.startswith("http://127.0.0.1:")
    put(cluster, 0, b"k", b"v")
    assert member.process is not None
    pid = member.process.pid
    cluster.stop(0)
    gen.close()  # the fixture's teardown
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not member.data_dir.exists()
    assert "ready to serve client requests" in member.log_path.read_text()
    cluster.terminate()  # twice is fine


@needs_etcd
def test_kill_and_restart_keep_the_data(tmp_path: Path) -> None:
    """SIGKILL then restart: the member comes back on its ports with its data."""
    with EtcdCluster(tmp_path) as cluster:
        cluster.start(1)
        put(cluster, 0, b"durable", b"yes")
        cluster.kill(0)
        assert not cluster.running(0)
        assert not cluster.healthy(0)
        cluster.restart(0)
        assert cluster.healthy(0)
        assert get(cluster, 0, b"durable") == b"yes"


@needs_etcd
async def test_stop_and_cont_freeze_and_thaw_a_member(etcd3: EtcdCluster) -> None:
    """SIGSTOP: the member answers nothing while the other two still serve; SIGCONT: it
    catches up. restart_async brings a killed member back without blocking trio."""
    with trio.fail_after(20):
        victim = (etcd3.leader() + 1) % 3
        others = [i for i in range(3) if i != victim]
        etcd3.stop(victim)
        assert not await trio.to_thread.run_sync(etcd3.healthy, victim)
        await trio.to_thread.run_sync(put, etcd3, others[0], b"while", b"stopped")
        etcd3.cont(victim)
        await etcd3.wait_healthy_async([victim])
        assert await trio.to_thread.run_sync(get, etcd3, victim, b"while") == b"stopped"
        etcd3.kill(victim)
        await etcd3.restart_async(victim)
        assert await trio.to_thread.run_sync(get, etcd3, victim, b"while") == b"stopped"
