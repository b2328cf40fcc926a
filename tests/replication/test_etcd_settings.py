"""The etcd client's settings (issue 29): the forms of ``replicate``, the TLS and auth
settings and the rules between them, the password file's checks, the warnings of an
unprotected etcd, and the client built from the settings (a rotated password picked up).

Each refusal is one line naming the setting and the fix, from the loader (flag, environment,
TOML) and from the ``lockserver`` command (exit 2, no traceback)."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from lockbench.etcd import ETCD, SKIP_REASON, EtcdCluster
from lockserver import ConfigError, ServerConfig, load_config
from lockserver._auth import SecurityConfigError
from lockserver.replication._etcd_access import (
    etcd_client,
    etcd_endpoints,
    etcd_tls_context,
    read_password_file,
)

REPO = Path(__file__).resolve().parents[2]


def secret_file(tmp_path: Path, text: str = "s3cret\n", mode: int = 0o600) -> str:
    path = tmp_path / "password"
    path.write_text(text)
    path.chmod(mode)
    return str(path)


# --- replicate ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "urls"),
    [
        ("etcd://e1:2379", ("http://e1:2379",)),
        ("etcd://e1:2379, e2:2379", ("http://e1:2379", "http://e2:2379")),
        ("etcds://e1:2379,e2:2379", ("https://e1:2379", "https://e2:2379")),
        ("ETCDS://e1:2379", ("https://e1:2379",)),
        ("https://e1:2379,https://e2:2379", ("https://e1:2379", "https://e2:2379")),
        ("http://127.0.0.1:2379", ("http://127.0.0.1:2379",)),
        ("etcds://[::1]:2379", ("https://[::1]:2379",)),
    ],
)
def test_replicate_forms(text: str, urls: tuple[str, ...]) -> None:
    """etcd:// (plain) and etcds:// (TLS) lists, or URLs of one scheme: the endpoints as
    URLs."""
    assert etcd_endpoints(text) == urls
    assert ServerConfig(replicate=text).replicate == text


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("e1:2379", "must be etcd://HOST:PORT"),
        ("etcd://", "an empty endpoint"),
        ("etcd://e1:2379,", "an empty endpoint"),
        ("etcds://https://e1:2379", "has a scheme of its own inside etcds://"),
        ("etcd://e1:2379,http://e2:2379", "has a scheme of its own inside etcd://"),
        ("https://e1:2379,http://e2:2379", "mixes http:// and https://"),
        ("https://e1:2379,e2:2379", "'e2:2379' has no scheme"),
        ("ftp://e1:2379", "the scheme is http:// or https://"),
        ("etcds://e1", "'e1' is not HOST:PORT"),
        ("etcds://e1:99999", "'e1:99999' is not HOST:PORT"),
        ("https://e1:2379/v3", "only HOST:PORT after the scheme"),
    ],
)
def test_bad_replicate_values_are_one_line_errors(text: str, words: str) -> None:
    """Every malformed value is refused with one line naming the part that is wrong."""
    with pytest.raises(ValueError, match="replicate: .*" + re.escape(words)) as caught:
        ServerConfig(replicate=text)
    assert "\n" not in str(caught.value)


# --- the rules between the settings -------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"etcd_ca_file": "/ca.pem"}, "etcd_ca_file is set but replicate is empty"),
        (
            {"replicate": "etcd://e:1", "etcd_ca_file": "/ca.pem"},
            "etcd_ca_file is set but replicate names plain-HTTP etcd endpoints",
        ),
        (
            {"replicate": "etcd://e:1", "etcd_cert_file": "/c.pem"},
            "etcd_cert_file is set but replicate names plain-HTTP",
        ),
        (
            {"replicate": "etcds://e:1", "etcd_key_file": "/k.pem"},
            "etcd_key_file is set without etcd_cert_file",
        ),
        (
            {"replicate": "etcds://e:1", "etcd_user": "u"},
            "etcd_user is set without etcd_password_file",
        ),
        (
            {"replicate": "etcds://e:1", "etcd_password_file": "/p"},
            "etcd_password_file is set without etcd_user",
        ),
        ({"etcd_user": "u", "etcd_password_file": "/p"}, "etcd_user is set but replicate is"),
        ({"replicate": "etcds://e:1", "etcd_user": "a\nb"}, "etcd_user must be an etcd user"),
    ],
)
def test_settings_that_do_not_go_together_are_refused(settings: dict[str, str], words: str) -> None:
    """TLS files without TLS endpoints (or without replicate), a key without its
    certificate, a user without a password file or the reverse: one line saying which."""
    with pytest.raises(ValueError, match=words):
        ServerConfig(**settings)  # type: ignore[arg-type]


def test_every_etcd_setting_loads_from_flag_environment_and_file(tmp_path: Path) -> None:
    """The five settings load like every other: flag > environment > TOML file."""
    values = {
        "replicate": "etcds://e1:2379",
        "etcd_ca_file": "/etc/l/ca.pem",
        "etcd_cert_file": "/etc/l/c.pem",
        "etcd_key_file": "/etc/l/c.key",
        "etcd_user": "lockserver-billing",
        "etcd_password_file": "/etc/l/password",
    }
    flags = [x for name, value in values.items() for x in ("--" + name.replace("_", "-"), value)]
    env = {"LOCKSERVER_" + name.upper(): value for name, value in values.items()}
    toml = tmp_path / "l.toml"
    toml.write_text("".join(f'{name} = "{value}"\n' for name, value in values.items()))
    for config in (
        load_config(flags, {}),
        load_config([], env),
        load_config(["--config", str(toml)], {}),
    ):
        for name, value in values.items():
            assert getattr(config, name) == value
    with pytest.raises(ConfigError, match="etcd_user is set without etcd_password_file"):
        load_config(["--replicate", "etcds://e:1", "--etcd-user", "u"], {})


def test_the_command_refuses_a_password_file_others_can_read(tmp_path: Path) -> None:
    """``lockserver --etcd-password-file`` naming a file of mode 0644: exit 2, one line
    saying how to fix it, before anything listens or reaches etcd."""
    path = secret_file(tmp_path, mode=0o644)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lockserver",
            "--port",
            "0",
            "--replicate",
            "etcds://127.0.0.1:9",
            "--etcd-user",
            "u",
            "--etcd-password-file",
            path,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert f"chmod 600 {path}" in done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


# --- the password file --------------------------------------------------------------------------


def test_a_password_file_is_read_without_its_newline(tmp_path: Path) -> None:
    """One line; a trailing newline (LF or CRLF) is not part of the password; 0400 is fine."""
    assert read_password_file(secret_file(tmp_path, "pass word\n")) == "pass word"
    assert read_password_file(secret_file(tmp_path, "crlf\r\n", mode=0o400)) == "crlf"
    assert read_password_file(secret_file(tmp_path, "no newline")) == "no newline"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o660, 0o644])
def test_a_password_file_others_may_touch_is_refused(tmp_path: Path, mode: int) -> None:
    """Any permission for the group or others (read or write) refuses the file, naming the
    mode and the chmod that fixes it."""
    path = secret_file(tmp_path, mode=mode)
    with pytest.raises(SecurityConfigError, match=f"mode {mode:04o}.*chmod 600"):
        read_password_file(path)


def test_bad_password_files_are_refused(tmp_path: Path) -> None:
    """Missing, a directory, a symlink, empty, two lines, not UTF-8, too long: each refused
    with the file's name and the reason."""
    with pytest.raises(SecurityConfigError, match=r"cannot read it .no such file"):
        read_password_file(str(tmp_path / "absent"))
    folder = tmp_path / "dir"
    folder.mkdir(mode=0o700)
    with pytest.raises(SecurityConfigError, match="dir"):
        read_password_file(str(folder))
    real = secret_file(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(SecurityConfigError, match="cannot read it"):
        read_password_file(str(link))
    for text, words in (
        ("", "empty"),
        ("\n", "empty"),
        ("a\nb\n", "more than one line"),
        ("x" * 5000, "longer than 4096"),
    ):
        with pytest.raises(SecurityConfigError, match=words):
            read_password_file(secret_file(tmp_path, text))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    binary.chmod(0o600)
    with pytest.raises(SecurityConfigError, match="not UTF-8"):
        read_password_file(str(binary))


def test_tls_files_that_cannot_be_loaded_are_named(tmp_path: Path) -> None:
    """A CA bundle or certificate that is missing or not PEM: the setting and file named."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(SecurityConfigError, match=f"etcd_ca_file {junk}"):
        etcd_tls_context(str(junk), "", "")
    with pytest.raises(SecurityConfigError, match=r"etcd_cert_file .*absent\.pem"):
        etcd_tls_context("", str(tmp_path / "absent.pem"), "")


# --- the client built from the settings ---------------------------------------------------------


def test_the_client_of_each_deployment_and_its_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Plain HTTP: a warning that anyone reaching etcd can write the log (and one more when
    a password would cross in clear). TLS with neither user nor certificate: a warning that
    etcd cannot tell the replica from anyone. TLS with a user: no warning. The password is
    in no message."""
    password = secret_file(tmp_path, "hunter2\n")
    cases = [
        (ServerConfig(replicate="etcd://e:1"), ["plain HTTP"]),
        (
            ServerConfig(replicate="etcd://e:1", etcd_user="u", etcd_password_file=password),
            ["plain HTTP", "crosses the network in clear"],
        ),
        (ServerConfig(replicate="etcds://e:1"), ["neither etcd_user nor etcd_cert_file"]),
        (ServerConfig(replicate="etcds://e:1", etcd_user="u", etcd_password_file=password), []),
    ]
    for config, warnings in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lockserver"):
            etcd = etcd_client(config)
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == len(warnings), messages
        for message, words in zip(messages, warnings, strict=True):
            assert words in message
        assert all("hunter2" not in m for m in messages)
        assert "hunter2" not in repr(etcd)
        assert etcd.tls == config.replicate.startswith("etcds")


async def test_a_password_rotated_in_its_file_is_used_at_the_next_renewal(
    tmp_path: Path,
) -> None:
    """The client of a replica reads the password file again when etcd rejects its token:
    the new password written to the file, then set in etcd (which revokes the old token),
    and the next call works without a restart."""
    if ETCD is None:
        pytest.skip(SKIP_REASON)
    with EtcdCluster(tmp_path / "etcd", auth=True) as cluster:
        cluster.start(1)
        assert cluster.password_file is not None
        config = ServerConfig(
            replicate=cluster.replicate,
            etcd_user="lockserver",
            etcd_password_file=str(cluster.password_file),
        )
        with trio.fail_after(20):
            async with etcd_client(config) as etcd:
                await etcd.put(b"/lockserver/x", b"1")
                cluster.change_password("rotated-" + os.urandom(4).hex())  # file, then etcd
                await etcd.put(b"/lockserver/x", b"2")
                assert etcd.statistics().tokens == 2
