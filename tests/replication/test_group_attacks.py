"""A group with a secret, attacked through etcd as a hostile user with write access to it
would (issue 29; each attack against a real etcd and real replicas in this process): the
two-put theft changes nothing on any replica; a put of an entry of an unknown format stops no
replica; an old entry and an old registration put again change nothing; a registration
deleted by hand costs the replica its connections, not a lock; a forged snapshot or genesis,
a wrong secret and a missing one are refused at start. An *authenticated* entry of an unknown
format (a newer replica's) halts every replica -- they say why in their statistics and
``/readyz``, and refuse requests -- and the documented way out (``--skip-revision`` given to
every replica) brings the group back with no lock lost. The secret can be rotated, one replica
at a time, with no lock lost; a replica started with the new key first while the others do
not hold it halts itself instead of diverging.

Time is real here (etcd's leases run on its clock): the leases are the shortest allowed
(2 s) and every test is bounded by ``trio.fail_after``."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
from httpd._client import get

from client import LockClientError, open_lock_client
from lockbench.etcd import EtcdCluster
from lockserver import ServerConfig, serve
from lockserver._config import ConfigError
from lockserver.replication import _replica
from lockserver.replication._etcd import Etcd
from lockserver.replication._group import (
    ENTRY_FORMAT,
    decode_header,
    encode_entry,
    encode_ops,
    wire,
)
from lockserver.replication._groupauth import GroupKeys
from lockserver.replication._replica import GroupRefused, group_prefix
from protocol import EndSession, pack

from .test_group_state import acquire_op
from .test_replicas import Handle, _serve, acquire, caught_up, release, session_on

_groups = itertools.count()
OLD = "o" * 48
NEW = "n" * 48


def secret_file(tmp_path: Path, *secrets: str, name: str = "group.secret") -> str:
    path = tmp_path / name
    path.write_text("\n".join(secrets) + "\n")
    path.chmod(0o600)
    return str(path)


async def start(
    nursery: trio.Nursery, etcd: EtcdCluster, group: str, secret: str, **settings: Any
) -> Handle:
    config = ServerConfig(
        port=0,
        replicate="etcd://" + ",".join(etcd.endpoints),
        group=group,
        replica_lease_ttl=2,
        group_secret_file=secret,
        **settings,
    )
    handle = Handle()
    handle.running = await nursery.start(_serve, config, handle)
    return handle


def repl(h: Handle) -> dict[str, Any]:
    stats: dict[str, Any] = h.running.statistics()["replication"]
    return stats


async def applied(handles: list[Handle], revision: int, timeout: float = 10.0) -> None:
    """Wait until every replica has applied ``revision``."""
    with trio.fail_after(timeout):
        while any(h.replica.state.revision < revision for h in handles):
            await trio.sleep(0.02)


async def holders_of(port: int, var: str) -> list[str]:
    async with open_lock_client("127.0.0.1", port) as c:
        page = await c.holders("ns")
    return [h.session for h in page.holders if h.var == var]


async def test_the_two_put_theft_changes_nothing_on_any_replica(
    etcd1: EtcdCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A registration for a made-up replica, then one entry from it ending the victim's
    session (as admin) and granting the thief's: every replica rejects both (its counter up,
    one warning for the burst naming the first revision) and the victim still holds, seen
    through every replica."""
    group = f"t{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, secret) for _ in range(3)]
            async with session_on(rs[0].port, "victim", 60.0) as victim:
                assert (await victim.execute("ns", acquire("x", "victim"))).ok
                prefix = group_prefix(group)
                async with Etcd(etcd1.endpoints) as e:
                    reg = await e.put(prefix + b"replicas/evil", b"127.0.0.1:1")
                    theft = [
                        ["e", 1, "admin", True, wire(EndSession(1, "victim"))],
                        acquire_op(1, 2, "thief", "x", None),
                    ]
                    entry = encode_entry("evil", 1, 0.0, 1.0, theft, registration=reg)
                    revision = await e.put(prefix + b"log", entry)
                await applied(rs, revision)
                for h in rs:
                    assert repl(h)["rejected_entries"] >= 2, repl(h)
                    assert "evil" not in h.replica.state.replicas
                    assert await holders_of(h.port, "x") == ["victim"]
                warnings = [
                    r.getMessage()
                    for r in caplog.records
                    if r.name == "lockserver.replica" and "rejected what was put" in r.getMessage()
                ]
                assert len(warnings) == len(rs), warnings  # one per replica for the burst
                assert all(f"at revision {reg} " in w for w in warnings)
                assert (await victim.execute("ns", acquire("y", "victim"))).ok  # still its
            nursery.cancel_scope.cancel()


async def test_an_unauthenticated_entry_of_an_unknown_format_stops_nothing(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """A put of an entry claiming a format this version does not know, not sealed by the
    group's secret: rejected and counted by every replica; none halts, every one serves."""
    group = f"t{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, secret) for _ in range(3)]
            future = pack([ENTRY_FORMAT + 1, "future", 0, 1, 0.0, 0, 1.0, b"?"])
            async with Etcd(etcd1.endpoints) as e:
                revision = await e.put(group_prefix(group) + b"log", future)
            await applied(rs, revision)
            for i, h in enumerate(rs):
                assert h.replica.halted is None
                assert repl(h)["rejected_entries"] == 1 and repl(h)["halted"] is None
                async with session_on(h.port, f"s{i}") as s:
                    assert (await s.execute("ns", acquire(f"v{i}", f"s{i}"))).ok
            nursery.cancel_scope.cancel()


async def test_an_authenticated_unknown_format_halts_and_skip_revision_brings_it_back(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """An entry of an unknown format sealed with the group's key (a newer replica wrote it):
    every replica halts -- its statistics say where and why, it refuses requests -- and stays
    halted when restarted as it was. Restarted with ``skip_revision`` = that revision, the
    group serves again and the holder's lock was never lost."""
    group = f"t{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, secret) for _ in range(3)]
            async with session_on(rs[0].port, "holder", 60.0) as holder:
                assert (await holder.execute("ns", acquire("x", "holder"))).ok
            await caught_up(*rs)
            context = pack([group, rs[0].replica.genesis.instance])
            sealer = GroupKeys([NEW.encode()]).sealer(b"entry", context)
            body = pack([ENTRY_FORMAT + 1, "newer", 0, 1, 0.0, 0, 1.0, encode_ops([["t"]])])
            async with Etcd(etcd1.endpoints) as e:
                revision = await e.put(group_prefix(group) + b"log", sealer.seal(body))
            with trio.fail_after(10):
                while any(h.replica.halted is None for h in rs):
                    await trio.sleep(0.02)
            for h in rs:
                halted = repl(h)["halted"]
                assert halted["revision"] == revision
                assert f"format {ENTRY_FORMAT + 1}" in halted["reason"]
                ready = await get(h.port, "/readyz")
                assert ready.status == 503 and b"halted" in ready.body
                with pytest.raises(LockClientError):
                    async with session_on(h.port, "other") as other:
                        await other.execute("ns", acquire("z", "other"))
                h.kill()
            # restarted as they were: halted again, at the same revision
            again = await start(nursery, etcd1, group, secret)
            with trio.fail_after(10):
                while again.replica.halted is None:
                    await trio.sleep(0.02)
            assert repl(again)["halted"]["revision"] == revision
            again.kill()
            # the way out: every replica skips that revision
            back = [
                await start(nursery, etcd1, group, secret, skip_revision=str(revision))
                for _ in range(3)
            ]
            for h in back:
                assert h.replica.halted is None
                assert repl(h)["skipped_revisions"] == 1
                assert await holders_of(h.port, "x") == ["holder"]
            async with session_on(back[1].port, "other") as other:
                denied = await other.execute("ns", acquire("x", "other"))
                assert not denied.ok and [x.session for x in denied.holders] == ["holder"]
            async with session_on(back[2].port, "holder", 60.0) as holder:
                assert (await holder.execute("ns", release("x"))).ok  # it was still its
            nursery.cancel_scope.cancel()


async def test_old_entries_and_registrations_put_again_change_nothing(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """A replica's authenticated entry put again (a replay at a new revision) is skipped (its
    batch was applied); once that replica departed, its registration and that entry put again
    change nothing but the rejected count: the registration brings back an id that proposes
    nothing (never the writer), the entry names the old registration."""
    group = f"t{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group, secret) for _ in range(2)]
            async with session_on(r1.port, "a", 60.0) as a:
                assert (await a.execute("ns", acquire("x", "a"))).ok
                assert (await a.execute("ns", release("x"))).ok
            await caught_up(r1, r2)
            prefix = group_prefix(group)
            gone = r1.replica.rid
            sealer = GroupKeys([NEW.encode()]).sealer(
                b"entry", pack([group, r1.replica.genesis.instance])
            )
            async with Etcd(etcd1.endpoints) as e:
                reg = await e.get(prefix + b"replicas/" + gone.encode())
                assert reg is not None
                old = None  # r1's last entry, from the log's history
                revision = r1.replica.state.revision
                while old is None:
                    kvs, _ = await e.get_prefix(prefix + b"log", revision=revision)
                    body = sealer.open(kvs[0].value) if kvs else None
                    if body is not None and decode_header(body).replica == gone:
                        old = kvs[0].value
                    revision = (kvs[0].mod_revision if kvs else revision) - 1
                skipped = r2.replica.state.skipped
                revision = await e.put(prefix + b"log", old)
                await applied([r2], revision)
                assert r2.replica.state.skipped == skipped + 1
                r1.kill()
                with trio.fail_after(10):
                    while gone in r2.replica.state.replicas:
                        await trio.sleep(0.05)
                rejected = repl(r2)["rejected_entries"]
                await e.put(prefix + b"replicas/" + gone.encode(), reg.value)
                revision = await e.put(prefix + b"log", old)
            await applied([r2], revision)
            assert repl(r2)["rejected_entries"] == rejected + 1
            assert r2.replica.state.writer() != gone
            assert await holders_of(r2.port, "x") == []
            nursery.cancel_scope.cancel()


async def test_a_registration_deleted_by_hand_costs_connections_not_locks(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """Deleting a replica's registration (a deletion cannot be authenticated) drops its
    connections in the group and makes it register again; the holder's lock stays."""
    group = f"t{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            r1, r2 = [await start(nursery, etcd1, group, secret) for _ in range(2)]
            async with session_on(r1.port, "holder", 60.0) as holder:
                assert (await holder.execute("ns", acquire("x", "holder"))).ok
            victim, resets = r1.replica.rid, r1.replica.resets
            async with Etcd(etcd1.endpoints) as e:
                await e.delete(group_prefix(group) + b"replicas/" + victim.encode())
            with trio.fail_after(10):
                while r1.replica.rid in ("", victim) or not r1.replica.registered.is_set():
                    await trio.sleep(0.05)
            assert r1.replica.resets > resets
            assert await holders_of(r1.port, "x") == ["holder"]
            async with session_on(r1.port, "holder", 60.0) as holder:
                assert await holders_of(r2.port, "x") == ["holder"]
                assert (await holder.execute("ns", release("x"))).ok
            nursery.cancel_scope.cancel()


async def test_forged_genesis_snapshot_and_wrong_secrets_are_refused_at_start(
    etcd1: EtcdCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica does not join: a group created without a secret when it has one; a group
    created with one when it has none, or another; a group whose snapshot description was put
    by someone else, or deleted; a group whose genesis was replaced by an unsealed one. Each
    refusal names what is wrong. The genesis deleted and put back as it was (its revisions
    moved) changes nothing: a replica that joins then sees the group's locks."""
    monkeypatch.setattr(_replica, "FIRST_SNAPSHOT_WAIT", 0.5)
    right = secret_file(tmp_path, NEW)
    wrong = secret_file(tmp_path, "w" * 48, name="wrong.secret")
    endpoints = "etcd://" + ",".join(etcd1.endpoints)

    async def refused(group: str, secret: str) -> str:
        config = ServerConfig(port=0, replicate=endpoints, group=group, group_secret_file=secret)
        with pytest.raises(GroupRefused) as info:
            await serve(config)
        return str(info.value)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            plain = f"t{next(_groups)}"
            r = await start(nursery, etcd1, plain, "")
            assert "created without a group secret" in await refused(plain, right)
            r.kill()
            sealed = f"t{next(_groups)}"
            r = await start(nursery, etcd1, sealed, right)
            async with session_on(r.port, "holder", 60.0) as a:
                assert (await a.execute("ns", acquire("x", "holder"))).ok
            assert "give this replica the group's secret" in await refused(sealed, "")
            assert "not sealed by any key this replica holds" in await refused(sealed, wrong)
            prefix = group_prefix(sealed)
            async with Etcd(etcd1.endpoints) as e:
                kv = await e.get(prefix + b"genesis")
                assert kv is not None
                await e.delete(prefix + b"genesis")
                await e.put(prefix + b"genesis", kv.value)
                late = await start(nursery, etcd1, sealed, right)
                assert await holders_of(late.port, "x") == ["holder"]
                r.kill()
                late.kill()
                snapshot = await e.get(prefix + b"snapshot")
                assert snapshot is not None
                meta = pack({"revision": 1, "chunks": 1, "size": 1, "sha256": "0" * 64})
                await e.put(prefix + b"snapshot", meta)
                assert "snapshot" in await refused(sealed, right)
                await e.delete(prefix + b"snapshot")
                assert "its snapshot does not" in await refused(sealed, right)
                await e.put(prefix + b"snapshot", snapshot.value)
                await e.put(prefix + b"genesis", r.replica.genesis.to_bytes())
                assert "created without a group secret" in await refused(sealed, right)
            nursery.cancel_scope.cancel()


def test_a_secret_file_others_can_read_is_a_config_error(tmp_path: Path) -> None:
    """The server refuses to start on a secret file others may read (as ssh does)."""
    path = secret_file(tmp_path, NEW)
    Path(path).chmod(0o644)
    config = ServerConfig(port=0, replicate="etcd://127.0.0.1:1", group_secret_file=path)
    with pytest.raises(ConfigError, match="others may read or write it"):
        trio.run(serve, config)


async def test_rotating_the_secret_one_replica_at_a_time_loses_no_lock(
    etcd1: EtcdCluster, tmp_path: Path
) -> None:
    """The documented rotation: every replica restarted with ``old, new`` (the old key still
    signs), then with ``new, old``, then with ``new`` alone -- the holder's lock held
    throughout, every replica serving; after the second step the group writes a snapshot past
    the last entry the old key sealed, so a replica holding only the new key replays none. A
    replica started with ``new`` first while another holds only ``old`` halts itself (it names
    the replica and the key) instead of diverging."""
    group = f"t{next(_groups)}"
    old = secret_file(tmp_path, OLD, name="old")
    both = secret_file(tmp_path, OLD, NEW, name="both")
    swapped = secret_file(tmp_path, NEW, OLD, name="swapped")
    new = secret_file(tmp_path, NEW, name="new")
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd1, group, old) for _ in range(2)]
            async with session_on(rs[0].port, "holder", 120.0) as holder:
                assert (await holder.execute("ns", acquire("x", "holder"))).ok
            early = await start(nursery, etcd1, group, swapped)  # out of order: halts itself
            assert early.replica.halted is not None
            assert "does not hold this replica's signing key" in early.replica.halted
            early.kill()
            for step in (both, swapped, new):
                for i in range(len(rs)):
                    rs[i].kill()
                    rs[i] = await start(nursery, etcd1, group, step)
                    assert rs[i].replica.halted is None, rs[i].replica.halted
                    assert await holders_of(rs[i].port, "x") == ["holder"]
                # the step is complete once the stopped replicas' registrations are gone
                # (each lingers for its lease's TTL)
                with trio.fail_after(10):
                    live = {h.replica.rid for h in rs}
                    while set(rs[0].replica.state.replicas) != live:
                        await trio.sleep(0.1)
                # after step 2, the writer snapshots past the last entry the old key sealed
                retired = rs[0].replica.state.retired_signers
                with trio.fail_after(10):
                    while max(retired().values(), default=0) > max(
                        h.replica.snapshot_revision for h in rs
                    ):
                        await trio.sleep(0.1)
            for h in rs:
                assert repl(h)["keys"] == [GroupKeys([NEW.encode()]).signing_id.hex()]
            async with session_on(rs[1].port, "holder", 120.0) as holder:
                assert (await holder.execute("ns", release("x"))).ok
            nursery.cancel_scope.cancel()
