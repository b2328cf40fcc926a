"""Where a namespace lives when one client talks to several servers: the server list, parsed
once, and rendezvous (highest-random-weight) hashing over it. Socket-free, shared by both
faces (and by lockbench, which places its load the same way).

Why rendezvous hashing: every transaction touches exactly one namespace, so a namespace lives
on exactly one server, and every client given the same server list must agree on which one,
whatever language it is written in. Rendezvous hashing needs no ring, no virtual nodes and no
shared state: each (server, namespace) pair gets a weight from a stable hash, the heaviest
server wins. Adding a server moves only the namespaces that now weigh most on it (~1/N of
them); removing one moves only its own. The algorithm, exactly, with test vectors:
PROTOCOL.md §12.

- :func:`parse_servers` turns ``"host:port"`` strings (and ranges ``"host:7400-7403"``, and
  comma-separated lists) into canonical :class:`ServerAddress` values, whose ``id`` (the
  canonical ``host:port`` text) is what the hash uses.
- :func:`parse_groups` reads a client's ``servers`` argument, whose items may also be
  replicated groups (a list or tuple of server strings: replicas sharing one lock state),
  into :class:`ServerGroup` values: the entries placement chooses between. A plain server is
  an entry of one member. A group's ``id`` is its members' ids sorted and joined by ``,``
  (PROTOCOL.md §12 item 4): the same for every client given the same members in any order,
  and equal to the member's own id for a group of one, so the single-server ids and vectors
  are unchanged.
- :func:`weight` and :func:`place`: the hash and the choice (over servers or groups alike:
  anything with an ``id``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import attrs

__all__ = [
    "MAX_SERVERS",
    "ServerAddress",
    "ServerGroup",
    "Servers",
    "parse_groups",
    "parse_servers",
    "place",
    "weight",
]

#: Most servers one client may name (a range expands to many; every member of every group
#: counts): a typo such as ``"h:7400-74000"`` gets a clear error instead of 66,601 lazy
#: connections.
MAX_SERVERS = 1024

#: What a client's ``servers`` argument may be: one string (servers separated by commas,
#: ranges), or an iterable whose items are such strings or groups (a list or tuple of them).
Servers = str | Iterable[str | Sequence[str]]


@attrs.frozen
class ServerAddress:
    """One server of the list: ``host`` (an IPv6 literal without brackets) and ``port``.

    ``id`` is the canonical text the placement hash uses (PROTOCOL.md §12): the host in lower
    case, an IPv6 literal in brackets, then ``:`` and the port in decimal; for example
    ``"127.0.0.1:7400"``, ``"lock-1.example:7400"``, ``"[::1]:7400"``.
    """

    host: str
    port: int

    @property
    def id(self) -> str:
        host = self.host.lower()  # as parse_servers makes it; kept for hand-made addresses
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return self.id


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"server {where!r}: the port must be a number, got {text!r}")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"server {where!r}: the port must be 1..65535, got {port}")
    return port


def _parse_one(item: str) -> list[ServerAddress]:
    text = item.strip()
    if not text:
        raise ValueError("a server address is empty")
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"server {item!r}: write an IPv6 address as [host]:port")
        host, ports = text[1:close], text[close + 2 :]
    else:
        host, sep, ports = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"server {item!r}: expected host:port (or host:first-last)")
        if ":" in host:
            raise ValueError(f"server {item!r}: write an IPv6 address as [host]:port")
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"server {item!r}: the host is empty or contains spaces")
    first_text, dash, last_text = ports.partition("-")
    first = _port(first_text, item)
    last = _port(last_text, item) if dash else first
    if last < first:
        raise ValueError(f"server {item!r}: the port range runs backwards ({first}-{last})")
    if last - first + 1 > MAX_SERVERS:
        raise ValueError(f"server {item!r}: more than {MAX_SERVERS} servers in one range")
    host = host.lower()  # DNS names and IPv6 literals are case-insensitive
    return [ServerAddress(host, port) for port in range(first, last + 1)]


def parse_servers(servers: str | Iterable[str]) -> tuple[ServerAddress, ...]:
    """The canonical server list of ``servers``: one string (``"h:7400"``, a range
    ``"h:7400-7403"`` meaning ports 7400 to 7403, or several of those separated by commas) or
    an iterable of such strings. Order is kept (it does not matter to placement). Raises
    ValueError for an empty list, a malformed address, a duplicate server (by canonical id)
    or more than :data:`MAX_SERVERS` servers; TypeError for anything but strings."""
    if isinstance(servers, str):
        items: list[str] = servers.split(",")
    else:
        items = []
        for item in servers:
            if type(item) is not str:
                raise TypeError(
                    f'servers must be "host:port" strings, got {type(item).__name__}: {item!r}'
                )
            items.extend(item.split(","))
    out: list[ServerAddress] = []
    seen: set[str] = set()
    for item in items:
        for address in _parse_one(item):
            if address.id in seen:
                raise ValueError(f"server {address.id} is named twice")
            seen.add(address.id)
            out.append(address)
            if len(out) > MAX_SERVERS:
                raise ValueError(f"more than {MAX_SERVERS} servers")
    if not out:
        raise ValueError("the server list is empty")
    return tuple(out)


@attrs.frozen(cache_hash=True)
class ServerGroup:
    """One entry of a client's server list, the unit placement chooses: a single server, or
    a replicated group (``replicated``: given as a list, even of one member), whose
    ``members`` all serve the same lock state, so the client fails over among them and adds
    the replicas their welcome names (``client._failover``).

    ``members``: in the configured order (the order failover tries them). ``id``: what the
    placement hash uses (PROTOCOL.md §12 item 4): the members' canonical ids sorted (code
    point order, which is UTF-8 byte order) and joined by ``,``; a group of one has its
    member's id."""

    members: tuple[ServerAddress, ...]
    replicated: bool = False
    id: str = attrs.field(init=False)

    @id.default
    def _id(self) -> str:
        return ",".join(sorted(member.id for member in self.members))

    def __attrs_post_init__(self) -> None:
        if not self.members:
            raise ValueError("a server group has no member")

    def __str__(self) -> str:
        return self.id


def parse_groups(servers: Servers) -> tuple[ServerGroup, ...]:
    """The entries of a client's ``servers`` argument, in order: every server a string
    names (as :func:`parse_servers` reads it) is an entry of its own; a list or tuple of
    server strings is one replicated group (each string may itself name several members:
    a range, a comma list). Raises ValueError for an empty list or group, a malformed
    address, a server named twice (within a group, or in two entries), or more than
    :data:`MAX_SERVERS` servers counting every member; TypeError for anything else."""
    items: Iterable[str | Sequence[str]] = [servers] if isinstance(servers, str) else servers
    out: list[ServerGroup] = []
    where: dict[str, int] = {}  # member id -> index of its entry in ``out``
    count = 0
    for i, item in enumerate(items):
        if type(item) is str:
            entries = [ServerGroup((address,)) for address in parse_servers(item)]
        elif isinstance(item, (list, tuple)):
            if not item:
                raise ValueError(f"servers[{i}]: the group is empty")
            try:
                members = parse_servers(item)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"servers[{i}] (a group): {exc}") from None
            entries = [ServerGroup(members, replicated=True)]
        else:
            raise TypeError(
                'servers must be "host:port" strings or groups (lists of them), got '
                f"{type(item).__name__}: {item!r:.80}"
            )
        for entry in entries:
            for member in entry.members:
                other = where.get(member.id)
                if other is not None:
                    if entry.replicated or out[other].replicated:
                        raise ValueError(
                            f"server {member.id} is in two groups ({out[other].id} and {entry.id})"
                        )
                    raise ValueError(f"server {member.id} is named twice")
                where[member.id] = len(out)
            count += len(entry.members)
            if count > MAX_SERVERS:
                raise ValueError(f"more than {MAX_SERVERS} servers")
            out.append(entry)
    if not out:
        raise ValueError("the server list is empty")
    return tuple(out)


def weight(server_id: str, namespace: str) -> int:
    """The rendezvous weight of ``namespace`` on the server named ``server_id``: the first 8
    bytes of BLAKE2b (digest size 8, no key) of ``utf8(server_id) + b"\\x00" +
    utf8(namespace)``, read as an unsigned big-endian integer."""
    digest = hashlib.blake2b(
        server_id.encode() + b"\x00" + namespace.encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big")


class _Placed(Protocol):
    @property
    def id(self) -> str: ...


_P = TypeVar("_P", bound=_Placed)


def place(namespace: str, servers: Sequence[_P]) -> _P:
    """The server (or group) ``namespace`` lives on: the one with the highest
    :func:`weight` of its ``id``; on equal weights (practically never) the one whose id is
    greater as UTF-8 bytes."""
    if len(servers) == 1:
        return servers[0]
    best = servers[0]
    best_key = (weight(best.id, namespace), best.id.encode())
    for server in servers[1:]:
        key = (weight(server.id, namespace), server.id.encode())
        if key > best_key:
            best, best_key = server, key
    return best
