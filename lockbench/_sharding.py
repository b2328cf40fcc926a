"""Where blast's load goes over several servers: its namespaces, placed as a client places them.

Why: a sharded client sends every transaction to the server its namespace lives on
(rendezvous hashing, PROTOCOL.md §12, ``client._placement.place``). The blaster does the same
with its pre-encoded load, so "2 shards" is measured with the traffic a real client would
send: every namespace's transactions go to the one server ``place`` assigns it, and nowhere
else.

- :func:`namespace_pool`: ``NAMESPACES_PER_SERVER`` namespaces per server, ``lb-0``,
  ``lb-1``, ...; the names depend only on how many servers there are, and one server gets
  every name (the same workload as several).
- :func:`plan`: for each server (by its index in the target's list), the namespaces placed on
  it, in pool order.
- :func:`prefill_batches`: ``--prefill N`` as transactions of ``per_tx`` entries, batch *j* in
  namespace ``pool[j % len(pool)]``, so the held entries spread over the namespaces (and hence
  the servers) the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

from client._placement import ServerAddress, place

__all__ = ["NAMESPACES_PER_SERVER", "namespace_pool", "plan", "prefill_batches", "server_ids"]

#: Namespaces per server in the pool: enough that rendezvous hashing spreads them roughly
#: evenly (with 16 per server each of 2 servers gets 16 ± 4), few enough that every
#: connection's 512 keys touch each of its server's namespaces many times.
NAMESPACES_PER_SERVER = 16


def namespace_pool(servers: int) -> tuple[str, ...]:
    """The namespaces a blast over ``servers`` servers uses."""
    return tuple(f"lb-{i}" for i in range(NAMESPACES_PER_SERVER * servers))


def server_ids(addresses: Sequence[tuple[str, int]]) -> tuple[ServerAddress, ...]:
    """The placement identities of ``addresses`` (the client's canonical ``host:port``)."""
    return tuple(ServerAddress(host, port) for host, port in addresses)


def plan(addresses: Sequence[tuple[str, int]]) -> list[tuple[str, ...]]:
    """For each server of ``addresses``, the pool's namespaces ``place`` puts on it. A server
    may get none (possible with few namespaces, never seen with 16 per server)."""
    servers = server_ids(addresses)
    index = {server: i for i, server in enumerate(servers)}
    placed: list[list[str]] = [[] for _ in servers]
    for namespace in namespace_pool(len(servers)):
        placed[index[place(namespace, servers)]].append(namespace)
    return [tuple(names) for names in placed]


def prefill_batches(n: int, pool: Sequence[str], per_tx: int) -> list[tuple[str, int, int]]:
    """``n`` entries as (namespace, first, stop) transactions of at most ``per_tx`` entries,
    batch *j* in ``pool[j % len(pool)]``."""
    return [
        (pool[j % len(pool)], start, min(n, start + per_tx))
        for j, start in enumerate(range(0, n, per_tx))
    ]
