"""DetectorPipeline: one batch through decode -> letterbox -> collate -> forward -> decode -> NMS -> rescale."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.data.coco import ImageRecord
from harness.measure.device import Device
from harness.models.protocol import Core, Detector, PreprocessSpec
from harness.pipeline.postprocess import ImageDetections, nms_per_image, to_original
from harness.pipeline.preprocess import decode_image, preprocess_batch
from harness.pipeline.stage_timer import StageTimer


@dataclass(frozen=True)
class Thresholds:
    conf: float
    iou: float
    max_det: int


class DetectorPipeline:
    """The harness side of a detector: everything but the core forward is shared code."""

    def __init__(self, detector: Detector, core: Core, device: Device, spec: PreprocessSpec,
                 thresholds: Thresholds):
        self.detector = detector
        self.core = core
        self.device = device
        self.spec = spec
        self.thresholds = thresholds
        # ONNX Runtime takes host memory (it copies to its device itself); torch cores take device tensors.
        self.input_device = device.torch_device if getattr(core, "torch_module", None) is not None else None

    def run_batch(self, records: list[ImageRecord], timer: StageTimer,
                  images: list[np.ndarray] | None = None) -> list[ImageDetections]:
        """Run one batch; `images` (already decoded) skips the decode substep."""
        timer.begin_batch(len(records))
        with timer.stage("preprocess"):
            if images is None:
                with timer.substep("decode"):
                    images = [decode_image(r.path) for r in records]
            batch, transforms = preprocess_batch(images, self.spec)
        with timer.stage("transfer"):
            if self.input_device is not None and self.input_device.type != "cpu":
                batch = batch.to(self.input_device, non_blocking=True)
        with timer.stage("forward"):
            raw = self.core(batch)
        with timer.stage("postprocess"):
            t = self.thresholds
            candidates = self.detector.decode(raw, self.spec.input_size, t.conf)
            with timer.substep("nms"):
                kept = [nms_per_image(c, t.conf, t.iou, t.max_det) for c in candidates]
            with timer.substep("boxes"):
                detections = [
                    ImageDetections(
                        image_id=record.image_id,
                        boxes=to_original(boxes, transform).cpu().numpy(),
                        scores=scores.cpu().numpy(),
                        labels=labels.cpu().numpy(),
                    )
                    for record, transform, (boxes, scores, labels) in zip(records, transforms, kept, strict=True)
                ]
        timer.end_batch()
        return detections
