"""Benchmark and soak scripts, run from the repository root as ``python -m benchmarks.<name>``.

Not installed: the wheel ships the harness and the test oracles as the ``lockbench`` package,
which these scripts import.
"""
