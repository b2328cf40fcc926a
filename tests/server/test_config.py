"""ServerConfig validation and load_config's precedence: flag > environment > file > default,
plus the one-line error of the command for an invalid setting."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from lockserver import ConfigError, ServerConfig, TrustSettings, load_config
from lockserver.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    """Every setting has a sane default; the command's defaults are ServerConfig()'s."""
    c = ServerConfig()
    assert (c.host, c.port) == ("127.0.0.1", 7400)
    assert c.max_frame == 1024 * 1024
    assert (c.max_ops, c.max_depth) == (1000, 32)
    assert c.max_connections == 10_000
    assert c.max_send_buffer == 4 * 1024 * 1024
    assert c.sweep_interval == 1.0
    assert c.handshake_timeout == 10.0
    assert c.idle_timeout == 300.0
    assert c.frame_timeout == 15.0
    assert c.max_receive_total == 256 * 1024 * 1024
    assert c.max_send_total == 512 * 1024 * 1024
    assert c.busy_poll == 0.0001
    assert c.log_level == "INFO"
    assert c.log_json is False
    assert c.trust == TrustSettings()
    assert load_config([], {}) == c


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_frame", 5, "max_frame must be >= 1024, got 5"),
        ("port", 70000, "port must be an integer in 0..65535, got 70000"),
        ("port", True, "port must be an integer in 0..65535, got True"),
        ("max_ops", 0, "max_ops must be >= 1, got 0"),
        ("max_connections", 1.5, "max_connections must be an integer, got 1.5"),
        ("sweep_interval", 0, "sweep_interval must be > 0 seconds, got 0.0"),
        ("idle_timeout", -1, "idle_timeout must be >= 0 seconds, got -1.0"),
        ("frame_timeout", -1, "frame_timeout must be >= 0 seconds, got -1.0"),
        ("max_send_total", 1023, "max_send_total must be >= 1024, got 1023"),
        ("max_receive_total", 1023, "max_receive_total must be >= 1024, got 1023"),
        (
            "max_receive_total",
            1024 * 1024,
            "max_receive_total must be >= max_frame + 4 (1048580), got 1048576",
        ),
        ("send_timeout", float("inf"), "send_timeout must be a finite number of seconds"),
        ("busy_poll", -0.001, "busy_poll must be >= 0 seconds, got -0.001"),
        ("replicate", "127.0.0.1:2379", "replicate: must be etcd://HOST:PORT"),
        ("replicate", "etcd://h:0", "replicate: 'h:0' is not HOST:PORT"),
        ("replicate", "etcd://h:2379,nohost", "replicate: 'nohost' is not HOST:PORT"),
        ("group", "", "group must be 1-64 characters"),
        ("group", "a/b", "group must be 1-64 characters"),
        ("group", "x" * 65, "group must be 1-64 characters"),
        ("replica_lease_ttl", 1, "replica_lease_ttl must be >= 2, got 1"),
        ("replica_lease_ttl", 301, "replica_lease_ttl must be <= 300, got 301"),
        ("replica_snapshot_every", 9, "replica_snapshot_every must be >= 10, got 9"),
        ("busy_poll", 0.0101, "busy_poll must be <= 0.01 seconds, got 0.0101"),
        ("busy_poll", "fast", "busy_poll must be a finite number of seconds, got 'fast'"),
        ("log_level", "loud", "log_level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("log_json", "yes", "log_json must be true or false, got 'yes'"),
        ("host", " ", "host must be a non-empty host name or address"),
        ("trust", {"tick": 1}, "trust must be a TrustSettings"),
    ],
)
def test_validators_name_field_bound_and_value(field: str, value: object, message: str) -> None:
    """A bad value fails at construction with a message naming the field, the rule and the
    value."""
    with pytest.raises(ValueError, match=re.escape(message)):
        ServerConfig(**{field: value})  # type: ignore[arg-type]


def test_busy_poll_bounds_are_inclusive() -> None:
    """0 (off) and the 10 ms ceiling are both accepted; whole numbers become floats."""
    assert ServerConfig(busy_poll=0).busy_poll == 0.0
    assert type(ServerConfig(busy_poll=0).busy_poll) is float
    assert ServerConfig(busy_poll=0.01).busy_poll == 0.01
    assert load_config(["--busy-poll", "0"], {}).busy_poll == 0.0
    assert load_config([], {"LOCKSERVER_BUSY_POLL": "0.00005"}).busy_poll == 0.00005


def test_seconds_and_log_level_are_normalised() -> None:
    """Whole seconds become floats, log levels upper case."""
    c = ServerConfig(sweep_interval=2, log_level="debug")
    assert c.sweep_interval == 2.0 and type(c.sweep_interval) is float
    assert c.log_level == "DEBUG"


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "lockserver.toml"
    path.write_text(text)
    return str(path)


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    """For each setting independently: a flag beats the environment, which beats the file,
    which beats the default."""
    path = _write(
        tmp_path,
        """
port = 1111
max_ops = 11
max_depth = 12
sweep_interval = 3
log_json = true

[trust]
tick = 0.5
norm_half_life = 20.0
""",
    )
    env = {
        "LOCKSERVER_PORT": "2222",
        "LOCKSERVER_MAX_OPS": "22",
        "LOCKSERVER_TRUST_TICK": "0.25",
        "LOCKSERVER_LOG_JSON": "no",
        "LOCKSERVER_UNRELATED_CLIENT_SETTING": "ignored",
    }
    c = load_config(["--config", path, "--port", "3333", "--trust-tick", "2"], env)
    assert c.port == 3333  # flag > env > file
    assert c.max_ops == 22  # env > file
    assert c.max_depth == 12  # file > default
    assert c.sweep_interval == 3.0
    assert c.max_frame == 1024 * 1024  # default
    assert c.log_json is False  # env "no" > file true
    assert c.trust == TrustSettings(tick=2.0, norm_half_life=20.0)
    c = load_config(["--config", path], env)
    assert c.port == 2222
    assert c.trust.tick == 0.25
    c = load_config(["--config", path], {})
    assert (c.port, c.max_ops, c.trust.tick, c.log_json) == (1111, 11, 0.5, True)


def test_config_file_from_environment(tmp_path: Path) -> None:
    """LOCKSERVER_CONFIG names the file when --config does not."""
    path = _write(tmp_path, "max_sessions = 7\n")
    assert load_config([], {"LOCKSERVER_CONFIG": path}).max_sessions == 7
    other = tmp_path / "other.toml"
    other.write_text("max_sessions = 8\n")
    assert load_config(["--config", str(other)], {"LOCKSERVER_CONFIG": path}).max_sessions == 8


def test_boolean_flags_and_values() -> None:
    """--log-json / --no-log-json, and true/false spellings in the environment."""
    assert load_config(["--log-json"], {}).log_json is True
    assert load_config(["--no-log-json"], {"LOCKSERVER_LOG_JSON": "1"}).log_json is False
    for text in ("1", "true", "YES", "on"):
        assert load_config([], {"LOCKSERVER_LOG_JSON": text}).log_json is True
    for text in ("0", "false", "No", "off"):
        assert load_config([], {"LOCKSERVER_LOG_JSON": text}).log_json is False


def test_every_setting_has_a_flag_and_an_env_var() -> None:
    """Every ServerConfig field (and every trust constant) can be set by flag and by env."""
    names = [f.name for f in attrs.fields(ServerConfig) if f.name != "trust"]
    names += [f"trust_{f.name}" for f in attrs.fields(TrustSettings)]
    # The etcd client's settings need replicate (and each other): tested in
    # tests/replication/test_etcd_settings.py.
    odd = {"log_json", "etcd_ca_file", "etcd_cert_file", "etcd_key_file", "etcd_user"}
    odd.add("etcd_password_file")
    for name in names:
        if name in odd:
            continue
        default = ServerConfig()
        flag = "--" + name.replace("_", "-")
        env = "LOCKSERVER_" + name.upper()
        value = _a_valid_other_value(name)
        by_flag = load_config([flag, str(value)], {})
        by_env = load_config([], {env: str(value)})
        assert by_flag == by_env != default, name


def _a_valid_other_value(name: str) -> object:
    return {
        "host": "localhost",
        "port": 7401,
        "processes": 4,
        "log_level": "DEBUG",
        "trust_spike_window": 3,
        "trust_load_alpha": 0.5,
        "trust_norm_alpha": 0.5,
        "trust_norm_floor": 2.0,
        "busy_poll": 0.001,
        "replica_commit_poll": 0.001,
        "max_text": 2048,
        "max_store_bytes": 2**21,
        "max_receive_total": 2 * 1024 * 1024,  # at least max_frame + 4
        "ready_min_trust": 0.5,
        "replicate": "etcd://127.0.0.1:2379,etcd-2:2379",
        "group": "billing",
        "replica_lease_ttl": 10,
        "replica_snapshot_rate": 100_000,
    }.get(name, 4096)


@pytest.mark.parametrize(
    ("argv", "env", "file_text", "message"),
    [
        (
            [],
            {"LOCKSERVER_MAX_FRAME": "5"},
            None,
            "max_frame must be >= 1024, got 5 (from LOCKSERVER_MAX_FRAME)",
        ),
        (["--max-frame", "5"], {}, None, "max_frame must be >= 1024, got 5 (from --max-frame)"),
        (["--port", "http"], {}, None, "port must be an integer, got 'http' (from --port)"),
        (
            [],
            {"LOCKSERVER_IDLE_TIMEOUT": "soon"},
            None,
            "idle_timeout must be a number, got 'soon' (from LOCKSERVER_IDLE_TIMEOUT)",
        ),
        (
            [],
            {"LOCKSERVER_LOG_JSON": "maybe"},
            None,
            "log_json must be true or false, got 'maybe' (from LOCKSERVER_LOG_JSON)",
        ),
        (["--trust-tick", "0"], {}, None, "trust_tick must be a finite number > 0, got 0.0"),
        ([], {}, "max_ops = 0\n", "max_ops must be >= 1, got 0 (from FILE)"),
        ([], {}, 'max_ops = "ten"\n', "max_ops must be an integer, got 'ten' (from FILE)"),
        ([], {}, "bogus = 1\n", "unknown setting 'bogus' in config file FILE"),
        ([], {}, "[trust]\nbogus = 1\n", "unknown setting 'bogus' in [trust] of config file"),
        ([], {}, "trust = 1\n", "[trust] in config file FILE must be a table"),
        ([], {}, "port = \n", "config file FILE is not valid TOML"),
        (["--bogus"], {}, None, "unrecognized arguments: --bogus"),
        (["--port"], {}, None, "argument --port: expected one argument"),
    ],
)
def test_errors_are_one_line_naming_the_source(
    tmp_path: Path, argv: list[str], env: dict[str, str], file_text: str | None, message: str
) -> None:
    """Every invalid setting is a ConfigError of one line that says what, why and where."""
    if file_text is not None:
        path = _write(tmp_path, file_text)
        argv = [*argv, "--config", path]
        message = message.replace("FILE", path)
    with pytest.raises(ConfigError) as info:
        load_config(argv, env)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    """A config file that cannot be read is a ConfigError naming it."""
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=re.escape(f"cannot read config file {missing}")):
        load_config(["--config", missing], {})


def _run_command(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lockserver", *args],
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_command_invalid_setting_one_line_exit_2() -> None:
    """`python -m lockserver` with a bad setting: exactly one line on stderr, nothing on
    stdout, exit code 2, no traceback."""
    done = _run_command(env={"LOCKSERVER_MAX_FRAME": "5"})
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "lockserver: error: max_frame must be >= 1024, got 5 (from LOCKSERVER_MAX_FRAME)\n"
    )
    done = _run_command("--max-connections", "-3", env={})
    assert done.returncode == 2
    assert done.stderr == (
        "lockserver: error: max_connections must be >= 1, got -3 (from --max-connections)\n"
    )
    done = _run_command("--frobnicate", env={})
    assert done.returncode == 2
    assert done.stderr == "lockserver: error: unrecognized arguments: --frobnicate\n"


def test_main_help_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """main() returns exit codes instead of raising: --help 0 (and lists every setting's
    flag and env var), a bad setting 2."""
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--max-send-buffer" in out and "LOCKSERVER_MAX_SEND_BUFFER" in out
    assert "--trust-norm-half-life" in out
    assert main(["--max-ops", "0"]) == 2
    assert (
        capsys.readouterr().err
        == "lockserver: error: max_ops must be >= 1, got 0 (from --max-ops)\n"
    )


def test_configuration_doc_lists_every_setting() -> None:
    """docs/configuration.md documents every setting by its flag and environment variable."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    names = [f.name for f in attrs.fields(ServerConfig) if f.name != "trust"]
    names += [f"trust_{f.name}" for f in attrs.fields(TrustSettings)]
    for name in names:
        assert "--" + name.replace("_", "-") in doc, name
        assert "LOCKSERVER_" + name.upper() in doc, name
