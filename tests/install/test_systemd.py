"""The systemd unit (deploy/systemd/, issue 32; docs/operations.md, "Running it as a daemon").

systemd is not the init of the machines this suite runs on, so the unit cannot be started
here. What can run does: ``systemd-analyze verify`` loads the unit and its replica drop-in as
systemd would and must say nothing (an unknown or misspelt key is a warning, which fails the
test); ``systemd-analyze security --offline`` scores its hardening; the unit's promises are
read from the file (its own user, no new privileges, a read-only system, the settings file
with the tokens and the group secret as credentials, no secret on the command line); and its
``ExecStart`` runs as systemd would run it, with ``%d`` a credentials directory holding a
settings file with a token: the server starts and asks for that token.

``systemd-analyze`` comes with Debian's ``systemd`` package (.ci/run installs it); without it
those two tests skip, saying so.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from client import AccessDenied, LockClient
from lockbench._spawn import free_port

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "lockserver.service"
DROP_IN = ROOT / "deploy" / "systemd" / "lockserver.service.d" / "replica.conf"
#: Where the unit expects the command (the install the unit's header describes).
INSTALLED = "/opt/skylock/bin/lockserver"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian: apt-get install systemd)"
)


def directives(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) of each directive of a unit file, in order (keys repeat)."""
    found, section = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key.strip(), value.strip()))
    return found


def values(path: Path, key: str) -> list[str]:
    return [v for s, k, v in directives(path) if s == "Service" and k == key]


def lockserver_command() -> str:
    """The ``lockserver`` command of this test environment, standing in for the installed
    one."""
    command = Path(sys.executable).with_name("lockserver")
    assert command.exists(), command
    return str(command)


@pytest.fixture
def unit_dir(tmp_path: Path) -> Path:
    """The unit and its drop-in, copied with the command's path made this environment's
    (``verify`` checks that the program exists)."""
    (tmp_path / "lockserver.service.d").mkdir()
    text = UNIT.read_text()
    assert INSTALLED in text
    (tmp_path / UNIT.name).write_text(text.replace(INSTALLED, lockserver_command()))
    shutil.copy(DROP_IN, tmp_path / "lockserver.service.d" / DROP_IN.name)
    return tmp_path


@needs_analyze
def test_systemd_analyze_verify_says_nothing(unit_dir: Path) -> None:
    """The unit and the replica drop-in load without an error or a warning."""
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "verify", str(unit_dir / UNIT.name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and done.stdout == ""


@needs_analyze
def test_the_hardening_scores_ok(unit_dir: Path) -> None:
    """``systemd-analyze security --offline`` rates the unit's exposure at most 2.0 ("OK" is
    below 4; an unhardened service scores 9.6)."""
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", str(unit_dir / UNIT.name)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(r"Overall exposure level for lockserver\.service: ([\d.]+)", done.stdout)
    assert found is not None, done.stdout + done.stderr
    assert float(found.group(1)) <= 2.0, done.stdout


def test_the_unit_runs_as_its_own_user_without_privileges() -> None:
    """Its own (dynamic) user, no new privileges, no capability, the system read-only, homes
    hidden; restarted on failure; started at boot."""
    d = directives(UNIT)
    for setting in (
        ("Service", "DynamicUser", "yes"),
        ("Service", "User", "lockserver"),
        ("Service", "NoNewPrivileges", "yes"),
        ("Service", "CapabilityBoundingSet", ""),
        ("Service", "ProtectSystem", "strict"),
        ("Service", "ProtectHome", "yes"),
        ("Service", "PrivateTmp", "yes"),
        ("Service", "Restart", "on-failure"),
        ("Install", "WantedBy", "multi-user.target"),
    ):
        assert setting in d, setting


def test_secrets_come_as_credentials_never_as_arguments() -> None:
    """The settings file (tokens, TLS) is a credential the command reads from ``%d``; the
    replica drop-in adds the group secret as a credential, named to the server by the
    ``group_secret_file`` setting; no token or secret flag on the command line, no secret in
    the environment."""
    assert values(UNIT, "LoadCredential") == ["settings.toml:/etc/lockserver/settings.toml"]
    [start] = values(UNIT, "ExecStart")
    assert shlex.split(start) == [INSTALLED, "--config", "%d/settings.toml"]
    assert values(DROP_IN, "LoadCredential") == ["group_secret:/etc/lockserver/group_secret"]
    assert values(DROP_IN, "Environment") == ["LOCKSERVER_GROUP_SECRET_FILE=%d/group_secret"]
    for path in (UNIT, DROP_IN):
        text = path.read_text().lower()
        assert "--tokens" not in text and "lockserver_tokens" not in text


def test_the_command_reads_its_tokens_from_the_credentials_directory(tmp_path: Path) -> None:
    """``ExecStart`` with ``%d`` a credentials directory, as systemd runs it: the server
    starts with the settings file found there and refuses a client without its token."""
    credentials = tmp_path / "credentials"
    credentials.mkdir(mode=0o700)
    port = free_port()
    (credentials / "settings.toml").write_text(
        f'port = {port}\n\n[[tokens]]\nname = "app"\ntoken = "s3cret-from-the-credential"\n'
    )
    [start] = values(UNIT, "ExecStart")
    argv = [a.replace("%d", str(credentials)) for a in shlex.split(start)]
    argv[0] = lockserver_command()
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            assert line.strip() == f"lockserver listening on 127.0.0.1:{port}", line
            with pytest.raises(AccessDenied):
                LockClient(port=port).close()
            with LockClient(port=port, token="s3cret-from-the-credential") as c:
                assert c.ping() is not None
        finally:
            server.terminate()
            server.wait(10)
    assert server.returncode == 0
