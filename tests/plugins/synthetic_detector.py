"""Synthetic detector plugins for the tests (`--model tests/plugins/synthetic_detector.py:FACTORY`).

- make_detector: a core whose forward sleeps FORWARD_MS per batch (a known cost) and measures its own
  sleep (MEASURED_MS), an independent reference for the harness's forward stage clock.
- make_failing_detector: the same core, failing at the batch size given by $VA_BENCH_TEST_FAIL
  ("4:error" raises RuntimeError, "4:oom" raises torch's OutOfMemoryError; "4:error:6" from its 6th forward at
  that size on, inside the timed pass) - a cell that breaks mid-sweep.
- $VA_BENCH_TEST_OUTPUT=nan-scores|nan-boxes|inf-boxes: a broken model's output.
- $VA_BENCH_TEST_HOLD_AT=2: a forward at that batch size waits (up to a minute) for a signal to end it, so a test's
  signal lands inside that cell however late it is sent.
- make_detector_not_in_extra_processes: make_detector, failing to load in an extra process of --repeats.
"""

from __future__ import annotations

import os
import time

import torch

from harness.data.categories import COCO80_TO_91
from harness.detector.protocol import Candidates, ModelStats, PreprocessSpec, ProtocolDefaults, WeightsInfo

FORWARD_MS = float(os.environ.get("VA_BENCH_TEST_FORWARD_MS", "40"))
MEASURED_MS: list[float] = []  # the core's own clock around each sleep
HOLD_AT = int(os.environ.get("VA_BENCH_TEST_HOLD_AT", "0"))
HOLD_S = 60.0


class SleepyCore:
    backend = "pytorch"
    format = "pytorch"
    provider = "cpu"
    precision = "fp32"

    def __init__(self, fail_at: int | None = None, fail_kind: str = "error", fail_from: int = 1):
        self.torch_module = torch.nn.Sequential(torch.nn.Identity())  # one leaf: what a layer pass times
        self.fail_at, self.fail_kind, self.fail_from, self.calls = fail_at, fail_kind, fail_from, 0

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        b = batch.shape[0]
        self.calls += b == self.fail_at
        if b == self.fail_at and self.calls >= self.fail_from:
            if self.fail_kind == "oom":
                raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (synthetic, batch {b})")
            raise RuntimeError(f"synthetic failure at batch size {b}")
        start = time.perf_counter()
        self.torch_module(batch)  # what a layer pass times (its one leaf, called once)
        time.sleep(FORWARD_MS / 1000.0)
        while b == HOLD_AT and time.perf_counter() - start < HOLD_S:  # the signal's handler raises out of the sleep
            time.sleep(0.05)
        MEASURED_MS.append((time.perf_counter() - start) * 1000.0)
        # one box per image covering the centre quarter of the input, class 0, score 0.9
        h, w = batch.shape[2:]
        row = torch.tensor([w / 4, h / 4, 3 * w / 4, 3 * h / 4, 0.9, 0.0])
        broken = os.environ.get("VA_BENCH_TEST_OUTPUT")
        if broken == "nan-scores":
            row[4] = float("nan")
        elif broken == "nan-boxes":
            row[0] = float("nan")
        elif broken == "inf-boxes":
            row[2] = float("inf")
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
    class_map = COCO80_TO_91  # a COCO detector's classes (it only ever predicts label 0, person)
    weights = WeightsInfo(file="none", sha256=None, source="plugin")

    def __init__(self, fail_at: int | None = None, fail_kind: str = "error", fail_from: int = 1):
        self.fail_at, self.fail_kind, self.fail_from = fail_at, fail_kind, fail_from

    def load_core(self, backend, device, precision, input_size, threads=None):
        return SleepyCore(self.fail_at, self.fail_kind, self.fail_from)

    def decode(self, raw, input_size, conf):
        out = raw[0]
        return [Candidates(boxes=o[:, :4], scores=o[:, 4], labels=o[:, 5].long()) for o in out]

    def model_stats(self, input_size):
        return ModelStats(params_millions=0.0, notes={"gflops": "synthetic model: no FLOPs"})


def make_detector():
    return SyntheticDetector()


def make_failing_detector():
    size, kind, *after = os.environ.get("VA_BENCH_TEST_FAIL", "4:error").split(":")
    return SyntheticDetector(fail_at=int(size), fail_kind=kind or "error", fail_from=int(after[0]) if after else 1)


def make_detector_not_in_extra_processes():
    """make_detector, refusing to load in an extra process of --repeats ($VA_BENCH_REPEAT_OF set there)."""
    if os.environ.get("VA_BENCH_REPEAT_OF"):
        raise RuntimeError("this plugin does not load in an extra process")
    return make_detector()
