"""The Redis side: each workload op as an atomic Lua script, driven by redis-py.

Why: the comparison is "Python client end to end", so Redis is driven the way a Python user
drives it: redis-py (``redis.Redis`` for the sync face, ``redis.asyncio`` for tasks), scripts
registered once and called by EVALSHA. Each script is the standard way to make the lock atomic
(seed 001: a lock *must* carry a timeout, and acquire/release must each be one atomic step).
Every lock gets a TTL (``TTL_MS``), because Redis has no sessions: a crashed holder's lock is
freed only by its expiry. Keys are prefixed ``lb:`` so a shared Redis is not trampled.

Scripts (KEYS / ARGV as passed by :func:`acquire_call` / :func:`release_call`):

- mutex acquire: ``SET key uid NX PX ttl`` -> 1/0. Release: compare the uid, then DEL.
- session-churn: Redis has no sessions; the cycle is a mutex acquire with a fresh uid and its
  release (which is what "open a session, lock, end it" costs a Redis user).
- rwlock: a writer key (string, uid) and a readers hash (uid -> 1). Reader acquire: fails when
  the writer key exists, else HSET uid and PEXPIRE the hash (Redis 7.0 cannot expire one hash
  field, so the readers' TTL is refreshed as a whole). Writer acquire: fails when the readers
  hash exists, else ``SET NX PX``. Releases: HDEL the uid / compare-and-DEL the writer.
  Same rules as the lockserver transactions: readers share, a writer excludes everyone.
- multilock: fails when any of the 4 keys exists, else sets all 4 (``PX``) -> all or nothing.
  Release: compare-and-DEL each key.
- mds (SEMANTICS.md's clinical example, variable = facility, value = patient):
  ``lb:me:F`` month-end holder; ``lb:rv:F`` the facility's one review (hash uid, patient) —
  the lockserver's exclusive ``SetVar("MDS-Review", F, P)`` also allows one review per facility;
  ``lb:en:F`` entries (hash uid -> patient) and ``lb:enc:F`` (hash patient -> count) so that
  "an entry of THIS patient exists" is one HEXISTS. Entry: no month-end, no review of this
  patient, then add. Review: no month-end, no entry of this patient, no review in the facility,
  then set. Month-end: no entry and no review in the facility, then ``SET NX PX``.
- ping: PING.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._workloads import Op, OpKind

__all__ = ["SCRIPTS", "TTL_MS", "RedisAsyncOps", "RedisSyncOps", "acquire_call", "release_call"]

TTL_MS = 30_000

SCRIPTS: dict[str, str] = {
    "mutex_acquire": """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0""",
    "mutex_release": """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0""",
    "read_acquire": """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1""",
    "read_release": """
return redis.call('HDEL', KEYS[1], ARGV[1])""",
    "write_acquire": """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0""",
    "multi_acquire": """
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then return 0 end
end
for i = 1, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2]) end
return 1""",
    "multi_release": """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then n = n + redis.call('DEL', KEYS[i]) end
end
return n""",
    "entry_acquire": """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('HGET', KEYS[2], 'patient') == ARGV[3] then return 0 end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
redis.call('PEXPIRE', KEYS[4], ARGV[2])
return 1""",
    "entry_release": """
if redis.call('HDEL', KEYS[1], ARGV[1]) == 1 then
  if redis.call('HINCRBY', KEYS[2], ARGV[2], -1) <= 0 then redis.call('HDEL', KEYS[2], ARGV[2]) end
  return 1
end
return 0""",
    "review_acquire": """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
redis.call('HSET', KEYS[3], 'uid', ARGV[1], 'patient', ARGV[3])
redis.call('PEXPIRE', KEYS[3], ARGV[2])
return 1""",
    "review_release": """
if redis.call('HGET', KEYS[1], 'uid') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0""",
    "month_end_acquire": """
if redis.call('EXISTS', KEYS[1]) == 1 or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
if redis.call('SET', KEYS[3], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
return 0""",
}

Call = tuple[str, list[str], list[str | int]]
"""(script name, KEYS, ARGV)."""


def acquire_call(op: Op) -> Call:
    """The script call that acquires ``op``'s lock(s)."""
    kind, keys, uid = op.kind, op.keys, op.ticket
    if kind is OpKind.MUTEX or kind is OpKind.SESSION:
        return "mutex_acquire", [f"lb:m:{keys[0]}"], [uid, TTL_MS]
    if kind is OpKind.READ:
        return "read_acquire", [f"lb:w:{keys[0]}", f"lb:r:{keys[0]}"], [uid, TTL_MS]
    if kind is OpKind.WRITE:
        return "write_acquire", [f"lb:w:{keys[0]}", f"lb:r:{keys[0]}"], [uid, TTL_MS]
    if kind is OpKind.MULTI:
        return "multi_acquire", [f"lb:m:{k}" for k in keys], [uid, TTL_MS]
    if kind is OpKind.MDS_ENTRY:
        f, p = keys
        return (
            "entry_acquire",
            [f"lb:me:{f}", f"lb:rv:{f}", f"lb:en:{f}", f"lb:enc:{f}"],
            [uid, TTL_MS, p],
        )
    if kind is OpKind.MDS_REVIEW:
        f, p = keys
        return "review_acquire", [f"lb:me:{f}", f"lb:enc:{f}", f"lb:rv:{f}"], [uid, TTL_MS, p]
    if kind is OpKind.MDS_MONTH_END:
        f = keys[0]
        return "month_end_acquire", [f"lb:en:{f}", f"lb:rv:{f}", f"lb:me:{f}"], [uid, TTL_MS]
    raise ValueError(f"{kind} takes no lock")


def release_call(op: Op) -> Call:
    """The script call that releases ``op``'s lock(s)."""
    kind, keys, uid = op.kind, op.keys, op.ticket
    if kind is OpKind.MUTEX or kind is OpKind.SESSION:
        return "mutex_release", [f"lb:m:{keys[0]}"], [uid]
    if kind is OpKind.READ:
        return "read_release", [f"lb:r:{keys[0]}"], [uid]
    if kind is OpKind.WRITE:
        return "mutex_release", [f"lb:w:{keys[0]}"], [uid]
    if kind is OpKind.MULTI:
        return "multi_release", [f"lb:m:{k}" for k in keys], [uid]
    if kind is OpKind.MDS_ENTRY:
        f, p = keys
        return "entry_release", [f"lb:en:{f}", f"lb:enc:{f}"], [uid, p]
    if kind is OpKind.MDS_REVIEW:
        return "review_release", [f"lb:rv:{keys[0]}"], [uid]
    if kind is OpKind.MDS_MONTH_END:
        return "mutex_release", [f"lb:me:{keys[0]}"], [uid]
    raise ValueError(f"{kind} takes no lock")


class RedisSyncOps:
    """Workload ops over a sync ``redis.Redis`` (pipelined batches with transaction=False)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}

    def ping(self, n: int) -> None:
        """``n`` PINGs (one pipeline when n > 1)."""
        if n == 1:
            self._client.ping()
            return
        pipe = self._client.pipeline(transaction=False)
        for _ in range(n):
            pipe.ping()
        pipe.execute()

    def acquire(self, ops: Sequence[Op]) -> list[bool]:
        """Try to acquire every op's lock; which ones succeeded."""
        return [bool(r) for r in self._calls([acquire_call(op) for op in ops])]

    def release(self, ops: Sequence[Op]) -> None:
        """Release every op's lock."""
        self._calls([release_call(op) for op in ops])

    def discard(self, ops: Sequence[Op]) -> None:
        """Nothing to clean up after a failed acquire (no sessions in Redis)."""

    def _calls(self, calls: list[Call]) -> list[Any]:
        if len(calls) == 1:
            name, keys, args = calls[0]
            return [self._scripts[name](keys=keys, args=args)]
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            self._scripts[name](keys=keys, args=args, client=pipe)
        return list(pipe.execute())


class RedisAsyncOps:
    """Workload ops over a ``redis.asyncio.Redis`` (its pool bounds the connections)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._scripts = {name: client.register_script(src) for name, src in SCRIPTS.items()}

    async def ping(self, n: int) -> None:
        """``n`` PINGs (one pipeline when n > 1)."""
        if n == 1:
            await self._client.ping()
            return
        pipe = self._client.pipeline(transaction=False)
        for _ in range(n):
            pipe.ping()
        await pipe.execute()

    async def acquire(self, ops: Sequence[Op]) -> list[bool]:
        """Try to acquire every op's lock; which ones succeeded."""
        return [bool(r) for r in await self._calls([acquire_call(op) for op in ops])]

    async def release(self, ops: Sequence[Op]) -> None:
        """Release every op's lock."""
        await self._calls([release_call(op) for op in ops])

    async def discard(self, ops: Sequence[Op]) -> None:
        """Nothing to clean up after a failed acquire (no sessions in Redis)."""

    async def _calls(self, calls: list[Call]) -> list[Any]:
        if len(calls) == 1:
            name, keys, args = calls[0]
            return [await self._scripts[name](keys=keys, args=args)]
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            await self._scripts[name](keys=keys, args=args, client=pipe)
        return list(await pipe.execute())
