"""va-bench: a benchmark harness for object detectors."""

__version__ = "0.1.0"
HARNESS_NAME = "va-bench"
