"""A dict for up to millions of keys that never stops the server to rebuild itself.

Why: a Python dict that keeps getting new keys inserted and old ones deleted (sessions coming
and going) rebuilds its whole hash table every ~0.4 x its size inserts, in one go: 37 ms for
1,000,000 keys on the benchmark machine, a pause of every request. Split over SHARDS dicts by
the key's hash, each rebuild moves 1/SHARDS of the keys. The price is a method call per
operation (~0.05-0.1 µs), so it is used where the key count can reach the millions and is
not the per-entry hot path (the sessions; the tables' own split is inlined, see ``BigTable``).
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Final, TypeVar

__all__ = ["ShardedDict"]

V = TypeVar("V")
_SHARDS: Final = 256
_MASK: Final = _SHARDS - 1


class ShardedDict(MutableMapping[str, V]):
    """A str-keyed mutable mapping over 256 dicts. Same behaviour as a dict except order:
    iteration goes shard by shard (insertion order within a shard only)."""

    __slots__ = ("_n", "_shards")

    def __init__(self) -> None:
        self._shards: list[dict[str, V]] = [{} for _ in range(_SHARDS)]
        self._n = 0

    def get(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        return self._shards[hash(key) & _MASK].get(key, default)

    def __getitem__(self, key: str) -> V:
        return self._shards[hash(key) & _MASK][key]

    def __setitem__(self, key: str, value: V) -> None:
        shard = self._shards[hash(key) & _MASK]
        if key not in shard:
            self._n += 1
        shard[key] = value

    def __delitem__(self, key: str) -> None:
        del self._shards[hash(key) & _MASK][key]
        self._n -= 1

    def __contains__(self, key: object) -> bool:
        return key in self._shards[hash(key) & _MASK]

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[str]:
        for shard in self._shards:
            yield from shard

    def __repr__(self) -> str:
        return f"ShardedDict({dict(self.items())!r})"
