"""lockbench: load generator for lockserver, side by side with Redis. See benchmarks/README.md."""

from ._cli import main as main

__all__ = ["main"]
