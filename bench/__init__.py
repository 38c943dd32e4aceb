"""Benchmarks: scripts that print a table (see bench/README.md). Never run by the tests."""
