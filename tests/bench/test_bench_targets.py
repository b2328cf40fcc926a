"""Target URLs and the loopback-only rule."""

from __future__ import annotations

import pytest

from lockbench import main
from lockbench._blast import BlastConfig, run_blast
from lockbench._runner import RunConfig, run
from lockbench._targets import Backend, Target, TargetError, check_loopback, parse_target


@pytest.mark.parametrize(
    ("text", "backend", "host", "port"),
    [
        ("lockserver://127.0.0.1:7400", Backend.LOCKSERVER, "127.0.0.1", 7400),
        ("redis://127.0.0.1:6379", Backend.REDIS, "127.0.0.1", 6379),
        ("lockserver://127.1.2.3:1", Backend.LOCKSERVER, "127.1.2.3", 1),
        ("lockserver://localhost:7400", Backend.LOCKSERVER, "localhost", 7400),
        ("redis://[::1]:6379", Backend.REDIS, "::1", 6379),
    ],
)
def test_loopback_targets_are_accepted(text: str, backend: Backend, host: str, port: int) -> None:
    """Any address of 127.0.0.0/8, ::1 and localhost is fine."""
    assert parse_target(text) == Target(backend, host, port)


@pytest.mark.parametrize(
    "text",
    [
        "lockserver://10.0.0.1:7400",
        "redis://192.168.1.10:6379",
        "lockserver://8.8.8.8:53",
        "redis://172.16.0.1:6379",
        "lockserver://0.0.0.0:7400",
        "redis://[2001:db8::1]:6379",
    ],
)
def test_other_addresses_are_refused(text: str) -> None:
    """Private, public and wildcard addresses are refused with a message that says why."""
    with pytest.raises(TargetError, match="only targets loopback"):
        parse_target(text)


def test_check_loopback_directly() -> None:
    """check_loopback passes loopback and names the offending address otherwise."""
    check_loopback("127.0.0.1")
    check_loopback("::1")
    with pytest.raises(TargetError, match=r"10\.1\.2\.3"):
        check_loopback("10.1.2.3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("http://127.0.0.1:80", "unknown target scheme"),
        ("127.0.0.1:7400", "unknown target scheme"),
        ("lockserver://127.0.0.1", "has no port"),
        ("lockserver://127.0.0.1:7400/x", "nothing after the port"),
        ("lockserver://127.0.0.1:99999", "bad port"),
    ],
)
def test_malformed_targets(text: str, message: str) -> None:
    """Malformed targets are refused with a readable reason."""
    with pytest.raises(TargetError, match=message):
        parse_target(text)


def test_spawn_takes_the_scheme_alone() -> None:
    """With --spawn the port is chosen later; naming one is a contradiction."""
    assert parse_target("redis://", spawn=True) == Target(Backend.REDIS)
    assert parse_target("lockserver://", spawn=True).url == "lockserver://127.0.0.1"
    with pytest.raises(TargetError, match="--spawn picks its own"):
        parse_target("redis://127.0.0.1:6379", spawn=True)


def test_the_runners_refuse_before_connecting() -> None:
    """run and blast validate the target themselves (not only the CLI)."""
    with pytest.raises(TargetError):
        run(RunConfig("ping", Target(Backend.LOCKSERVER, "10.0.0.1", 7400)))
    with pytest.raises(TargetError):
        run_blast(BlastConfig(Target(Backend.LOCKSERVER, "192.168.0.1", 7400)))


def test_cli_reports_refusal_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """The command exits 2 with one 'lockbench: error:' line and sends nothing."""
    assert main(["run", "ping", "--target", "lockserver://10.0.0.1:7400", "--count", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("lockbench: error: refusing to send load to '10.0.0.1'")
    assert main(["blast", "--target", "redis://8.8.8.8:6379"]) == 2
    assert main(["run", "ping"]) == 2  # neither --target nor --spawn
