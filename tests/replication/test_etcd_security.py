"""etcd deployed as docs/replication.md says, against real members: TLS on the client port,
client certificates demanded (mutual TLS), etcd's auth with a ``lockserver`` user whose role
reads and writes the ``/lockserver/`` prefix only (issue 29).

What is pinned down: a replicated group runs through all of it; every misconfiguration a
deployment can have is a clear error naming its cause (a wrong CA, no client certificate, a
certificate of another CA or with a Common Name, a wrong password, a missing permission,
auth configured on one side only), promptly and without a write being doubled; a token etcd
revokes or lets expire is renewed without the caller noticing and without a write applied
twice.

Every test runs twice: through etcd's gRPC API (the default transport; the token goes as
gRPC's ``token`` metadata) and through its JSON gateway (``etcds+gateway://``), which must
give the same results and errors (save the one the gateway alone has: it refuses a client
certificate with a Common Name).

The certificates are made by the fixture (``lockbench.etcd.TestPki``, trustme); etcd's
password hashing runs at its cheapest cost so an authentication costs milliseconds.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from client import Assert, SetVar, open_lock_client
from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster, started, wipe
from lockserver import ServerConfig, serve
from lockserver.replication import _etcd
from lockserver.replication._etcd import EtcdAuthError, EtcdError, EtcdUnavailable

# Each test once per transport (the autouse fixture), and a client over the one running.
from .test_etcd_client import TRANSPORT, Etcd, transport  # noqa: F401

#: Seconds any one test may take.
BOUND = 30

_groups = itertools.count()


def replicate(cluster: EtcdCluster) -> str:
    """The ``replicate`` setting naming ``cluster`` over the transport of the test running."""
    if TRANSPORT[0] == "grpc":
        return cluster.replicate
    return cluster.replicate.replace("://", "+gateway://", 1)


@pytest.fixture(scope="module")
def secure_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One member with TLS, client certificates and auth, for the whole module."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    yield from started(
        tmp_path_factory.mktemp("secure"), 1, tls=True, client_cert_auth=True, auth=True
    )


@pytest.fixture
def secure(secure_module: EtcdCluster) -> EtcdCluster:
    """The module's secure member, healthy and holding no key."""
    if not secure_module.healthy(0):
        secure_module.restart(0)
    wipe(secure_module)
    return secure_module


def client(cluster: EtcdCluster, **changes: Any) -> _etcd.Etcd:
    """A client of ``cluster`` as a replica would be, with ``changes`` to its options."""
    options = {**cluster.client_options(), **changes}
    return Etcd(cluster.urls, timeout=2.0, **options)


def context(
    cluster: EtcdCluster, ca: Path | None = None, cert: tuple[Path, Path] | None = None
) -> ssl.SSLContext:
    """An SSL context trusting ``ca`` (default: the cluster's) and presenting ``cert``."""
    assert cluster.pki is not None
    ctx = ssl.create_default_context(cafile=str(ca or cluster.pki.ca_file))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return ctx


# --- a group through TLS and auth ---------------------------------------------------------------


async def test_a_group_runs_through_tls_client_certificates_and_auth(
    secure: EtcdCluster,
) -> None:
    """Two replicas whose settings name the cluster as docs/replication.md does (etcds://,
    the CA, a client certificate, a user and its password file): a lock granted through one
    is refused through the other, released, then granted there; both replicas' etcd clients
    speak TLS and hold a token."""
    assert secure.pki is not None and secure.password_file is not None
    group = f"s{next(_groups)}"
    config = ServerConfig(
        port=0,
        replicate=replicate(secure),
        group=group,
        replica_lease_ttl=2,
        etcd_ca_file=str(secure.pki.ca_file),
        etcd_cert_file=str(secure.pki.client_cert_file),
        etcd_key_file=str(secure.pki.client_key_file),
        etcd_user="lockserver",
        etcd_password_file=str(secure.password_file),
    )
    assert config.replicate.startswith("etcds")
    with trio.fail_after(BOUND):
        async with two_replicas_hand_a_lock_over(config) as replicas:
            for running in replicas:
                etcd = running.replica.etcd
                assert etcd.tls
                assert etcd.endpoint.startswith("https://")
                assert etcd.statistics().tokens >= 1
                assert etcd.transport == TRANSPORT[0]


@asynccontextmanager
async def two_replicas_hand_a_lock_over(config: ServerConfig) -> AsyncIterator[list[Any]]:
    """Two replicas of ``config``'s group, running; a lock taken through one is refused
    through the other, then granted there once its holder's session ends (asserted). Yields
    the two running servers (their replicas), stopped on exit."""
    async with trio.open_nursery() as nursery:
        r1 = await nursery.start(serve, config)
        r2 = await nursery.start(serve, config)
        lock = [Assert(SetVar("L", "x", "v"))]
        async with (
            open_lock_client("127.0.0.1", r1.port) as c1,
            open_lock_client("127.0.0.1", r2.port) as c2,
        ):
            a, b = c1.session(session_id="a"), c2.session(session_id="b")
            assert (await a.execute("ns", lock)).ok
            assert not (await b.execute("ns", lock)).ok
            await a.end()
            assert (await b.execute("ns", lock)).ok
        yield [r1, r2]
        nursery.cancel_scope.cancel()


async def test_tls_connections_are_kept_alive(secure: EtcdCluster) -> None:
    """Sequential calls over TLS share one connection (one handshake), tokens included."""
    with trio.fail_after(BOUND):
        async with client(secure) as etcd:
            for i in range(10):
                await etcd.put(b"/lockserver/alive", b"%d" % i)
                await etcd.get(b"/lockserver/alive")
            assert etcd.statistics().connections_opened == 1


async def test_the_lockserver_user_reaches_its_prefix_only(secure: EtcdCluster) -> None:
    """The role the docs give the replicas' user allows /lockserver/ and nothing else: a
    write or a read elsewhere is an EtcdAuthError saying what to grant, never retried."""
    with trio.fail_after(BOUND):
        async with client(secure) as etcd:
            assert await etcd.put(b"/lockserver/g/k", b"v") > 0
            before = etcd.statistics().requests
            with pytest.raises(EtcdAuthError, match=r"permission denied.*grant its role"):
                await etcd.put(b"/other/k", b"v")
            with pytest.raises(EtcdAuthError, match="permission denied"):
                await etcd.get(b"/other/k")
            assert etcd.statistics().requests == before + 2  # one attempt each


# --- TLS misconfigurations ----------------------------------------------------------------------


async def test_a_wrong_ca_is_a_clear_error_and_no_write_went_out(secure: EtcdCluster) -> None:
    """A client trusting another CA: every call raises EtcdUnavailable saying the server's
    certificate is not trusted; a put says the write cannot have been applied."""
    assert secure.pki is not None
    with trio.fail_after(BOUND):
        async with client(secure, tls=context(secure, ca=secure.pki.stranger_cert_file)) as etcd:
            with pytest.raises(EtcdUnavailable, match="certificate is not trusted") as caught:
                await etcd.put(b"/lockserver/k", b"v")
            assert not caught.value.maybe_applied
            assert secure.urls[0] in str(caught.value)
        async with client(secure) as etcd:
            assert await etcd.get(b"/lockserver/k") is None


async def test_a_host_name_the_certificate_does_not_name_is_refused(secure: EtcdCluster) -> None:
    """Host names are checked: the member's certificate names 127.0.0.1 and ::1; asked as
    localhost (the same member), the client refuses it."""
    port = secure.members[0].client_port
    with trio.fail_after(BOUND):
        async with Etcd(
            [f"https://localhost:{port}"], timeout=2.0, **secure.client_options()
        ) as etcd:
            with pytest.raises(EtcdUnavailable, match=r"not trusted.*(mismatch|match)"):
                await etcd.get(b"/lockserver/k")


async def test_no_client_certificate_is_a_clear_error_and_no_write_went_out(
    secure: EtcdCluster,
) -> None:
    """Against etcd's --client-cert-auth, a client without a certificate, or with one of
    another CA, is told its certificate was refused; a put is not "maybe applied" (etcd
    refused the connection before reading a request)."""
    assert secure.pki is not None
    stranger = (secure.pki.stranger_cert_file, secure.pki.stranger_key_file)
    with trio.fail_after(BOUND):
        for tls in (context(secure), context(secure, cert=stranger)):
            async with client(secure, tls=tls) as etcd:
                with pytest.raises(EtcdUnavailable, match="refused this client's certificate") as c:
                    await etcd.put(b"/lockserver/k", b"v")
                assert not c.value.maybe_applied


async def test_a_client_certificate_with_a_common_name_is_explained(secure: EtcdCluster) -> None:
    """etcd's gateway refuses a client certificate that has a Common Name: the error says
    so and how to issue one it accepts. etcd's gRPC API takes it (the user is the token's)."""
    assert secure.pki is not None
    named = secure.pki.issue("named.invalid", common_name="lockserver")
    with trio.fail_after(BOUND):
        async with client(secure, tls=context(secure, cert=named)) as etcd:
            if etcd.transport == "grpc":
                await etcd.put(b"/lockserver/k", b"v")
                kv = await etcd.get(b"/lockserver/k")
                assert kv is not None and kv.value == b"v"
                return
            with pytest.raises(EtcdAuthError, match=r"Common Name.*subject alternative name"):
                await etcd.get(b"/lockserver/k")


# --- auth ---------------------------------------------------------------------------------------


async def test_a_wrong_password_is_an_auth_error_asked_once(secure: EtcdCluster) -> None:
    """A wrong password: EtcdAuthError naming the settings to fix, after one authentication
    (not retried, not failed over), and nothing written."""
    with trio.fail_after(BOUND):
        async with client(secure, password="not-the-password") as etcd:
            with pytest.raises(EtcdAuthError, match="wrong user name or password") as caught:
                await etcd.put(b"/lockserver/k", b"v")
            assert "not-the-password" not in str(caught.value)
            assert "not-the-password" not in repr(etcd)
            assert etcd.statistics().requests == 1
            assert etcd.statistics().tokens == 0


async def test_no_user_against_etcd_with_auth_is_refused(secure: EtcdCluster) -> None:
    """A client without a user, where etcd requires one (and takes no identity from the
    gateway's certificate): EtcdAuthError naming the setting."""
    with trio.fail_after(BOUND):
        async with client(secure, user=None, password=None) as etcd:
            with pytest.raises(EtcdAuthError, match=r"permission denied.*etcd_user, or none"):
                await etcd.get(b"/lockserver/k")


async def test_a_user_against_etcd_without_auth_is_refused(etcd1: EtcdCluster) -> None:
    """A user configured here while etcd's auth is off would give a false sense of safety:
    EtcdAuthError saying auth is not enabled in etcd."""
    with trio.fail_after(BOUND):
        async with Etcd(etcd1.endpoints, user="lockserver", password="pw") as etcd:
            with pytest.raises(EtcdAuthError, match="not enabled"):
                await etcd.get(b"k")


async def test_a_revoked_token_is_renewed_and_no_write_is_doubled(secure: EtcdCluster) -> None:
    """Changing the user's password revokes its tokens (what a password rotation does): the
    next put, transaction and watch get a new token by themselves, and each write is applied
    exactly once (the key's version counts the puts)."""
    with trio.fail_after(BOUND):
        async with client(secure) as etcd:
            await etcd.put(b"/lockserver/r", b"1")
            assert etcd.statistics().tokens == 1
            secure.change_password()
            revision = await etcd.put(b"/lockserver/r", b"2")
            assert etcd.statistics().tokens == 2
            kv = await etcd.get(b"/lockserver/r")
            assert kv is not None
            assert (kv.value, kv.version, kv.mod_revision) == (b"2", 2, revision)

            secure.change_password()
            ok, _ = await etcd.put_if_absent(b"/lockserver/once", b"x")
            assert ok
            assert etcd.statistics().tokens == 3
            once = await etcd.get(b"/lockserver/once")
            assert once is not None
            assert once.version == 1

            secure.change_password()
            async with etcd.watch(b"/lockserver/r", start_revision=revision) as stream:
                batch = await stream.__anext__()
            assert [e.value for e in batch] == [b"2"]
            assert etcd.statistics().tokens == 4


async def test_tasks_meeting_a_revoked_token_together_renew_it_once(secure: EtcdCluster) -> None:
    """Ten tasks whose requests all meet the revoked token: one authenticates, the others use
    its token; every write lands once."""
    with trio.fail_after(BOUND):
        async with client(secure) as etcd:
            await etcd.put(b"/lockserver/t/0", b"")
            secure.change_password()
            async with trio.open_nursery() as nursery:
                for i in range(10):
                    nursery.start_soon(etcd.put, b"/lockserver/t/%d" % i, b"v")
            assert etcd.statistics().tokens == 2
            kvs, _ = await etcd.get_prefix(b"/lockserver/t/")
            assert sorted(kv.version for kv in kvs) == [1] * 9 + [2]


async def test_a_new_password_is_an_auth_error_not_a_loop(secure: EtcdCluster) -> None:
    """When the password changed for good (the client's is stale), the renewal fails with
    EtcdAuthError: one authentication, no loop."""
    with trio.fail_after(BOUND):
        async with client(secure) as etcd:
            await etcd.put(b"/lockserver/p", b"1")
            old = secure.client_options()["password"]
            secure.change_password("rotated-" + old)
            try:
                with pytest.raises(EtcdAuthError, match="wrong user name or password"):
                    await etcd.put(b"/lockserver/p", b"2")
            finally:
                secure.change_password(old)
            kv = await etcd.get(b"/lockserver/p")
            assert kv is not None
            assert kv.value == b"1"


async def test_an_expired_token_is_renewed(tmp_path: Path) -> None:
    """etcd (``--auth-token-ttl 1``) drops a token unused for a second: the next call gets a
    new one by itself. Real time: etcd's token clock cannot be mocked (bounded: ~3 s). (And
    a client without a user there is told etcd requires authentication.)"""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    with EtcdCluster(tmp_path, auth=True, auth_token_ttl=1) as cluster:
        cluster.start(1)
        with trio.fail_after(BOUND):
            async with Etcd(cluster.urls) as anonymous:
                with pytest.raises(EtcdAuthError, match=r"requires authentication.*etcd_user"):
                    await anonymous.get(b"/lockserver/e")
            async with Etcd(cluster.urls, **cluster.client_options()) as etcd:
                await etcd.put(b"/lockserver/e", b"1")
                await trio.sleep(2.5)  # etcd's TTL (1 s) and its sweep's tick (1 s)
                await etcd.put(b"/lockserver/e", b"2")
                assert etcd.statistics().tokens == 2
                kv = await etcd.get(b"/lockserver/e")
                assert kv is not None
                assert kv.version == 2


async def test_a_replica_with_a_wrong_password_exits_saying_why(
    secure: EtcdCluster, tmp_path: Path
) -> None:
    """``serve`` with a password file holding a wrong password fails at the group's first
    call with the EtcdAuthError (the command prints it and exits 1)."""
    assert secure.pki is not None
    wrong = tmp_path / "wrong.password"
    wrong.write_text("wrong\n")
    wrong.chmod(0o600)
    config = ServerConfig(
        port=0,
        replicate=replicate(secure),
        group="denied",
        etcd_ca_file=str(secure.pki.ca_file),
        etcd_cert_file=str(secure.pki.client_cert_file),
        etcd_key_file=str(secure.pki.client_key_file),
        etcd_user="lockserver",
        etcd_password_file=str(wrong),
    )
    with trio.fail_after(BOUND), pytest.raises(EtcdError, match="wrong user name or password"):
        await serve(config)
