"""A synthetic detector plugin whose core forward costs a known time (FORWARD_MS per batch).

Used by the tests through `--model tests/plugins/synthetic_detector.py:make_detector`.
"""

from __future__ import annotations

import time

import torch

from harness.models.protocol import Candidates, ModelStats, PreprocessSpec, ProtocolDefaults, WeightsInfo

FORWARD_MS = 40.0


class SleepyCore:
    backend = "pytorch"
    format = "pytorch"
    provider = "cpu"
    precision = "fp32"

    def __init__(self):
        self.torch_module = torch.nn.Identity()

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        time.sleep(FORWARD_MS / 1000.0)
        b = batch.shape[0]
        # one box per image covering the centre quarter of the input, class 0, score 0.9
        h, w = batch.shape[2:]
        row = torch.tensor([w / 4, h / 4, 3 * w / 4, 3 * h / 4, 0.9, 0.0])
        return [row.repeat(b, 1, 1)]

    def info(self) -> dict:
        return {"backend": self.backend, "note": f"sleeps {FORWARD_MS} ms per batch"}


class SyntheticDetector:
    model_id = "synthetic-sleepy"
    family = "synthetic"
    variant = "sleepy"
    preprocess = PreprocessSpec(input_size=(64, 64), resize="stretch", channel_order="RGB", scale=1 / 255)
    defaults = ProtocolDefaults()
    backends = ("pytorch",)
    class_map = (1,)
    weights = WeightsInfo(file="none", sha256=None, source="plugin")

    def load_core(self, backend, device, precision, input_size, threads=None):
        return SleepyCore()

    def decode(self, raw, input_size, conf):
        out = raw[0]
        return [Candidates(boxes=o[:, :4], scores=o[:, 4], labels=o[:, 5].long()) for o in out]

    def model_stats(self, input_size):
        return ModelStats(params_millions=0.0, notes={"gflops": "synthetic model: no FLOPs"})


def make_detector():
    return SyntheticDetector()
