"""The run's data model: cells, their status, timings, detections, accuracy and probe results.

A torch-free leaf (numpy only): results/, eval/, compare and report import these types without
loading torch or the pipeline. The runner produces them; everything downstream reads them.
"""

from __future__ import annotations

import hashlib
import json
import typing
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import numpy as np

from harness.errors import NonFiniteNumberError


def utc_now_iso() -> str:
    """Now, as every record's time stamp is written: ISO 8601 in UTC with a Z (2026-11-29T03:04:05.678901Z)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")

# ---------------------------------------------------------------------------------------------- cells


@dataclass(frozen=True)
class LoadKey:
    """What is loaded once: (model, backend, precision, input size)."""

    model: str
    backend: str
    precision: str
    input_size: tuple[int, int]

    @property
    def label(self) -> str:
        h, w = self.input_size
        size = str(h) if h == w else f"{h}x{w}"
        return f"{self.model} {self.backend} {self.precision} {size}"


@dataclass(frozen=True)
class Cell:
    """One performance coordinate; one submission file."""

    load: LoadKey
    batch_size: int

    @property
    def label(self) -> str:
        return f"{self.load.label} b{self.batch_size}"

    def coordinates(self) -> dict[str, Any]:
        """The cell's coordinates as plain JSON values (run.json, CSVs)."""
        return {"model": self.load.model, "backend": self.load.backend, "precision": self.load.precision,
                "input_size": list(self.load.input_size), "batch_size": self.batch_size}


CellState = Literal["pending", "running", "ok", "failed", "oom", "skipped", "interrupted"]
CELL_STATES: tuple[str, ...] = typing.get_args(CellState)
COCO_MAX_DETS = 100  # COCO's own detection cap per image, where COCOeval reads AP


RETRYABLE_STATES = ("failed", "oom", "skipped")  # re-run on --resume only with --retry-failed


@dataclass
class CellStatus:
    """Where one cell stands in a run (run.json's `cells` list)."""

    cell: Cell
    state: CellState = "pending"
    reason: str | None = None
    submission: str | None = None  # relative to the run folder
    started_at: str | None = None
    finished_at: str | None = None
    node: dict | None = None  # a fleet run's: the node that ran it (host, address, Ray's node id)

    def to_dict(self) -> dict[str, Any]:
        return {"cell": self.cell.label, **self.cell.coordinates(), "status": self.state, "reason": self.reason,
                "submission": self.submission, "started_at": self.started_at, "finished_at": self.finished_at,
                **({"node": self.node} if self.node is not None else {})}


# ------------------------------------------------------------------------------------------ statistics


@dataclass(frozen=True)
class Summary:
    """Distribution of one measured quantity (milliseconds unless stated)."""

    count: int
    mean: float
    std: float | None  # None with fewer than 2 samples
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    median_ci95: tuple[float, float] | None  # bootstrap CI of the median; None with < 6 samples (none exists)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self, digits: int = 4) -> dict:
        out = {k: (round(v, digits) if isinstance(v, float) else v) for k, v in asdict(self).items()}
        if self.median_ci95 is not None:
            out["median_ci95"] = [round(v, digits) for v in self.median_ci95]
        return out


# ------------------------------------------------------------------------------------------ detections


@dataclass
class ImageDetections:
    """Final detections of one image, in original-image pixels (xyxy)."""

    image_id: int
    boxes: np.ndarray  # [K, 4] float32
    scores: np.ndarray  # [K]
    labels: np.ndarray  # [K] contiguous class index
    masks: list[dict] | None = None  # segment detectors: K COCO RLEs ({"size": [h, w], "counts": str}), source size

    def select(self, keep: np.ndarray) -> ImageDetections:
        """The detections at `keep` (a boolean array or indices), masks included."""
        rows = np.flatnonzero(keep) if keep.dtype == bool else keep
        masks = None if self.masks is None else [self.masks[i] for i in rows.tolist()]
        return ImageDetections(self.image_id, self.boxes[rows], self.scores[rows], self.labels[rows], masks)

    def to_coco(self, class_map: tuple[int, ...]) -> list[dict]:
        """COCO results format: bbox [x, y, w, h], category_id = class_map[label], and the mask as
        `segmentation` where there is one; a label mapped to a negative id (a class the dataset does not have)
        is left out."""
        _check_labels(self, class_map)
        out = []
        for k, ((x1, y1, x2, y2), score, label) in enumerate(zip(self.boxes.tolist(), self.scores.tolist(),
                                                                 self.labels.tolist(), strict=True)):
            if class_map[label] < 0:
                continue
            result = {"image_id": self.image_id, "category_id": class_map[label],
                      "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                      "score": round(score, 6)}
            if self.masks is not None:
                result["segmentation"] = self.masks[k]
            out.append(result)
        return out


def _check_labels(det: ImageDetections, class_map: tuple[int, ...]) -> None:
    """Labels are indices into the class map: a negative one would index it from the end (label -1 scored as the
    last class)."""
    if det.labels.size and (int(det.labels.min()) < 0 or int(det.labels.max()) >= len(class_map)):
        raise ValueError(f"image {det.image_id}: labels from {int(det.labels.min())} to {int(det.labels.max())} are "
                         f"not all class indices of the model's {len(class_map)} classes (its class_map)")


def coco_json_texts(det: ImageDetections, class_map: tuple[int, ...]) -> list[str]:
    """`det.to_coco(class_map)` encoded as JSON texts without building the dicts (a cell's detections file holds
    ~140 results per image). Numbers are printed as "%.3f" / "%.6f": the decimal that round(x, 3) / round(x, 6)
    stands for, so every value reads back as to_coco's. NaN/inf are refused as `allow_nan=False` does."""
    if det.masks is not None:
        try:
            return [json.dumps(r, allow_nan=False) for r in det.to_coco(class_map)]
        except ValueError as exc:
            raise NonFiniteNumberError(f"image {det.image_id}: a detection holds NaN or inf (a bug upstream); "
                                       "nothing was written") from exc
    _check_labels(det, class_map)
    boxes, scores = det.boxes.astype(np.float64), det.scores.astype(np.float64)
    if not (np.isfinite(boxes).all() and np.isfinite(scores).all()):
        raise NonFiniteNumberError(f"image {det.image_id}: a detection holds NaN or inf (a bug upstream); nothing "
                                   "was written")
    rows = np.column_stack([boxes[:, :2], boxes[:, 2:] - boxes[:, :2], scores]).tolist()
    head = f'{{"image_id": {int(det.image_id)}, "category_id": '
    return [f'{head}{class_map[label]}, "bbox": [{x:.3f}, {y:.3f}, {w:.3f}, {h:.3f}], "score": {score:.6f}}}'
            for label, (x, y, w, h, score) in zip(det.labels.tolist(), rows, strict=True) if class_map[label] >= 0]


def detections_digest(detections: list[ImageDetections]) -> str:
    """A digest of everything `coco_json_texts` encodes of these detections (ids, boxes, scores, labels with their
    dtypes and shapes, and masks): equal digests, under the same class map, encode to the same bytes."""
    digest = hashlib.blake2b(digest_size=20)
    for det in detections:
        arrays = (det.boxes, det.scores, det.labels)
        digest.update(repr((int(det.image_id), *((a.dtype.str, a.shape) for a in arrays),
                            det.masks is None)).encode())
        for a in arrays:
            digest.update(np.ascontiguousarray(a))
        if det.masks is not None:
            digest.update(json.dumps(det.masks, sort_keys=True).encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class MatchReport:
    """How well detections B reproduce detections A."""

    images: int
    detections_a: int
    detections_b: int
    matched: int
    max_score_delta: float
    iou_threshold: float
    score_tolerance: float
    mask_iou_threshold: float | None = None  # masks compared too: a pair also needs this mask IoU

    @property
    def match_rate(self) -> float:
        """Matched pairs over the larger of the two detection counts (1.0 when both are empty)."""
        denom = max(self.detections_a, self.detections_b)
        return 1.0 if denom == 0 else self.matched / denom

    def to_dict(self) -> dict:
        return {"images": self.images, "detections_reference": self.detections_a,
                "detections_compared": self.detections_b, "matched": self.matched,
                "match_rate": round(self.match_rate, 6), "max_score_delta": round(self.max_score_delta, 8),
                "iou_threshold": self.iou_threshold, "score_tolerance": self.score_tolerance,
                **({"mask_iou_threshold": self.mask_iou_threshold} if self.mask_iou_threshold is not None else {})}


# ------------------------------------------------------------------------------------- cell results


@dataclass
class AccuracyRecord:
    """COCO evaluation of one cell's detections (its scored timing pass) on the dataset variant."""

    stats: dict[str, Any]  # the 12 COCO statistics (None where undefined, with "unavailable" reasons)
    evaluator: str
    num_images: int
    num_detections: int
    batch_size: int
    detections_file: str  # relative to the run folder
    max_dets: list[int] = field(default_factory=lambda: [1, 10, 100])  # COCOeval's maxDets (the last: the cap)
    per_class_file: str | None = None  # per-category AP, relative to the run folder
    iou_types: list[str] = field(default_factory=lambda: ["bbox"])  # segmentation: ["segm", "bbox"], same detections
    reference: dict[str, Any] | None = None  # int8: the same model's fp32 mAP on the same images, and the verdict
    operating_point: dict[str, Any] | None = None  # the best-mean-F1 confidence and P/R/F1 there, or unavailable
    map_interval: dict[str, Any] | None = None  # --map-ci: the bootstrap interval of mAP over the scored images
    detections_sha256: str | None = None
    same_detections_as: str | None = None  # the statistics are this earlier cell's: its detections file is identical


@dataclass
class TimingRecord:
    """The timing pass of one cell."""

    batch_size: int
    timed_batches: int
    timed_images: int
    warmup_batches: int
    warmup_seconds: float
    warmup_ended: str  # why the warm-up ended: the batch times settled, or the time cap
    stage_sync: bool
    mode: str  # "latency": stages in sequence; "overlapped": host work overlaps the forward
    batch_ms: Summary
    image_ms: Summary
    stages_ms: dict[str, Summary]  # per batch, keyed by stage / "stage.substep"
    images_per_s: float
    short_batch: dict[str, Any] | None
    batch_samples_ms: list[float] = field(default_factory=list)  # every timed batch, in order: the evidence
    # overlapped mode: each batch's per-image interval since the previous completion (what total_ms summarises; a
    # batch's sample above is its end-to-end latency, queueing included); None in latency mode, where they agree
    interval_samples_ms: list[float] | None = None
    warnings: list[str] = field(default_factory=list)
    throttled: bool | None = None  # the device throttled during the pass (None: not sampled)
    target_ci: dict[str, Any] | None = None  # --target-ci: how far the median's CI reached, and why timing stopped
    timed_seconds: float | None = None  # the timed pass's wall time, first batch's start to last batch's end
    # each warm-up batch's time, in order (overlapped: its end-to-end latency): the first is the cell's cold batch,
    # the group's first inference for its first cell (lazy initialisation, allocation, autotuning included)
    warmup_samples_ms: list[float] = field(default_factory=list)
    # per image (what total_ms summarises): p90/p95/p99 beside a distribution-free 95 % upper bound of each
    tail: dict[str, Any] | None = None


@dataclass
class Invariance:
    """Batch invariance of a cell: its detections against the reference cell's (same group, smallest batch)."""

    reference_batch_size: int
    report: MatchReport | None  # None for the reference cell itself

    def to_dict(self) -> dict[str, Any]:
        if self.report is None:
            return {"reference_batch_size": self.reference_batch_size, "is_reference": True}
        return {**self.report.to_dict(), "reference_batch_size": self.reference_batch_size}


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
    accuracy_reason: str | None  # why accuracy is None
    invariance: Invariance | None
    energy: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    layers: dict[str, Any] | None = None
    profiler: dict[str, Any] | None = None
    artifacts: dict[str, str] = field(default_factory=dict)
    server: dict[str, Any] | None = None  # --scenario server: the trial(s) at the target rate, or the search
    detections_file: str | None = None  # the cell's detections (relative to the run folder), scored or not


# ------------------------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class LayerCall:
    """One execution of one layer (module or ONNX node) within one batch."""

    batch: int
    name: str
    type: str
    input_shapes: str
    output_shapes: str
    ms: float


@dataclass
class LayerPassRecord:
    """Per-layer timing of a few batches, with the forward stage time of the same batches."""

    method: str
    calls: list[LayerCall]
    by_type: list[dict]
    forward_ms: list[float]  # forward stage per batch, hooks included
    layer_sum_ms: list[float]  # layer times summed per batch
    runtime_trace: str | None = None  # the runtime's own profile of the layer pass (ONNX Runtime, OpenVINO, ...)

    @property
    def coverage(self) -> list[float | None]:
        """Summed layer time / forward stage time, per batch (None where the forward took no measurable time)."""
        return [s / f if f else None for s, f in zip(self.layer_sum_ms, self.forward_ms, strict=True)]

    def summary(self, top: int = 10) -> dict:
        return {"method": self.method, "batches": len(self.forward_ms), "layer_calls": len(self.calls),
                "by_type_top": self.by_type[:top],
                "layer_sum_over_forward": [None if c is None else round(c, 4) for c in self.coverage]}


@dataclass
class ProfilePassRecord:
    """A torch.profiler pass: the Chrome trace it wrote and its key averages."""

    trace_file: str
    ops: list[dict]
    batches: int
    notes: list[str] = field(default_factory=list)

    def summary(self, top: int = 10) -> dict:
        return {"trace": self.trace_file, "batches": self.batches, "top_ops": self.ops[:top], "notes": self.notes}
