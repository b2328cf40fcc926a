"""Fixtures of the security tests: a trustme CA, server and client certificates on disk, and
a helper to start a real server on 127.0.0.1, port 0."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """The CA that signs the server's certificate (clients trust it)."""
    return trustme.CA()


@pytest.fixture(scope="session")
def client_ca() -> trustme.CA:
    """A second CA, for client certificates (the server trusts it with tls_client_ca)."""
    return trustme.CA()


@pytest.fixture
def server_files(ca: trustme.CA, tmp_path: Path) -> tuple[str, str]:
    """(certificate chain, key) PEM files of a server certificate for 127.0.0.1."""
    cert = ca.issue_cert("127.0.0.1", "localhost")
    chain = tmp_path / "server.pem"
    key = tmp_path / "server.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return str(chain), str(key)


@pytest.fixture
def client_ctx(ca: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts ``ca`` and checks the name 127.0.0.1."""
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    return ctx
