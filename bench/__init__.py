"""Benchmarks and soak runs of the operator (run as scripts: bench/converge.py, bench/soak.py)."""
