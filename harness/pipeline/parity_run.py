"""Run the preprocessing parity study (`va-bench parity preprocess`): one model core, several
preprocessing implementations, the same images. The comparison itself is torch-free (harness/eval/parity.py).

Per implementation: the model input tensor against the reference's, image by image (pixel max / mean
|Δ|); all images through the real pipeline at --batch-size; the detections diffed against the
reference's (greedy pairing) and COCO-evaluated with pycocotools. The noise floor is the reference run
again (same batch size) and at another batch size, compared exactly the same way.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from harness.data.classes import model_class_names
from harness.data.coco import CocoDataset, ImageRecord
from harness.detector.protocol import Detector, postprocess_spec
from harness.errors import UsageError
from harness.eval.coco_eval import evaluate_bbox
from harness.eval.detection_diff import DetectionSet, diff_detections, parse_coco_detections
from harness.eval.parity import Candidate, ParityReport, PixelStats
from harness.measure.device import Device
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.preprocess import (
    IMPLEMENTATIONS,
    decode_bytes,
    decode_tensor,
    preprocess_batch,
    preprocess_tensors,
)
from harness.pipeline.stage_timer import StageTimer


@dataclass(frozen=True)
class ParitySetup:
    """What one parity study runs."""

    implementations: tuple[str, ...]  # the first is the reference
    batch_size: int
    noise_batch_size: int
    conf: float  # the detection diff's score cut
    iou: float  # the detection diff's pairing IoU
    tolerance: float


def _input_tensor(pipeline: DetectorPipeline, record: ImageRecord) -> torch.Tensor:
    """One image's model input tensor [3,H,W] as `pipeline` makes it, decoder included, on the host."""
    data = pipeline._read(record)
    if pipeline.spec.library == "torch":
        target = pipeline.input_device if pipeline.input_device is not None else torch.device("cpu")
        batch, _ = preprocess_tensors([decode_tensor(data, record.path)], pipeline.spec, target,
                                      whole_batch=pipeline.letterbox_whole_batch)
    else:
        batch, _ = preprocess_batch([decode_bytes(data, record.path)], pipeline.spec)
    return batch[0].cpu()


def _detections(pipeline: DetectorPipeline, records: list[ImageRecord], batch_size: int,
                label_categories: tuple[int, ...], progress: Any = None, label: str = "") -> list[dict]:
    """COCO results of every image, in batches of `batch_size` (latency mode); one progress task of the pass."""
    timer = StageTimer(pipeline.device)
    out: list[dict] = []
    task = progress.task(f"parity: {label}", len(records)) if progress is not None else nullcontext(None)
    with task as advance:
        for start in range(0, len(records), batch_size):
            batch = records[start:start + batch_size]
            for det in pipeline.run_batch(batch, timer):
                out.extend(det.to_coco(label_categories))
            if advance is not None:
                advance(len(batch))
    return out


def run_parity(detector: Detector, core, device: Device, dataset: CocoDataset, records: list[ImageRecord],
               setup: ParitySetup, thresholds: Thresholds | None = None, progress: Any = None) -> ParityReport:
    """The whole study; see the module docstring. `progress` (a run's progress display: `task(description, total)`)
    shows each pass over the images."""
    unknown = [i for i in setup.implementations if i not in IMPLEMENTATIONS]
    if unknown or not setup.implementations:
        raise UsageError(f"--impl {' '.join(unknown) or '(none)'}: use some of {', '.join(IMPLEMENTATIONS)}")
    post = postprocess_spec(detector)
    thresholds = thresholds or Thresholds(post.conf, post.iou, post.max_det)
    base = detector.preprocess
    pipelines = {name: DetectorPipeline(detector, core, device, replace(base, library=name), thresholds)
                 for name in dict.fromkeys(setup.implementations)}
    reference = setup.implementations[0]
    image_ids = [r.image_id for r in records]

    def evaluate(results: list[dict]) -> tuple[dict[str, float], DetectionSet]:
        return evaluate_bbox(dataset.coco, results, image_ids), parse_coco_detections(results)

    categories = dataset.label_categories(detector.model_id, model_class_names(detector))
    ref_metrics, ref_set = evaluate(_detections(pipelines[reference], records, setup.batch_size, categories, progress,
                                                f"{reference} (reference)"))
    ref_inputs = [_input_tensor(pipelines[reference], r).numpy() for r in records]
    candidates = []
    runs = [(f"{reference} (again)", reference, setup.batch_size, True),
            (f"{reference} (batch {setup.noise_batch_size})", reference, setup.noise_batch_size, True)]
    runs += [(name, name, setup.batch_size, False) for name in pipelines if name != reference]
    for label, name, batch_size, noise in runs:
        metrics, dets = evaluate(_detections(pipelines[name], records, batch_size, categories, progress, label))
        pixels = None
        if not noise:
            pixels = PixelStats()
            for record, ref in zip(records, ref_inputs, strict=True):
                pixels.add(_input_tensor(pipelines[name], record).numpy(), ref)
        candidates.append(Candidate(label, noise, metrics, diff_detections(ref_set, dets, setup.iou, setup.conf),
                                    pixels))
    info = {"model": detector.model_id, "backend": getattr(core, "backend", "?"), "device": str(device),
            "images": len(records), "batch_size": setup.batch_size, "noise_batch_size": setup.noise_batch_size,
            "diff_conf": setup.conf, "diff_iou": setup.iou,
            "preprocess": {name: p.preprocess_info() for name, p in pipelines.items()}}
    return ParityReport(reference, ref_metrics, candidates, setup.tolerance, info)
