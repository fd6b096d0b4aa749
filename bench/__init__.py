"""Benchmarks: standalone modules (`python -m bench.bench_<name>`) printing markdown tables."""
