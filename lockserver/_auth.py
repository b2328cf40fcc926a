"""Who may talk to the server and what they may touch: tokens, namespaces, the TLS context.

Why / rules kept (issue #8, docs/security.md):
- Authentication is a shared secret per client (a *token*, with a *name*: the principal),
  presented in ``hello``. With no tokens configured the server is open (loopback by default).
- Tokens are compared with :func:`hmac.compare_digest`, against *every* configured token, so
  the time taken says nothing about which token, or how much of one, matched.
- A token's secret never reaches a log line, an error message or a repr: :class:`TokenSpec`
  hides it from its repr, and every message about tokens names them by name or position.
- Authorization is per namespace: a token may list exact namespace names and prefixes
  (``"jobs-*"``); a transaction outside them is refused (FORBIDDEN) by the shell before the
  engine sees it. Session ownership (SESSION_CONFLICT) is checked by the shell (the engine
  keeps the owner as the session's tag), not here: this module is pure and holds no
  connection state.
- Administration (issue 16): a token marked ``admin = true`` (TOML only) may force-release
  entries and end another principal's session; any other token is refused (FORBIDDEN).
  Listings and the change feed show a principal only the namespaces it may use (its own
  sessions always). The shell logs every admin action with the principal's name.
- The TLS context is built once, at start, from ``tls_cert`` / ``tls_key`` / ``tls_client_ca``;
  a missing or unreadable file is a :class:`~lockserver._config.ConfigError`-style one-line
  error (raised as :class:`SecurityConfigError`).

Prior art: Redis's ``requirepass``/ACL users (named credentials with key-pattern
restrictions), etcd's per-role key prefixes, and the stdlib's advice to compare secrets with
``hmac.compare_digest``.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Iterable
from typing import Any, Final

import attrs

__all__ = [
    "ANONYMOUS",
    "Authenticator",
    "Principal",
    "SecurityConfigError",
    "TokenSpec",
    "parse_tokens_text",
    "server_ssl_context",
    "tokens_from_toml",
]

#: Name given to a token written as a bare secret (``LOCKSERVER_TOKENS=<secret>``).
DEFAULT_TOKEN_NAME: Final = "default"


class SecurityConfigError(ValueError):
    """An invalid security setting; ``str(exc)`` is one line and never contains a secret."""


def _token_name(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not str or not value.strip() or any(c in value for c in ":,"):
        raise ValueError(f"token name must be a non-blank string without ':' or ',', got {value!r}")


def _secret(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    # The value is a secret: the message must not show it.
    if type(value) is not str or not value or value != value.strip() or "," in value:
        raise ValueError("token secret must be a non-empty string without ',' or outer spaces")


def _namespaces(inst: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if type(value) is not tuple or not all(type(n) is str and n.strip() for n in value):
        raise ValueError(f"token namespaces must be a list of non-blank names, got {value!r}")
    for n in value:
        if "*" in n[:-1]:
            raise ValueError(f"token namespace {n!r}: '*' may only end a prefix")


def _to_tuple(value: Any) -> Any:
    return tuple(value) if type(value) is list else value


@attrs.frozen
class TokenSpec:
    """One configured token: its ``name`` (the principal, shown in logs), its secret
    ``token`` (never shown), and the ``namespaces`` it may use (None: all). A namespace ending
    in ``*`` is a prefix: ``"jobs-*"`` allows ``jobs-a`` and ``jobs-`` itself."""

    name: str = attrs.field(validator=_token_name)
    token: str = attrs.field(validator=_secret, repr=False)
    namespaces: tuple[str, ...] | None = attrs.field(
        default=None, converter=_to_tuple, validator=_namespaces
    )
    admin: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen
class Principal:
    """Who a connection authenticated as, and the namespaces it may use."""

    name: str
    exact: frozenset[str] | None  # None: every namespace
    prefixes: tuple[str, ...] = ()
    admin: bool = False  # may force-release and end other principals' sessions

    @classmethod
    def from_spec(cls, spec: TokenSpec) -> Principal:
        if spec.namespaces is None:
            return cls(spec.name, None, (), spec.admin)
        exact = frozenset(n for n in spec.namespaces if not n.endswith("*"))
        prefixes = tuple(n[:-1] for n in spec.namespaces if n.endswith("*"))
        return cls(spec.name, exact, prefixes, spec.admin)

    @property
    def sees_everything(self) -> bool:
        """True when it may use every namespace (listings then need no filtering)."""
        return self.exact is None

    @property
    def sees_the_server(self) -> bool:
        """True when it may read the server-wide counts (``stats``, ``/v1/status``,
        ``/metrics``): an admin token, or one that may use every namespace. Any other sees
        the counts of its own namespaces and sessions (docs/security.md)."""
        return self.admin or self.exact is None

    def allows(self, namespace: str) -> bool:
        """True when this principal may run transactions in ``namespace``."""
        if self.exact is None or namespace in self.exact:
            return True
        return any(namespace.startswith(p) for p in self.prefixes)


#: The principal of every connection of a server without tokens.
ANONYMOUS: Final = Principal("", None)


class Authenticator:
    """Maps a presented token to its :class:`Principal` (None: refused)."""

    __slots__ = ("_entries",)

    def __init__(self, tokens: Iterable[TokenSpec]) -> None:
        self._entries = tuple((t.token.encode(), Principal.from_spec(t)) for t in tokens)
        if not self._entries:
            raise ValueError("an Authenticator needs at least one token")

    def authenticate(self, presented: str | None) -> Principal | None:
        """The principal whose token is ``presented``; None when it matches none.

        Every configured token is compared, each in constant time, whatever matched."""
        if presented is None:
            return None
        candidate = presented.encode("utf-8", "surrogatepass")
        found: Principal | None = None
        for secret, principal in self._entries:
            if hmac.compare_digest(candidate, secret) and found is None:
                found = principal
        return found


# --- loading -----------------------------------------------------------------------------------


def parse_tokens_text(text: str) -> tuple[TokenSpec, ...]:
    """The flag / environment form: ``NAME:SECRET[,NAME:SECRET...]``; an entry without
    ``:`` is a bare secret named ``default``. No namespace restriction (use the TOML form)."""
    out = []
    for i, raw in enumerate(text.split(","), 1):
        entry = raw.strip()
        if not entry:
            raise SecurityConfigError(f"tokens: entry {i} is empty (expected NAME:SECRET)")
        name, sep, secret = entry.partition(":")
        if not sep:
            name, secret = DEFAULT_TOKEN_NAME, entry
        out.append(_spec(f"tokens: entry {i}", name.strip(), secret.strip(), None))
    return check_tokens(tuple(out))


def tokens_from_toml(value: Any) -> tuple[TokenSpec, ...]:
    """The TOML form: an array of tables ``[[tokens]]`` with ``name``, ``token``, optional
    ``namespaces`` (a list of strings) and optional ``admin`` (a bool)."""
    if type(value) is not list:
        raise SecurityConfigError("tokens must be an array of tables ([[tokens]])")
    out = []
    for i, item in enumerate(value, 1):
        where = f"tokens: entry {i}"
        if type(item) is not dict:
            raise SecurityConfigError(f"{where} must be a table with name and token")
        unknown = sorted(set(item) - {"name", "token", "namespaces", "admin"})
        if unknown:
            raise SecurityConfigError(f"{where} has unknown key(s) {', '.join(unknown)}")
        if "name" not in item or "token" not in item:
            raise SecurityConfigError(f"{where} needs both name and token")
        namespaces = item.get("namespaces")
        if namespaces is not None and type(namespaces) is not list:
            raise SecurityConfigError(f"{where}: namespaces must be a list of strings")
        admin = item.get("admin", False)
        if type(admin) is not bool:
            raise SecurityConfigError(f"{where}: admin must be true or false")
        out.append(_spec(where, item["name"], item["token"], namespaces, admin))
    return check_tokens(tuple(out))


def _spec(where: str, name: Any, secret: Any, namespaces: Any, admin: bool = False) -> TokenSpec:
    try:
        return TokenSpec(name, secret, namespaces, admin)
    except (TypeError, ValueError) as exc:
        raise SecurityConfigError(f"{where}: {exc}") from None


def check_tokens(tokens: Any) -> tuple[TokenSpec, ...]:
    """A tuple of TokenSpec with unique names and unique secrets, or SecurityConfigError."""
    if type(tokens) is not tuple or not all(isinstance(t, TokenSpec) for t in tokens):
        raise SecurityConfigError("tokens must be a tuple of TokenSpec")
    names: set[str] = set()
    secrets: set[str] = set()
    for t in tokens:
        if t.name in names:
            raise SecurityConfigError(f"tokens: the name {t.name!r} is used twice")
        if t.token in secrets:
            raise SecurityConfigError(f"tokens: token {t.name!r} reuses another token's secret")
        names.add(t.name)
        secrets.add(t.token)
    return tokens


# --- TLS ---------------------------------------------------------------------------------------


def server_ssl_context(cert: str, key: str = "", client_ca: str = "") -> ssl.SSLContext | None:
    """The server's TLS context, or None when ``cert`` is empty (plain TCP).

    ``key`` empty: the key is in the ``cert`` file. ``client_ca``: require client
    certificates signed by this CA bundle. TLS 1.2 is the minimum."""
    if not cert:
        if key or client_ca:
            which = "tls_key" if key else "tls_client_ca"
            raise SecurityConfigError(f"{which} is set but tls_cert is not")
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key or None)
    except (OSError, ssl.SSLError) as exc:
        what = f"{cert} / {key}" if key else cert
        reason = getattr(exc, "strerror", None) or exc
        raise SecurityConfigError(
            f"tls_cert: cannot load the certificate and key from {what}: {reason}"
        ) from None
    if client_ca:
        try:
            ctx.load_verify_locations(cafile=client_ca)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            raise SecurityConfigError(
                f"tls_client_ca: cannot load CA certificates from {client_ca}: {reason}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
