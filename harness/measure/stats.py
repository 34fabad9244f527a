"""Summary statistics of timing samples, with the stability warnings DESIGN.md asks for."""

from __future__ import annotations

import numpy as np
from scipy import stats as scipy_stats

from harness.records import Summary

MIN_SAMPLES = 10
CV_WARN = 0.10
FIRST_SAMPLE_WARN = 2.0


def summarize(samples: list[float] | np.ndarray, *, seed: int = 0) -> Summary:
    """Describe samples; flags CV > 10 %, a first sample > 2x the median, and < 10 samples."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    ci = None
    if x.size >= 2 and np.ptp(x) > 0:
        res = scipy_stats.bootstrap((x,), np.median, confidence_level=0.95, n_resamples=2000,
                                    method="percentile", random_state=np.random.default_rng(seed))
        ci = (float(res.confidence_interval.low), float(res.confidence_interval.high))
    elif x.size >= 2:
        ci = (float(p50), float(p50))
    warnings = []
    if x.size < MIN_SAMPLES:
        warnings.append(f"only {x.size} samples (< {MIN_SAMPLES}): statistics are rough")
    if mean > 0 and std / mean > CV_WARN:
        warnings.append(f"high variation: CV {std / mean:.0%} > {CV_WARN:.0%}")
    if x.size > 1 and p50 > 0 and x[0] > FIRST_SAMPLE_WARN * p50:
        warnings.append(f"first timed sample {x[0]:.2f} > {FIRST_SAMPLE_WARN:g}x median {p50:.2f}: warm-up too short?")
    return Summary(int(x.size), mean, std, float(x.min()), float(p50), float(p90), float(p95), float(p99),
                   float(x.max()), ci, warnings)
