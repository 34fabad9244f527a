"""Typed records a run produces; submissions, tables and reports are built from these alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.eval.matching import MatchReport
from harness.measure.stats import Summary
from harness.plan import Cell


@dataclass
class AccuracyRecord:
    """COCO evaluation of one (model, backend, precision, input size) on the dataset variant."""

    stats: dict[str, float]
    evaluator: str
    num_images: int
    num_detections: int
    batch_size: int
    detections_file: str


@dataclass
class TimingRecord:
    """The timing pass of one cell."""

    batch_size: int
    timed_batches: int
    timed_images: int
    warmup_batches: int
    warmup_seconds: float
    stage_sync: bool
    mode: str  # "latency": stages in sequence; "overlapped": host work overlaps the forward
    batch_ms: Summary
    image_ms: Summary
    stages_ms: dict[str, Summary]  # per batch, keyed by stage / "stage.substep"
    images_per_s: float
    short_batch: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)


@dataclass
class CellRecord:
    """Everything measured for one cell, plus the coordinates and environment that identify it."""

    run_id: str
    created_at: str
    cell: Cell
    model: dict[str, Any]  # id, family, variant, weights {file, sha256, source}
    runtime: dict[str, Any]  # format, provider, precision, device, backend details
    dataset: dict[str, Any]  # variant, base_variant, num_images, image_id_sha256
    thresholds: dict[str, Any]
    hardware: dict[str, Any]
    environment: dict[str, Any]
    model_stats: dict[str, Any]
    timing: TimingRecord
    accuracy: AccuracyRecord | None
    invariance: MatchReport | None
    energy: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    layers: dict[str, Any] | None = None
    profiler: dict[str, Any] | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
