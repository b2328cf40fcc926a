"""Real etcd on this machine, for the replication tests, the soak, the benchmark and the demo:
:class:`EtcdCluster` starts one or three etcd members as child processes on loopback ports,
with their data and logs in a temporary directory, and injects the faults the tests need
(SIGKILL, SIGSTOP/SIGCONT, restart). It deploys them as docs/replication.md does when asked:
``tls=True`` serves the client port over TLS with certificates made here (:class:`TestPki`,
trustme), ``client_cert_auth=True`` demands a client certificate, ``auth=True`` enables
etcd's auth with a root user and a ``lockserver`` user whose role may read and write one
prefix only (``auth_prefix``).

Rules kept:
- **Only loopback, only free ports.** Client and peer URLs are 127.0.0.1 on ports the kernel
  just handed out; a member that cannot bind (another process took the port in between) makes
  :meth:`EtcdCluster.start` try again on new ports, up to :data:`START_ATTEMPTS` times.
- **Bounded.** Starting (or restarting) waits at most :data:`START_TIMEOUT` seconds for every
  member to answer ``/health`` with a leader, then raises with the tail of each member's log.
- **No process outlives the test.** :meth:`EtcdCluster.terminate` SIGCONTs and SIGKILLs
  every member, reaps it and removes its data (the logs stay, for a failure's post-mortem);
  the fixtures call it in ``finally``, and an ``atexit`` hook calls it once more if the
  interpreter leaves without teardown.
- **Fast settings for tests**: heartbeat 50 ms and election timeout 500 ms, so a three-member
  cluster elects a leader (and re-elects after a kill) within about a second.

The member's readiness probe and the fixture's own calls (auth setup, wipe, status) speak
HTTP(S) with the standard library, not the client under test, so a bug in
``lockserver.replication._etcd`` cannot make the fixture look healthy. They authenticate as
root with a password that exists only in this process.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Generator
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Final

import attrs
import trio

#: The etcd binary (Debian's ``etcd-server`` puts it in /usr/bin), or None when not installed.
ETCD: Final = shutil.which("etcd")
SKIP_REASON: Final = "etcd not installed: apt-get install etcd-server"

#: Seconds a start or restart may take until every member is healthy.
START_TIMEOUT: Final = 20.0
#: Fresh ports a start tries before it gives up (a port taken between choice and bind).
START_ATTEMPTS: Final = 3
#: Raft timing for tests (milliseconds): a leader within about a second, also after a kill.
HEARTBEAT_MS: Final = 50
ELECTION_MS: Final = 500
#: The etcd user a replica authenticates as in an ``auth=True`` cluster.
LOCKSERVER_USER: Final = "lockserver"
#: bcrypt cost of the test users' passwords: etcd's minimum, so an authentication costs
#: about a millisecond instead of ~60 ms at etcd's default of 10 (keep the default in
#: production: docs/replication.md).
BCRYPT_COST: Final = 4


@attrs.frozen
class TestPki:
    """Certificates for a TLS cluster, made with trustme under ``directory``: a CA, the
    members' certificate (for 127.0.0.1 and ::1: not localhost, so a test can reach a member by
    a name its certificate does not hold), a client certificate for the
    replicas (no Common Name, which etcd's gateway refuses) and one from another CA (what a
    stranger would present)."""

    __test__ = False  # not a pytest test class, whatever its name

    ca_file: Path
    ca_key_file: Path
    server_cert_file: Path
    server_key_file: Path
    client_cert_file: Path
    client_key_file: Path
    stranger_cert_file: Path
    stranger_key_file: Path

    @classmethod
    def create(cls, directory: Path) -> TestPki:
        """New certificates under ``directory`` (keys mode 0600). Needs trustme."""
        try:
            import trustme
        except ImportError:
            raise RuntimeError(
                "an etcd cluster with TLS makes its certificates with trustme: "
                "pip install trustme (in the test and bench extras)"
            ) from None
        directory.mkdir(parents=True, exist_ok=True)
        ca, other_ca = trustme.CA(), trustme.CA()
        server = ca.issue_cert("127.0.0.1", "::1")
        # No Common Name: etcd's gateway refuses a client certificate that has one (it would
        # be ignored there, while gRPC takes it as the user). A name in the SAN instead.
        client = ca.issue_cert("lockserver.invalid")
        stranger = other_ca.issue_cert("lockserver.invalid")
        pki = cls(
            ca_file=directory / "ca.pem",
            ca_key_file=directory / "ca.key",
            server_cert_file=directory / "server.pem",
            server_key_file=directory / "server.key",
            client_cert_file=directory / "client.pem",
            client_key_file=directory / "client.key",
            stranger_cert_file=directory / "stranger.pem",
            stranger_key_file=directory / "stranger.key",
        )
        ca.cert_pem.write_to_path(str(pki.ca_file))
        ca.private_key_pem.write_to_path(str(pki.ca_key_file))
        pki.ca_key_file.chmod(0o600)
        for cert, cert_file, key_file in (
            (server, pki.server_cert_file, pki.server_key_file),
            (client, pki.client_cert_file, pki.client_key_file),
            (stranger, pki.stranger_cert_file, pki.stranger_key_file),
        ):
            cert.cert_chain_pems[0].write_to_path(str(cert_file))
            cert.private_key_pem.write_to_path(str(key_file))
            key_file.chmod(0o600)
        return pki

    def issue(self, name: str, *, common_name: str | None = None) -> tuple[Path, Path]:
        """Another client certificate from this CA (for ``name``, with ``common_name`` if
        given): its certificate and key files, beside the others."""
        import trustme

        ca = trustme.CA.from_pem(self.ca_file.read_bytes(), self.ca_key_file.read_bytes())
        cert = ca.issue_cert(name, common_name=common_name)
        cert_file = self.ca_file.with_name(f"{name}.pem")
        key_file = self.ca_file.with_name(f"{name}.key")
        cert.cert_chain_pems[0].write_to_path(str(cert_file))
        cert.private_key_pem.write_to_path(str(key_file))
        key_file.chmod(0o600)
        return cert_file, key_file

    def client_context(self, *, with_cert: bool = True) -> ssl.SSLContext:
        """An SSL context trusting the CA, presenting the client certificate if asked."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if with_cert:
            context.load_cert_chain(str(self.client_cert_file), str(self.client_key_file))
        return context


class EtcdMember:
    """One member: its name, ports, data directory, log file and process (None when not
    running)."""

    def __init__(self, name: str, client_port: int, peer_port: int, directory: Path) -> None:
        self.name = name
        self.client_port = client_port
        self.peer_port = peer_port
        self.data_dir = directory / f"{name}.data"
        self.log_path = directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of its client URL."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of its log (all runs of it), for a failure message."""
        return log_tail(self.log_path, lines)


class EtcdCluster:
    """Real etcd members under ``directory``: ``start(n_members)``, ``endpoints``, faults by
    member index, and ``terminate()``. Usable as a context manager (terminates on exit)."""

    def __init__(
        self,
        directory: Path,
        *,
        binary: str | None = ETCD,
        tls: bool = False,
        client_cert_auth: bool = False,
        auth: bool = False,
        auth_prefix: bytes = b"/lockserver/",
        auth_token_ttl: int | None = None,
    ) -> None:
        if binary is None:
            raise FileNotFoundError(SKIP_REASON)
        if client_cert_auth and not tls:
            raise ValueError("client_cert_auth needs tls")
        self.directory = directory
        self.binary = binary
        self.members: list[EtcdMember] = []
        self._registered = False
        self.tls = tls
        self.client_cert_auth = client_cert_auth
        self.auth = auth
        self.auth_prefix = auth_prefix
        self.auth_token_ttl = auth_token_ttl
        #: The certificates (``tls=True``), made when the cluster starts.
        self.pki: TestPki | None = None
        #: The ``lockserver`` user's password file (``auth=True``), mode 0600.
        self.password_file: Path | None = None
        self._password = ""
        self._root_password = secrets.token_urlsafe(18)
        self._admin_tls: ssl.SSLContext | None = None
        self._auth_on = False

    def __enter__(self) -> EtcdCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.terminate()

    @property
    def endpoints(self) -> list[str]:
        """Every member's ``127.0.0.1:PORT``, in member order."""
        return [m.endpoint for m in self.members]

    @property
    def urls(self) -> list[str]:
        """Every member's client URL (``https://`` with ``tls``), in member order."""
        scheme = "https" if self.tls else "http"
        return [f"{scheme}://{m.endpoint}" for m in self.members]

    @property
    def replicate(self) -> str:
        """The ``replicate`` setting naming this cluster (``etcds://`` with ``tls``)."""
        return ("etcds://" if self.tls else "etcd://") + ",".join(self.endpoints)

    def replica_flags(self) -> list[str]:
        """The ``lockserver`` flags (besides ``--replicate``) a replica needs to reach this
        cluster: its CA and client certificate, its etcd user and password file."""
        flags: list[str] = []
        if self.pki is not None:
            flags += ["--etcd-ca-file", str(self.pki.ca_file)]
            if self.client_cert_auth:
                flags += ["--etcd-cert-file", str(self.pki.client_cert_file)]
                flags += ["--etcd-key-file", str(self.pki.client_key_file)]
        if self.password_file is not None:
            flags += [
                "--etcd-user",
                LOCKSERVER_USER,
                "--etcd-password-file",
                str(self.password_file),
            ]
        return flags

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of ``lockserver.replication._etcd.Etcd`` for a client of this cluster
        as a replica would be (``tls``, ``user``, ``password``)."""
        options: dict[str, Any] = {}
        if self.pki is not None:
            options["tls"] = self.pki.client_context(with_cert=self.client_cert_auth)
        if self.auth:
            options["user"] = LOCKSERVER_USER
            options["password"] = self._password
        return options

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self, n_members: int = 1) -> EtcdCluster:
        """Start a new cluster of ``n_members`` (1 or 3) and return once every member is
        healthy (a leader elected, reads served). Raises RuntimeError with the members' logs
        when it does not get there."""
        if n_members not in (1, 3):
            raise ValueError(f"a test cluster has 1 or 3 members, not {n_members}")
        if self.members:
            raise RuntimeError("this cluster was already started")
        if not self._registered:
            atexit.register(self.terminate)
            self._registered = True
        if self.tls and self.pki is None:
            self.pki = TestPki.create(self.directory / "pki")
            self._admin_tls = self.pki.client_context(with_cert=self.client_cert_auth)
        for attempt in range(1, START_ATTEMPTS + 1):
            ports = free_ports(2 * n_members)
            run = self.directory / f"run{attempt}"
            run.mkdir(parents=True)
            self.members = [
                EtcdMember(f"m{i}", ports[2 * i], ports[2 * i + 1], run) for i in range(n_members)
            ]
            for i in range(n_members):
                self._spawn(i)
            try:
                self.wait_healthy()
            except RuntimeError:
                if attempt == START_ATTEMPTS or all(self.running(i) for i in range(n_members)):
                    self.terminate()
                    raise
                self.terminate()  # a member died early (a port taken?): new ports
                continue
            if self.auth:
                self._enable_auth()
            return self
        raise AssertionError("unreachable")

    def _enable_auth(self) -> None:
        """A root user, a ``lockserver`` user whose role reads and writes ``auth_prefix``
        only, then auth on: what docs/replication.md has an operator do with etcdctl."""
        self._password = secrets.token_urlsafe(18)
        self.password_file = self.directory / "lockserver.password"
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self._password + "\n")
        prefix = base64.b64encode(self.auth_prefix).decode()
        end = base64.b64encode(_prefix_end(self.auth_prefix)).decode()
        for path, body in (
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/add", {"name": "root", "password": self._root_password}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            ("/v3/auth/role/add", {"name": LOCKSERVER_USER}),
            (
                "/v3/auth/role/grant",
                {
                    "name": LOCKSERVER_USER,
                    "perm": {"permType": "READWRITE", "key": prefix, "range_end": end},
                },
            ),
            ("/v3/auth/user/add", {"name": LOCKSERVER_USER, "password": self._password}),
            ("/v3/auth/user/grant", {"user": LOCKSERVER_USER, "role": LOCKSERVER_USER}),
            ("/v3/auth/enable", {}),
        ):
            self.admin(path, body)

    def admin(self, path: str, body: dict[str, Any], *, timeout: float = 5.0) -> dict[str, Any]:
        """One call of etcd's gateway as root (after a fresh authentication when auth is on),
        through the first running member; its JSON answer. RuntimeError for an error answer."""
        running = [i for i in range(len(self.members)) if self.running(i)]
        if not running:
            raise RuntimeError("no etcd member is running")
        i = running[0]
        token = None
        if self._auth_on:
            answer = self._http(
                i, "/v3/auth/authenticate", {"name": "root", "password": self._root_password}
            )
            token = answer.get("token")
        answer = self._http(i, path, body, token=token, timeout=timeout)
        if "error" in answer:
            name = self.members[i].name
            raise RuntimeError(f"etcd {name}: {path}: {answer.get('message') or answer}")
        if path == "/v3/auth/enable":
            self._auth_on = True
        return answer

    def _http(
        self,
        i: int,
        path: str,
        body: dict[str, Any] | None,
        *,
        method: str = "POST",
        token: str | None = None,
        timeout: float = 5.0,
    ) -> dict[str, Any]:
        return _http(
            self.members[i].client_port, method, path, body, timeout, self._admin_tls, token
        )

    def change_password(self, password: str | None = None) -> None:
        """Set the ``lockserver`` user's password (to the same one by default): etcd then
        rejects every token it had issued to that user (a revocation, as an operator
        rotating a password causes). A new password is written to :attr:`password_file`."""
        if not self.auth:
            raise RuntimeError("this cluster has no auth")
        if password is not None:
            self._password = password
            assert self.password_file is not None
            self.password_file.write_text(password + "\n")
        self.admin("/v3/auth/user/changepw", {"name": LOCKSERVER_USER, "password": self._password})

    def _spawn(self, i: int) -> None:
        member = self.members[i]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        client_url = f"{'https' if self.tls else 'http'}://{member.endpoint}"
        args = [
            self.binary,
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            client_url,
            "--advertise-client-urls",
            client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"lockserver-test-{os.getpid()}-{id(self)}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
            "--bcrypt-cost",
            str(BCRYPT_COST),
        ]
        if self.pki is not None:
            args += ["--cert-file", str(self.pki.server_cert_file)]
            args += ["--key-file", str(self.pki.server_key_file)]
            if self.client_cert_auth:
                args += ["--client-cert-auth", "--trusted-ca-file", str(self.pki.ca_file)]
        if self.auth_token_ttl is not None:
            args += ["--auth-token-ttl", str(self.auth_token_ttl)]
        with member.log_path.open("ab") as log:
            member.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the terminal is the test run's, not etcd's
            )

    def running(self, i: int) -> bool:
        """Whether member ``i``'s process exists (it may be stopped)."""
        process = self.members[i].process
        return process is not None and process.poll() is None

    def terminate(self) -> None:
        """Kill every member (SIGCONT first, so a stopped one dies too), reap it and remove
        its data directory (etcd preallocates ~120 MB there); the logs stay. Safe to call
        twice and after a failed start."""
        for i, member in enumerate(self.members):
            self.kill(i)
            shutil.rmtree(member.data_dir, ignore_errors=True)
        if self._registered:
            atexit.unregister(self.terminate)
            self._registered = False

    # --- faults ------------------------------------------------------------------------------

    def kill(self, i: int) -> None:
        """SIGKILL member ``i`` and reap it (nothing happens when it is not running)."""
        process = self.members[i].process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        process.wait(timeout=10)
        self.members[i].process = None

    def stop(self, i: int) -> None:
        """SIGSTOP member ``i``: it keeps its sockets but answers nothing."""
        self._signal(i, signal.SIGSTOP)

    def cont(self, i: int) -> None:
        """SIGCONT member ``i`` after :meth:`stop`."""
        self._signal(i, signal.SIGCONT)

    def restart(self, i: int) -> None:
        """Kill member ``i`` if it runs, start it again on its ports and data, and return once
        it is healthy (blocking; in a trio test, :meth:`restart_async`)."""
        self.kill(i)
        self._spawn(i)
        self.wait_healthy([i])

    async def restart_async(self, i: int) -> None:
        """:meth:`restart` without blocking the trio run while the member comes up."""
        self.kill(i)
        self._spawn(i)
        await self.wait_healthy_async([i])

    def _signal(self, i: int, signum: signal.Signals) -> None:
        process = self.members[i].process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"etcd member {i} is not running")
        os.kill(process.pid, signum)

    # --- health ------------------------------------------------------------------------------

    def healthy(self, i: int) -> bool:
        """Whether member ``i`` answers ``/health`` with ``"true"`` (it has a leader)."""
        if not self.running(i):
            return False
        try:
            answer = self._http(i, "/health", None, method="GET", timeout=1.0)
        except (OSError, ValueError):
            return False
        return answer.get("health") == "true"

    def wait_healthy(self, members: list[int] | None = None) -> None:
        """Block until the given members (default: all) are healthy; RuntimeError with their
        logs after :data:`START_TIMEOUT` or when one exits."""
        indices = list(range(len(self.members))) if members is None else members
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            self._check_alive(indices)
            if all(self.healthy(i) for i in indices):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(self._failure("is not healthy after", indices))
            time.sleep(0.02)

    async def wait_healthy_async(self, members: list[int] | None = None) -> None:
        """:meth:`wait_healthy` under trio: each probe in a worker thread, sleeps in trio."""
        indices = list(range(len(self.members))) if members is None else members
        deadline = trio.current_time() + START_TIMEOUT
        while True:
            self._check_alive(indices)
            states = [await trio.to_thread.run_sync(self.healthy, i) for i in indices]
            if all(states):
                return
            if trio.current_time() > deadline:
                raise RuntimeError(self._failure("is not healthy after", indices))
            await trio.sleep(0.02)

    def _check_alive(self, indices: list[int]) -> None:
        dead = [i for i in indices if not self.running(i)]
        if dead:
            raise RuntimeError(self._failure("exited during start of", dead))

    def _failure(self, what: str, indices: list[int]) -> str:
        lines = [f"etcd member(s) {indices} {what} {START_TIMEOUT} s:"]
        for i in indices:
            member = self.members[i]
            lines.append(f"--- {member.name} ({member.endpoint}), {member.log_path}:")
            lines.append(member.log_tail())
        return "\n".join(lines)

    def status(self, i: int) -> dict[str, Any]:
        """Member ``i``'s maintenance status as etcd's gateway gives it (int64s as strings)."""
        return self._http(i, "/v3/maintenance/status", {}, timeout=2.0)

    def leader(self) -> int:
        """The index of the member that is the Raft leader now (asked of a running member)."""
        for i in range(len(self.members)):
            if not self.running(i):
                continue
            try:
                status = self.status(i)
            except (OSError, ValueError):
                continue
            for j in range(len(self.members)):
                if not self.running(j):
                    continue
                try:
                    if self.status(j)["header"]["member_id"] == status["leader"]:
                        return j
                except (OSError, ValueError, KeyError):
                    continue
        raise RuntimeError("no running etcd member names a running leader")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file, for a failure message ("(no log)" if none)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports the kernel has just handed out (all bound at once, so
    none repeats; released before etcd binds them)."""
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]


def _http(
    port: int,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    timeout: float,
    tls: ssl.SSLContext | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """One HTTP(S) request to a member (with ``token`` as its auth token); its JSON answer."""
    connection = (
        http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
        if tls is not None
        else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    )
    try:
        payload = None if body is None else json.dumps(body).encode()
        headers = {} if token is None else {"Authorization": token}
        connection.request(method, path, body=payload, headers=headers)
        answer = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    if not isinstance(answer, dict):
        raise ValueError(f"not a JSON object: {answer!r}")
    return answer


def started(directory: Path, n_members: int, **options: Any) -> Generator[EtcdCluster, None, None]:
    """A started cluster for a fixture (``options`` as :class:`EtcdCluster` takes them),
    terminated afterwards however the test ends."""
    cluster = EtcdCluster(directory, **options)
    try:
        yield cluster.start(n_members)
    finally:
        cluster.terminate()


def wipe(cluster: EtcdCluster) -> None:
    """Delete every key of a running cluster (through its first running member, as root)."""
    everything = {"key": "AA==", "range_end": "AA=="}  # b"\0" to the end: all keys
    cluster.admin("/v3/kv/deleterange", everything)


def _prefix_end(prefix: bytes) -> bytes:
    trimmed = prefix.rstrip(b"\xff")
    return trimmed[:-1] + bytes([trimmed[-1] + 1]) if trimmed else b"\0"
