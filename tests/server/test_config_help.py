"""Every setting declared once (issue 32): ``lockserver --help`` describes each flag in one line,
grouped as docs/configuration.md groups them, and that page's tables agree with the declarations
(name, flag, environment variable, group, default); the limits the welcome and ``stats`` report
are the settings declared ``advertised``, in the order the hand-written map had them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from support import TEST_CONFIG, start_server

from lockserver import ServerConfig, TrustSettings
from lockserver._config import (
    _SETTINGS,
    ENGINE_PARTS,
    GROUPS,
    _Setting,
    advertised_limits,
    engine_limits,
    load_config,
)
from lockserver.engine import EngineLimits, LockCore, WaitLimits

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "configuration.md"

# A row of a settings table: | `name` | `--flag` / `ENV` | default | why |
ROW = re.compile(r"^\| `(\w+)` \| `(--[\w-]+)` / `(\w+)` \| ([^|]*)\|")


def help_text(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        load_config(["--help"], {})
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def help_sections(text: str) -> dict[str, str]:
    """``--help``'s text per argument group: heading -> the lines under it."""
    sections: dict[str, str] = {}
    heading = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            sections[heading] = ""
        elif heading:
            sections[heading] += line + "\n"
    return sections


def squeeze(text: str) -> str:
    """argparse wraps the help column; compare with whitespace runs as one space."""
    return " ".join(text.split())


def test_every_setting_has_a_one_line_description() -> None:
    """Each setting (the trust constants too) declares a help line: non-empty, one line, short
    enough to read in a terminal, without a trailing period (argparse appends the env and the
    default), and a group that is one of docs/configuration.md's sections."""
    assert len(_SETTINGS) == len(attrs.fields(ServerConfig)) - 1 + len(attrs.fields(TrustSettings))
    for s in _SETTINGS:
        assert s.help.strip() == s.help and s.help, s.name
        assert "\n" not in s.help and len(s.help) <= 80, s.name
        assert not s.help.endswith("."), s.name
        assert s.group in GROUPS, s.name


def test_help_describes_every_flag_in_its_group(capsys: pytest.CaptureFixture[str]) -> None:
    """``lockserver --help`` shows every flag under its group's heading, in the page's order of
    groups, with its description, its environment variable and its default (the tokens: none,
    never a value)."""
    text = help_text(capsys)
    sections = help_sections(text)
    shown = [h for h in sections if h in GROUPS]
    assert shown == list(GROUPS)
    for s in _SETTINGS:
        section = squeeze(sections[s.group])
        assert s.flag in section, s.name
        after = squeeze(section.split(s.flag, 1)[1])
        assert squeeze(s.help) in after.split(f"(env {s.env}", 1)[0], s.name
        if s.kind is tuple:
            assert f"(env {s.env}, default none;" in after, s.name
        elif s.kind is bool:
            assert f"(env {s.env}, default {str(s.default).lower()})" in after, s.name
        else:
            assert f"(env {s.env}, default {s.default})" in after, s.name


def doc_rows() -> list[tuple[str, str, str, str, str]]:
    """(section, name, flag, env, default cell) of every settings-table row of the page."""
    rows = []
    section = ""
    in_settings = False
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            in_settings = line == "## Settings"
        elif line.startswith("### ") and in_settings:
            section = line[4:]
        elif in_settings and (m := ROW.match(line)):
            rows.append((section, m[1], m[2], m[3], m[4].strip()))
    return rows


def doc_default_matches(cell: str, default: Any) -> bool:
    """The page's default cell names the declared default: a backticked value first (a number
    compared as a number), or (empty) / empty / none for an empty string or no tokens."""
    m = re.match(r"`([^`]*)`", cell)
    if m is None:
        return default in ("", ()) and cell.split(maxsplit=1)[0] in ("(empty)", "empty", "none")
    shown = m[1]
    if type(default) is bool:
        return shown == str(default).lower()
    if type(default) in (int, float):
        return float(shown) == default
    return bool(shown == default)


def test_the_configuration_page_agrees_with_the_settings() -> None:
    """docs/configuration.md's sections are the groups, in order; its tables list every setting
    exactly once, in the section of its group, with the derived flag and environment variable
    and the declared default."""
    rows = doc_rows()
    sections = list(dict.fromkeys(section for section, *_ in rows))
    assert sections == list(GROUPS)
    by_name: dict[str, _Setting] = {s.name: s for s in _SETTINGS}
    names = [name for _, name, *_ in rows]
    assert sorted(names) == sorted(by_name), "each setting once, and nothing else"
    for section, name, flag, env, default in rows:
        s = by_name[name]
        assert (section, flag, env) == (s.group, s.flag, s.env), name
        assert doc_default_matches(default, s.default), (name, default, s.default)


def test_the_doc_checker_can_fail() -> None:
    """The default comparison tells a wrong default from a right one."""
    assert doc_default_matches("`1048576` (1 MiB)", 1024 * 1024)
    assert not doc_default_matches("`1048576` (1 MiB)", 1024)
    assert doc_default_matches("`10`", 10.0)
    assert doc_default_matches("(empty)", "")
    assert not doc_default_matches("(empty)", "x")
    assert doc_default_matches("`false`", False)
    assert not doc_default_matches("`true`", False)


# The limits the welcome and stats reported when they were a hand-written map, in its order.
WELCOME_LIMITS = [
    "max_frame",
    "max_ops",
    "max_depth",
    "max_name",
    "max_text",
    "max_value",
    "max_ttl",
    "max_connections",
    "max_sessions",
    "max_entries",
    "max_entries_per_session",
    "max_store_bytes",
    "max_session_age",
    "max_send_buffer",
    "send_timeout",
    "handshake_timeout",
    "idle_timeout",
    "frame_timeout",
    "max_receive_total",
    "max_send_total",
    "max_wait",
    "max_waiters",
    "max_waiters_per_session",
    "max_waiters_per_connection",
    "max_waiting_ops_per_variable",
    "max_waiting_ops_per_session",
    "max_waiting_ops_per_principal",
    "max_subscriptions",
    "max_subscriptions_per_principal",
]


def test_advertised_limits_are_the_welcome_limits_in_their_order() -> None:
    """advertised_limits gives the same map (keys, order, values) as the 29 keys the shell once
    copied by hand from the configuration."""
    config = ServerConfig(max_ops=7, max_wait=12.5, max_subscriptions=3)
    limits = advertised_limits(config)
    assert list(limits) == WELCOME_LIMITS
    assert limits == {name: getattr(config, name) for name in WELCOME_LIMITS}


def test_engine_limits_are_every_limit_of_each_part_of_the_core() -> None:
    """engine_limits gives, for each part of the lock core, exactly the fields of its limits
    record (EngineLimits, WaitLimits) in their order, or the door's subscription keywords,
    under the core's names (the ``max_waiters_per_connection`` setting is the wait queue's
    ``max_waiters_per_owner``), with the configuration's values: a limit added to the core
    without a setting, or a setting marked for a limit the core lacks, fails here."""
    config = ServerConfig(
        max_store_bytes=2**30, max_waiters_per_connection=7, max_subscriptions_per_principal=3
    )
    store = engine_limits(config, "store")
    assert list(store) == [f.name for f in attrs.fields(EngineLimits)]
    assert EngineLimits(**store).max_store_bytes == 2**30
    wait = engine_limits(config, "wait")
    assert list(wait) == [f.name for f in attrs.fields(WaitLimits)]
    assert WaitLimits(**wait).max_waiters_per_owner == 7
    feed = engine_limits(config, "feed")
    assert feed == {"max_subscriptions": 10_000, "max_subscriptions_per_principal": 3}
    door = LockCore(started_at=0.0, **feed)  # the door's keywords (either build)
    assert door._max_subscriptions_per_principal == 3
    assert ENGINE_PARTS == ("store", "wait", "feed")


def test_engine_limits_refuses_a_part_the_core_does_not_have() -> None:
    """Asking for an unknown part is a programming error named as such, not an empty map."""
    with pytest.raises(ValueError, match="part must be one of"):
        engine_limits(ServerConfig(), "engine")


async def test_a_server_applies_the_configured_limits_to_its_core(nursery: trio.Nursery) -> None:
    """The shell builds its lock core from engine_limits: a server started with non-default
    limits has them in its engine, its wait queue and its door."""
    config = attrs.evolve(
        TEST_CONFIG, max_sessions=123, max_waiting_ops_per_session=4567, max_subscriptions=89
    )
    running = await start_server(nursery, config=config)
    core = running.core
    assert isinstance(core, LockCore)
    assert core.engine.limits == EngineLimits(**engine_limits(config, "store"))
    assert core.engine.limits.max_sessions == 123
    assert core.waits.limits.max_waiting_ops_per_session == 4567
    assert core._max_subscriptions == 89
