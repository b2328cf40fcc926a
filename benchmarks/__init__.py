"""Benchmarks and load generators (run as ``python -m benchmarks.<name>``)."""
