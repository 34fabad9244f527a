"""The server scenario (MLPerf LoadGen's Server): queries arrive at random (a seeded Poisson process at a target
rate), one image each, and wait in a FIFO queue while the device serves the one before; each query's latency runs
from its arrival to its result. The scenario asks whether the p99 latency stays under a bound at that rate, and
`find_max_qps` searches for the highest rate that holds it, as LoadGen's search does.

One server, one query at a time (a batch-1 pipeline): written out here because no kept library schedules a
real-time Poisson load against a Python callable (LoadGen is C++ with its own harness protocol). The clock is
injected so the scheduling and the statistics are tested on a virtual clock against an independent
discrete-event simulation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SEED = 0
SEARCH_TOLERANCE = 0.02  # the search stops when its bracket is within 2 % of its lower end


class RealClock:
    """Wall time (perf_counter); waiting sleeps, then spins the last half millisecond (sleep overshoots)."""

    def now(self) -> float:
        return time.perf_counter()

    def wait_until(self, t: float) -> None:
        while (left := t - time.perf_counter()) > 0:
            if left > 5e-4:
                time.sleep(left - 5e-4)


class VirtualClock:
    """A clock that moves only when told: waiting jumps to the time, a service advances it by its duration."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wait_until(self, t: float) -> None:
        self.t = max(self.t, t)

    def advance(self, seconds: float) -> None:
        self.t += seconds


def poisson_arrivals(qps: float, queries: int, seed: int = SEED) -> np.ndarray:
    """Arrival times (s, from 0) of `queries` queries of a Poisson process at `qps`: seeded exponential gaps,
    scaled so that the last query arrives at queries / qps. Unscaled, one seed's gaps average 1/qps only in the
    limit (seed 0: the load offered at 100 queries is 0.85 of the rate asked for, at 1000 0.98, the same each run),
    so a rate found to hold would overstate the load that held; given its count, a Poisson process's arrival gaps
    are exponential ones normalised to the window, which this is."""
    if qps <= 0 or queries < 1:
        raise ValueError(f"a server load needs a positive rate and at least one query (qps {qps}, queries {queries})")
    gaps = np.random.default_rng(seed).exponential(1.0 / qps, queries)
    return np.cumsum(gaps * (queries / qps / gaps.sum()))


@dataclass(frozen=True)
class ServerResult:
    """One server-scenario trial at a rate."""

    qps: float
    queries: int
    latency_ms: dict[str, float]  # p50, p90, p99, max, mean: arrival to result
    queue_ms_p99: float  # p99 of the time queries waited for the device (the rest of their latency is service)
    achieved_qps: float  # queries over the time from the window's start (arrival time 0) to the last result
    bound_ms: float
    seed: int
    latency_samples_ms: tuple[float, ...] = ()  # each query's, in arrival order (`samples`: a file of the run's)
    queue_samples_ms: tuple[float, ...] = ()

    @property
    def held(self) -> bool:
        return self.latency_ms["p99"] <= self.bound_ms

    def to_dict(self) -> dict:
        return {"qps": round(self.qps, 4), "queries": self.queries, "latency_ms": self.latency_ms,
                "queue_ms_p99": round(self.queue_ms_p99, 4), "achieved_qps": round(self.achieved_qps, 4),
                "latency_bound_ms": self.bound_ms, "bound_held": self.held, "seed": self.seed}

    def samples(self) -> dict:
        """Every query's latency and wait (ms, arrival order): kept beside the submission, whose size they would
        outgrow (a search of 12 trials of 10,000 queries is over 4 MB)."""
        return {"qps": round(self.qps, 4), "latency_samples_ms": list(self.latency_samples_ms),
                "queue_samples_ms": list(self.queue_samples_ms)}


def serve(arrivals: np.ndarray, service: Callable[[int], None], clock, bound_ms: float, qps: float,
          seed: int = SEED) -> ServerResult:
    """Serve query i (`service(i)`) at max(its arrival, the previous query's end), in arrival order, on `clock`
    (times relative to the start); the latency of each is from its arrival to the end of its service."""
    start = clock.now()
    latencies, waits = np.empty(len(arrivals)), np.empty(len(arrivals))
    for i, arrival in enumerate(arrivals):
        clock.wait_until(start + arrival)  # idle until it arrives; a query that waited is served at once
        begin = clock.now()
        service(i)
        end = clock.now()
        latencies[i], waits[i] = end - start - arrival, begin - start - arrival
    total = clock.now() - start  # the arrivals' window starts at 0 (its N queries offered over N / qps)
    p50, p90, p99 = np.percentile(latencies, [50, 90, 99]) * 1000
    return ServerResult(qps, len(arrivals), {"p50": round(float(p50), 4), "p90": round(float(p90), 4),
                                             "p99": round(float(p99), 4),
                                             "max": round(float(latencies.max() * 1000), 4),
                                             "mean": round(float(latencies.mean() * 1000), 4)},
                        float(np.percentile(waits, 99) * 1000), len(arrivals) / total if total > 0 else float("nan"),
                        bound_ms, seed, tuple(round(float(v) * 1000, 4) for v in latencies),
                        tuple(round(float(v) * 1000, 4) for v in waits))


def find_max_qps(trial: Callable[[float], ServerResult], low: float, high: float,
                 tolerance: float = SEARCH_TOLERANCE, max_trials: int = 12) -> tuple[float | None, list[ServerResult]]:
    """The highest rate whose trial holds the bound, by bisection between `low` and `high` (LoadGen's search):
    (that rate, or None when even `low` fails; every trial, in order). `high` is tried first and `low` only if
    no rate between them held: a trial is a fixed number of queries, so the slowest rate is the longest trial."""
    trials = [trial(high)]
    if trials[-1].held:
        return high, trials
    low_holds = False
    while high - low > tolerance * low and len(trials) < max_trials - 1:
        middle = (low + high) / 2
        trials.append(trial(middle))
        if trials[-1].held:
            low, low_holds = middle, True
        else:
            high = middle
    if not low_holds:
        trials.append(trial(low))
        if not trials[-1].held:
            return None, trials
    return low, trials
