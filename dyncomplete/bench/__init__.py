"""Benchmark: datasets, metrics, the runner and reports."""
