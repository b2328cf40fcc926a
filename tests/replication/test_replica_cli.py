"""The ``lockserver`` command as a replica: conflicting or unreachable settings end it at once
with one clear line (no traceback) and the documented exit status."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, free_ports
from lockbench.replicas import ReplicaGroup


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lockserver", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_processes_and_replicate_do_not_go_together() -> None:
    """--processes N with --replicate: exit 2, saying why."""
    done = run("--processes", "2", "--replicate", "etcd://127.0.0.1:2379")
    assert done.returncode == 2
    assert "--processes and --replicate do not go together" in done.stderr
    assert "Traceback" not in done.stderr


def test_unreachable_etcd_exits_1_naming_the_group_and_endpoint() -> None:
    """Nothing listens at the etcd endpoint: exit 1 with the group and the endpoint named."""
    (port,) = free_ports(1)
    done = run("--replicate", f"etcd://127.0.0.1:{port}", "--group", "orders")
    assert done.returncode == 1, done.stderr
    assert "replica of group 'orders'" in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_replicate_value_is_a_usage_error() -> None:
    """A --replicate that is not etcd://HOST:PORT (or etcds://, or URLs): exit 2 naming the
    setting."""
    done = run("--replicate", "127.0.0.1:2379")
    assert done.returncode == 2
    assert "replicate: must be etcd://HOST:PORT" in done.stderr


@pytest.mark.parametrize("flags", [[], ["--secure"]])
def test_the_replicated_group_demo_runs(flags: list[str]) -> None:
    """examples/replicated_group.py: etcd and three replicas start, a lock survives the kill
    of its holder's replica, and the next grant's fence is larger; with ``--secure`` the same
    runs through etcd with TLS, client certificates and auth."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    done = subprocess.run(
        [sys.executable, "examples/replicated_group.py", "--once", *flags],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "another client, through another replica: refused" in done.stdout
    assert "still held: the other client is refused" in done.stdout
    assert "(failed over; no lock lost)" in done.stdout
    assert ("etcd: https://" in done.stdout) == bool(flags)
    line = next(x for x in done.stdout.splitlines() if x.startswith("the other client takes"))
    later, earlier = (int(x) for x in line.split("fence ")[1].split(" > "))
    assert later > earlier


def lockctl_of(address: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lockctl", "--server", address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_entry_of_an_unknown_format_halts_the_replica_and_status_says_why(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """A log entry of a format this version does not know, in a group without a secret
    (nothing can tell a newer replica's entry from anyone's there): the replica does not skip
    it (the replicas that know it apply it; skipping would diverge) but halts -- its client's
    connection is closed, it keeps running, and ``lockctl status`` shows it HALTED at that
    revision with the reason, and warns that the group's log is not authenticated. The log
    says it once at CRITICAL, no traceback."""
    import base64
    import json
    import socket

    from client import Assert, LockClient, SetVar
    from lockbench.etcd import _http
    from lockserver.replication._group import ENTRY_FORMAT
    from lockserver.replication._replica import group_prefix
    from protocol import Connection, Hello, Role, pack

    future = ENTRY_FORMAT + 1
    group = f"u{time.monotonic_ns()}"
    with ReplicaGroup(etcd1.endpoints, tmp_path / "replicas", n=1, group=group) as g:
        g.start()
        (replica,) = g.replicas
        with LockClient(port=replica.port, timeout=10) as client, client.session() as session:
            # Served through the log: the replica applies it from here on.
            assert session.execute("ns", [Assert(SetVar("t", "v"))]).ok
        with socket.create_connection(("127.0.0.1", replica.port), timeout=10) as sock:
            # The handshake's answer: the replica serves this connection before the entry is
            # put (a connection it accepted only after halting would stay open, unasked).
            proto = Connection(Role.CLIENT)
            sock.sendall(proto.send(Hello(1, client_name="halt-test")))
            while proto.next_message() is None:
                proto.receive_data(sock.recv(65536))
            entry = pack([future, "future-replica", 0, 1, 0.0, 0, 1.0, b"ops of the future"])
            key = group_prefix(group) + b"log"
            body = {
                "key": base64.b64encode(key).decode(),
                "value": base64.b64encode(entry).decode(),
            }
            port = etcd1.members[0].client_port
            answer = _http(port, "POST", "/v3/kv/put", body, 5.0)
            revision = int(answer["header"]["revision"])
            sock.settimeout(10)
            try:
                while sock.recv(65536):  # the server closed it: EOF after whatever it sent
                    pass
            except TimeoutError:
                pytest.fail(f"the connection stayed open; the replica's log:\n{replica.log_tail()}")
        assert replica.process is not None and replica.process.poll() is None  # still up
        (record,) = json.loads(lockctl_of(replica.address, "--json", "status"))
        text = lockctl_of(replica.address, "status")
        log_text = replica.log_path.read_text()
    halted = record["replication"]["halted"]
    assert halted["revision"] == revision
    assert f"a log entry of format {future}, which this version cannot apply" in halted["reason"]
    header, row, *notes = text.splitlines()
    assert row.split()[header.split().index("STATE")] == "HALTED"
    assert row.split()[header.split().index("AUTH")] == "NO"
    assert any(n.startswith(f"HALTED {replica.address}: replica ") for n in notes)
    assert any("is not authenticated" in n for n in notes)
    assert f"halted at revision {revision}" in log_text and "--skip-revision" in log_text
    assert "GROUP" in log_text and "HAS NO SECRET" in log_text
    assert "Traceback" not in log_text


def test_a_secret_file_others_can_read_ends_the_command(tmp_path: Path) -> None:
    """--group-secret-file naming a file others may read: exit 2, naming the file, never
    showing the secret; and there is no flag that takes a secret itself."""
    path = tmp_path / "group.secret"
    path.write_text("s" * 64 + "\n")
    path.chmod(0o644)
    done = run("--replicate", "etcd://127.0.0.1:1", "--group-secret-file", str(path))
    assert done.returncode == 2
    assert "others may read or write it" in done.stderr and str(path) in done.stderr
    assert "s" * 64 not in done.stderr
    assert run("--group-secret", "x").returncode == 2  # no such flag


def test_lockctl_status_names_a_replicas_group_and_revision(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """`lockctl status` of a replica: its group, id, the group's replicas, the revision it
    applied, whether its log is authenticated, what it rejected (JSON), and GROUP, REVISION,
    STATE, AUTH and REJECTED columns (text); a standalone server has none."""
    import json

    group = f"s{time.monotonic_ns()}"
    with ReplicaGroup(
        etcd1.endpoints, tmp_path / "replicas", n=1, group=group, secret="k" * 64
    ) as g:
        g.start()
        (replica,) = g.replicas
        (record,) = json.loads(lockctl_of(replica.address, "--json", "status"))
        text = lockctl_of(replica.address, "status")
    repl = record["replication"]
    assert repl["group"] == group and repl["replicas"] == [replica.address]
    assert repl["revision"] > 0 and repl["replica"]
    assert repl["authenticated"] is True and repl["halted"] is None
    assert repl["rejected_entries"] == 0
    header, row = text.splitlines()
    assert header.split()[-5:] == ["GROUP", "REVISION", "STATE", "AUTH", "REJECTED"]
    assert row.split()[-5:] == [group, str(repl["revision"]), "serving", "yes", "0"]
