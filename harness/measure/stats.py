"""Summary statistics of timing samples, with stability warnings (high CV, a slow first sample, a series still
falling or rising, few samples)."""

from __future__ import annotations

import math

import numpy as np

from harness.records import Summary

MIN_SAMPLES = 10
MIN_CI_SAMPLES = 6  # below 6 values no pair of order statistics covers the median 95 % of the time
TREND_Z, TREND_SHIFT = 3.0, 0.05  # a timed series still falling: rank trend z < -3, first third >= 5 % slower
CV_WARN = 0.10
FIRST_SAMPLE_WARN = 2.0
BOOTSTRAP_RESAMPLES = 2000
WARMUP_WINDOW, WARMUP_SPREAD = 3, 0.10  # warm-up ends when the last 3 batch times are within 10 % of each other
_RESAMPLE_CHUNK = 1 << 20  # indices drawn per chunk (8 MB): a 5000-sample series never holds 2000 x 5000 at once


def bootstrap_ci(samples: tuple[np.ndarray, ...], statistic, *, seed: int = 0, confidence: float = 0.95,
                 n_resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of `statistic(*samples, axis=-1)`, each sample resampled on its
    own: the resamples of `scipy.stats.bootstrap(samples, statistic, paired=False, vectorized=True,
    method="percentile", random_state=default_rng(seed))`, the interval by numpy's quantile (equal to ~1e-14
    relative; tests check one and two samples). Written out because importing scipy.stats costs every run ~1 s
    and ~60 MB (measured on the reference box) for these few lines; drawn in chunks to bound memory (within one
    chunk the draws are scipy's: each sample's indices in turn). Needs two or more values per sample."""
    rng = np.random.default_rng(seed)
    per_chunk = max(1, _RESAMPLE_CHUNK // sum(s.size for s in samples))
    values = []
    for k in range(0, n_resamples, per_chunk):
        m = min(per_chunk, n_resamples - k)
        drawn = [s[rng.integers(0, s.size, (m, s.size))] for s in samples]
        values.append(statistic(*drawn, axis=-1))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(np.concatenate(values), [alpha, 1 - alpha])
    return float(low), float(high)


def lag1_autocorrelation(x: np.ndarray) -> float:
    """The sample autocorrelation at lag 1 (0 for fewer than 3 values or no spread)."""
    d = np.asarray(x, dtype=np.float64) - np.mean(x)
    denominator = float(d @ d)
    return float(d[1:] @ d[:-1]) / denominator if len(d) >= 3 and denominator > 0 else 0.0


def block_size(n: int) -> int:
    """The batch-means method's block: floor(sqrt(n)) values, so that n values make at least floor(sqrt(n)) blocks."""
    return max(1, math.isqrt(n))


def block_means(x: np.ndarray, size: int | None = None) -> np.ndarray:
    """The means of consecutive blocks of `size` values (default block_size(n); a last, shorter block is left out):
    nearly independent where the values themselves are autocorrelated."""
    size = size or block_size(len(x))
    blocks = len(x) // size
    return np.asarray(x[:blocks * size], dtype=np.float64).reshape(blocks, size).mean(axis=1)


def autocorrelated(x: np.ndarray) -> bool:
    """Whether a lag-1 autocorrelation this large is more than white noise would show (above Bartlett's 95 %
    bound, 1.96 / sqrt(n)): then the values are not the independent draws a rank test and a bootstrap assume.
    Taken on the ranks: a few outlying batches (a page fault, another tenant's burst) would hide the drift of the
    rest from the values' own autocorrelation."""
    return len(x) >= 3 and lag1_autocorrelation(average_ranks(np.asarray(x))) > 1.96 / math.sqrt(len(x))


def median_ci(x: np.ndarray, *, seed: int = 0, confidence: float = 0.95,
              n_resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the median (bootstrap_ci of one sample)."""
    return bootstrap_ci((x,), np.median, seed=seed, confidence=confidence, n_resamples=n_resamples)


def median_ci_extent_pct(samples: list[float] | np.ndarray, *, seed: int = 0) -> float | None:
    """How far the median's 95 % bootstrap CI reaches from the median, in % of it: the farther of its two ends
    (--target-ci: both within +-PCT %; a skewed interval's half-width would understate its long side). Of the block
    means where the samples are autocorrelated (a bootstrap of the drifting batches themselves said "met" while the
    median was off by more than the target in 22 of 100 simulated runs). None below MIN_CI_SAMPLES samples (or
    blocks)."""
    x = np.asarray(samples, dtype=np.float64)
    if autocorrelated(x):  # drifting batches: the interval of independent draws would be too narrow
        x = block_means(x)
    if x.size < MIN_CI_SAMPLES:
        return None
    median = float(np.median(x))
    if median <= 0:
        return None
    low, high = median_ci(x, seed=seed) if np.ptp(x) > 0 else (median, median)
    return 100 * max(median - low, high - median) / median


def median_ci_extent_missing(samples: list[float] | np.ndarray) -> str:
    """Why `median_ci_extent_pct` gives None for these samples (too few of them, or too few block means of drifting
    ones), in words for the warning that says the target was not reached."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size < MIN_CI_SAMPLES:
        return f"{x.size} timed batches, fewer than the {MIN_CI_SAMPLES} an interval needs"
    if autocorrelated(x) and (blocks := x.size // block_size(x.size)) < MIN_CI_SAMPLES:
        return (f"{x.size} timed batches that drift together, judged on their {blocks} block means, fewer than the "
                f"{MIN_CI_SAMPLES} an interval needs")
    return "the median batch time is not positive"


TAIL_QUANTILES = (90, 95, 99)


def samples_for_upper_bound(q: float, confidence: float = 0.95) -> int:
    """The fewest samples whose largest is a `confidence` upper bound of the q-quantile (q in (0, 1)): n with
    1 - q**n >= confidence (299 for the 99th percentile at 95 %)."""
    return math.ceil(math.log(1 - confidence) / math.log(q) - 1e-9)


def quantile_upper_bound(samples: list[float] | np.ndarray, q: float, confidence: float = 0.95) -> float | None:
    """A distribution-free `confidence` upper bound of the q-quantile of what `samples` were drawn from
    (independent draws): their k-th smallest, k the least with P(Binomial(n, q) <= k - 1) >= confidence, i.e. at
    least k of n draws fall below the true quantile no more often than 1 - confidence. None with fewer than
    `samples_for_upper_bound(q)` samples: then even their largest is no such bound. The binomial sums are taken in
    log space (the terms of (1 - q)**n underflow for the tail quantiles)."""
    x = np.sort(np.asarray(samples, dtype=np.float64))
    n = x.size
    if n < samples_for_upper_bound(q, confidence):
        return None
    log_q, log_not_q, log_n = math.log(q), math.log1p(-q), math.lgamma(n + 1)
    cdf = 0.0
    for k in range(n + 1):  # cdf = P(Binomial(n, q) <= k)
        cdf += math.exp(log_n - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_q + (n - k) * log_not_q)
        if cdf >= confidence:
            return float(x[k])  # the (k + 1)-th smallest: P(at most k draws below the quantile) >= confidence
    return float(x[-1])


def tail_bounds(samples: list[float] | np.ndarray, confidence: float = 0.95) -> dict[str, dict]:
    """Each tail percentile of `samples` (numpy's, as Summary gives it) beside its distribution-free upper bound
    (`quantile_upper_bound`, null below the samples it needs, which are said). The bound assumes independent draws:
    `autocorrelated` says when the samples drift together beyond white noise, which makes it too low."""
    x = np.asarray(samples, dtype=np.float64)
    out: dict = {"autocorrelated": autocorrelated(x)}
    for pct in TAIL_QUANTILES:
        bound = quantile_upper_bound(x, pct / 100, confidence)
        out[f"p{pct}"] = {"value": round(float(np.percentile(x, pct)), 4),
                          f"upper{round(100 * confidence)}": None if bound is None else round(bound, 4),
                          "samples": int(x.size), "samples_needed": samples_for_upper_bound(pct / 100, confidence)}
    return out


def percent(fraction: float, digits: int = 1, toward: str = "nearest") -> str:
    """`fraction` as a percentage with `digits` decimals, rounded `toward` "up", "down" or "nearest": a figure said
    to be past a threshold is rounded away from it, so the text never reads "10% > 10%" or "99.00% < 99%"."""
    scaled = round(100 * fraction * 10**digits, 6)  # 0.57 is 56.99999... in binary: not 56.9 % rounded down
    rounded = {"up": math.ceil, "down": math.floor}.get(toward, round)(scaled)
    return f"{rounded / 10**digits:.{digits}f}%"


def warmup_end(batches_ms: list[float], elapsed_s: float, min_batches: int, cap_s: float) -> str | None:
    """Why the warm-up ends now, or None to go on: never before `min_batches`; then "stable" once the last
    WARMUP_WINDOW batch times are within WARMUP_SPREAD of each other (max <= 1.1 x min), else "cap" once `cap_s`
    seconds have passed (--warmup-seconds)."""
    if len(batches_ms) < min_batches:
        return None
    recent = batches_ms[-WARMUP_WINDOW:]
    if len(recent) == WARMUP_WINDOW and max(recent) <= (1 + WARMUP_SPREAD) * min(recent):
        return "stable"
    return "cap" if elapsed_s >= cap_s else None


def _trend(x: np.ndarray) -> tuple[float, float, float] | None:
    """Spearman's rank correlation of a series with its order, as a z (its null distribution's normal approximation,
    widened for drifting batches below), and the medians of its first and last thirds; None below MIN_SAMPLES values
    or with no spread."""
    n = x.size
    if n < MIN_SAMPLES or np.ptp(x) == 0:
        return None
    ranks = average_ranks(x)
    order = np.arange(n, dtype=np.float64)
    rho = float(np.corrcoef(order, ranks)[0, 1])
    # batches that drift together make a trend by chance more often: the z is shrunk by the lag-1 autocorrelation
    # left once the trend is taken out (Hamed and Rao's correction, in its AR(1) form)
    residuals = ranks - np.polyval(np.polyfit(order, ranks, 1), order)
    r = min(max(lag1_autocorrelation(residuals), 0.0), 0.99)
    z = rho * math.sqrt(n - 1) * math.sqrt((1 - r) / (1 + r))
    third = n // 3
    return z, float(np.median(x[:third])), float(np.median(x[-third:]))


def still_falling(x: np.ndarray) -> float | None:
    """How much slower the first third of a series is than its last third (a fraction), when the series falls
    steadily: the rank trend's z (`_trend`) under -TREND_Z, and the first third's median at least TREND_SHIFT above
    the last third's; else None.
    A warm-up that stopped on three flat batches during a slow ramp (clocks, an allocator growing) leaves this."""
    trend = _trend(x)
    if trend is None:
        return None
    z, first, last = trend
    return first / last - 1 if z < -TREND_Z and last > 0 and first >= (1 + TREND_SHIFT) * last else None


def slowing_down(x: np.ndarray) -> float | None:
    """How much slower the last third of a series is than its first third (a fraction), when the series rises
    steadily (the mirror of `still_falling`); else None.
    A device that throttles under sustained load, or a machine that another process starts to share, leaves this."""
    trend = _trend(x)
    if trend is None:
        return None
    z, first, last = trend
    return last / first - 1 if z > TREND_Z and first > 0 and last >= (1 + TREND_SHIFT) * first else None


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 with ties given their average (scipy.stats.rankdata's "average", less one)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.arange(x.size)
    _, tie_group, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(tie_group, weights=ranks) / counts)[tie_group]


def summarize(samples: list[float] | np.ndarray, *, seed: int = 0) -> Summary:
    """Describe samples; flags CV > 10 %, a first sample > 2x the median (else a series still falling, else one
    rising), and < 10 samples. No median CI from fewer than MIN_CI_SAMPLES."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no samples to summarize")
    p50, p90, p95, p99 = np.percentile(x, [50, 90, 95, 99])
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else None  # one sample has no spread to speak of, not a spread of 0
    ci = None  # none from fewer than MIN_CI_SAMPLES: a bootstrap's there covers the median 50-75 % of the time
    if x.size >= MIN_CI_SAMPLES and np.ptp(x) > 0:
        ci = median_ci(x, seed=seed)
    elif x.size >= MIN_CI_SAMPLES:
        ci = (float(p50), float(p50))
    warnings = []
    if x.size < MIN_SAMPLES:
        warnings.append(f"only {x.size} samples (< {MIN_SAMPLES}): statistics are rough")
    if std is not None and mean > 0 and std / mean > CV_WARN:
        warnings.append(f"high variation: CV {percent(std / mean, 1, 'up')} > {CV_WARN:.0%}")
    if x.size > 1 and p50 > 0 and x[0] > FIRST_SAMPLE_WARN * p50:
        warnings.append(f"first timed sample {x[0]:.2f} > {FIRST_SAMPLE_WARN:g}x median {p50:.2f}: warm-up too short?")
    elif (falling := still_falling(x)) is not None:
        warnings.append(f"timed samples still falling (the first third's median {percent(falling, 0, 'down')} above "
                        "the last third's): a slow warm-up not over; raise --warmup-batches")
    elif (slowing := slowing_down(x)) is not None:
        warnings.append(f"timed samples rising (the last third's median {percent(slowing, 0, 'down')} above the first "
                        "third's): the machine slowed during the pass (throttling, or another process)")
    return Summary(int(x.size), mean, std, float(x.min()), float(p50), float(p90), float(p95), float(p99),
                   float(x.max()), ci, warnings)
