"""A replica applies its own entry from its put's answer when nothing lies between (issue 29:
a lone client's acquire waits for one etcd write, not a write and then a watch delivery):
etcd's revisions count every write, so a put answered at revision R right after the replica
applied R - 1 is the log's next entry. Its watch event is then passed over, not applied twice
(the state's skipped count stays); a write to etcd between the two (another replica's entry,
any key) makes the replica wait for the watch as before; every replica holds the same state.

On a real etcd (one member), replicas in this process, every test bounded by
``trio.fail_after``; nothing asserts on elapsed time."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from httpd._client import get

from lockbench.etcd import EtcdCluster
from lockserver.replication import _etcd, _replica

from .test_replicas import acquire, caught_up, session_on, start

_groups = itertools.count()


def _from_answer(handle: object) -> int:
    return int(handle.replica.statistics()["applied_from_answer"])  # type: ignore[attr-defined]


class _AfterAnswers:
    """A watch's batches, each held while ``replica`` has a put in flight (at most 1 s): the
    put's answer is then handled before the watch's event of it."""

    def __init__(self, batches: AsyncIterator[Any], replicas: list[Any], etcd: object) -> None:
        self._batches = batches
        self._replicas = replicas
        self._etcd = etcd

    def __aiter__(self) -> _AfterAnswers:
        return self

    async def __anext__(self) -> Any:
        events = await self._batches.__anext__()
        for replica in self._replicas:
            if replica.etcd is self._etcd:
                with trio.move_on_after(1.0):
                    while replica._committing:
                        await trio.sleep(0.001)
        return events


@pytest.fixture
def answers_first(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The put's answer comes before the watch's event, deterministically (in one process
    they race): the watch of a replica in the returned list holds each batch while that
    replica has a put in flight. No replica proposes heartbeats."""
    monkeypatch.setattr(_replica, "HEARTBEAT", 3600.0)
    held: list[Any] = []
    watch = _etcd.Etcd.watch

    @asynccontextmanager
    async def late(self: _etcd.Etcd, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with watch(self, *args, **kwargs) as batches:
            yield _AfterAnswers(batches, held, self)

    monkeypatch.setattr(_etcd.Etcd, "watch", late)
    return held


async def test_a_lone_replica_applies_its_entries_from_the_answers(
    etcd1: EtcdCluster, answers_first: list[Any]
) -> None:
    """30 acquires through A: A applies every entry it puts from the put's answer, passes
    over their watch events (no entry skipped), and B, applying from its watch, holds the
    same state."""
    group = f"answer{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a, b = [await start(nursery, etcd1, group) for _ in range(2)]
            answers_first.append(a.replica)
            async with session_on(a.port, "S") as s:
                assert (await s.execute("ns", acquire("first", "S"))).ok
                await caught_up(a, b)
                early, puts, skipped = _from_answer(a), a.replica.puts, a.replica.state.skipped
                for i in range(30):
                    assert (await s.execute("ns", acquire(f"v{i}", "S"))).ok
                await caught_up(a, b)
                assert a.replica.puts - puts >= 30  # the acquires (and any tick of A's)
                assert _from_answer(a) - early == a.replica.puts - puts  # every one of them
                assert a.replica.state.skipped == skipped
                assert _from_answer(b) == 0
                assert b.replica.state.entries == a.replica.state.entries
                assert b.replica.state.fingerprint() == a.replica.state.fingerprint()
                fenced = await s.execute("ns", acquire("v0", "T"))
                assert not fenced.ok  # held: the early applies are the state, not a copy
            nursery.cancel_scope.cancel()


async def test_a_write_between_makes_the_replica_wait_for_its_watch(
    etcd1: EtcdCluster, answers_first: list[Any]
) -> None:
    """A key written to etcd outside the group between two of A's entries: the next entry's
    answer is one revision further than A can know is complete, so A applies it from the
    watch (no early apply), answers the client all the same, and applies the one after from
    its answer again."""
    group = f"answer{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, etcd1, group)
            answers_first.append(a.replica)
            async with (
                session_on(a.port, "S") as s,
                _etcd.Etcd(etcd1.endpoints) as outsider,
            ):
                assert (await s.execute("ns", acquire("first", "S"))).ok
                assert (await s.execute("ns", acquire("second", "S"))).ok
                early = _from_answer(a)
                await outsider.put(b"/elsewhere/" + group.encode(), b"x")
                assert (await s.execute("ns", acquire("third", "S"))).ok
                assert _from_answer(a) == early
                assert (await s.execute("ns", acquire("fourth", "S"))).ok
                assert _from_answer(a) == early + 1
                assert a.replica.state.revision == await outsider.mod_revision(a.replica.log_key)
            nursery.cancel_scope.cancel()


def _polls(handle: object) -> tuple[int, int]:
    stats = handle.replica.statistics()  # type: ignore[attr-defined]
    return int(stats["commit_poll_hits"]), int(stats["commit_poll_misses"])


async def _acquire_until(session: Any, prefix: str, done: Callable[[], bool]) -> None:
    """Acquires (``prefix`` 0, 1, ...) until ``done()``, at most 200: a loaded machine may
    make a commit slower than the window now and then."""
    for i in range(200):
        assert (await session.execute("ns", acquire(f"{prefix}{i}", "S"))).ok
        if done():
            return


async def test_the_commit_poll_finds_answers_and_stops_after_a_slow_commit(
    etcd1: EtcdCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``replica_commit_poll`` the replica polls while its puts are in flight, and the
    answers come while it polls (hits); a commit slower than the window is polled once (a
    miss), the ones after it are not polled at all, and polling resumes once a commit is
    quick again."""
    slow = [0.0]
    put = _etcd.Etcd.put

    async def maybe_slow(self: _etcd.Etcd, *args: Any, **kwargs: Any) -> int:
        await trio.sleep(slow[0])
        return await put(self, *args, **kwargs)

    monkeypatch.setattr(_etcd.Etcd, "put", maybe_slow)
    group = f"answer{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, etcd1, group, replica_commit_poll=0.01)
            async with session_on(a.port, "S") as s:
                await _acquire_until(
                    s, "quick", lambda: _polls(a)[0] >= 1 and a.replica._last_commit <= 0.01
                )
                hits, misses = _polls(a)
                assert hits >= 1
                assert a.replica.commit_poll_seconds > 0
                slow[0] = 0.05  # five times the window: no slow commit can be a hit
                for i in range(5):
                    assert (await s.execute("ns", acquire(f"slow{i}", "S"))).ok
                assert _polls(a) == (hits, misses + 1)  # the first polled, the others not
                slow[0] = 0.0
                await _acquire_until(s, "again", lambda: _polls(a)[0] > hits)
                assert _polls(a)[0] > hits
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("good", "bad", "message"),
    [(0.0, -0.001, "must be >= 0 seconds, got -0.001"), (0.01, 0.0101, "must be <= 0.01")],
)
def test_the_commit_poll_at_and_past_its_bounds(good: float, bad: float, message: str) -> None:
    """0 (never poll) and 0.01 are accepted; past either is refused, naming the setting, from
    the config and from the command line alike."""
    from lockserver._config import ConfigError, ServerConfig, load_config

    assert ServerConfig(replica_commit_poll=good).replica_commit_poll == good
    with pytest.raises(ValueError, match=f"replica_commit_poll {message}"):
        ServerConfig(replica_commit_poll=bad)
    with pytest.raises(ConfigError, match=f"{message}.*--replica-commit-poll"):
        load_config(["--replica-commit-poll", str(bad)], {})


async def test_the_commit_poll_shows_in_metrics(etcd1: EtcdCluster) -> None:
    """What the poll spent is on the replica's ``/metrics`` (its port answers HTTP), as the
    statistics say it, next to the revision applied."""
    group = f"answer{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, etcd1, group, replica_commit_poll=0.01)
            async with session_on(a.port, "S") as s:
                await _acquire_until(s, "v", lambda: _polls(a)[0] >= 1)
            # The replica goes on (its session's end, ticks): the figures only grow, so
            # /metrics lies between the statistics read before and after it.
            before = a.replica.statistics()
            text = (await get(a.port, "/metrics")).body.decode()
            after = a.replica.statistics()
            metrics = dict(
                line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#")
            )
            polled = float(metrics["lockserver_replication_commit_poll_seconds_total"])
            assert before["commit_poll_seconds"] - 1e-6 <= polled
            assert polled <= after["commit_poll_seconds"] + 1e-6
            assert polled > 0
            revision = float(metrics["lockserver_replication_revision"])
            assert before["revision"] <= revision <= after["revision"]
            nursery.cancel_scope.cancel()


def test_the_commit_poll_defaults_alike() -> None:
    """The command's default (``replica_commit_poll``) and the replica's are one value."""
    from lockserver._config import ServerConfig

    settings = _replica.ReplicationSettings(endpoints=("127.0.0.1:1",), group="g")
    assert ServerConfig().replica_commit_poll == settings.commit_poll == 0.002


async def test_no_commit_poll_when_it_is_off(etcd1: EtcdCluster) -> None:
    """``replica_commit_poll`` 0: the replica never polls (nothing counted)."""
    group = f"answer{next(_groups)}"
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, etcd1, group, replica_commit_poll=0)
            async with session_on(a.port, "S") as s:
                for i in range(10):
                    assert (await s.execute("ns", acquire(f"v{i}", "S"))).ok
                assert _polls(a) == (0, 0)
                assert a.replica.commit_poll_seconds == 0
            nursery.cancel_scope.cancel()
