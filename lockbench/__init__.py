"""lockbench: the load harness for lockserver (side by side with Redis) and the test oracles.

- ``lockbench`` (the command, :func:`main`): seeded workloads, blast, compare, plot, sitting;
  it needs the ``bench`` extra. See benchmarks/README.md in the repository.
- :mod:`lockbench.safety`: record critical sections and check a history for exclusion and
  fence order (docs/recipes.md); needs nothing beyond lockserver's own dependencies.
- :mod:`lockbench.fuzz`: the mutated-frame generator and the blocking conversation that the
  fuzz tests and ``benchmarks/fuzz_server.py`` share (docs/faults.md).

Importing the package imports none of the harness (see ``_main.py``).
"""

from ._main import main as main

__all__ = ["main"]
