"""Benchmarks of the harness itself (make bench-*): figures for issue notes, not unit tests."""
