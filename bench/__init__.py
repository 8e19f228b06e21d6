"""Pesto IR's benchmarks: `python -m bench` runs the model-zoo suite; the bench_*.py scripts each
measure one goal; `bench/micro` holds pytest-benchmark micro-benchmarks of the hot paths."""
