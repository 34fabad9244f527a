"""Batch post-processing and throughput (overlapped) mode on the real detector and real images."""

import json

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, CORPUS, requires_coco, requires_corpus, requires_yolox, run_benchmark
from torchvision.ops import batched_nms, clip_boxes_to_image

from harness.data.coco import CocoDataset
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.postprocess import BatchCandidates, nms_batch, to_original
from harness.pipeline.preprocess import decode_image, preprocess_batch
from harness.pipeline.stage_timer import StageTimer
from harness.results.site_rules import schema_findings, site_findings

pytestmark = [requires_coco, requires_yolox]


@pytest.fixture(scope="module")
def pipeline():
    device = parse_device("cpu")
    detector = get_detector("yolox-nano")
    spec = detector.preprocess
    core = detector.load_core("onnxruntime", device, "fp32", spec.input_size, threads=torch.get_num_threads())
    d = detector.defaults
    return DetectorPipeline(detector, core, device, spec, Thresholds(d.conf, d.iou, d.max_det))


@pytest.fixture(scope="module")
def records():
    dataset = CocoDataset(str(COCO_DIR))
    return dataset.records(dataset.variant("sample"))[:40]


def test_batch_nms_equals_torchvision_batched_nms_per_image(pipeline, records):
    """The batch form (one coordinate shift for all images, one kernel call per image) keeps exactly
    what batched_nms keeps on each image alone, also on crowded images (> 1000 candidates, where
    batched_nms takes its per-class loop)."""
    t = pipeline.thresholds
    crowded = 0
    for start in range(0, len(records), 8):
        images = [decode_image(r.path) for r in records[start:start + 8]]
        batch, _ = preprocess_batch(images, pipeline.spec)
        per_image = pipeline.detector.decode(pipeline.core(batch), pipeline.spec.input_size, t.conf)
        kept = nms_batch(BatchCandidates.from_images(per_image, t.conf), t.iou, t.max_det, pipeline.host_executor)
        offset = 0
        for i, c in enumerate(per_image):
            mask = c.scores >= t.conf
            boxes, scores, labels = c.boxes[mask], c.scores[mask], c.labels[mask]
            crowded += boxes.shape[0] > 1000
            order = batched_nms(boxes, scores, labels, t.iou)[:t.max_det]
            n = kept.counts[i]
            assert n == order.numel()
            assert torch.equal(kept.boxes[offset:offset + n], boxes[order])
            assert torch.equal(kept.scores[offset:offset + n], scores[order])
            assert torch.equal(kept.labels[offset:offset + n], labels[order])
            assert bool((kept.image[offset:offset + n] == i).all())
            offset += n
    assert crowded >= 3  # the sample's crowded scenes are in the first 40 images


def test_batch_rescale_equals_clip_boxes_to_image_per_image(pipeline, records):
    images = [decode_image(r.path) for r in records[:8]]
    batch, transforms = preprocess_batch(images, pipeline.spec)
    t = pipeline.thresholds
    per_image = pipeline.detector.decode(pipeline.core(batch), pipeline.spec.input_size, t.conf)
    cands = BatchCandidates.from_images(per_image, t.conf)
    ours = to_original(cands, transforms)
    for i, tr in enumerate(transforms):
        rows = cands.image == i
        pad = torch.tensor([tr.pad[0], tr.pad[1]] * 2)
        ratio = torch.tensor([tr.ratio[0], tr.ratio[1]] * 2)
        assert torch.equal(ours[rows], clip_boxes_to_image((cands.boxes[rows] - pad) / ratio, tr.orig_size))


def test_overlapped_mode_gives_the_latency_mode_detections(pipeline, records):
    batches = [records[i:i + 8] for i in range(0, len(records), 8)]
    latency = [d for b in batches for d in pipeline.run_batch(b, StageTimer(pipeline.device))]
    timer = StageTimer(pipeline.device)
    overlapped = [d for out in pipeline.run_stream(batches, timer, overlap=True) for d in out]
    assert [d.image_id for d in overlapped] == [r.image_id for r in records]
    for a, b in zip(latency, overlapped, strict=True):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
        assert np.array_equal(a.labels, b.labels)
    assert len(timer.batches) == len(batches)
    for timing in timer.batches:  # each batch: every stage timed, end-to-end latency covers its stages
        assert {"preprocess", "preprocess.decode", "forward", "postprocess", "postprocess.nms"} <= set(timing.stages)
        assert timing.total_ns >= timing.stages["preprocess"] + timing.stages["forward"] + timing.stages["postprocess"]


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory):
    return run_benchmark(tmp_path_factory, "overlap", backends=["onnxruntime"], batch_sizes=[8], limit=48,
                         overlap=True, energy=False)


def test_overlap_run_reports_stream_throughput(overlap_run):
    (record,) = overlap_run[1]
    t = record.timing
    assert t.mode == "overlapped"
    # batches are in flight together: images over the stream's wall time beat one batch's latency
    assert t.images_per_s > t.batch_size * 1000 / t.batch_ms.mean
    assert record.invariance is None  # one batch size: nothing to compare (detections equal latency mode: above)
    assert record.accuracy.num_images == 48  # overlapped batches are scored too
    assert record.environment["threads"]["overlapped_host_worker"]["threads"] == 1



@requires_corpus
def test_overlap_run_submission_is_site_valid(overlap_run):
    plan, _ = overlap_run
    schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
    support = json.loads((CORPUS / "support-matrix.json").read_text())
    (path,) = (plan.run_dir / "submissions").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["timing"]["mode"] == "overlapped"
    assert schema_findings(doc, schema) == []
    assert site_findings(doc, support) == []
