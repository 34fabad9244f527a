"""A test plugin whose detections depend on the batch size (`--model tests/plugins/batch_dependent_detector.py:make`):
one class-1 (person) box per image, the whole image at batch 1 and its centre quarter at any other batch size,
so two cells of one run have different detections and different COCO scores. A run that scored every cell
with one cell's detections (or one shared accuracy pass) would give them equal accuracy blocks."""

from __future__ import annotations

import torch

from harness.data.categories import COCO80_TO_91
from harness.detector.protocol import Candidates, ModelStats, PreprocessSpec, ProtocolDefaults, WeightsInfo


class BatchDependentCore:
    backend = "pytorch"
    format = "pytorch"
    provider = "cpu"
    precision = "fp32"

    def __init__(self):
        self.torch_module = torch.nn.Identity()

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        b, _, h, w = batch.shape
        if b == 1:
            row = torch.tensor([0.0, 0.0, float(w), float(h), 0.9, 0.0])
        else:
            row = torch.tensor([w / 4, h / 4, 3 * w / 4, 3 * h / 4, 0.9, 0.0])
        return [row.repeat(b, 1, 1)]

    def info(self) -> dict:
        return {"backend": self.backend, "note": "whole-image box at batch 1, centre quarter otherwise"}


class BatchDependentDetector:
    model_id = "synthetic-batch-dependent"
    family = "synthetic"
    variant = "batch-dependent"
    preprocess = PreprocessSpec(input_size=(64, 64), resize="stretch", channel_order="RGB", scale=1 / 255)
    defaults = ProtocolDefaults()
    backends = ("pytorch",)
    class_map = COCO80_TO_91  # a COCO detector's classes (it only ever predicts label 0, person)
    weights = WeightsInfo(file="none", sha256=None, source="plugin")

    def load_core(self, backend, device, precision, input_size, threads=None):
        return BatchDependentCore()

    def decode(self, raw, input_size, conf):
        return [Candidates(boxes=o[:, :4], scores=o[:, 4], labels=o[:, 5].long()) for o in raw[0]]

    def model_stats(self, input_size):
        return ModelStats(params_millions=0.0, notes={"gflops": "synthetic model: no FLOPs"})


def make():
    return BatchDependentDetector()
