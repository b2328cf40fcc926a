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
- :func:`weight` and :func:`place`: the hash and the choice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import attrs

__all__ = ["MAX_SERVERS", "ServerAddress", "parse_servers", "place", "weight"]

#: Most servers one client may name (a range expands to many): a typo such as
#: ``"h:7400-74000"`` gets a clear error instead of 66,601 lazy connections.
MAX_SERVERS = 1024


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


def weight(server_id: str, namespace: str) -> int:
    """The rendezvous weight of ``namespace`` on the server named ``server_id``: the first 8
    bytes of BLAKE2b (digest size 8, no key) of ``utf8(server_id) + b"\\x00" +
    utf8(namespace)``, read as an unsigned big-endian integer."""
    digest = hashlib.blake2b(
        server_id.encode() + b"\x00" + namespace.encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big")


def place(namespace: str, servers: Sequence[ServerAddress]) -> ServerAddress:
    """The server ``namespace`` lives on: the one with the highest :func:`weight`; on equal
    weights (practically never) the one whose id is greater as UTF-8 bytes."""
    if len(servers) == 1:
        return servers[0]
    best = servers[0]
    best_key = (weight(best.id, namespace), best.id.encode())
    for server in servers[1:]:
        key = (weight(server.id, namespace), server.id.encode())
        if key > best_key:
            best, best_key = server, key
    return best
