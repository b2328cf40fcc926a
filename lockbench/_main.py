"""The ``lockbench`` command's entry point, light enough to import without the bench extra.

Why: the ``lockbench`` package also holds the test oracles (:mod:`lockbench.safety`,
:mod:`lockbench.fuzz`), which need nothing beyond lockserver's own dependencies, while the
harness behind the command needs the ``bench`` extra (rich, hdrhistogram, psutil, redis).
Importing the package must not import the harness, so :func:`main` imports it when called,
and a missing extra is one readable error line (exit 2), not a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]

#: Top-level modules of the ``bench`` extra that the harness imports when it loads.
_BENCH_EXTRA = frozenset({"rich", "hdrh", "psutil", "redis", "matplotlib"})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lockbench`` command (``argv`` defaults to ``sys.argv[1:]``); the exit code."""
    try:
        from ._cli import main as run_command
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _BENCH_EXTRA:
            raise
        print(
            f"lockbench: error: {missing} is not installed; the command needs the bench "
            "extra (pip install 'skylock[bench]')",
            file=sys.stderr,
        )
        return 2
    return run_command(argv)
