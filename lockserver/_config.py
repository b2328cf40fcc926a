"""The server's settings: one frozen value, and the loader that fills it from four sources.

Why / rules kept (issue #3, docs/configuration.md):
- :class:`ServerConfig` is a frozen attrs value with a validator on every field and a sane
  default for everything, so ``ServerConfig()`` is a working server and a bad value fails when
  the value is made, naming the field, the bound and the value (``max_frame must be >= 1024,
  got 5``). Trust constants are a nested :class:`~lockserver._trust.TrustSettings`.
- :func:`load_config` applies the precedence **flag > environment > file > default**, one
  setting at a time. Each setting is validated on its own with the field's own validator, so
  the one error line names where the bad value came from: ``(from --max-frame)``,
  ``(from LOCKSERVER_MAX_FRAME)`` or ``(from /etc/lockserver.toml)``.
- Every failure is a :class:`ConfigError` with a one-line message; the command prints it and
  exits 2. argparse's own exits (bad flags) are routed through the same error, so no usage
  block, no traceback.

Theory of operation: one table (``_SETTINGS``) lists every setting with its flat name and
kind; the flag (``--max-send-buffer``), the environment variable (``LOCKSERVER_MAX_SEND_BUFFER``)
and the file key (``max_send_buffer``, or ``tick`` inside ``[trust]`` for ``trust_tick``) are
all derived from that name, so the four sources cannot drift apart. Each setting is declared
once, as a field of :class:`ServerConfig` (or of ``TrustSettings``): its name, type, default,
bound (the validator) and, in the field's metadata (``_about``), its one-line help, its group
(``lockserver --help`` shows the flags in docs/configuration.md's sections, and a test holds
that page's tables to this one) and whether it is an advertised limit
(:func:`advertised_limits`, what the welcome and ``stats`` report). Text sources (flags, env)
are parsed by kind; the TOML file is already typed and is only checked.

Prior art: the twelve-factor "config in the environment" layering, as in pip's
``PIP_*``/config-file/flag scheme; attrs validators as in trio's and h11's value classes.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn

import attrs

from protocol import HEADER_SIZE

from ._auth import SecurityConfigError, TokenSpec, check_tokens, parse_tokens_text, tokens_from_toml
from ._build import DISTRIBUTION, version_line
from ._trust import TrustSettings
from .replication import etcd_endpoints

__all__ = [
    "GROUPS",
    "ConfigError",
    "ServerConfig",
    "advertised_limits",
    "engine_limits",
    "load_config",
    "server_version",
    "skip_revisions",
    "ENGINE_PARTS",
    "ENV_PREFIX",
    "LOG_LEVELS",
    "MAX_PROCESSES",
]

ENV_PREFIX: Final = "LOCKSERVER_"
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_MAX_FRAME_ENCODABLE: Final = 0xFFFFFFFF  # the 4-byte length prefix
#: Most shard processes of one ``lockserver --processes N``: a fixed bound (not the machine's
#: core count, so a config file means the same on every machine), far above the cores of any
#: one machine; a typo such as 4000 gets an error instead of 4,000 processes.
MAX_PROCESSES: Final = 256


class ConfigError(ValueError):
    """An invalid setting or command line. ``str(exc)`` is one line, ready for stderr."""


# --- validators (each message: "<name> must be ..., got <value>") -----------------------------


def _is_int(value: object) -> bool:
    return type(value) is int


def _is_number(value: object) -> bool:
    return type(value) in (int, float)


def _int_at_least(low: int, high: int | None = None) -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not _is_int(value):
            raise ValueError(f"{attribute.name} must be an integer, got {value!r}")
        if value < low:
            raise ValueError(f"{attribute.name} must be >= {low}, got {value!r}")
        if high is not None and value > high:
            raise ValueError(f"{attribute.name} must be <= {high}, got {value!r}")

    return check


def _seconds(*, zero_ok: bool) -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"{attribute.name} must be a finite number of seconds, got {value!r}")
        if value < 0 or (value == 0 and not zero_ok):
            bound = ">= 0" if zero_ok else "> 0"
            raise ValueError(f"{attribute.name} must be {bound} seconds, got {value!r}")

    return check


_BUSY_POLL_DEFAULT: Final = 0.0001
_POLL_MAX: Final = 0.01
_COMMIT_POLL_DEFAULT: Final = 0.002


def _poll_window(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    """A spin window (busy_poll, replica_commit_poll): 0 (never spin) up to _POLL_MAX."""
    _seconds(zero_ok=True)(inst, attribute, value)
    if value > _POLL_MAX:
        # A longer spin would burn a core through any pause in the traffic: never useful.
        raise ValueError(f"{attribute.name} must be <= {_POLL_MAX} seconds, got {value!r}")


def _receive_total(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _int_at_least(1024)(inst, attribute, value)
    # Cross-field (not when the loader checks this setting alone, inst None): below one whole
    # frame and its header, a frame of max_frame bytes could never be received.
    max_frame = getattr(inst, "max_frame", None)
    if type(max_frame) is int and value < max_frame + HEADER_SIZE:
        raise ValueError(
            f"{attribute.name} must be >= max_frame + {HEADER_SIZE} "
            f"({max_frame + HEADER_SIZE}), got {value!r}"
        )


#: Upper bound of ``http_max_header``: a request head is a line and some headers, never more.
_HTTP_MAX_HEADER_MAX: Final = 1024 * 1024


def _fraction(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_number(value) or not 0 <= value <= 1:
        raise ValueError(f"{attribute.name} must be a number in 0..1, got {value!r}")


def _port(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not _is_int(value) or not 0 <= value <= 65535:
        raise ValueError(f"{attribute.name} must be an integer in 0..65535, got {value!r}")


def _processes(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _int_at_least(1, MAX_PROCESSES)(inst, attribute, value)
    # Cross-field (not when the loader checks this setting alone, inst None): the shards of a
    # fixed port listen on port .. port + processes - 1, which must all be TCP ports.
    port = getattr(inst, "port", None)
    if type(port) is int and port and port + value - 1 > 65535:
        raise ValueError(
            f"{attribute.name} must be <= {65536 - port} with port {port} (the shards take "
            f"consecutive ports, the last is 65535), got {value!r}"
        )


def _host(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value.strip():
        raise ValueError(
            f"{attribute.name} must be a non-empty host name or address, got {value!r}"
        )


def _etcd_endpoints(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value == "":
        return
    try:
        etcd_endpoints(value)
    except ValueError as exc:
        raise ValueError(f"{attribute.name}: {exc}") from None


def _etcd_file(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    _path(inst, attribute, value)
    # Cross-field (not when the loader checks this setting alone, inst None).
    if inst is None or not value:
        return
    replicate = getattr(inst, "replicate", "")
    if not replicate:
        raise ValueError(f"{attribute.name} is set but replicate is empty (no etcd to reach)")
    if attribute.name != "etcd_password_file" and not etcd_endpoints(replicate)[0].startswith(
        "https://"
    ):
        raise ValueError(
            f"{attribute.name} is set but replicate names plain-HTTP etcd endpoints: "
            "use etcds://HOST:PORT,... (or https:// URLs)"
        )
    if attribute.name == "etcd_key_file" and not getattr(inst, "etcd_cert_file", ""):
        raise ValueError("etcd_key_file is set without etcd_cert_file (the certificate)")
    if attribute.name == "etcd_password_file" and not getattr(inst, "etcd_user", ""):
        raise ValueError("etcd_password_file is set without etcd_user")


def _etcd_user(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    ok = type(value) is str and len(value) <= 256 and value == value.strip()
    if not ok or any(c in value for c in "\r\n\0"):
        raise ValueError(f"{attribute.name} must be an etcd user name (or empty), got {value!r}")
    if inst is None or not value:
        return
    if not getattr(inst, "replicate", ""):
        raise ValueError(f"{attribute.name} is set but replicate is empty (no etcd to reach)")
    if not getattr(inst, "etcd_password_file", ""):
        raise ValueError(
            f"{attribute.name} is set without etcd_password_file (the password is read from a "
            "file, never given on the command line)"
        )


def skip_revisions(text: str) -> frozenset[int]:
    """The revisions of a ``skip_revision`` value (``R[,R...]``, each a positive integer);
    ValueError naming the bad part."""
    if not text.strip():
        return frozenset()
    out = set()
    for raw in text.split(","):
        part = raw.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a log revision (a positive integer)")
        out.add(int(part))
    return frozenset(out)


def _revisions(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str:
        raise ValueError(f"{attribute.name} must be R[,R...], got {value!r}")
    try:
        skip_revisions(value)
    except ValueError as exc:
        raise ValueError(f"{attribute.name} must be R[,R...] (log revisions): {exc}") from None


def _group_name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    ok = type(value) is str and 0 < len(value) <= 64
    if not ok or not all(c.isascii() and (c.isalnum() or c in "-_.") for c in value):
        raise ValueError(
            f"{attribute.name} must be 1-64 characters of letters, digits, '-', '_' or '.', "
            f"got {value!r}"
        )


def _log_level(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in LOG_LEVELS:
        raise ValueError(f"{attribute.name} must be one of {', '.join(LOG_LEVELS)}, got {value!r}")


def _bool(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not bool:
        raise ValueError(f"{attribute.name} must be true or false, got {value!r}")


def _trust_settings(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, TrustSettings):
        raise ValueError(f"{attribute.name} must be a TrustSettings, got {value!r}")


def _path(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    # Only the type: the file is read when the server starts (serve), so a config can be
    # built on a machine without the files.
    if type(value) is not str or value != value.strip():
        raise ValueError(f"{attribute.name} must be a file path (or empty), got {value!r}")


def _tokens(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    try:
        check_tokens(value)
    except SecurityConfigError as exc:
        raise ValueError(str(exc)) from None


def _to_tokens(value: Any) -> Any:
    return tuple(value) if type(value) is list else value


def _to_float(value: Any) -> Any:
    """Accept whole numbers for seconds; leave anything else for the validator to refuse."""
    return float(value) if type(value) is int else value


def _to_upper(value: Any) -> Any:
    return value.upper() if type(value) is str else value


# --- the value --------------------------------------------------------------------------------

# The groups of settings, in the order docs/configuration.md and ``lockserver --help`` show
# them (its "### " headings).
NETWORK: Final = "Network"
SECURITY: Final = "Security"
ENGINE: Final = "Transactions and the engine"
TRUST: Final = "Trust (the QoS monitor)"
LATENCY: Final = "Latency and CPU"
HTTP: Final = "HTTP: metrics, health, the status page"
LOGGING: Final = "Logging"
GROUPS: Final = (NETWORK, SECURITY, ENGINE, TRUST, LATENCY, HTTP, LOGGING)


#: The parts of the lock core a setting may bound (``_about(engine=...)``): the lock store's
#: ``EngineLimits``, the wait queue's ``WaitLimits``, the change feed's limits (``LockCore``'s
#: keywords); :func:`engine_limits` gives each its settings.
ENGINE_PARTS: Final = ("store", "wait", "feed")


def _about(
    group: str,
    help: str,
    *,
    advertised: bool = False,
    engine: str | None = None,
    engine_name: str | None = None,
) -> dict[str, Any]:
    """The metadata of one setting of ServerConfig, which is declared once: its name and type
    are the field's, its default and bound the field's default and validator; ``help`` is
    its one line in ``lockserver --help``, ``group`` its section there and in
    docs/configuration.md, ``advertised`` whether the welcome and ``stats`` report it among
    the limits, ``engine`` the part of the lock core it bounds (one of ENGINE_PARTS), under
    ``engine_name`` there when that is not the setting's name."""
    assert engine is None or engine in ENGINE_PARTS, engine
    return {
        "group": group,
        "help": help,
        "advertised": advertised,
        "engine": engine,
        "engine_name": engine_name,
    }


@attrs.frozen
class ServerConfig:
    """Every setting of the server, validated. docs/configuration.md says why each default is
    what it is."""

    host: str = attrs.field(
        default="127.0.0.1",
        validator=_host,
        metadata=_about(NETWORK, "address to listen on (a name, an IPv4 or an IPv6 address)"),
    )
    port: int = attrs.field(
        default=7400,
        validator=_port,
        metadata=_about(NETWORK, "TCP port; 0 asks the OS for a free one (printed once listening)"),
    )
    # Shard processes the ``lockserver`` command starts (one independent server each, on
    # ports ``port`` .. ``port + processes - 1``, or each on a free port with port 0); 1 is
    # one plain server process. ``serve`` itself ignores it: it serves one shard.
    processes: int = attrs.field(
        default=1,
        validator=_processes,
        metadata=_about(
            NETWORK, "shard processes to start, shard i on port + i; 1: one plain server"
        ),
    )
    max_frame: int = attrs.field(
        default=1024 * 1024,
        validator=_int_at_least(1024, _MAX_FRAME_ENCODABLE),
        metadata=_about(NETWORK, "largest accepted request frame, in bytes", advertised=True),
    )
    max_ops: int = attrs.field(
        default=1000,
        validator=_int_at_least(1),
        metadata=_about(ENGINE, "most nodes in one transaction tree", advertised=True),
    )
    max_depth: int = attrs.field(
        default=32,
        validator=_int_at_least(1),
        metadata=_about(ENGINE, "deepest nesting of one transaction tree", advertised=True),
    )
    max_name: int = attrs.field(
        default=1024,
        validator=_int_at_least(1),
        metadata=_about(
            ENGINE,
            "longest name (session, namespace, table, var, tx_id, client), in characters",
            advertised=True,
        ),
    )
    max_text: int = attrs.field(
        default=4096,
        validator=_int_at_least(1),
        metadata=_about(
            ENGINE,
            "longest description (of a session, a transaction, an entry), in characters",
            advertised=True,
        ),
    )
    # Largest user value, as counted by ``protocol.value_size`` (32 per element plus the
    # bytes of its strings and binaries).
    max_value: int = attrs.field(
        default=65536,
        validator=_int_at_least(32),
        metadata=_about(
            ENGINE, "largest user value, as protocol.value_size counts it", advertised=True
        ),
    )
    max_ttl: float = attrs.field(
        default=30 * 86400.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(ENGINE, "longest ttl or period of an entry, in seconds", advertised=True),
    )
    max_connections: int = attrs.field(
        default=10_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK, "most simultaneous client connections; one more is refused", advertised=True
        ),
    )
    max_sessions: int = attrs.field(
        default=1_000_000,
        validator=_int_at_least(1),
        metadata=_about(ENGINE, "most live sessions", advertised=True, engine="store"),
    )
    max_entries: int = attrs.field(
        default=10_000_000,
        validator=_int_at_least(1),
        metadata=_about(ENGINE, "most lock entries in the server", advertised=True, engine="store"),
    )
    max_entries_per_session: int = attrs.field(
        default=100_000,
        validator=_int_at_least(1),
        metadata=_about(
            ENGINE, "most lock entries one session may hold", advertised=True, engine="store"
        ),
    )
    max_store_bytes: int = attrs.field(
        default=4 * 1024**3,
        validator=_int_at_least(1024 * 1024),
        metadata=_about(
            ENGINE,
            "budget of what the server stores, in bytes; past it: STORE_FULL",
            advertised=True,
            engine="store",
        ),
    )
    max_session_age: float = attrs.field(
        default=3600.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(
            ENGINE,
            "largest session max age (idle time) a client may ask for, in seconds",
            advertised=True,
        ),
    )
    sweep_interval: float = attrs.field(
        default=1.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(ENGINE, "longest sleep of the expiry timer, in seconds"),
    )
    max_send_buffer: int = attrs.field(
        default=4 * 1024 * 1024,
        validator=_int_at_least(1024),
        metadata=_about(
            NETWORK,
            "unsent bytes one connection may hold before it is dropped as slow",
            advertised=True,
        ),
    )
    send_timeout: float = attrs.field(
        default=10.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(
            NETWORK,
            "seconds a blocked send may make no progress before the client is dropped",
            advertised=True,
        ),
    )
    handshake_timeout: float = attrs.field(
        default=10.0,
        converter=_to_float,
        validator=_seconds(zero_ok=True),
        metadata=_about(
            NETWORK, "seconds a new connection has to send its hello; 0: no limit", advertised=True
        ),
    )
    idle_timeout: float = attrs.field(
        default=300.0,
        converter=_to_float,
        validator=_seconds(zero_ok=True),
        metadata=_about(
            NETWORK,
            "seconds a connection may send nothing before it is dropped; 0: never",
            advertised=True,
        ),
    )
    frame_timeout: float = attrs.field(
        default=15.0,
        converter=_to_float,
        validator=_seconds(zero_ok=True),
        metadata=_about(
            NETWORK,
            "seconds a request frame may take to arrive once begun; 0: no limit",
            advertised=True,
        ),
    )
    # Bytes of incomplete request frames all connections together may hold; a receive that
    # passes it closes its connection with OVERLOADED. At least ``max_frame`` + 4.
    max_receive_total: int = attrs.field(
        default=256 * 1024 * 1024,
        validator=_receive_total,
        metadata=_about(
            NETWORK, "bytes of incomplete request frames all connections may hold", advertised=True
        ),
    )
    max_send_total: int = attrs.field(
        default=512 * 1024 * 1024,
        validator=_int_at_least(1024),
        metadata=_about(
            NETWORK,
            "unsent bytes all connections may hold; past it slow ones are dropped",
            advertised=True,
        ),
    )
    max_wait: float = attrs.field(
        default=300.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(
            NETWORK,
            "longest server-side wait a transaction may ask for, in seconds",
            advertised=True,
        ),
    )
    max_waiters: int = attrs.field(
        default=100_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most parked (waiting) transactions in the server",
            advertised=True,
            engine="wait",
        ),
    )
    max_waiters_per_session: int = attrs.field(
        default=1_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK, "most parked transactions of one session", advertised=True, engine="wait"
        ),
    )
    max_waiters_per_connection: int = attrs.field(
        default=10_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most parked transactions of one connection",
            advertised=True,
            engine="wait",
            engine_name="max_waiters_per_owner",
        ),
    )
    max_waiting_ops_per_variable: int = attrs.field(
        default=200_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most weight (ops + 64 each) parked on one variable",
            advertised=True,
            engine="wait",
        ),
    )
    max_waiting_ops_per_session: int = attrs.field(
        default=100_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most weight of the transactions one session has parked",
            advertised=True,
            engine="wait",
        ),
    )
    max_waiting_ops_per_principal: int = attrs.field(
        default=10_000_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most weight of the transactions one principal has parked",
            advertised=True,
            engine="wait",
        ),
    )
    max_subscriptions: int = attrs.field(
        default=10_000,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most change-feed subscriptions of all connections together",
            advertised=True,
            engine="feed",
        ),
    )
    max_subscriptions_per_principal: int = attrs.field(
        default=2_500,
        validator=_int_at_least(1),
        metadata=_about(
            NETWORK,
            "most change-feed subscriptions of one principal (token)",
            advertised=True,
            engine="feed",
        ),
    )
    # The spin policy: lockserver.shell._busypoll.
    busy_poll: float = attrs.field(
        default=_BUSY_POLL_DEFAULT,
        converter=_to_float,
        validator=_poll_window,
        metadata=_about(
            LATENCY, "seconds the poller keeps polling after a batch in dense traffic; 0: sleep"
        ),
    )
    http_max_connections: int = attrs.field(
        default=64,
        validator=_int_at_least(1, 100_000),
        metadata=_about(HTTP, "most simultaneous HTTP connections, on top of max_connections"),
    )
    http_max_header: int = attrs.field(
        default=16 * 1024,
        validator=_int_at_least(1024, _HTTP_MAX_HEADER_MAX),
        metadata=_about(HTTP, "largest HTTP request head (request line and headers), in bytes"),
    )
    http_request_timeout: float = attrs.field(
        default=10.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(HTTP, "seconds an HTTP request may take to arrive whole once begun"),
    )
    http_idle_timeout: float = attrs.field(
        default=30.0,
        converter=_to_float,
        validator=_seconds(zero_ok=False),
        metadata=_about(HTTP, "seconds a kept-alive HTTP connection may wait for its next request"),
    )
    ready_min_trust: float = attrs.field(
        default=0.0,
        converter=_to_float,
        validator=_fraction,
        metadata=_about(HTTP, "/readyz answers 503 while trust is below this"),
    )
    ready_min_uptime: float = attrs.field(
        default=0.0,
        converter=_to_float,
        validator=_seconds(zero_ok=True),
        metadata=_about(HTTP, "/readyz answers 503 while the server is up for less, in seconds"),
    )
    log_level: str = attrs.field(
        default="INFO",
        converter=_to_upper,
        validator=_log_level,
        metadata=_about(
            LOGGING, "threshold of the lockserver logger: DEBUG, INFO, WARNING, ERROR, CRITICAL"
        ),
    )
    log_json: bool = attrs.field(
        default=False,
        validator=_bool,
        metadata=_about(LOGGING, "one JSON object per log line instead of the human format"),
    )
    # Shared-secret tokens (docs/security.md); empty: no authentication, every client may do
    # everything. Secrets never appear in the repr or in logs.
    tokens: tuple[TokenSpec, ...] = attrs.field(
        default=(),
        converter=_to_tokens,
        validator=_tokens,
        metadata=_about(
            SECURITY, "shared-secret tokens (docs/security.md); none: no authentication"
        ),
    )
    tls_cert: str = attrs.field(
        default="",
        validator=_path,
        metadata=_about(SECURITY, "PEM certificate chain of the server; empty: plain TCP"),
    )
    tls_key: str = attrs.field(
        default="",
        validator=_path,
        metadata=_about(
            SECURITY, "PEM private key of tls_cert; empty: the key is in the tls_cert file"
        ),
    )
    tls_client_ca: str = attrs.field(
        default="",
        validator=_path,
        metadata=_about(
            SECURITY, "PEM CA bundle; set: every client must present a certificate it signed"
        ),
    )
    replicate: str = attrs.field(
        default="",
        validator=_etcd_endpoints,
        metadata=_about(
            NETWORK, "etcd cluster of a replicated group (etcds://HOST:PORT,...); empty: one server"
        ),
    )
    etcd_ca_file: str = attrs.field(
        default="",
        validator=_etcd_file,
        metadata=_about(
            NETWORK, "PEM CA bundle etcd's certificates are verified with; empty: the system's"
        ),
    )
    etcd_cert_file: str = attrs.field(
        default="",
        validator=_etcd_file,
        metadata=_about(NETWORK, "PEM certificate this replica presents to etcd; empty: none"),
    )
    etcd_key_file: str = attrs.field(
        default="",
        validator=_etcd_file,
        metadata=_about(
            NETWORK, "PEM private key of etcd_cert_file; empty: the key is in that file"
        ),
    )
    etcd_user: str = attrs.field(
        default="",
        validator=_etcd_user,
        metadata=_about(NETWORK, "etcd user this replica authenticates as; empty: no etcd auth"),
    )
    etcd_password_file: str = attrs.field(
        default="",
        validator=_etcd_file,
        metadata=_about(NETWORK, "file holding etcd_user's password (mode 0600)"),
    )
    group: str = attrs.field(
        default="default",
        validator=_group_name,
        metadata=_about(
            NETWORK, "the replicated group's name, the same on every replica of the group"
        ),
    )
    replica_lease_ttl: int = attrs.field(
        default=5,
        validator=_int_at_least(2, 300),
        metadata=_about(
            NETWORK, "seconds a replica may fail to renew its etcd lease before it is dropped"
        ),
    )
    replica_snapshot_every: int = attrs.field(
        default=10_000,
        validator=_int_at_least(10),
        metadata=_about(NETWORK, "applied log entries between two snapshots of the group's state"),
    )
    replica_snapshot_chunk: int = attrs.field(
        default=16_000,
        validator=_int_at_least(1024, 1_000_000),
        metadata=_about(NETWORK, "bytes of a snapshot's state per etcd value (one put each)"),
    )
    replica_snapshot_rate: int = attrs.field(
        default=4_000_000,
        validator=_int_at_least(65_536, 1_000_000_000),
        metadata=_about(NETWORK, "bytes per second a snapshot is written to and deleted from etcd"),
    )
    replica_commit_poll: float = attrs.field(
        default=_COMMIT_POLL_DEFAULT,
        converter=_to_float,
        validator=_poll_window,
        metadata=_about(
            LATENCY,
            "seconds a replica polls for its etcd put's answer instead of sleeping; 0: sleep",
        ),
    )
    group_secret_file: str = attrs.field(
        default="",
        validator=_path,
        metadata=_about(
            NETWORK, "file holding the group's secret; empty: the log is not authenticated"
        ),
    )
    skip_revision: str = attrs.field(
        default="",
        validator=_revisions,
        metadata=_about(
            NETWORK, "log revisions (R[,R...]) whose entries a halted group's replicas skip"
        ),
    )
    #: Constants of the trust monitor (docs/trust.md); their help is TrustSettings' own.
    trust: TrustSettings = attrs.field(factory=TrustSettings, validator=_trust_settings)


def engine_limits(config: ServerConfig, part: str) -> dict[str, int]:
    """The settings that bound ``part`` of the lock core (one of ENGINE_PARTS: declared with
    ``_about(engine=part)``), by the core's name for each, in the order ServerConfig declares
    them: ``EngineLimits(**engine_limits(config, "store"))``."""
    if part not in ENGINE_PARTS:
        raise ValueError(f"part must be one of {ENGINE_PARTS}, got {part!r}")
    return {
        f.metadata["engine_name"] or f.name: getattr(config, f.name)
        for f in attrs.fields(ServerConfig)
        if f.metadata.get("engine") == part
    }


def advertised_limits(config: ServerConfig) -> dict[str, Any]:
    """The limits the welcome and ``stats`` report (PROTOCOL.md "welcome"): every setting
    declared ``advertised``, by name, in the order ServerConfig declares them."""
    return {
        f.name: getattr(config, f.name)
        for f in attrs.fields(ServerConfig)
        if f.metadata.get("advertised")
    }


# --- the loader -------------------------------------------------------------------------------

_KIND_NAMES: Final = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    tuple: "NAME:SECRET entries",
}
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})


@attrs.frozen
class _Setting:
    """One loadable setting: its flat name, kind, and where it lives in ServerConfig."""

    name: str  # flat name: "max_frame", "trust_tick"
    kind: type
    field: attrs.Attribute[Any]  # the attrs field whose validator judges it
    trust: bool  # True: a TrustSettings field

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def help(self) -> str:
        """Its one line of ``lockserver --help`` (the field's metadata)."""
        return str(self.field.metadata["help"])

    @property
    def group(self) -> str:
        """Its section of ``lockserver --help`` and docs/configuration.md."""
        return TRUST if self.trust else str(self.field.metadata["group"])

    @property
    def default(self) -> Any:
        default: Any = self.field.default
        if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
            default = default.factory()
        return default

    def check(self, value: Any) -> Any:
        """Convert and validate ``value`` with the field's own converter and validator."""
        converter = self.field.converter
        if callable(converter):
            value = converter(value)
        validator = self.field.validator
        if validator is not None:
            try:
                validator(None, self.field, value)
            except (TypeError, ValueError) as exc:
                message = str(exc).replace("TrustSettings.", "trust_")
                if self.trust and not message.startswith("trust_"):
                    message = f"trust_{message}"
                raise ValueError(message) from None
        return value


def _build_settings() -> tuple[_Setting, ...]:
    out = []
    for f in attrs.fields(ServerConfig):
        if f.name == "trust":
            continue
        out.append(_Setting(f.name, type(f.default), f, trust=False))
    for f in attrs.fields(TrustSettings):
        kind = int if type(f.default) is int else float
        out.append(_Setting(f"trust_{f.name}", kind, f, trust=True))
    return tuple(out)


_SETTINGS: Final = _build_settings()
_BY_NAME: Final = {s.name: s for s in _SETTINGS}


def _parse_text(setting: _Setting, text: str) -> Any:
    """Parse a flag or environment value by the setting's kind."""
    kind = setting.kind
    stripped = text.strip()
    try:
        if kind is bool:
            low = stripped.lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError
        if kind is int:
            return int(stripped)
        if kind is float:
            return float(stripped)
        if kind is tuple:  # the tokens, the only list-valued setting
            return parse_tokens_text(text)
    except SecurityConfigError:
        raise
    except ValueError:
        raise ValueError(f"{setting.name} must be {_KIND_NAMES[kind]}, got {text!r}") from None
    return text


def _check_typed(setting: _Setting, value: Any) -> Any:
    """Check a TOML value's type by the setting's kind (TOML is typed already)."""
    kind = setting.kind
    if kind is tuple:  # [[tokens]]
        return tokens_from_toml(value)
    if not (type(value) is kind or (kind is float and type(value) is int)):
        raise ValueError(f"{setting.name} must be {_KIND_NAMES[kind]}, got {value!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def server_version() -> str:
    """The installed distribution's version, or "unknown" when run from a bare checkout."""
    try:
        from importlib.metadata import version

        return version(DISTRIBUTION)
    except Exception:  # not installed (PYTHONPATH checkout): say so rather than fail
        return "unknown"


class _VersionAction(argparse.Action):
    """``--version``: one line, never wrapped (argparse's own action wraps long text)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> NoReturn:
        print(version_line(server_version()))
        parser.exit()


def _argument_parser() -> _Parser:
    p = _Parser(
        prog="lockserver",
        usage="%(prog)s [--config FILE] [options]",  # every option is listed below, by group
        description=(
            "An in-memory lock server. Every setting can also come from the environment "
            f"({ENV_PREFIX}<NAME>) or a TOML file (--config); a flag wins over the "
            "environment, which wins over the file. See docs/configuration.md."
        ),
        allow_abbrev=False,
    )
    p.add_argument("--version", action=_VersionAction, nargs=0, help="print the version, the build")
    p.add_argument("--config", metavar="FILE", help=f"TOML settings file (or {ENV_PREFIX}CONFIG)")
    sections = {name: p.add_argument_group(name) for name in GROUPS}
    for s in _SETTINGS:
        section = sections[s.group]
        if s.kind is tuple:  # the tokens: never echo a default or a value
            section.add_argument(
                s.flag,
                dest=s.name,
                metavar="NAME:SECRET[,...]",
                default=None,
                help=f"{s.help} (env {s.env}, default none; prefer the env or file)",
            )
        elif s.kind is bool:
            section.add_argument(
                s.flag,
                dest=s.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{s.help} (env {s.env}, default {str(s.default).lower()})",
            )
        else:
            section.add_argument(
                s.flag,
                dest=s.name,
                metavar=s.name.upper() if s.kind is str else s.kind.__name__.upper(),
                default=None,
                help=f"{s.help} (env {s.env}, default {s.default})",
            )
    return p


def _read_file(path: str) -> dict[str, tuple[Any, str]]:
    """Flat name -> (value, source) from a TOML file."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    out: dict[str, tuple[Any, str]] = {}
    for key, value in data.items():
        if key == "trust":
            if not isinstance(value, dict):
                raise ConfigError(f"[trust] in config file {path} must be a table")
            for tkey, tvalue in value.items():
                name = f"trust_{tkey}"
                if name not in _BY_NAME:
                    raise ConfigError(f"unknown setting {tkey!r} in [trust] of config file {path}")
                out[name] = (tvalue, path)
            continue
        setting = _BY_NAME.get(key)
        if setting is None or setting.trust:
            raise ConfigError(f"unknown setting {key!r} in config file {path}")
        out[key] = (value, path)
    return out


def load_config(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    """Build the ServerConfig from command-line flags, ``LOCKSERVER_*`` environment variables,
    an optional TOML file and the defaults, in that order of precedence.

    ``argv`` excludes the program name (None: ``sys.argv[1:]``); ``environ`` defaults to
    ``os.environ``. Raises :class:`ConfigError` with one line naming the setting, the problem
    and the source; ``--help`` and ``--version`` raise SystemExit(0) as argparse does.
    Unknown ``LOCKSERVER_*`` variables are ignored (clients share the prefix).
    """
    argv = list(argv) if argv is not None else sys.argv[1:]
    environ = os.environ if environ is None else environ
    args = _argument_parser().parse_args(argv)

    config_path = args.config
    if config_path is None:
        config_path = environ.get(ENV_PREFIX + "CONFIG") or None
    from_file = _read_file(config_path) if config_path else {}

    values: dict[str, Any] = {}
    for s in _SETTINGS:
        flag_value = getattr(args, s.name)
        try:
            if flag_value is not None:
                source = s.flag
                value = flag_value if s.kind is bool else _parse_text(s, flag_value)
            elif s.env in environ:
                source = s.env
                value = _parse_text(s, environ[s.env])
            elif s.name in from_file:
                raw, source = from_file[s.name]
                value = _check_typed(s, raw)
            else:
                continue
            values[s.name] = s.check(value)
        except ValueError as exc:
            raise ConfigError(f"{exc} (from {source})") from None

    trust_kwargs = {
        s.field.name: values.pop(s.name) for s in _SETTINGS if s.trust and s.name in values
    }
    try:
        trust = TrustSettings(**trust_kwargs)
        return ServerConfig(**values, trust=trust)
    except (TypeError, ValueError) as exc:  # a cross-field rule, should one be added
        raise ConfigError(str(exc)) from None
