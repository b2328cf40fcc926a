"""The ``lockserver://`` URL and its options, through ``get_coordinator``: bad URLs and
options are refused with a ValueError naming what is wrong (never a token in the URL); a
server that cannot be reached is tooz's ToozConnectionError at ``start()``; the token comes
from a file or the environment, TLS from the CA file; tooz's characteristics are stated."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import trustme
from support import ThreadedServer
from tooz import coordination
from tooz_support import Make, member, url_of

from lockserver import RunningServer
from lockserver._auth import TokenSpec

SECRET = "tooz-secret-0123456789abcdef"


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        ("lockserver://", "expected lockserver://host:port"),
        ("lockserver://127.0.0.1", "is not host:port"),
        ("lockserver://127.0.0.1:0", "is not host:port"),
        ("lockserver://127.0.0.1:99999", "is not host:port"),
        ("lockserver://127.0.0.1:7400,", "expected lockserver://host:port"),
        ("lockserver://user:pw@127.0.0.1:7400", "no credentials in the URL"),
        ("lockserver://127.0.0.1:7400?token=s3cret", "never put the token in the URL"),
        ("lockserver://127.0.0.1:7400?colour=blue", "unknown option 'colour'"),
        ("lockserver://127.0.0.1:7400?namespace=a&namespace=b", "given 2 times"),
        ("lockserver://127.0.0.1:7400/a/b", "the path is the namespace"),
        ("lockserver://127.0.0.1:7400/a?namespace=b", "disagree"),
        ("lockserver://127.0.0.1:7400?session_max_age=0", "must be a finite number > 0"),
        ("lockserver://127.0.0.1:7400?session_max_age=soon", "must be a number of seconds"),
        ("lockserver://127.0.0.1:7400?session_max_age=5&timeout=6", "disagree"),
        ("lockserver://127.0.0.1:7400?call_timeout=inf", "must be a finite number > 0"),
        ("lockserver://127.0.0.1:7400?tls=maybe", "tls must be 1 or 0"),
        ("lockserver://127.0.0.1:7400?token_env=TOOZ_TEST_NOT_SET", "is not set"),
        ("lockserver://127.0.0.1:7400?token_file=/nonexistent/token", "token_file"),
        ("lockserver://127.0.0.1:7400?ca_file=/nonexistent/ca.pem", "ca_file"),
        (
            "lockserver://127.0.0.1:7400?token_env=A&token_file=/b",
            "token_file or token_env, not both",
        ),
    ],
)
def test_bad_urls_are_refused_with_what_is_wrong(url: str, complaint: str) -> None:
    """Each bad URL gets a ValueError from ``get_coordinator`` whose text says what is
    wrong; a refused token never appears in the message."""
    with pytest.raises(ValueError, match="lockserver URL") as caught:
        coordination.get_coordinator(url, member())
    assert complaint in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_a_bad_member_id_is_refused() -> None:
    """Member ids are text (UTF-8 bytes): others are a ValueError."""
    with pytest.raises(ValueError, match="member_id must be UTF-8"):
        coordination.get_coordinator("lockserver://127.0.0.1:7400", b"\xff\xfe")


def test_a_server_that_is_not_there_is_a_connection_error() -> None:
    """``start()`` against a port nobody listens on raises tooz's ToozConnectionError
    naming the address."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        c = coordination.get_coordinator(url_of(port), member())
        with pytest.raises(coordination.ToozConnectionError, match=f"127.0.0.1:{port}"):
            c.start()
    assert not c.is_started


def test_the_characteristics_are_stated() -> None:
    """tooz's characteristics: distributed across threads, processes and hosts;
    linearizable (and so serializable, sequential, causal); not NON_TIMEOUT_BASED (a dead
    member's session expires); asking for a missing one is ToozDriverChosenPoorly."""
    C = coordination.Characteristics
    c = coordination.get_coordinator(
        "lockserver://127.0.0.1:7400",
        member(),
        characteristics=[C.DISTRIBUTED_ACROSS_HOSTS, C.LINEARIZABLE, C.SERIALIZABLE],
    )
    assert C.NON_TIMEOUT_BASED not in c.CHARACTERISTICS
    with pytest.raises(coordination.ToozDriverChosenPoorly):
        coordination.get_coordinator(
            "lockserver://127.0.0.1:7400", member(), characteristics=[C.NON_TIMEOUT_BASED]
        )


@pytest.fixture
def token_server() -> ThreadedServer[RunningServer]:
    ts: ThreadedServer[RunningServer] = ThreadedServer(
        tokens=(TokenSpec("svc", SECRET, ("tooz",)),)
    ).start()
    try:
        yield ts  # type: ignore[misc]
    finally:
        ts.stop()


def test_the_token_comes_from_a_file_or_the_environment(
    token_server: ThreadedServer[RunningServer],
    coordinators: Make,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against a server that asks for a token: without one, ``start()`` fails (a
    ToozError); with ``token_file`` or ``token_env`` the coordinators work (a lock taken by
    one excludes the other)."""
    port = token_server.port
    with pytest.raises(coordination.ToozError):
        coordinators(url_=url_of(port))
    path = tmp_path / "token"
    path.write_text(SECRET + "\n")
    monkeypatch.setenv("TOOZ_TEST_TOKEN", SECRET)
    a = coordinators(url_=url_of(port, f"token_file={path}"))
    b = coordinators(url_=url_of(port, "token_env=TOOZ_TEST_TOKEN"))
    assert a.get_lock(b"t").acquire(blocking=False)
    assert not b.get_lock(b"t").acquire(blocking=False)


def test_tls_with_a_ca_file(coordinators: Make, tmp_path: Path) -> None:
    """A TLS server is reached with ``ca_file`` (its CA) and the name checked; without TLS
    the start fails."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    chain, key, ca_file = tmp_path / "s.pem", tmp_path / "s.key", tmp_path / "ca.pem"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    ts: ThreadedServer[RunningServer] = ThreadedServer(
        tls_cert=str(chain), tls_key=str(key)
    ).start()
    try:
        c = coordinators(url_=url_of(ts.port, f"ca_file={ca_file}"))
        assert c.get_lock(b"tls").acquire(blocking=False)
        c.stop()
        with pytest.raises(coordination.ToozError):
            coordinators(url_=url_of(ts.port, "connect_timeout=2"))
    finally:
        ts.stop()


def test_the_backend_is_registered_under_tooz_backends() -> None:
    """The installed distribution declares the ``lockserver`` backend under tooz's entry
    point group, naming the driver class (tooz finds it there by the URL's scheme)."""
    from importlib.metadata import entry_points

    from client.tooz_driver import LockServerDriver

    (found,) = entry_points(group="tooz.backends", name="lockserver")
    assert found.value == "client.tooz_driver:LockServerDriver"
    assert found.load() is LockServerDriver
