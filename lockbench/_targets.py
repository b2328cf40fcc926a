"""Where the load goes: target URLs, and the loopback-only rule.

Why: lockbench generates heavy load, and this machine's rules (and plain decency) say load goes
to servers *we* run on this machine only. Every target is parsed here, and its host must resolve
to loopback addresses exclusively (127.0.0.0/8 or ::1) before a single byte is sent; anything
else is refused with a :class:`TargetError` naming the host and what it resolved to.

A target is ``lockserver://HOST:PORT`` or ``redis://HOST:PORT``. The scheme selects the backend.
With ``--spawn`` the host and port may be left out (``redis://``): the spawned server picks a
free loopback port. A lockserver target may name several servers (shards) in the client's
server-list syntax (PROTOCOL.md §12, ``client._placement.parse_servers``):
``lockserver://127.0.0.1:7400-7403`` or ``lockserver://127.0.0.1:7400,127.0.0.1:7410``; every
one of them must be on loopback.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

import attrs

from client._placement import parse_servers

__all__ = ["Backend", "Target", "TargetError", "check_loopback", "parse_target"]

DEFAULT_HOST = "127.0.0.1"


class Backend(enum.StrEnum):
    """Which server a target speaks to."""

    LOCKSERVER = "lockserver"
    REDIS = "redis"


class TargetError(ValueError):
    """A target that lockbench refuses: malformed, unknown scheme, or not on loopback."""


@attrs.frozen
class Target:
    """A parsed target. ``port`` is None only before a spawned server has chosen one.
    ``host``/``port`` is the first server; ``others`` the rest of a list of shards."""

    backend: Backend
    host: str = DEFAULT_HOST
    port: int | None = None
    others: tuple[tuple[str, int], ...] = ()

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        """Every server of the target, (host, port), the first first."""
        assert self.port is not None, "no address before the server is spawned"
        return ((self.host, self.port), *self.others)

    @property
    def url(self) -> str:
        """The target as a URL (without port when none is known yet); several servers are
        listed comma-separated."""
        if self.port is None:
            return f"{self.backend}://{_host_port(self.host, None)}"
        servers = ",".join(_host_port(h, p) for h, p in self.addresses)
        return f"{self.backend}://{servers}"

    def with_address(self, host: str, port: int) -> Target:
        """The same backend at a concrete address (after spawning)."""
        return Target(self.backend, host, port)

    def with_addresses(self, addresses: Sequence[tuple[str, int]]) -> Target:
        """The same backend at concrete addresses (after spawning several)."""
        (host, port), *others = addresses
        return Target(self.backend, host, port, tuple(others))


def _host_port(host: str, port: int | None) -> str:
    text = f"[{host}]" if ":" in host else host
    return text if port is None else f"{text}:{port}"


def parse_target(text: str, *, spawn: bool = False) -> Target:
    """Parse ``lockserver://HOST:PORT`` / ``redis://HOST:PORT``.

    The host is checked with :func:`check_loopback`. Without ``spawn`` a port is required.
    """
    parts = urlsplit(text)
    if "," in parts.netloc or _is_range(parts.netloc):
        if parts.scheme != Backend.LOCKSERVER:
            raise TargetError(
                f"target {text!r} names several servers: only lockserver:// targets can"
            )
        return _parse_servers_target(text, parts.netloc, spawn=spawn)
    try:
        backend = Backend(parts.scheme)
    except ValueError:
        raise TargetError(
            f"unknown target scheme in {text!r}: use lockserver://HOST:PORT or redis://HOST:PORT"
        ) from None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise TargetError(f"target {text!r} must be SCHEME://HOST:PORT, nothing after the port")
    try:
        port = parts.port
    except ValueError as exc:
        raise TargetError(f"bad port in target {text!r}: {exc}") from None
    host = parts.hostname or DEFAULT_HOST
    if port is None and not spawn:
        raise TargetError(f"target {text!r} has no port (give HOST:PORT, or use --spawn)")
    if port is not None and spawn:
        raise TargetError(
            f"target {text!r} names a port, but --spawn picks its own: drop one of the two"
        )
    check_loopback(host)
    return Target(backend, host, port)


def _is_range(netloc: str) -> bool:
    return "-" in netloc.rpartition(":")[2]


def _parse_servers_target(text: str, netloc: str, *, spawn: bool) -> Target:
    """``lockserver://`` followed by a server list (a range or several servers)."""
    if spawn:
        raise TargetError(
            f"target {text!r} names servers, but --spawn starts its own: drop one of the two"
        )
    try:
        servers = parse_servers(netloc)
    except ValueError as exc:
        raise TargetError(f"bad server list in target {text!r}: {exc}") from None
    for server in servers:
        check_loopback(server.host)
    return Target(Backend.LOCKSERVER).with_addresses([(s.host, s.port) for s in servers])


def check_loopback(host: str) -> None:
    """Raise :class:`TargetError` unless every address ``host`` resolves to is loopback."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise TargetError(f"cannot resolve target host {host!r}: {exc.strerror}") from None
    addresses = sorted({str(info[4][0]) for info in infos})
    outside = [a for a in addresses if not ipaddress.ip_address(a.split("%")[0]).is_loopback]
    if not addresses or outside:
        raise TargetError(
            f"refusing to send load to {host!r} (resolves to {', '.join(addresses) or 'nothing'}):"
            " lockbench only targets loopback addresses (127.0.0.0/8, ::1, localhost)"
        )
