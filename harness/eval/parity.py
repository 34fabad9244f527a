"""Preprocessing parity: how far each implementation is from the reference (cv2), and whether
that distance is larger than the noise floor of the reference itself.

Torch-free: it works on what a parity run produced (pixel statistics, COCO detections, the 12 COCO
metrics); harness/pipeline/parity_run.py produces them. The detection diff is harness/eval/detection_diff.py
(greedy pairing per image and class at IoU >= 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.eval.coco_eval import STAT_NAMES
from harness.eval.detection_diff import DetectionDiff

# The metrics --tolerance gates: the aggregate APs. The per-size APs and ARs are shown with their deltas but
# not gated: on a 206-image sample a handful of small objects moves them by more than any preprocessing does.
GATED = ("mAP_50_95", "mAP_50", "mAP_75")

FEW_IMAGES = 100  # a parity study on fewer images than this says how little they can tell


@dataclass
class PixelStats:
    """Absolute difference of two model input tensors, accumulated over images."""

    max_abs: float = 0.0
    sum_abs: float = 0.0
    count: int = 0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        """Accumulate |a - b| of two same-shaped arrays (float64 arithmetic)."""
        if a.shape != b.shape:
            raise ValueError(f"input tensors differ in shape: {a.shape} vs {b.shape}")
        d = np.abs(a.astype(np.float64) - b.astype(np.float64))
        self.max_abs = max(self.max_abs, float(d.max(initial=0.0)))
        self.sum_abs += float(d.sum())
        self.count += d.size

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.count if self.count else 0.0

    def to_dict(self) -> dict:
        return {"max_abs": self.max_abs, "mean_abs": self.mean_abs, "values": self.count}


@dataclass(frozen=True)
class Candidate:
    """One run compared with the reference run: an implementation, or the reference again (noise floor)."""

    name: str  # "torch", "pil", "cv2 (again)", "cv2 (batch 1)"
    noise: bool  # part of the noise floor (the reference against itself)
    metrics: dict[str, float]
    detections: DetectionDiff
    pixels: PixelStats | None  # None for noise-floor runs of the same implementation (identical input)


@dataclass
class ParityReport:
    """The reference's metrics, every candidate against it, and the verdict at `tolerance`."""

    reference: str
    reference_metrics: dict[str, float]
    candidates: list[Candidate]
    tolerance: float
    setup: dict = field(default_factory=dict)

    def deltas(self, candidate: Candidate) -> dict[str, float]:
        """Candidate - reference, per COCO metric."""
        return {k: candidate.metrics[k] - self.reference_metrics[k] for k in STAT_NAMES}

    def noise_floor(self) -> float:
        """The largest |Δ| of a gated metric between the reference and itself (rerun, other batch size)."""
        return max((abs(self.deltas(c)[k]) for c in self.candidates if c.noise for k in GATED), default=0.0)

    def failures(self) -> list[str]:
        """One line per (implementation, gated metric) whose |Δ| exceeds the tolerance; noise runs included:
        a reference that does not reproduce itself within tolerance is a failure too."""
        out = []
        for c in self.candidates:
            for k, d in self.deltas(c).items():
                if k in GATED and abs(d) > self.tolerance:
                    out.append(f"{c.name}: {k} {d:+.4f} exceeds the tolerance {self.tolerance}")
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.failures() else 0

    def notes(self) -> list[str]:
        """What a reader should know before quoting the verdict: a sample too small to say how far its deltas
        (exact for these images: the runs are paired) hold on others."""
        images = self.setup.get("images")
        if isinstance(images, int) and images < FEW_IMAGES:
            return [f"{images} images: each delta is exact for them (every run scores the same images), but one "
                    f"image moves a metric by a lot here; how far a change holds on other images needs more "
                    f"(--limit {FEW_IMAGES} or more)"]
        return []

    def to_dict(self) -> dict:
        return {"reference": self.reference, "tolerance": self.tolerance, "gated_metrics": list(GATED),
                "setup": self.setup, "reference_metrics": self.reference_metrics,
                "noise_floor": self.noise_floor(),
                "candidates": [{"name": c.name, "noise_floor": c.noise, "metrics": c.metrics,
                                "deltas": self.deltas(c), "detections": c.detections.to_dict(),
                                "pixels": c.pixels.to_dict() if c.pixels else None} for c in self.candidates],
                "failures": self.failures(), "notes": self.notes(), "exit_code": self.exit_code}
