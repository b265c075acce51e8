"""Benchmark scripts: python -m workbench.bench.<name> writes JSON to data/results/."""
