"""Blast over several servers: two lockserver shards started by ``lockserver --processes 2``,
a target naming several servers, per-server and total counts, every namespace's traffic and
entries on the server ``client._placement.place`` assigns it, and the CLI's errors. Small
runs bounded by --count; no timing assertions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import LockClient
from client._placement import ServerAddress, place
from lockbench import main
from lockbench._blast import BlastConfig, run_blast
from lockbench._blaster import PREFILL_PER_TX
from lockbench._sharding import NAMESPACES_PER_SERVER, namespace_pool, plan
from lockbench._spawn import ServerProcess, spawned_shards
from lockbench._targets import Backend, Target, TargetError, parse_target
from protocol import Assert, Exists

COUNT = 3000
POOL = 2 * NAMESPACES_PER_SERVER
PREFILL = 2 * POOL * PREFILL_PER_TX  # two transactions in every namespace of the pool


@pytest.fixture(scope="module")
def shards() -> Iterator[tuple[ServerProcess, ...]]:
    with spawned_shards(2) as servers:
        yield servers


def _target(shards: tuple[ServerProcess, ...]) -> Target:
    return Target(Backend.LOCKSERVER).with_addresses([(s.host, s.port) for s in shards])


def _statistics(server: ServerProcess) -> dict[str, object]:
    with LockClient(server.host, server.port, timeout=5.0) as client:
        return dict(client.statistics())


def _engine(server: ServerProcess) -> dict[str, int]:
    engine = _statistics(server)["engine"]
    assert isinstance(engine, dict)
    return engine


def test_spawned_shards_are_distinct_processes(shards: tuple[ServerProcess, ...]) -> None:
    """spawned_shards(2): two shards on two ports, each its own process (pid found by port)."""
    assert len({s.port for s in shards}) == 2
    pids = [s.pid for s in shards]
    assert None not in pids and len(set(pids)) == 2


def test_blast_over_two_shards_counts_each_and_places_every_namespace(
    shards: tuple[ServerProcess, ...],
) -> None:
    """A prefilled blast over two shards: no errors, every sampled acquire succeeded, the
    per-server counts add up to the total and each server served at least its count; each
    prefilled entry sits on the server ``place`` assigns its namespace (and not on the
    other), and each server's namespace count is what placement predicts."""
    before = [_engine(s)["transactions"] for s in shards]
    config = BlastConfig(
        _target(shards),
        connections=2,
        pipeline=8,
        count=COUNT,
        warmup=0.0,
        duration=20.0,
        prefill=PREFILL,
        interval=0.1,
    )
    [r] = run_blast(config)
    assert r.errors == 0, r.error_samples
    assert r.acquires > 0 and r.acquired == r.acquires
    assert r.params["servers"] == 2 and r.params["connections"] == 2
    per = r.extra["servers"]
    assert [x["server"] for x in per] == [f"{s.host}:{s.port}" for s in shards]
    assert all(x["connections"] == 2 and x["tx"] > 0 for x in per)
    assert sum(x["tx"] for x in per) == r.requests >= COUNT
    assert r.extra["entries_held_per_server"] == [
        sum(
            1
            for j in range(PREFILL)
            if _server_of(shards, f"lb-{(j // PREFILL_PER_TX) % POOL}") == i
        )
        for i in range(2)
    ]
    after = [_engine(s)["transactions"] for s in shards]
    for i, x in enumerate(per):
        assert after[i] - before[i] >= x["tx"]  # the server saw at least what was counted

    # Placement, checked on the servers themselves: with a fresh session (the prefill's
    # entries belong to other sessions), the first entry of every prefill transaction exists
    # on its namespace's server and on no other.
    servers = tuple(ServerAddress(s.host, s.port) for s in shards)
    clients = [LockClient(s.host, s.port, timeout=5.0) for s in shards]
    try:
        sessions = [c.session(keepalive=False) for c in clients]
        for start in range(0, PREFILL, PREFILL_PER_TX):
            ns = namespace_pool(2)[(start // PREFILL_PER_TX) % POOL]
            home = servers.index(place(ns, servers))
            for i, session in enumerate(sessions):
                found = session.execute(ns, [Assert(Exists("Mutex", f"pf:{start}"))]).ok
                assert found == (i == home), (ns, start, i)
        for session in sessions:
            session.end()
    finally:
        for c in clients:
            c.close()
    placed = plan([(s.host, s.port) for s in shards])
    assert [_engine(s)["namespaces"] for s in shards] == [len(p) for p in placed]
    assert sorted(placed[0] + placed[1]) == sorted(namespace_pool(2))


def _server_of(shards: tuple[ServerProcess, ...], namespace: str) -> int:
    servers = tuple(ServerAddress(s.host, s.port) for s in shards)
    return servers.index(place(namespace, servers))


def test_plan_is_place_for_every_namespace() -> None:
    """plan() gives each server exactly the pool's namespaces place() puts on it; with one
    server, all of them."""
    addresses = [("127.0.0.1", 7400), ("127.0.0.1", 7401), ("127.0.0.1", 7402)]
    servers = tuple(ServerAddress(h, p) for h, p in addresses)
    placed = plan(addresses)
    for ns in namespace_pool(3):
        assert [ns in names for names in placed] == [place(ns, servers) == s for s in servers]
    assert plan(addresses[:1]) == [namespace_pool(1)]


def test_cli_blast_over_a_server_list(
    shards: tuple[ServerProcess, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--target lockserver://A,B``: the output states the servers, connections per server
    and each server's tx/s; the JSON result has the per-server counts."""
    servers = ",".join(f"{s.host}:{s.port}" for s in shards)
    out = tmp_path / "r.json"
    argv = ["blast", "--target", f"lockserver://{servers}", "--count", "400", "--warmup", "0"]
    assert main([*argv, "--pipeline", "4", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 servers, 1 connection(s) each" in text
    assert "/S2" in text
    data = json.loads(out.read_text())
    [result] = data["results"]
    assert [x["server"] for x in result["extra"]["servers"]] == servers.split(",")


def test_targets_name_several_servers() -> None:
    """A lockserver target in the client's server-list syntax: a range or a comma list, each
    on loopback; the URL lists them all."""
    t = parse_target("lockserver://127.0.0.1:7400-7402")
    assert t.addresses == (("127.0.0.1", 7400), ("127.0.0.1", 7401), ("127.0.0.1", 7402))
    assert t.url == "lockserver://127.0.0.1:7400,127.0.0.1:7401,127.0.0.1:7402"
    t = parse_target("lockserver://127.0.0.1:7400,[::1]:7500")
    assert t.addresses == (("127.0.0.1", 7400), ("::1", 7500))
    for bad, message in [
        ("lockserver://127.0.0.1:7402-7400", "runs backwards"),
        ("lockserver://127.0.0.1:7400,127.0.0.1:7400", "named twice"),
        ("lockserver://127.0.0.1:7400,10.1.2.3:7401", "refusing to send load to '10.1.2.3'"),
        ("redis://127.0.0.1:7400-7401", "only lockserver:// targets"),
    ]:
        with pytest.raises(TargetError, match=message):
            parse_target(bad)
    with pytest.raises(TargetError, match="--spawn starts its own"):
        parse_target("lockserver://127.0.0.1:7400-7401", spawn=True)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["blast", "--target", "lockserver://127.0.0.1:1", "--shards", "2"], "needs --spawn"),
        (["blast", "--spawn", "--target", "redis://", "--shards", "2"], "only lockserver"),
        (["blast", "--spawn", "--shards", "65"], "--shards must be in 1..64"),
        (["blast", "--spawn", "--shards", "2", "--profile", "x"], "--profile samples one"),
        (["run", "ping", "--target", "lockserver://127.0.0.1:1-2"], "drives one server"),
        (["blast", "--target", "redis://127.0.0.1:1,127.0.0.1:2"], "only lockserver://"),
    ],
)
def test_cli_refuses_what_several_servers_cannot_do(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Option mistakes around shards: one line, exit 2, nothing started."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("lockbench: error: ") and message in err
    assert err.count("\n") == 1
