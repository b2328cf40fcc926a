"""Where the load goes: target URLs, and the loopback-only rule.

Why: lockbench generates heavy load, and this machine's rules (and plain decency) say load goes
to servers *we* run on this machine only. Every target is parsed here, and its host must resolve
to loopback addresses exclusively (127.0.0.0/8 or ::1) before a single byte is sent; anything
else is refused with a :class:`TargetError` naming the host and what it resolved to.

A target is ``lockserver://HOST:PORT`` or ``redis://HOST:PORT``. The scheme selects the backend.
With ``--spawn`` the host and port may be left out (``redis://``): the spawned server picks a
free loopback port.
"""

from __future__ import annotations

import enum
import ipaddress
import socket
from urllib.parse import urlsplit

import attrs

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
    """A parsed target. ``port`` is None only before a spawned server has chosen one."""

    backend: Backend
    host: str = DEFAULT_HOST
    port: int | None = None

    @property
    def url(self) -> str:
        """The target as a URL (without port when none is known yet)."""
        port = "" if self.port is None else f":{self.port}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.backend}://{host}{port}"

    def with_address(self, host: str, port: int) -> Target:
        """The same backend at a concrete address (after spawning)."""
        return Target(self.backend, host, port)


def parse_target(text: str, *, spawn: bool = False) -> Target:
    """Parse ``lockserver://HOST:PORT`` / ``redis://HOST:PORT``.

    The host is checked with :func:`check_loopback`. Without ``spawn`` a port is required.
    """
    parts = urlsplit(text)
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
