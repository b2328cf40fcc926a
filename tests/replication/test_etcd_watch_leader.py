"""The etcd client's part of issue 31 against real etcd: a watch asks for a leader (a member
that has none refuses it instead of keeping it open and silent), a put's attempt bound is
kept on a stopped member and the next call starts elsewhere, ``avoid`` moves the start past
a member, and ``mod_revision`` reads a key's last change without its value."""

from __future__ import annotations

import time
from typing import Literal

import pytest
import trio

from lockbench.etcd import EtcdCluster
from lockserver.replication._etcd import Etcd, EtcdError, EtcdUnavailable


async def test_mod_revision_reads_the_last_change_of_a_key(etcd1: EtcdCluster) -> None:
    async with Etcd(etcd1.endpoints) as etcd:
        assert await etcd.mod_revision(b"/watch-test/none") == 0
        first = await etcd.put(b"/watch-test/k", b"x" * 1000)
        assert await etcd.mod_revision(b"/watch-test/k") == first
        second = await etcd.put(b"/watch-test/k", b"y")
        assert await etcd.mod_revision(b"/watch-test/k", timeout=1.0) == second > first


@pytest.mark.parametrize("transport", ["gateway", "grpc"])
async def test_a_watch_on_a_member_without_a_leader_is_refused(
    etcd3: EtcdCluster, transport: Literal["gateway", "grpc"]
) -> None:
    """Two of three members stopped: the third has no leader (after its election timeout),
    and a watch opened there is refused -- it asked for a leader (the gateway's header, or
    the gRPC metadata itself) -- rather than created and left silent for ever."""
    async with Etcd([etcd3.endpoints[0]], timeout=3.0, transport=transport) as etcd:
        await etcd.put(b"/watch-test/a", b"1")
        etcd3.stop(1)
        etcd3.stop(2)
        try:
            with trio.fail_after(20):
                while True:
                    try:
                        async with etcd.watch(b"/watch-test/", start_revision=1) as events:
                            # Created before the member noticed: it must end the watch.
                            with trio.move_on_after(5):
                                async for _ in events:
                                    pass
                    except EtcdError as exc:
                        assert isinstance(exc, EtcdUnavailable)
                        assert "leader" in str(exc).lower() or "no answer" not in str(exc)
                        break
                    await trio.sleep(0.2)
        finally:
            etcd3.cont(1)
            etcd3.cont(2)


async def test_a_put_gives_up_on_a_stopped_member_within_its_bound(etcd3: EtcdCluster) -> None:
    """A put asked with a 0.5 s attempt bound, its first member stopped: it fails (it may
    have reached the member) within about that bound, not the client's 5 s, and the next
    put starts at the next member and succeeds (once etcd has a leader)."""
    async with Etcd(etcd3.endpoints, timeout=5.0) as etcd:
        await etcd.put(b"/watch-test/p", b"0")
        first = etcd.endpoint
        stopped = etcd3.urls.index(first)
        etcd3.stop(stopped)
        try:
            began = time.monotonic()
            with pytest.raises(EtcdUnavailable) as caught:
                await etcd.put(b"/watch-test/p", b"1", timeout=0.5)
            assert caught.value.maybe_applied
            assert time.monotonic() - began < 3.0  # generous: 0.5 s and a loaded machine
            assert etcd.endpoint != first
            with trio.fail_after(10):  # (an election first, if the stopped member led)
                while True:
                    try:
                        await etcd.put(b"/watch-test/p", b"2", timeout=2.0)
                        break
                    except EtcdUnavailable:
                        await trio.sleep(0.1)
            assert etcd.endpoint != first
        finally:
            etcd3.cont(stopped)


async def test_avoid_moves_the_next_call_past_a_member(etcd3: EtcdCluster) -> None:
    async with Etcd(etcd3.endpoints) as etcd:
        await etcd.put(b"/watch-test/v", b"0")
        first = etcd.endpoint
        etcd.avoid("http://nowhere:1")  # not the current one: nothing moves
        assert etcd.endpoint == first
        etcd.avoid(first)
        assert etcd.endpoint != first
        async with etcd.watch(b"/watch-test/", start_revision=1):
            assert etcd.watching == etcd.endpoint != first
