"""Units of the measurement layer: device sync ownership, the stage timer, statistics, letterbox,
the overlapped-mode worker's priority."""

import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import requires_coco

from harness.detector.protocol import PreprocessSpec
from harness.measure.device import Device
from harness.measure.stats import (
    median_ci,
    median_ci_extent_missing,
    median_ci_extent_pct,
    still_falling,
    summarize,
    warmup_end,
)
from harness.pipeline.pipeline import STREAM_WORKER_NICE, _stream_workers, stream_worker_priority
from harness.pipeline.preprocess import preprocess_batch
from harness.pipeline.stage_timer import BatchTiming, StageTimer, completion_intervals_ms


def test_cpu_device_never_touches_cuda(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("torch.cuda.synchronize called on a CPU run")

    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    timer = StageTimer(Device("cpu"), stage_sync=True)
    timer.begin_batch(1)
    with timer.stage("forward"):
        pass
    timer.end_batch()


def test_cuda_device_syncs_at_every_stage_boundary(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: calls.append(index))
    timer = StageTimer(Device("cuda", 1), stage_sync=True)
    timer.begin_batch(2)
    for name in ("preprocess", "forward", "postprocess"):
        with timer.stage(name):
            pass
    timer.end_batch()
    assert calls == [1] * 5  # batch start, three stages, batch end


def test_throughput_mode_syncs_once_per_batch(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda index=None: calls.append(index))
    timer = StageTimer(Device("cuda", 0), stage_sync=False)
    timer.begin_batch(2)
    for name in ("preprocess", "forward"):
        with timer.stage(name):
            pass
    timer.end_batch()
    assert calls == [0, 0]


def test_stage_timer_times_stages_and_substeps():
    timer = StageTimer(Device("cpu"))
    timer.begin_batch(4)
    outer = time.perf_counter()
    with timer.stage("forward"):
        time.sleep(0.02)
    outer_ms = (time.perf_counter() - outer) * 1e3  # the stage's own span, as long as a loaded machine makes it
    with timer.stage("postprocess"):
        for _ in range(2):
            with timer.substep("nms"):
                time.sleep(0.005)
    batch = timer.end_batch()
    assert 19 <= batch.ms("forward") <= outer_ms
    assert 9.5 <= batch.ms("postprocess.nms") <= batch.ms("postprocess")
    assert batch.ms("forward") + batch.ms("postprocess") <= batch.ms("total")


def test_completion_intervals_follow_the_order_batches_completed_in():
    """Overlapped with --host-processes and two workers, two batches finish at once and the later one can end first:
    each interval is the time since the previous completion, never negative, and they add up to the stream's end."""
    ms = 1_000_000
    handed_on = [BatchTiming(size=2, end_ns=10 * ms), BatchTiming(size=2, end_ns=8 * ms),  # batch 1 ended first
                 BatchTiming(size=2, end_ns=15 * ms)]
    intervals = completion_intervals_ms(handed_on, start_ns=0)
    assert intervals == pytest.approx([4.0, 1.0, 2.5])  # 8, 2 and 5 ms since the previous completion, per image
    assert min(intervals) > 0
    assert sum(i * 2 for i in intervals) == pytest.approx(15.0)  # the stream's wall time: to its last completion


def test_summarize_matches_numpy_and_flags_instability():
    rng = np.random.default_rng(0)
    x = rng.normal(10, 0.1, 200)
    s = summarize(x)
    assert s.count == 200
    assert s.mean == pytest.approx(x.mean())
    assert s.p95 == pytest.approx(np.percentile(x, 95))
    assert s.median_ci95[0] <= s.p50 <= s.median_ci95[1]
    assert s.warnings == []
    noisy = summarize([50.0] + [10.0, 20.0] * 5)
    assert any("CV" in w for w in noisy.warnings)
    assert any("first timed sample" in w for w in noisy.warnings)
    assert any("only" in w for w in summarize([1.0, 2.0]).warnings)


def test_every_summary_figure_is_numpys():
    """Each figure of summarize() on a skewed sample is numpy's own; to_dict keeps 4 decimals of each."""
    x = np.random.default_rng(4).lognormal(np.log(20.0), 0.4, 101)
    assert x[-1] != x.max() and np.sort(x)[1] != x.min()  # the extremes are neither the last nor a neighbour
    s = summarize(x)
    assert s.count == 101
    assert s.mean == pytest.approx(np.mean(x), rel=1e-12) and s.std == pytest.approx(np.std(x, ddof=1), rel=1e-12)
    assert (s.min, s.max) == (np.min(x), np.max(x))
    for q in (50, 90, 95, 99):
        assert getattr(s, f"p{q}") == pytest.approx(np.percentile(x, q), rel=1e-12), q
    out = s.to_dict()
    for name in ("mean", "std", "min", "p50", "p90", "p95", "p99", "max"):
        assert out[name] == round(float(getattr(s, name)), 4), name
        assert abs(out[name] - getattr(s, name)) <= 5e-5 + 1e-12, name
    assert out["median_ci95"] == [round(v, 4) for v in s.median_ci95]


@pytest.mark.parametrize("n, seed", [(2, 0), (3, 1), (10, 0), (57, 3), (1025, 0), (3000, 5)])
def test_median_ci_equals_scipys_percentile_bootstrap(n, seed):
    """The run's median CI is scipy.stats.bootstrap's (same draws, same quantiles), also where it is drawn in
    chunks (3000 samples); summarize() reports it."""
    from scipy import stats as scipy_stats

    x = np.random.default_rng(100 + n).lognormal(size=n)
    expected = scipy_stats.bootstrap((x,), np.median, confidence_level=0.95, n_resamples=2000, method="percentile",
                                     random_state=np.random.default_rng(seed)).confidence_interval
    assert median_ci(x, seed=seed) == pytest.approx((expected.low, expected.high), rel=1e-12, abs=0)
    if n < 6:  # no 95 % CI of a median exists from so few: none is reported (the bootstrap's covers 50-75 %)
        assert summarize(x, seed=seed).median_ci95 is None and median_ci_extent_pct(x) is None
    else:
        assert summarize(x, seed=seed).median_ci95 == pytest.approx((expected.low, expected.high), rel=1e-12, abs=0)


def test_a_median_ci_is_given_only_where_one_can_cover_the_median():
    """Coverage by simulation: from 6 values on, the reported CI holds the true median about 95 % of the time;
    below that, the bootstrap's interval would hold it far less often, so none is reported."""
    rng = np.random.default_rng(11)
    for n, low in ((6, 0.90), (10, 0.90)):
        covered = [(ci := summarize(rng.lognormal(0, 0.3, n)).median_ci95)[0] <= 1.0 <= ci[1] for _ in range(400)]
        assert np.mean(covered) >= low, n
    three = [median_ci(rng.lognormal(0, 0.3, 3), seed=0) for _ in range(400)]
    assert np.mean([lo <= 1.0 <= hi for lo, hi in three]) < 0.85  # why n = 3 gets none
    assert summarize(rng.lognormal(0, 0.3, 5)).median_ci95 is None


def test_target_ci_judges_drifting_batches_by_their_block_means():
    """--target-ci on batches that drift together (AR(1), phi 0.8): simulated runs stopped as "met" at +-2 % whose
    true median lay outside +-2 %: the bootstrap of the batches themselves says "met" for most of them."""
    from harness.measure.stats import bootstrap_ci

    rng = np.random.default_rng(3)
    wrongly_met_raw = wrongly_met = 0
    for _ in range(100):
        noise = rng.normal(0, 0.08 * math.sqrt(1 - 0.8**2), 200)
        x = np.empty(200)
        x[0] = rng.normal(0, 0.08)
        for i in range(1, 200):
            x[i] = 0.8 * x[i - 1] + noise[i]
        batches = 20 * np.exp(x)  # true median 20
        off = abs(np.median(batches) / 20 - 1) > 0.02
        low, high = bootstrap_ci((batches,), np.median)
        raw = 100 * max(np.median(batches) - low, high - np.median(batches)) / np.median(batches)
        wrongly_met_raw += off and raw <= 2
        wrongly_met += off and median_ci_extent_pct(batches) <= 2
    assert wrongly_met_raw >= 20 and wrongly_met <= wrongly_met_raw // 4



def test_a_target_ci_without_an_interval_says_why():
    """--target-ci stopped at --max-seconds before the median had an interval: the warning said "fewer than 2 timed
    batches" whatever the count; it says how many there were, and the block means of drifting ones."""
    four = [26.8, 57.3, 26.2, 24.2]
    assert median_ci_extent_pct(four) is None
    assert median_ci_extent_missing(four) == "4 timed batches, fewer than the 6 an interval needs"
    drifting = 20 + np.arange(20.0)  # 20 batches, steadily slower: autocorrelated, blocks of 4, 5 block means
    assert median_ci_extent_pct(drifting) is None
    assert "20 timed batches that drift together, judged on their 5 block means" in median_ci_extent_missing(drifting)


@requires_coco
def test_a_target_ci_stopped_before_any_interval_names_its_batches(tmp_path_factory):
    """The run's warning when --max-seconds ends the timing before the median has an interval (the synthetic plugin:
    4 batches, the seconds long gone after the first pass)."""
    from conftest import run_benchmark

    plugin = Path(__file__).parent / "plugins" / "synthetic_detector.py"
    _, (record,) = run_benchmark(tmp_path_factory, "target-ci-undefined", models=[f"{plugin}:make_detector"],
                                 backends=["pytorch"], limit=4, batch_sizes=[1], min_timed_batches=2,
                                 warmup_batches=1, target_ci=1.0, max_seconds=0.001, energy=False, memory=False,
                                 accuracy=False, draw_images=0)
    assert record.timing.target_ci["extent_pct"] is None and record.timing.timed_batches == 4
    (warning,) = [w for w in record.timing.warnings if w.startswith("--target-ci")]
    assert "undefined (4 timed batches, fewer than the 6 an interval needs)" in warning


def ramped(rng: np.random.Generator, excess: float, tau: float, n_timed: int) -> np.ndarray:
    """The timed batches after the run's own warm-up rule, on a 20 ms core that starts `excess` slower and settles
    with time constant `tau` batches (3 % noise)."""
    times, elapsed, i = [], 0.0, 0
    def batch(k):
        return 20 * (1 + excess * math.exp(-k / tau)) * (1 + 0.03 * rng.normal())
    while not warmup_end(times, elapsed, 3, 10.0):
        times.append(batch(i))
        elapsed, i = elapsed + times[-1] / 1000, i + 1
    return np.array([batch(i + j) for j in range(n_timed)])


def test_a_warm_up_that_stopped_during_a_slow_ramp_is_flagged():
    """The warm-up rule (three flat batches) can stop on a slow ramp, leaving the timed median 35-70 % high in this
    simulation: the timed series' own trend flags it; steady batches are never flagged."""
    rng = np.random.default_rng(5)
    for excess, tau, n in ((1.0, 10, 15), (1.0, 30, 62)):
        runs = [ramped(rng, excess, tau, n) for _ in range(100)]
        assert np.median([np.median(x) / 20 - 1 for x in runs]) > 0.3  # the bias is there
        flagged = [any("still falling" in w for w in summarize(x).warnings) for x in runs]
        assert np.mean(flagged) >= 0.95, (excess, tau)
    steady = [summarize(rng.lognormal(math.log(20), 0.03, n)).warnings for n in (15, 62, 300) for _ in range(100)]
    assert not any("still falling" in w for ws in steady for w in ws)
    # steady batches that drift together (AR(1), phi 0.9) fall over a window by chance: flagged 13-23 % of the time
    # by the plain rank test, rarely once it allows for the drift
    drifting = [still_falling(20 * np.exp(_ar1(rng, 0.9, 0.05, 100))) is not None for _ in range(200)]
    assert np.mean(drifting) <= 0.05


def _ar1(rng, phi: float, spread: float, n: int) -> np.ndarray:
    """A stationary AR(1) series of standard deviation `spread`: batches that drift together."""
    noise = rng.normal(0, spread * math.sqrt(1 - phi**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, spread)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return x


def test_a_pass_that_slowed_down_is_flagged():
    """The mirror of the warm-up's ramp: batch times that rise over the pass (a device throttling under sustained
    load, another process arriving) are flagged with how much; steady and drifting batches rarely are, and a falling
    series is said to fall, not to rise."""
    from harness.measure.stats import slowing_down

    rng = np.random.default_rng(11)
    n = 90
    for slowdown in (0.10, 0.25):  # throttled from a third of the way in, to `slowdown` slower by the end
        runs = []
        for _ in range(100):
            ramp = np.clip((np.arange(n) - n / 3) / (n / 3), 0, 1) * slowdown
            runs.append(20 * (1 + ramp) * rng.lognormal(0, 0.03, n))
        flagged = [next((w for w in summarize(x).warnings if "timed samples rising" in w), None) for x in runs]
        assert np.mean([w is not None for w in flagged]) >= 0.95, slowdown
        truth = np.median([np.median(x[-n // 3:]) / np.median(x[:n // 3]) - 1 for x in runs])
        assert np.median([slowing_down(x) for x in runs]) == pytest.approx(truth, rel=1e-9)
    steady = [summarize(rng.lognormal(math.log(20), 0.03, m)).warnings for m in (15, 62, 300) for _ in range(100)]
    assert not any("rising" in w for ws in steady for w in ws)
    drifting = [slowing_down(20 * np.exp(_ar1(rng, 0.9, 0.05, 100))) is not None for _ in range(200)]
    assert np.mean(drifting) <= 0.05
    falling = 20 * (1 + np.linspace(0.5, 0, 40)) * rng.lognormal(0, 0.01, 40)
    assert slowing_down(falling) is None and still_falling(falling) is not None
    rising = falling[::-1]  # thirds of 13 values
    assert slowing_down(rising) == pytest.approx(np.median(rising[-13:]) / np.median(rising[:13]) - 1, rel=1e-12)


def test_a_tail_percentiles_upper_bound_covers_the_true_one_95_percent_of_the_time():
    """quantile_upper_bound: the order statistic scipy's binomial quantile names; none below 299 samples for the
    p99 (59 for p95, 29 for p90); in simulation (lognormal batch times, the true quantile known), the bound is at or
    above the true p99 in about 95 % of runs, where the printed p99 itself is below it about half the time."""
    from scipy.stats import binom, lognorm

    from harness.measure.stats import quantile_upper_bound, samples_for_upper_bound, tail_bounds

    assert [samples_for_upper_bound(q) for q in (0.9, 0.95, 0.99)] == [29, 59, 299]
    rng = np.random.default_rng(3)
    x = rng.lognormal(0, 0.3, 700)
    for q in (0.9, 0.95, 0.99):
        assert quantile_upper_bound(x, q) == np.sort(x)[int(binom.ppf(0.95, x.size, q))]
        assert quantile_upper_bound(x[:samples_for_upper_bound(q) - 1], q) is None
    truth = float(lognorm(0.3).ppf(0.99))
    covered, below = [], []
    for _ in range(400):
        y = rng.lognormal(0, 0.3, 400)
        covered.append(quantile_upper_bound(y, 0.99) >= truth)
        below.append(np.percentile(y, 99) < truth)
    assert 0.92 <= np.mean(covered) <= 0.99 and 0.3 <= np.mean(below) <= 0.7
    block = tail_bounds(x[:100])
    assert block["p99"]["upper95"] is None and block["p99"]["samples_needed"] == 299
    assert block["p90"]["value"] == pytest.approx(np.percentile(x[:100], 90), abs=1e-4)
    assert block["autocorrelated"] is False and tail_bounds(np.cumsum(rng.normal(0, 1, 100)) + 50)["autocorrelated"]


def test_ties_share_their_average_rank():
    from scipy.stats import rankdata

    from harness.measure.stats import average_ranks

    x = np.array([3.0, 1.0, 2.0, 1.0, 3.0, 3.0, 0.5])
    assert average_ranks(x).tolist() == (rankdata(x) - 1).tolist()


def test_target_ci_counts_the_intervals_long_side():
    """Two service times, 13 batches in 30 the slower (a skewed median interval): --target-ci judges the farther end
    of scipy's interval from the median, which is here about twice the half-width."""
    from scipy import stats as scipy_stats

    from harness.measure.stats import median_ci_extent_pct

    rng = np.random.default_rng(0)
    x = rng.permutation(np.array([103.6] * 13 + [100.0] * 17) + rng.normal(0, 0.05, 30))  # independent batches
    low, high = scipy_stats.bootstrap((x,), np.median, confidence_level=0.95, n_resamples=2000, method="percentile",
                                      random_state=np.random.default_rng(0)).confidence_interval
    median = np.median(x)
    extent = median_ci_extent_pct(x)
    assert extent == pytest.approx(100 * max(median - low, high - median) / median, rel=1e-9)
    assert extent > 1.5 * 100 * (high - low) / 2 / median


def _reference_transform(img: np.ndarray, spec: PreprocessSpec) -> np.ndarray:
    """The straightforward way: resize, paste onto a canvas full of the pad value."""
    import cv2

    (in_h, in_w), (h, w) = spec.input_size, img.shape[:2]
    if spec.resize == "stretch":
        return cv2.resize(img, (in_w, in_h), interpolation=cv2.INTER_LINEAR)
    r = min(in_h / h, in_w / w)
    new_h, new_w = int(h * r), int(w * r)
    top, left = ((in_h - new_h) // 2, (in_w - new_w) // 2) if spec.pad_position == "center" else (0, 0)
    canvas = np.full((in_h, in_w, 3), spec.pad_value, np.uint8)
    canvas[top:top + new_h, left:left + new_w] = cv2.resize(img, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    return canvas


@pytest.mark.parametrize("options", [
    {},  # YOLOX: top-left padding
    {"pad_position": "center"},
    {"resize": "stretch"},
    {"input_size": (320, 480), "pad_position": "center"},
])
def test_letterbox_writes_every_pixel_as_the_reference_transform(options, monkeypatch):
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, shape, dtype=np.uint8) for shape in ((300, 500, 3), (500, 300, 3), (416, 416, 3))]
    spec = PreprocessSpec(input_size=options.get("input_size", (416, 416)), **{
        k: v for k, v in options.items() if k != "input_size"})
    # The canvas is allocated uninitialised: make that memory a value no pixel should have.
    real_empty = np.empty
    monkeypatch.setattr(np, "empty", lambda shape, dtype=float: np.full(shape, 7, dtype) if dtype == np.uint8
                        else real_empty(shape, dtype))
    batch, transforms = preprocess_batch(images, spec)
    assert batch.shape == (3, 3, *spec.input_size) and batch.dtype == torch.float32
    for image, got, tr in zip(images, batch, transforms, strict=True):
        assert np.array_equal(got.permute(1, 2, 0).numpy(), _reference_transform(image, spec).astype(np.float32))
        h, w = image.shape[:2]
        x_in = np.array([w, h]) * tr.ratio + tr.pad  # the bottom-right corner maps inside the canvas
        assert (x_in <= np.array(spec.input_size[::-1]) + 1e-6).all()


def test_matching_counts_identical_zero_area_boxes():
    from harness.eval.matching import match_detections
    from harness.records import ImageDetections

    boxes = np.array([[10, 10, 10, 30], [0, 0, 5, 5]], dtype=np.float32)  # the first has zero width
    a = ImageDetections(1, boxes, np.array([0.5, 0.4]), np.array([0, 1]))
    b = ImageDetections(1, boxes.copy(), np.array([0.5, 0.4005]), np.array([0, 1]))
    report = match_detections([a], [b])
    assert report.matched == 2 and report.match_rate == 1.0
    assert report.max_score_delta == pytest.approx(0.0005)


def test_match_rate_is_over_the_larger_detection_count():
    """A has 3 detections, B the same 2 of them: 2 matched of the 3 either set could have had, whichever is A."""
    from harness.eval.matching import match_detections
    from harness.records import ImageDetections

    boxes = np.array([[0, 0, 10, 10], [20, 20, 40, 40], [50, 0, 60, 30]], dtype=np.float32)
    a = ImageDetections(1, boxes, np.array([0.9, 0.8, 0.7]), np.array([0, 1, 2]))
    b = ImageDetections(1, boxes[:2].copy(), np.array([0.9, 0.8]), np.array([0, 1]))
    for x, y in ((a, b), (b, a)):
        report = match_detections([x], [y])
        assert report.matched == 2 and report.match_rate == pytest.approx(2 / 3)
        assert report.to_dict()["match_rate"] == round(2 / 3, 6)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is a Linux feature")
def test_overlapped_host_worker_yields_to_the_forward():
    """The worker runs at a lower priority than the thread that runs the forward; the caller's stays as it was."""
    def own_nice():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    before = own_nice()
    worker_nice = _stream_workers(1).submit(own_nice).result()
    assert worker_nice == min(19, before + STREAM_WORKER_NICE) and own_nice() == before
    assert stream_worker_priority() == {"torch_intra_op": 1, "opencv_threads": 1, "nice_increment": STREAM_WORKER_NICE}


def test_overlapped_host_worker_is_single_threaded_and_leaves_the_callers_threads_alone():
    """A torch thread team in the worker slows the caller's PyTorch forward for good (see _init_host_thread);
    making the worker single-threaded must not change the caller's count or the default of later threads."""
    from concurrent.futures import ThreadPoolExecutor

    before = torch.get_num_threads()
    assert _stream_workers(1).submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == before
    with ThreadPoolExecutor(1) as later:
        assert later.submit(torch.get_num_threads).result() == before


@pytest.mark.parametrize("n_a, n_b, seed", [(5, 7, 0), (40, 30, 2), (200, 250, 1)])
def test_two_sample_bootstrap_equals_scipys(n_a, n_b, seed):
    """compare's CI of median(B) / median(A) is scipy.stats.bootstrap's (unpaired, percentile), drawn by the same
    bootstrap the run's median CI uses."""
    from scipy import stats as scipy_stats

    from harness.measure.stats import bootstrap_ci

    rng = np.random.default_rng(7 + n_a)
    a, b = rng.lognormal(size=n_a), 1.1 * rng.lognormal(size=n_b)

    def ratio(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis)

    expected = scipy_stats.bootstrap((a, b), ratio, paired=False, vectorized=True, confidence_level=0.95,
                                     n_resamples=2000, method="percentile",
                                     random_state=np.random.default_rng(seed)).confidence_interval
    assert bootstrap_ci((a, b), ratio, seed=seed) == pytest.approx((expected.low, expected.high), rel=1e-12, abs=0)


def test_warmup_ends_when_the_batch_times_settle_or_at_the_cap():
    from harness.measure.stats import warmup_end

    assert warmup_end([50.0, 20.0], 0.5, 3, 10.0) is None  # fewer than --warmup-batches
    assert warmup_end([50.0, 20.0, 20.5, 21.9], 0.5, 3, 10.0) == "stable"  # 21.9 <= 1.1 x 20.0
    assert warmup_end([50.0, 20.0, 20.5, 22.1], 0.5, 3, 10.0) is None  # 22.1 > 1.1 x 20.0: not yet
    assert warmup_end([50.0, 20.0, 20.5, 22.1], 10.0, 3, 10.0) == "cap"
    assert warmup_end([50.0], 0.0, 1, 0.0) == "cap"  # --warmup-seconds 0: exactly the minimum
    assert warmup_end([50.0, 49.0], 99.0, 3, 10.0) is None  # the minimum holds past the cap


def _reference_greedy(a, b, iou_thr, tol, mask_ok=None):
    """A straightforward greedy matcher (every pair, score order): the reference for the harness's. `mask_ok(i, j)`:
    whether the pair's masks agree."""
    def iou(p, q):
        w = max(0.0, min(p[2], q[2]) - max(p[0], q[0]))
        h = max(0.0, min(p[3], q[3]) - max(p[1], q[1]))
        union = (p[2] - p[0]) * (p[3] - p[1]) + (q[2] - q[0]) * (q[3] - q[1]) - w * h
        return 1.0 if list(p) == list(q) else (w * h / union if union > 0 else 0.0)

    taken, matched, worst = set(), 0, 0.0
    for i in sorted(range(len(a.scores)), key=lambda k: -float(a.scores[k])):
        best, best_iou = None, -1.0
        for j in range(len(b.scores)):
            if j in taken or a.labels[i] != b.labels[j]:
                continue
            o, d = iou(a.boxes[i].astype(float), b.boxes[j].astype(float)), abs(float(a.scores[i]) - float(b.scores[j]))
            if o >= iou_thr and d <= tol and o > best_iou and (mask_ok is None or mask_ok(i, j)):
                best, best_iou = j, o
        if best is not None:
            taken.add(best)
            matched += 1
            worst = max(worst, abs(float(a.scores[i]) - float(b.scores[best])))
    return matched, worst


def test_detection_matching_with_masks_is_the_plain_greedy_one():
    """With masks, a pair also needs mask IoU >= the threshold (two empty masks agree): the matcher against the
    plain greedy loop with pycocotools' IoU of each pair, on masks that are the same, eroded or emptied."""
    from pycocotools import mask as mask_utils

    from harness.eval.matching import match_detections
    from harness.records import ImageDetections

    rng = np.random.default_rng(5)

    def rle(m):
        return mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))

    a_set, b_set, want = [], [], []
    for image in range(80):
        n = int(rng.integers(0, 12))
        boxes = np.tile(np.array([[2, 2, 30, 30]], np.float32), (n, 1))  # same boxes: the masks decide
        scores, labels = rng.uniform(0, 1, n).astype(np.float32), rng.integers(0, 2, n)
        grids = [rng.uniform(0, 1, (32, 32)) > 0.5 for _ in range(n)]
        changed = [g & (rng.uniform(0, 1, g.shape) > [0.0, 0.002, 0.3][k % 3]) if k % 7 else np.zeros_like(g)
                   for k, g in enumerate(grids)]
        if n and image % 4 == 0:
            grids[0] = np.zeros_like(grids[0])  # empty in both: the same mask
            changed[0] = np.zeros_like(grids[0])
        a = ImageDetections(image, boxes, scores, labels, masks=[rle(g) for g in grids])
        b = ImageDetections(image, boxes.copy(), scores.copy(), labels.copy(), masks=[rle(g) for g in changed])

        def agree(i, j, a=a, b=b):
            empty = mask_utils.area(a.masks[i]) == 0 and mask_utils.area(b.masks[j]) == 0
            return empty or float(mask_utils.iou([a.masks[i]], [b.masks[j]], [0])[0][0]) >= 0.99

        a_set.append(a)
        b_set.append(b)
        want.append(_reference_greedy(a, b, 0.99, 1e-3, agree))
    report = match_detections(a_set, b_set, mask_iou_threshold=0.99)
    assert report.mask_iou_threshold == 0.99
    assert 0 < report.matched == sum(m for m, _ in want) < report.detections_a


def test_mask_matching_of_images_without_a_pair():
    """Masked detections with no candidate pairs (none at all, or scores too far apart) match nothing."""
    from pycocotools import mask as mask_utils

    from harness.eval.matching import match_detections
    from harness.records import ImageDetections

    empty = ImageDetections(1, np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), masks=[])
    mask = mask_utils.encode(np.asfortranarray(np.ones((8, 8), np.uint8)))
    box = np.array([[0, 0, 8, 8]], np.float32)
    a = ImageDetections(2, box, np.array([0.9], np.float32), np.array([0]), masks=[mask])
    b = ImageDetections(2, box, np.array([0.5], np.float32), np.array([0]), masks=[mask])
    report = match_detections([empty, a], [empty, b], mask_iou_threshold=0.99)
    assert (report.detections_a, report.detections_b, report.matched) == (1, 1, 0)


def test_detection_matching_is_the_plain_greedy_one():
    """Batch invariance's matcher (per class, uncontested pairs without the loop) against a plain greedy loop,
    on sets with duplicates, jitter and classes that disagree."""
    from harness.eval.matching import match_detections
    from harness.records import ImageDetections

    rng = np.random.default_rng(3)
    a_set, b_set = [], []
    for image in range(150):  # more than one chunk of images
        n = int(rng.integers(0, 25))
        xy = rng.uniform(0, 300, (n, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(1, 80, (n, 2))], 1).astype(np.float32)
        scores, labels = rng.uniform(0, 1, n).astype(np.float32), rng.integers(0, 4, n)
        if n and image % 3 == 0:  # duplicates: contested candidates
            boxes, scores, labels = (np.concatenate([boxes, boxes[:2]]), np.concatenate([scores, scores[:2] + 1e-4]),
                                     np.concatenate([labels, labels[:2]]))
        jitter = [0.0, 0.05, 3.0][image % 3]
        order = rng.permutation(len(scores))
        b_labels = labels[order] if image % 5 else (labels[order] + 1) % 4
        a_set.append(ImageDetections(image, boxes, scores, labels))
        b_set.append(ImageDetections(image, boxes[order] + rng.normal(0, jitter, boxes[order].shape).astype(np.float32),
                                     (scores[order] + rng.normal(0, jitter * 1e-3, len(order))).astype(np.float32),
                                     b_labels))
    for iou_thr, tol in ((0.99, 1e-3), (0.5, 0.4)):
        report = match_detections(a_set, b_set, iou_thr, tol)
        want = [_reference_greedy(a, b, iou_thr, tol) for a, b in zip(a_set, b_set, strict=True)]
        assert report.matched == sum(m for m, _ in want)
        assert report.max_score_delta == pytest.approx(max(w for _, w in want), abs=1e-9)


def test_a_percentage_past_a_threshold_is_rounded_away_from_it():
    """A warning's figure never reads as the threshold it crossed ("CV 10% > 10%", "99.00% < 99%")."""
    from harness.measure.stats import percent, summarize

    assert percent(0.10288, 1, "up") == "10.3%" and percent(0.1000001, 1, "up") == "10.1%"
    assert percent(0.98996, 2, "down") == "98.99%" and percent(0.9995, 1, "down") == "99.9%"
    assert percent(0.57, 1, "down") == "57.0%" and percent(0.57, 1, "up") == "57.0%"  # binary 0.57 is no less
    noisy = summarize([10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 10.0, 13.3])
    (warning,) = [w for w in noisy.warnings if w.startswith("high variation")]
    assert warning == f"high variation: CV {percent(noisy.std / noisy.mean, 1, 'up')} > 10%" and "10.0%" not in warning


def test_one_sample_has_no_spread_rather_than_a_spread_of_zero():
    from harness.measure.stats import summarize

    one = summarize([12.5])
    assert one.std is None and one.to_dict()["std"] is None and one.p50 == 12.5


def test_cocoeval_s_minus_one_is_null_with_its_reason():
    """The cells' and the fleet's sharded accuracy say the same for an area range with no ground truth."""
    from harness.eval.coco_eval import defined_stats

    out = defined_stats({"mAP_50_95": 0.41, "mAP_small": -1.0, "AR_small": -1.0})
    assert out["mAP_50_95"] == 0.41 and out["mAP_small"] is None and out["AR_small"] is None
    assert set(out["unavailable"]) == {"mAP_small", "AR_small"}
    assert "unavailable" not in defined_stats({"mAP_50_95": 0.0})  # 0 is a score, not undefined
