"""Loading the security settings: tokens from TOML, the environment and flags; one-line
errors that never show a secret; TLS files checked when the server starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from security_support import start_server

from lockserver import ConfigError, ServerConfig, load_config
from lockserver._auth import Principal, TokenSpec

SECRET = "s3cret-value-that-must-not-leak"


def test_tokens_from_the_toml_file(tmp_path: Path) -> None:
    """``[[tokens]]`` in the settings file: names, secrets, optional namespaces."""
    path = tmp_path / "lockserver.toml"
    path.write_text(
        "[[tokens]]\n"
        f'name = "billing"\ntoken = "{SECRET}"\nnamespaces = ["billing", "billing-*"]\n'
        "[[tokens]]\n"
        'name = "ops"\ntoken = "other-secret"\n'
    )
    config = load_config(["--config", str(path)], {})
    assert config.tokens == (
        TokenSpec("billing", SECRET, ("billing", "billing-*")),
        TokenSpec("ops", "other-secret"),
    )
    assert SECRET not in repr(config)
    billing = Principal.from_spec(config.tokens[0])
    assert billing.allows("billing") and billing.allows("billing-eu")
    assert not billing.allows("billin") and not billing.allows("ops")
    assert Principal.from_spec(config.tokens[1]).allows("anything")


def test_tokens_from_env_and_flag() -> None:
    """``LOCKSERVER_TOKENS`` / ``--tokens``: NAME:SECRET entries, a bare secret is named
    "default"; the flag wins over the environment."""
    env = {"LOCKSERVER_TOKENS": f"a:{SECRET}, b:x:y"}
    assert load_config([], env).tokens == (TokenSpec("a", SECRET), TokenSpec("b", "x:y"))
    assert load_config(["--tokens", "solo"], env).tokens == (TokenSpec("default", "solo"),)
    assert load_config([], {}).tokens == ()


@pytest.mark.parametrize(
    ("argv", "env", "toml", "message"),
    [
        ([], {"LOCKSERVER_TOKENS": f"a:{SECRET},"}, None, "entry 2 is empty"),
        ([], {"LOCKSERVER_TOKENS": f"a:{SECRET},a:other"}, None, "'a' is used twice"),
        (["--tokens", f"a:{SECRET},b:{SECRET}"], {}, None, "reuses another token's secret"),
        (["--tokens", "a:"], {}, None, "token secret must be"),
        ([], {}, 'tokens = "x"', "array of tables"),
        ([], {}, '[[tokens]]\nname = "a"\n', "needs both name and token"),
        ([], {}, f'[[tokens]]\nname = "a"\ntoken = "{SECRET}"\nrole = 1\n', "unknown key"),
        ([], {}, f'[[tokens]]\nname = "a"\ntoken = "{SECRET}"\nnamespaces = "x"\n', "a list"),
        ([], {}, f'[[tokens]]\nname = "a"\ntoken = "{SECRET}"\nnamespaces = ["a*b"]\n', "'*'"),
        ([], {}, f'[[tokens]]\nname = ""\ntoken = "{SECRET}"\n', "token name must be"),
        ([], {}, '[[tokens]]\nname = "a"\ntoken = 5\n', "token secret must be"),
    ],
)
def test_invalid_tokens_config_is_one_line_without_the_secret(
    tmp_path: Path, argv: list[str], env: dict[str, str], toml: str | None, message: str
) -> None:
    """An invalid tokens setting is one ConfigError line naming the problem and the source,
    and the secret is never in it."""
    if toml is not None:
        path = tmp_path / "c.toml"
        path.write_text(toml)
        argv = [*argv, "--config", str(path)]
    with pytest.raises(ConfigError) as info:
        load_config(argv, env)
    text = str(info.value)
    assert "\n" not in text
    assert message in text
    assert "(from " in text
    assert SECRET not in text


def test_tokens_value_rules_in_serverconfig() -> None:
    """ServerConfig validates tokens itself (embedding programs) and accepts a list."""
    config = ServerConfig(tokens=[TokenSpec("a", SECRET)])  # type: ignore[arg-type]
    assert config.tokens == (TokenSpec("a", SECRET),)
    with pytest.raises(ValueError, match="used twice"):
        ServerConfig(tokens=(TokenSpec("a", "1"), TokenSpec("a", "2")))
    with pytest.raises(ValueError, match="tuple of TokenSpec"):
        ServerConfig(tokens=("a:b",))  # type: ignore[arg-type]


def test_tls_paths_from_env_and_file(tmp_path: Path) -> None:
    """tls_cert / tls_key / tls_client_ca are plain path settings (read at start)."""
    path = tmp_path / "c.toml"
    path.write_text('tls_cert = "/a.pem"\ntls_key = "/a.key"\n')
    config = load_config(["--config", str(path)], {"LOCKSERVER_TLS_CLIENT_CA": "/ca.pem"})
    assert (config.tls_cert, config.tls_key, config.tls_client_ca) == (
        "/a.pem",
        "/a.key",
        "/ca.pem",
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tls_cert": "/nonexistent/cert.pem"}, "tls_cert: cannot load"),
        ({"tls_key": "/x.key"}, "tls_key is set but tls_cert is not"),
        ({"tls_client_ca": "/x.pem"}, "tls_client_ca is set but tls_cert is not"),
    ],
)
async def test_unusable_tls_files_stop_serve_with_one_line(
    nursery: trio.Nursery, overrides: dict[str, str], message: str
) -> None:
    """serve() refuses to start with TLS files it cannot use: one ConfigError line."""
    with trio.fail_after(5), pytest.raises(ConfigError) as info:
        await start_server(nursery, **overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


async def test_bad_client_ca_stops_serve(
    nursery: trio.Nursery, server_files: tuple[str, str], tmp_path: Path
) -> None:
    """An unreadable tls_client_ca is refused at start too."""
    cert, key = server_files
    with trio.fail_after(5), pytest.raises(ConfigError, match="tls_client_ca: cannot load"):
        await start_server(
            nursery, tls_cert=cert, tls_key=key, tls_client_ca=str(tmp_path / "none.pem")
        )
