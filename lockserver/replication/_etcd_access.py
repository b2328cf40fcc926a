"""How a replica reaches etcd: the syntax of ``replicate``, the TLS context of the etcd
client, the password file, and the client built from the settings with a warning for each
defence that is missing.

This module owns the step from the etcd settings (:class:`EtcdSettings`, which
``ServerConfig`` has: ``replicate``, ``etcd_ca_file``, ``etcd_cert_file``, ``etcd_key_file``,
``etcd_user``, ``etcd_password_file``; docs/replication.md "Deploy") to a ready
:class:`Etcd`.

Rules kept:
- **One cluster, one way in.** ``replicate`` is ``etcd://HOST:PORT[,...]`` (plain HTTP),
  ``etcds://HOST:PORT[,...]`` (TLS), or a list of ``http://`` or ``https://`` URLs; every
  endpoint has the same scheme (a cluster reached partly in clear would give its secrets to
  whoever listens on the clear part). Each mistake is a one-line error naming the part.
- **gRPC unless the gateway is asked for.** Every call goes through etcd's gRPC API, which
  every member serves on its client port; ``etcd+gateway://`` / ``etcds+gateway://`` send
  them through etcd's JSON gateway instead (the only transport before issue 29), and
  ``etcd+grpc://`` / ``etcds+grpc://`` are accepted as the default's explicit names.
- **Secrets never on a command line, never readable by others.** The password comes from a
  file (``etcd_password_file``, also by environment or TOML: the *path* is the setting); the
  file must be a regular file that neither its group nor others may read or write (mode
  0600 or 0400, as ssh demands of a private key), or the server refuses to start. The
  password appears in no message and no repr. The file is read at start and again at each
  authentication, so a rotation is: the new password into every replica's file, then into
  etcd (which revokes the old tokens; each replica then logs in with the file's).
- **An unprotected etcd is said out loud.** Plain HTTP (a laptop demo) works, with a warning
  in the log at start; so does TLS without a user or a client certificate, and a password
  sent over plain HTTP, each with its own warning.
- Files are read when the server starts (a config can be built where the files are not).
  A file that cannot be read or parsed is a :class:`SecurityConfigError` naming it.

Prior art: etcdctl's ``--cacert/--cert/--key/--user`` and its ``https://`` endpoints, ssh's
refusal of a private key others can read, PostgreSQL's same rule for its ``.pgpass``.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from functools import partial
from typing import Final, Literal, Protocol

from lockserver._auth import SecurityConfigError

from ._etcd import Etcd, EtcdAuthError
from ._etcd_http import parse_endpoint

__all__ = [
    "EtcdSettings",
    "etcd_client",
    "etcd_endpoints",
    "etcd_transport",
    "etcd_tls_context",
    "read_password_file",
]

log = logging.getLogger("lockserver")

#: Longest password read from a password file, in bytes.
MAX_PASSWORD: Final = 4096
_SCHEMES: Final = {"etcd://": "http", "etcds://": "https"}
#: The same endpoints with the transport named: ``+gateway`` (etcd's JSON gateway,
#: ``_etcd_http.py``) or ``+grpc`` (the default, etcd's gRPC API, ``_etcd_grpc.py``).
_TRANSPORT_SCHEMES: Final[dict[str, tuple[str, Literal["gateway", "grpc"]]]] = {
    "etcd+gateway://": ("etcd://", "gateway"),
    "etcds+gateway://": ("etcds://", "gateway"),
    "etcd+grpc://": ("etcd://", "grpc"),
    "etcds+grpc://": ("etcds://", "grpc"),
}
_FORMS: Final = (
    "etcd://HOST:PORT[,HOST:PORT...] (plain HTTP), etcds://HOST:PORT[,HOST:PORT...] (TLS), "
    "etcd+gateway:// or etcds+gateway:// (the same, through etcd's JSON gateway), "
    "or http://HOST:PORT[,http://...] / https://HOST:PORT[,https://...]"
)


class EtcdSettings(Protocol):
    """The settings an etcd client is built from (``ServerConfig`` has them)."""

    @property
    def replicate(self) -> str: ...
    @property
    def etcd_ca_file(self) -> str: ...
    @property
    def etcd_cert_file(self) -> str: ...
    @property
    def etcd_key_file(self) -> str: ...
    @property
    def etcd_user(self) -> str: ...
    @property
    def etcd_password_file(self) -> str: ...


def etcd_endpoints(text: str) -> tuple[str, ...]:
    """The endpoints ``replicate`` names, as URLs (``http://HOST:PORT`` or
    ``https://HOST:PORT``); ValueError with one line naming what is wrong."""
    if type(text) is not str or not text.strip():
        raise ValueError(f"must be {_FORMS}, got {text!r}")
    text = text.strip()
    for named, (plain, _) in _TRANSPORT_SCHEMES.items():
        if text.lower().startswith(named):
            text = plain + text[len(named) :]
    for prefix, scheme in _SCHEMES.items():
        if text.lower().startswith(prefix):
            parts = text[len(prefix) :].split(",")
            for part in parts:
                if "://" in part:
                    raise ValueError(
                        f"{part.strip()!r} has a scheme of its own inside {prefix}: give "
                        f"{prefix}HOST:PORT,HOST:PORT or a list of URLs (in {text!r})"
                    )
            return tuple(_url(part, scheme, text) for part in parts)
    parts = text.split(",")
    schemes: set[str] = set()
    for part in parts:
        if "://" not in part:
            raise ValueError(
                f"{part.strip()!r} has no scheme: must be {_FORMS}, got {text!r}"
                if len(parts) > 1
                else f"must be {_FORMS}, got {text!r}"
            )
        schemes.add(part.strip().split("://", 1)[0].lower())
    urls = tuple(_url(part, "", text) for part in parts)
    if len(schemes) > 1:
        raise ValueError(
            f"mixes http:// and https:// endpoints: one etcd cluster is reached one way "
            f"(got {text!r})"
        )
    return urls


def etcd_transport(text: str) -> Literal["gateway", "grpc"]:
    """How ``replicate`` says the calls reach etcd: ``"gateway"`` for ``etcd+gateway://``
    and ``etcds+gateway://``, else ``"grpc"``."""
    lowered = text.strip().lower() if type(text) is str else ""
    for named, (_, transport) in _TRANSPORT_SCHEMES.items():
        if lowered.startswith(named):
            return transport
    return "grpc"


def _url(part: str, scheme: str, whole: str) -> str:
    part = part.strip()
    if not part:
        raise ValueError(f"an empty endpoint in {whole!r}")
    try:
        if scheme:
            return parse_endpoint(part, default_scheme=scheme).url
        return parse_endpoint(part).url
    except ValueError as exc:
        message = str(exc).removeprefix("etcd endpoint ")
        raise ValueError(f"{message} (in {whole!r})") from None


def etcd_tls_context(ca_file: str, cert_file: str, key_file: str) -> ssl.SSLContext:
    """The context etcd's certificates are verified with: ``ca_file`` (PEM; empty: the
    system's CAs), host names checked, TLS 1.2 at least, and this client's certificate
    ``cert_file`` with its key ``key_file`` (empty: in the certificate's file) when given."""
    try:
        context = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise SecurityConfigError(
            f"etcd_ca_file {ca_file}: cannot load a CA bundle ({_why(exc)})"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file:
        try:
            context.load_cert_chain(cert_file, key_file or None)
        except (OSError, ssl.SSLError) as exc:
            where = f"{cert_file} / {key_file}" if key_file else cert_file
            raise SecurityConfigError(
                f"etcd_cert_file {where}: cannot load the certificate and its key ({_why(exc)})"
            ) from None
    return context


def read_password_file(path: str) -> str:
    """The password in ``path``: its text without one trailing newline. Refused (a
    :class:`SecurityConfigError` naming the file and the fix) when the file cannot be read,
    is not a regular file, may be read or written by its group or others, is empty, or is
    not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise SecurityConfigError(
            f"etcd_password_file {path}: cannot read it ({_why(exc)})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecurityConfigError(f"etcd_password_file {path}: not a regular file")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise SecurityConfigError(
                f"etcd_password_file {path}: its group or others may read or write it (mode "
                f"{mode:04o}); a secret must be its owner's alone: chmod 600 {path}"
            )
        data = os.read(fd, MAX_PASSWORD + 3)
    finally:
        os.close(fd)
    if len(data) > MAX_PASSWORD + 2:
        raise SecurityConfigError(
            f"etcd_password_file {path}: longer than {MAX_PASSWORD} bytes: not a password"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecurityConfigError(f"etcd_password_file {path}: not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise SecurityConfigError(f"etcd_password_file {path}: empty")
    if "\n" in text or "\0" in text:
        raise SecurityConfigError(f"etcd_password_file {path}: more than one line")
    return text


def etcd_client(config: EtcdSettings, *, timeout: float = 5.0) -> Etcd:
    """The etcd client of a replica with these settings (files read now), after logging a
    warning for each defence that is missing. Raises :class:`SecurityConfigError` for a file
    that cannot be used."""
    endpoints = etcd_endpoints(config.replicate)
    tls_on = endpoints[0].startswith("https://")
    tls = (
        etcd_tls_context(config.etcd_ca_file, config.etcd_cert_file, config.etcd_key_file)
        if tls_on
        else None
    )
    transport = etcd_transport(config.replicate)
    password_file = config.etcd_password_file
    # Read now, so a bad file stops the start; read again at each authentication, so a
    # password rotated in the file is used once etcd rejects the old token.
    password = read_password_file(password_file) if config.etcd_user else None
    where = ", ".join(endpoints)
    if not tls_on:
        log.warning(
            "etcd (%s) is reached over plain HTTP: whoever can reach its port can read and "
            "write this group's log. Deploy etcd with TLS and auth (etcds://, etcd_ca_file, "
            "etcd_user: docs/replication.md)",
            where,
        )
        if config.etcd_user:
            log.warning(
                "the password of etcd user %r crosses the network in clear (plain HTTP)",
                config.etcd_user,
            )
    elif not config.etcd_user and not config.etcd_cert_file:
        log.warning(
            "etcd (%s) is reached with TLS but with neither etcd_user nor etcd_cert_file: "
            "etcd cannot tell this replica from anyone else who reaches its port "
            "(docs/replication.md)",
            where,
        )
    return Etcd(
        endpoints,
        timeout=timeout,
        tls=tls,
        user=config.etcd_user or None,
        password=None if password is None else partial(_read_again, password_file),
        transport=transport,
    )


def _read_again(path: str) -> str:
    """The password file's content at a renewal; an unusable file is an EtcdAuthError (the
    call that needed the token fails with it, and the next one reads the file again)."""
    try:
        return read_password_file(path)
    except SecurityConfigError as exc:
        raise EtcdAuthError(str(exc)) from None


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
