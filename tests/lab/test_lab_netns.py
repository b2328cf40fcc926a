"""The lab's hosts (root only): namespaces joined by a bridge, the machine's own network left
untouched, everything removed at the end and after a crash, and the firewall rules doing
what the nemesis needs -- partitions cut both ways, one-way loss cuts one way, and the etcd
cut drops one uid's connections (established ones too) while root's pass."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from lockbench.faults._netns import (
    BRIDGE_ADDRESS,
    STATE_DIR,
    Lab,
    Rules,
    inside,
    list_namespaces,
    refusal,
    remove_leftovers,
)

REASON = refusal()
pytestmark = pytest.mark.skipif(REASON is not None, reason=str(REASON))

#: Connects to ADDRESS:PORT, sends a byte, waits for the echo, every 0.2 s for N rounds;
#: prints one line per round: "ok" or "down".
PROBE = r"""
import socket, sys, time
host, port, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = None
for _ in range(rounds):
    try:
        if s is None:
            s = socket.create_connection((host, port), timeout=0.5)
        s.settimeout(0.5)
        s.sendall(b"x")
        assert s.recv(1) == b"x"
        print("ok", flush=True)
    except OSError:
        print("down", flush=True)
        if s is not None:
            s.close()
        s = None
    time.sleep(0.2)
"""

#: An echo server on ADDRESS:PORT, for the probes.
ECHO = r"""
import socket, sys, threading
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen()
print("listening", flush=True)
def serve(c):
    while (d := c.recv(100)):
        c.sendall(d)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def _pids(netns: str) -> list[int]:
    out = subprocess.run(
        ["ip", "netns", "pids", netns], capture_output=True, text=True, check=True
    ).stdout
    return [int(x) for x in out.split()]


@pytest.fixture
def lab() -> Iterator[Lab]:
    with Lab(3) as created:
        yield created


def _probe(
    lab: Lab, host_name: str, address: str, port: int, rounds: int, uid: int | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["ip", "netns", "exec", lab.host(host_name).netns]
        + (
            [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=+dac_override,+dac_read_search",
                "--ambient-caps=+dac_override,+dac_read_search",
            ]
            if uid is not None
            else []
        )
        + [sys.executable, "-c", PROBE, address, str(port), str(rounds)],
        stdout=subprocess.PIPE,
    )


@contextlib.contextmanager
def _echo(lab: Lab, host_name: str, port: int = 9000) -> Iterator[None]:
    """An echo server on the host's address for the block."""
    host = lab.host(host_name)
    with subprocess.Popen(
        ["ip", "netns", "exec", host.netns, sys.executable, "-c", ECHO, host.address, str(port)],
        stdout=subprocess.PIPE,
    ) as p:
        try:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == b"listening"
            yield
        finally:
            p.kill()


def _reach(lab: Lab, src: str, dst: str, port: int = 9000) -> bool:
    with _probe(lab, src, lab.host(dst).address, port, 1) as probe:
        out, _ = probe.communicate(timeout=10)
    return out.split() == [b"ok"]


def test_the_machines_network_is_untouched_and_nothing_is_left() -> None:
    """Building and removing a lab adds no link to the machine's own namespace, and leaves no
    namespace or state file behind."""
    before = Lab(3).host_links()
    with Lab(3) as lab:
        assert Lab(3).host_links() == before
        names = set(list_namespaces())
        assert {h.netns for h in lab.hosts} | {lab.outer} <= names
        assert (STATE_DIR / lab.run_id).read_text().strip() == str(os.getpid())
    assert Lab(3).host_links() == before
    assert not [n for n in list_namespaces() if n.startswith(f"{lab.prefix}{lab.run_id}")]
    assert not (STATE_DIR / lab.run_id).exists()


def test_every_host_reaches_every_other_through_the_bridge(lab: Lab) -> None:
    """Nodes and clients see each other at their lab addresses, and the controller, inside
    the outer namespace, sees them all."""
    with _echo(lab, "n2"):
        assert _reach(lab, "c1", "n2")
        assert _reach(lab, "n3", "n2")
        with inside(lab.outer_path):
            import socket

            with socket.create_connection((lab.host("n2").address, 9000), timeout=2) as s:
                s.sendall(b"y")
                assert s.recv(1) == b"y"
            # and the outer namespace has the bridge's address
            with socket.socket() as s:
                s.bind((BRIDGE_ADDRESS, 0))


def test_a_partition_cuts_both_ways_and_heals(lab: Lab) -> None:
    """Blocking n2's address on n1 (and n1's on n2) cuts n1-n2 in both directions, leaves
    n3 reachable, and clearing the rules heals it."""
    with _echo(lab, "n2"), _echo(lab, "n1"):
        n1, n2 = lab.host("n1"), lab.host("n2")
        lab.apply(n1, Rules(blocked=frozenset({n2.address})))
        lab.apply(n2, Rules(blocked=frozenset({n1.address})))
        assert not _reach(lab, "n1", "n2")
        assert not _reach(lab, "n2", "n1")
        assert _reach(lab, "n3", "n2")
        assert _reach(lab, "n3", "n1")
        lab.apply(n1, Rules())
        lab.apply(n2, Rules())
        assert _reach(lab, "n1", "n2")
        assert _reach(lab, "n2", "n1")


def test_one_way_loss_drops_only_what_comes_in(lab: Lab) -> None:
    """n1 dropping everything from n2: n1 cannot talk to n2 (the answers are lost), yet n2's
    packets leave; with a 30 % rate some rounds pass and some fail."""
    with _echo(lab, "n2"):
        n1, n2 = lab.host("n1"), lab.host("n2")
        lab.apply(n1, Rules(lossy=frozenset({n2.address})))
        assert not _reach(lab, "n1", "n2")
        assert lab.rules(n1).lossy == {n2.address}
        assert lab.rules(n2) == Rules()
        lab.apply(n1, Rules(lossy=frozenset({n2.address}), loss_percent=30))
        with _probe(lab, "n1", n2.address, 9000, 25) as p:
            out, _ = p.communicate(timeout=60)
        assert b"ok" in out.split()


def test_the_etcd_cut_drops_one_uids_connections_only(lab: Lab) -> None:
    """With the cut for uid 64999 on port 9000: that uid's established connection stops
    getting through, a root connection from the same host to the same port goes on, and
    the heal lets the uid connect again."""
    n1, n2 = lab.host("n1"), lab.host("n2")
    with _echo(lab, "n2"), _probe(lab, "n1", n2.address, 9000, 20, uid=64999) as cut:
        assert cut.stdout is not None
        assert cut.stdout.readline().strip() == b"ok"  # established before the cut
        lab.apply(n1, Rules(cut_uid=64999, cut_port=9000))
        assert _reach(lab, "n1", "n2")  # root, same host, same port
        out, _ = cut.communicate(timeout=60)
        assert out.split()[-5:] == [b"down"] * 5
        lab.apply(n1, Rules())
        with _probe(lab, "n1", n2.address, 9000, 1, uid=64999) as p:
            healed, _ = p.communicate(timeout=10)
        assert healed.split() == [b"ok"]


def test_a_link_set_down_takes_a_host_off_the_network(lab: Lab) -> None:
    with _echo(lab, "n2"):
        lab.set_link(lab.host("n1"), up=False)
        assert not _reach(lab, "n1", "n2")
        lab.set_link(lab.host("n1"), up=True)
        deadline = time.monotonic() + 10
        while not _reach(lab, "n1", "n2"):
            assert time.monotonic() < deadline


def test_destroy_kills_what_runs_inside(lab: Lab) -> None:
    """A process left running in a host (even a stopped one) does not survive the lab."""
    host = lab.host("c2")
    p = lab.popen(host, ["sleep", "600"])
    try:
        deadline = time.monotonic() + 10
        while p.pid not in _pids(host.netns):  # until it is inside (ip exec'd sleep)
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGSTOP)
        lab.destroy()
        assert p.wait(timeout=10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_leftovers_of_a_crashed_run_are_removed_and_a_live_labs_kept() -> None:
    """A lab whose controller is gone (its pid file names a dead process) is removed by the
    next lab's start, processes and all; a lab whose controller lives is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    crashed = Lab(2).create()
    sleeper = crashed.popen(crashed.host("n1"), ["sleep", "600"])
    deadline = time.monotonic() + 10
    while sleeper.pid not in _pids(crashed.host("n1").netns):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    (STATE_DIR / crashed.run_id).write_text(f"{dead.pid}\n")
    live = Lab(2).create()  # its start removes the crashed lab
    try:
        assert sleeper.wait(timeout=10) != 0
        names = set(list_namespaces())
        assert crashed.outer not in names
        assert not {h.netns for h in crashed.hosts} & names
        assert not (STATE_DIR / crashed.run_id).exists()
        assert not [n for n in remove_leftovers() if n.startswith(f"{live.prefix}{live.run_id}")]
        assert live.outer in set(list_namespaces())
    finally:
        live.destroy()
        crashed.created = False
        if sleeper.poll() is None:
            sleeper.kill()
        sleeper.wait()


def test_without_root_the_lab_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = refusal()
    assert why is not None and "root" in why and "\n" not in why
    with pytest.raises(PermissionError, match="needs root"):
        Lab(3).create()
