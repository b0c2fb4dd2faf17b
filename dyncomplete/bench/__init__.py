"""Benchmark: the runner, metrics, the sandbox for generated code, reports and plots, and the
editor-session replay through a real server."""
