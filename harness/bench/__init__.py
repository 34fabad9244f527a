"""Benchmarks of the harness itself (make bench-*): figures for docs/benchmarks.md, not unit tests."""
