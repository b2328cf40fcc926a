"""A stopped etcd member under a replica's watch stalls no replica (issue 31, finding (a) of
the second long sitting): three real etcd members, two replicas; the member the first
replica's watch is on is stopped (SIGSTOP: it keeps its sockets, answers nothing, ends
nothing). etcd keeps a quorum, so the group must go on granting through both replicas
within a bound: the watch guard sees etcd hold revisions the watch does not deliver and
reopens it at another member, and puts and keepalives give up on the stopped member within
their own bound. The first replica grants once more after the second: that grant needs the
second's entry, which only its (reopened) watch delivers."""

from __future__ import annotations

import itertools
from pathlib import Path

import trio

from client import LockClientError
from lockbench.etcd import EtcdCluster

from .test_group_attacks import NEW, repl, secret_file, start
from .test_replicas import acquire, session_on

_groups = itertools.count()

#: Seconds within which the group grants again after the member stops: the watch bound
#: (1 s with a 2 s lease), a put's attempt bound, an etcd election if the member led, and
#: a noisy 2-core machine.
RECOVERY = 12.0


async def test_a_stopped_member_under_the_watch_leaves_the_group_granting(
    etcd3: EtcdCluster, tmp_path: Path
) -> None:
    group = f"w{next(_groups)}"
    secret = secret_file(tmp_path, NEW)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            rs = [await start(nursery, etcd3, group, secret) for _ in range(2)]
            async with session_on(rs[0].port, "before") as s:
                assert (await s.execute("ns", acquire("v0", "before"))).ok
            watched = rs[0].replica.etcd.watching
            assert watched is not None
            (stopped,) = [i for i, url in enumerate(etcd3.urls) if url == watched]
            etcd3.stop(stopped)
            try:
                # The first replica grants again last: its put then lands after the second
                # one's entry, which only its watch can deliver (an entry it applies from its
                # own put's answer needs nothing of the watch): it must have reopened it.
                for i, h in enumerate([*rs, rs[0]]):
                    with trio.fail_after(RECOVERY):
                        while True:
                            try:
                                with trio.move_on_after(4.0):
                                    async with session_on(h.port, f"during{i}") as s:
                                        result = await s.execute("ns", acquire(f"v{i + 1}", "x"))
                                        assert result.ok
                                        break
                            except (OSError, LockClientError):
                                pass  # the replica closed it (a commit failed, a lapse): again
                            await trio.sleep(0.1)
                stats = repl(rs[0])
                assert stats["watching"] != watched
                assert stats["watch_reopens"] >= 1 or stats["resets"] >= 1
            finally:
                etcd3.cont(stopped)
            nursery.cancel_scope.cancel()
