"""The fault lab's hosts: Linux network namespaces joined by a bridge, and the firewall rules
that cut them apart.

A lab is one *outer* namespace holding a bridge, and one namespace per host: nodes ``n1..nN``
(each will run an etcd member and a lockserver replica) and clients ``c1..cN`` (client ``ci``
is *homed* at node ``ni``: partitions put it on its node's side, so a holder can be cut off
together with its replica). Each host has one veth pair: ``eth0`` inside the host, its peer
on the bridge in the outer namespace. Addresses are a private /24 (:data:`SUBNET`) that exists
only on the lab's own interfaces; the bridge itself has ``.254``, where the lab's controller
(and the fenced resource) lives once it has entered the outer namespace (:func:`inside`).

Rules kept:
- **The machine's own network is never touched.** Every link is created inside the outer
  namespace (``ip -n OUTER link add ... peer ... netns HOST``), no address, route or rule is
  added outside the lab's namespaces, and nothing routes out of the bridge: no traffic can
  leave the lab.
- **Nothing outlives the lab.** :meth:`Lab.destroy` kills every process still running in the
  lab's namespaces and deletes them (their links go with them). A lab records its
  controller's pid in :data:`STATE_DIR`; :func:`remove_leftovers` (called by
  :meth:`Lab.create`) removes every namespace with the lab's prefix whose controller is dead:
  an earlier run that crashed. A lab whose controller still runs is left alone.
- **Root or nothing.** Namespaces need CAP_SYS_ADMIN: :func:`refusal` says in one line why a
  lab cannot run here (not root, no ``ip``, no ``nft``), and the command prints it.
- **Firewall per host, replaced whole.** A host's rules are one nftables table (``inet lab``)
  rebuilt atomically from a :class:`Rules` value each time the nemesis changes them: dropped
  peers (partitions), a one-way loss rate, and the *etcd cut* (the replica's own connections
  to etcd's client port, matched by the replica's uid and marked in conntrack so established
  connections die too, while its clients and the co-located etcd member are untouched).

What this kernel allows, as tried: namespaces, veth pairs, bridges, links set down, nftables
(``numgen`` for random loss, ``meta skuid``, ``ct mark``) inside a namespace; ``tc`` qdiscs
(netem) and dummy links do not work, so there is no delay or jitter fault here.

Ports: inside the lab every address is the lab's own, so its services listen on fixed ports
(etcd's 2379/2380, lockserver's 7400) that cannot collide with anything outside; the one
listener in the outer namespace (the fenced resource) takes a port from the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Final

import attrs

__all__ = [
    "PREFIX",
    "SUBNET",
    "Host",
    "Lab",
    "Rules",
    "inside",
    "refusal",
    "remove_leftovers",
]

#: Every lab namespace's name starts with this (then the run id, a dash and the host).
PREFIX: Final = "lslab"
#: The lab's private /24: nodes .1-.9, clients .101-.109, the bridge .254.
SUBNET: Final = "10.77.0"
BRIDGE_ADDRESS: Final = f"{SUBNET}.254"
#: Where a lab records its controller's pid (to tell its leftovers from a live lab's).
STATE_DIR: Final = Path("/run/lockbench-lab")
#: Seconds a command of ``ip``/``nft`` may take.
COMMAND_TIMEOUT: Final = 20.0
_CLONE_NEWNET: Final = 0x40000000
_MAX_NODES: Final = 9


def refusal() -> str | None:
    """Why a lab cannot run on this machine (one line), or None when it can."""
    if os.geteuid() != 0:
        return (
            "the fault lab needs root: it creates network namespaces (ip netns) and firewall "
            "rules; run it as root"
        )
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"the fault lab needs {tool!r} (Debian package {package}), which is missing"
    if not Path("/proc/self/ns/net").exists():
        return "the fault lab needs network namespaces, which this kernel does not offer"
    return None


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    done = subprocess.run(
        list(argv),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def list_namespaces() -> list[str]:
    """The names of every named network namespace of the machine."""
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(netns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_all_in(netns: str) -> None:
    """SIGCONT then SIGKILL every process in ``netns`` (a stopped one dies too), then wait
    (bounded) until none is left."""
    deadline = time.monotonic() + 10.0
    while True:
        pids = _pids_in(netns)
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete every namespace named ``<prefix><run>-...`` whose run's controller is no longer
    alive (its processes killed first); return the names removed. A live lab's namespaces
    (its pid file names a running process) are kept."""
    removed = []
    for name in list_namespaces():
        if not name.startswith(prefix) or "-" not in name:
            continue
        run = name[len(prefix) :].split("-", 1)[0]
        state = STATE_DIR / run
        try:
            pid = int(state.read_text().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid):
            continue
        _kill_all_in(name)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
        with contextlib.suppress(OSError):
            state.unlink()
    return removed


@attrs.frozen
class Host:
    """One host of the lab: ``name`` (``n1``, ``c2``...), its namespace, its address, and for
    a client the node it is homed at."""

    name: str
    netns: str
    address: str
    home: str = ""

    @property
    def is_node(self) -> bool:
        return not self.home


@attrs.frozen
class Rules:
    """A host's firewall: traffic to and from ``blocked`` addresses dropped both ways
    (a partition); packets *from* ``lossy`` addresses dropped with ``loss_percent``
    probability (one-way loss); and, with ``cut_uid``, the connections that processes of that
    uid make to TCP port ``cut_port`` (the replica's to etcd) dropped."""

    blocked: frozenset[str] = frozenset()
    lossy: frozenset[str] = frozenset()
    loss_percent: int = 100
    cut_uid: int | None = None
    cut_port: int = 2379

    def render(self) -> str:
        """The nftables script that replaces the host's ``inet lab`` table with these rules."""
        ins: list[str] = []
        outs: list[str] = []
        if self.blocked:
            addresses = ", ".join(sorted(self.blocked))
            ins.append(f"ip saddr {{ {addresses} }} drop")
            outs.append(f"ip daddr {{ {addresses} }} drop")
        if self.lossy:
            addresses = ", ".join(sorted(self.lossy))
            if self.loss_percent >= 100:
                ins.append(f"ip saddr {{ {addresses} }} drop")
            else:
                ins.append(
                    f"ip saddr {{ {addresses} }} numgen random mod 100 < {self.loss_percent} drop"
                )
        if self.cut_uid is not None:
            outs.append(f"meta skuid {self.cut_uid} tcp dport {self.cut_port} ct mark set 0x4c")
            outs.append("ct mark 0x4c drop")
            ins.append("ct mark 0x4c drop")
        lines = ["add table inet lab", "delete table inet lab", "table inet lab {"]
        for chain, hook, rules in (("in", "input", ins), ("out", "output", outs)):
            lines.append(f"  chain {chain} {{")
            lines.append(f"    type filter hook {hook} priority 0; policy accept;")
            lines.extend(f"    {rule}" for rule in rules)
            lines.append("  }")
        lines.append("}")
        return "\n".join(lines) + "\n"


@contextlib.contextmanager
def inside(netns_path: str) -> Iterator[None]:
    """Run the calling thread inside the network namespace at ``netns_path`` for the block
    (threads it starts meanwhile stay there for good); back to its own namespace after."""
    libc = ctypes.CDLL(None, use_errno=True)
    own_path = f"/proc/self/task/{threading.get_native_id()}/ns/net"
    with open(own_path, "rb") as own, open(netns_path, "rb") as target:
        if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {netns_path} failed")
        try:
            yield
        finally:
            if libc.setns(own.fileno(), _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the own namespace failed")


class Lab:
    """The namespaces of one lab run: ``nodes`` nodes, one client host per node, the outer
    namespace with the bridge. :meth:`create`, then :meth:`popen` processes into hosts and
    :meth:`apply` firewall rules; :meth:`destroy` (also on ``__exit__``) removes it all."""

    def __init__(self, nodes: int, *, run_id: str | None = None, prefix: str = PREFIX) -> None:
        if not 1 <= nodes <= _MAX_NODES:
            raise ValueError(f"a lab has 1 to {_MAX_NODES} nodes, not {nodes}")
        self.run_id = run_id or secrets.token_hex(3)
        self.prefix = prefix
        self.outer = f"{prefix}{self.run_id}-out"
        self.nodes = [
            Host(f"n{i}", f"{prefix}{self.run_id}-n{i}", f"{SUBNET}.{i}")
            for i in range(1, nodes + 1)
        ]
        self.clients = [
            Host(f"c{i}", f"{prefix}{self.run_id}-c{i}", f"{SUBNET}.{100 + i}", home=f"n{i}")
            for i in range(1, nodes + 1)
        ]
        self.created = False
        self._rules: dict[str, Rules] = {}

    @property
    def hosts(self) -> list[Host]:
        """Nodes, then clients."""
        return [*self.nodes, *self.clients]

    def host(self, name: str) -> Host:
        """The host called ``name`` (KeyError if none)."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(name)

    @property
    def outer_path(self) -> str:
        """The outer namespace's file (for :func:`inside`)."""
        return f"/var/run/netns/{self.outer}"

    def __enter__(self) -> Lab:
        return self.create()

    def __exit__(self, *exc_info: object) -> None:
        self.destroy()

    def create(self) -> Lab:
        """Remove earlier crashed labs' leftovers, then build this one: namespaces, the
        bridge, one veth pair per host, addresses, loopbacks up."""
        why = refusal()
        if why is not None:
            raise PermissionError(why)
        remove_leftovers(self.prefix)
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / self.run_id).write_text(f"{os.getpid()}\n")
        self.created = True
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        out = self.outer
        _run(["ip", "netns", "add", out])
        _run(["ip", "-n", out, "link", "set", "lo", "up"])
        _run(["ip", "-n", out, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", out, "addr", "add", f"{BRIDGE_ADDRESS}/24", "dev", "br0"])
        _run(["ip", "-n", out, "link", "set", "br0", "up"])
        for host in self.hosts:
            _run(["ip", "netns", "add", host.netns])
            veth = f"v{host.name}"
            peer = ["peer", "name", "eth0", "netns", host.netns]
            _run(["ip", "-n", out, "link", "add", veth, "type", "veth", *peer])
            _run(["ip", "-n", out, "link", "set", veth, "master", "br0", "up"])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])

    def destroy(self) -> None:
        """Kill every process left in the lab's namespaces and delete them; idempotent."""
        if not self.created:
            return
        existing = set(list_namespaces())
        for netns in [h.netns for h in self.hosts] + [self.outer]:
            if netns in existing:
                _kill_all_in(netns)
                _run(["ip", "netns", "del", netns], check=False)
        with contextlib.suppress(OSError):
            (STATE_DIR / self.run_id).unlink()
        self.created = False

    # --- processes ---------------------------------------------------------------------------

    def popen(
        self,
        host: Host,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: IO[bytes] | None = None,
        uid: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``'s namespace (``ip netns exec``, which execs it: the
        pid is the program's). With ``uid``, the program runs as that uid, keeping only the
        capability to read and write files as root does (so it reaches the interpreter and
        its files wherever they are) -- what lets a firewall rule tell its sockets apart."""
        prefix = ["ip", "netns", "exec", host.netns]
        if uid is not None:
            prefix += [
                "setpriv",
                f"--reuid={uid}",
                f"--regid={uid}",
                "--clear-groups",
                "--inh-caps=+dac_override,+dac_read_search",
                "--ambient-caps=+dac_override,+dac_read_search",
            ]
        return subprocess.Popen(
            [*prefix, *argv],
            stdin=subprocess.DEVNULL,
            stdout=log if log is not None else subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,  # a Ctrl-C in the terminal is the controller's to handle
        )

    # --- firewall ----------------------------------------------------------------------------

    def apply(self, host: Host, rules: Rules) -> None:
        """Replace ``host``'s firewall with ``rules`` (atomically)."""
        if self._rules.get(host.name, Rules()) == rules:
            return
        _run(["ip", "netns", "exec", host.netns, "nft", "-f", "-"], stdin=rules.render())
        self._rules[host.name] = rules

    def rules(self, host: Host) -> Rules:
        """The rules in force on ``host``."""
        return self._rules.get(host.name, Rules())

    def set_link(self, host: Host, up: bool) -> None:
        """Set ``host``'s link down (it is off the network) or up again."""
        state = "up" if up else "down"
        _run(["ip", "-n", host.netns, "link", "set", "eth0", state])

    def host_links(self) -> str:
        """``ip -o link`` of the machine's own namespace (the tests check it is untouched)."""
        return _run(["ip", "-o", "link"])
