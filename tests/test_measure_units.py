"""Units of the measurement layer: device sync ownership, the stage timer, statistics, letterbox."""

import time

import numpy as np
import pytest
import torch

from harness.measure.device import Device
from harness.measure.stats import summarize
from harness.models.protocol import PreprocessSpec
from harness.pipeline.preprocess import preprocess_batch
from harness.pipeline.stage_timer import StageTimer


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
    with timer.stage("forward"):
        time.sleep(0.02)
    with timer.stage("postprocess"):
        for _ in range(2):
            with timer.substep("nms"):
                time.sleep(0.005)
    batch = timer.end_batch()
    assert 19 <= batch.ms("forward") <= 30
    assert 9.5 <= batch.ms("postprocess.nms") <= batch.ms("postprocess")
    assert batch.ms("forward") + batch.ms("postprocess") <= batch.ms("total")


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


def test_letterbox_matches_yolox_reference_transform():
    import cv2

    rng = np.random.default_rng(1)
    img = rng.integers(0, 255, (300, 500, 3), dtype=np.uint8)
    spec = PreprocessSpec(input_size=(416, 416))
    batch, (tr,) = preprocess_batch([img], spec)
    r = min(416 / 300, 416 / 500)
    ref = np.full((416, 416, 3), 114, np.uint8)
    resized = cv2.resize(img, (int(500 * r), int(300 * r)), interpolation=cv2.INTER_LINEAR)
    ref[: int(300 * r), : int(500 * r)] = resized
    assert batch.shape == (1, 3, 416, 416) and batch.dtype == torch.float32
    assert np.array_equal(batch[0].permute(1, 2, 0).numpy(), ref.astype(np.float32))
    assert tr.ratio == (r, r) and tr.pad == (0.0, 0.0)


def test_matching_counts_identical_zero_area_boxes():
    from harness.eval.matching import match_detections
    from harness.pipeline.postprocess import ImageDetections

    boxes = np.array([[10, 10, 10, 30], [0, 0, 5, 5]], dtype=np.float32)  # the first has zero width
    a = ImageDetections(1, boxes, np.array([0.5, 0.4]), np.array([0, 1]))
    b = ImageDetections(1, boxes.copy(), np.array([0.5, 0.4005]), np.array([0, 1]))
    report = match_detections([a], [b])
    assert report.matched == 2 and report.match_rate == 1.0
    assert report.max_score_delta == pytest.approx(0.0005)
