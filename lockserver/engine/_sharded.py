"""A dict for up to millions of keys that never stops the server to rebuild itself.

Why: a Python dict that keeps getting new keys inserted and old ones deleted (locks taken and
released, sessions coming and going) rebuilds its whole hash table every ~0.4 x its size
inserts, in one go, and every request waits: 41-50 ms for 1,000,000 held locks in one
table, 42-165 ms for a million sessions, on the benchmark machine (benchmarks/stalls.py).
Split over SHARDS dicts by the key's hash, a rebuild moves 1/SHARDS of the keys. The price is
a method call per operation (~0.05-0.1 µs); the evaluator's hot paths skip it by going to
``shards[hash(key) & mask]`` themselves (and then keep ``n`` right). Big tables
(``_store.BigTable``), big namespaces and many namespaces (``_store.Tables``,
``_store.Namespaces``) and the sessions use it. A listing resumes in one shard
(``_inspect.py``): a page costs O(shard), never a copy of every key.

``StableKeys`` is the same idea for a set of keys that must iterate alike in every process
(a session's held variables in one table: the order they are released in when it ends shows
in its lock-lost notice and the change feed, and every replica of a group must produce the
same): its keys are placed by a hash that does not depend on the process's hash seed.
``StableMap`` is that for a map keyed by (namespace, table) pairs (a session's groups, when
it holds in SHARD_AT tables or more).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Generic, TypeVar

from mypy_extensions import mypyc_attr

__all__ = [
    "SHARDS",
    "ShardedDict",
    "StableKeys",
    "StableMap",
    "pair_hash",
    "sharded",
    "stable_hash",
]

V = TypeVar("V")
# Shards per ShardedDict, a power of two. A module global on purpose: tests shrink it to put
# the sharded forms under the model tests (each instance keeps the mask it was made with).
SHARDS = 256


def _first(item: tuple[str, object]) -> str:
    return item[0]


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class ShardedDict(MutableMapping[str, V]):
    """A str-keyed mutable mapping over SHARDS dicts: ``shards[hash(key) & mask]`` holds
    ``key``, ``n`` counts the keys. Same behaviour as a dict except order: iteration goes
    shard by shard (insertion order within a shard only)."""

    __slots__ = ("mask", "n", "shards")

    def __init__(self, shard: Callable[[], dict[str, V]] = dict) -> None:
        self.shards = [shard() for _ in range(SHARDS)]
        self.mask = SHARDS - 1
        self.n = 0

    def get(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        return self.shards[hash(key) & self.mask].get(key, default)

    def __getitem__(self, key: str) -> V:
        return self.shards[hash(key) & self.mask][key]

    def __setitem__(self, key: str, value: V) -> None:
        shard = self.shards[hash(key) & self.mask]
        if key not in shard:
            self.n += 1
        shard[key] = value

    def __delitem__(self, key: str) -> None:
        del self.shards[hash(key) & self.mask][key]
        self.n -= 1

    def __contains__(self, key: object) -> bool:
        return key in self.shards[hash(key) & self.mask]

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[str]:
        for shard in self.shards:
            yield from shard

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    # A shard is chosen by ``hash(key)``, which differs between processes (PYTHONHASHSEED):
    # a pickle (a replicated group's snapshot, loaded by another replica) carries the items
    # and the shard type, and the loading process places them by its own hashes.
    def __getstate__(self) -> tuple[int, type, list[tuple[str, V]]]:
        # Sorted: the same items pickle alike on every replica, whatever its hash seed.
        return self.mask, type(self.shards[0]), sorted(self.items(), key=_first)

    def __setstate__(self, state: tuple[int, type, list[tuple[str, V]]]) -> None:
        mask, shard, items = state
        self.shards = [shard() for _ in range(mask + 1)]
        self.mask = mask
        self.n = 0
        shards = self.shards
        for key, value in items:
            shards[hash(key) & mask][key] = value
        self.n = len(items)


def sharded(items: dict[str, V]) -> ShardedDict[V]:
    """A ShardedDict (of plain dict shards) holding ``items`` (one synchronous copy)."""
    out: ShardedDict[V] = ShardedDict()
    shards, mask = out.shards, out.mask
    for key, value in items.items():
        shards[hash(key) & mask][key] = value
    out.n = len(items)
    return out


def stable_hash(key: str) -> int:
    """A hash of ``key`` that is the same in every process, whatever its hash seed (the CRC-32
    of its UTF-8 form; ~0.1 µs for a short key, four times ``hash``)."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass"))


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class StableKeys:
    """A set of str keys, used like a ``dict[str, None]`` (``keys[k] = None``, ``del
    keys[k]``, ``k in keys``, ``len``, iteration), over SHARDS dicts: ``shards[stable_hash(k)
    & mask]`` holds ``k``, so a rebuild moves 1/SHARDS of the keys. Iteration goes shard by
    shard, in insertion order within one: it depends on which keys were added and removed in
    which order, never on the process (unlike ``ShardedDict``). Its state is its attributes,
    plain lists and dicts: a snapshot carries the order as it is."""

    __slots__ = ("mask", "n", "shards")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.shards: list[dict[str, None]] = [{} for _ in range(SHARDS)]
        self.mask = mask = SHARDS - 1
        shards, crc32 = self.shards, zlib.crc32  # (the move of a group is one call: inlined)
        for key in keys:
            shards[crc32(key.encode("utf-8", "surrogatepass")) & mask][key] = None
        self.n = sum(map(len, shards))

    def __setitem__(self, key: str, value: None) -> None:
        shard = self.shards[stable_hash(key) & self.mask]
        if key not in shard:
            self.n += 1
            shard[key] = value

    def __delitem__(self, key: str) -> None:
        del self.shards[stable_hash(key) & self.mask][key]
        self.n -= 1

    def __contains__(self, key: object) -> bool:
        return type(key) is str and key in self.shards[stable_hash(key) & self.mask]

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[str]:
        for shard in self.shards:
            yield from shard

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


def pair_hash(key: tuple[str, str]) -> int:
    """A hash of a (namespace, table) pair that is the same in every process: the CRC-32 of
    the table's UTF-8 form, continuing that of the namespace's."""
    ns, table = key
    crc = zlib.crc32(ns.encode("utf-8", "surrogatepass"))
    return zlib.crc32(table.encode("utf-8", "surrogatepass"), crc)


@mypyc_attr(allow_interpreted_subclasses=True)  # snapshots: lockserver/replication/_group.py
class StableMap(Generic[V]):
    """A map of (namespace, table) pairs, used like a dict (``get``, ``m[k]``, ``m[k] = v``,
    ``del m[k]``, ``k in m``, ``len``, iteration, ``items``, ``values``, ``clear``), over
    SHARDS dicts: ``shards[pair_hash(k) & mask]`` holds ``k``. Iteration goes shard by
    shard, in insertion order within one: the same in every process (``StableKeys``'s
    rule). Its state is its attributes: a snapshot carries the order as it is."""

    __slots__ = ("mask", "n", "shards")

    def __init__(self, items: dict[tuple[str, str], V] | None = None) -> None:
        self.shards: list[dict[tuple[str, str], V]] = [{} for _ in range(SHARDS)]
        self.mask = mask = SHARDS - 1
        self.n = 0
        if items:
            shards = self.shards
            for key, value in items.items():
                shards[pair_hash(key) & mask][key] = value
            self.n = len(items)

    def get(self, key: tuple[str, str], default: V | None = None) -> V | None:
        return self.shards[pair_hash(key) & self.mask].get(key, default)

    def __getitem__(self, key: tuple[str, str]) -> V:
        return self.shards[pair_hash(key) & self.mask][key]

    def __setitem__(self, key: tuple[str, str], value: V) -> None:
        shard = self.shards[pair_hash(key) & self.mask]
        if key not in shard:
            self.n += 1
        shard[key] = value

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self.shards[pair_hash(key) & self.mask][key]
        self.n -= 1

    def __contains__(self, key: object) -> bool:
        if type(key) is not tuple or len(key) != 2:
            return False
        return key in self.shards[pair_hash(key) & self.mask]

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for shard in self.shards:
            yield from shard

    def items(self) -> Iterator[tuple[tuple[str, str], V]]:
        for shard in self.shards:
            yield from shard.items()

    def values(self) -> Iterator[V]:
        for shard in self.shards:
            yield from shard.values()

    def clear(self) -> None:
        for shard in self.shards:
            shard.clear()
        self.n = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"
