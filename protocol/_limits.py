"""TreeLimits: the bounds of decoding a request.

Apart from _trees.py, which may be compiled with mypyc (lockserver/_build.py): a compiled
module cannot hold an attrs class; this one is never compiled, so ``TreeLimits`` is the same
class in both builds.
"""

from __future__ import annotations

import math

import attrs

from ._ops import ELEMENT_SIZE, MIN_SECONDS

__all__ = ["TreeLimits"]


@attrs.frozen
class TreeLimits:
    """Bounds applied while decoding a request (its tree and its fields); the server's
    settings of the same names (PROTOCOL.md, docs/configuration.md).

    ``max_name``: characters of a session id, namespace, table, var, ``into``, ``tx_id`` or
    client name; ``max_text``: characters of a description; ``max_value``: the size of one
    user value (``value_size``); ``max_ttl``: seconds of a SetVar ``ttl`` or ``period``."""

    max_depth: int = 32
    max_ops: int = 1000
    max_name: int = 1024
    max_text: int = 4096
    max_value: int = 65536
    max_ttl: float = 30 * 86400.0

    def __attrs_post_init__(self) -> None:
        if min(self.max_depth, self.max_ops, self.max_name, self.max_text) < 1:
            raise ValueError("tree limits must be >= 1")
        if self.max_value < ELEMENT_SIZE:
            raise ValueError(f"max_value must be >= {ELEMENT_SIZE}")
        if not MIN_SECONDS <= self.max_ttl < math.inf:
            raise ValueError(f"max_ttl must be a finite number >= {MIN_SECONDS}")
