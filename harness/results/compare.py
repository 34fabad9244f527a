"""`va-bench compare`: what changed between two runs.

Inputs are run folders (`outputs/<run_id>/`), submission files, or two COCO detection files. Torch-free:
only the JSON records are read, nothing is re-run.

* **Pairing.** A cell is (model, hardware, backend = format/provider, precision, input size, batch size,
  dataset variant, timing mode). Coordinates constant within A and within B but different between
  them are what the comparison is about (e.g. the backend of an ORT run vs a PyTorch run); cells are
  paired on all the other coordinates. Both lists are printed, nothing is paired silently.
* **Accuracy**: the 12 COCO metrics side by side with B - A.
* **Detections**: `artifacts.detections` of both sides (absolute, or relative to the run folder) diffed
  by harness.eval.detection_diff.
* **Performance** per paired cell: p50/p95 latency per image and images/s, B/A - 1, and a verdict from
  the per-batch samples of the per-image time (`timing.batch_samples_ms` divided by the batch size; an
  overlapped cell's `timing.interval_samples_ms`, the interval between completions): significant only when
  the two-sided Mann-Whitney U test gives p < alpha AND the 95 % bootstrap CI of the ratio of medians
  excludes 1; the geometric mean of the ratios across cells (pyperf `compare_to` style).
* **Gates** (`--fail-on METRIC:±X[%]`): harness/results/compare_gates.py.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from harness.errors import UsageError, VaBenchError, brief, path_problem
from harness.eval.coco_eval import SITE_BBOX_KEYS, STAT_NAMES
from harness.eval.detection_diff import DetectionDiff, DetectionFileError, diff_detections, load_coco_detections
from harness.files import file_identity, file_sha256
from harness.measure.stats import autocorrelated, block_means, block_size, bootstrap_ci, lag1_autocorrelation
from harness.records import COCO_MAX_DETS
from harness.results.model import SEGMENT_TASKS, Submission
from harness.results.reader import (
    RUN_FILE,
    CellIdentity,
    inside_run_folder,
    latest_wins,
    not_a_file_or_folder,
    read_json,
    read_submission,
    refuse_fleet_or_campaign,
    resolve_detections,
    run_folders_in,
    submission_files,
)

# (key, label) of a cell's coordinates, in display order
COORDS = (("model", "model"), ("hardware", "hardware"), ("backend", "backend"), ("precision", "precision"),
          ("input_size", "input size"), ("batch_size", "batch"), ("variant", "dataset"), ("mode", "timing mode"),
          ("protocol", "protocol"), ("preprocess", "preprocessing"))
ACCURACY_FREE = ("batch_size", "mode")  # accuracy does not depend on these
ALPHA = 0.05
# eval.operating_point's figures, as compare names them beside the COCO statistics
OPERATING_POINT_KEYS = (("op_confidence", "confidence"), ("op_precision", "precision"), ("op_recall", "recall"),
                        ("op_F1", "F1"))


# ----------------------------------------------------------------------------------- inputs --
@dataclass(frozen=True)
class Entry:
    """One submission file and its cell coordinates."""

    path: Path
    doc: dict
    coords: dict[str, Any]
    run_dir: Path  # artifacts with relative paths resolve against this
    identity: CellIdentity
    timestamp: datetime | None  # when it was made (latest wins)
    fingerprint: str | None  # dataset image_id_sha256
    ground_truth: str | None = None  # repro.dataset.annotations_sha256, where recorded

    def detections_file(self) -> tuple[Path | None, str]:
        """(path, note) of artifacts.detections, or (None, why not)."""
        return resolve_detections(self.doc, self.path, self.run_dir)

    def replaced_detections(self, path: Path) -> str | None:
        """Why `path` (its detections file) is not the file this cell was scored from, by the SHA-256 its
        submission recorded (eval.detections_sha256); None when it is, or when none was recorded."""
        recorded = (self.doc.get("eval") or {}).get("detections_sha256") if isinstance(self.doc.get("eval"),
                                                                                       dict) else None
        actual = _file_digest(path)
        if not isinstance(recorded, str) or actual is None:  # none recorded, or unreadable (its reading says why)
            return None
        return None if actual == recorded else (f"its detections file {path.name} is not the one it was scored from "
                                                f"(SHA-256 {actual[:12]}, recorded {recorded[:12]})")


def _file_digest(path: Path) -> str | None:
    """A file's SHA-256, read once per file version (a run's cells are compared several times over); None when it
    cannot be read."""
    try:
        st = path.stat()
        key = (file_identity(path), st.st_size, st.st_mtime_ns)
        if key not in _DIGESTS:
            _DIGESTS[key] = file_sha256(path)
    except OSError:
        return None
    return _DIGESTS[key]


_DIGESTS: dict[tuple, str] = {}


@dataclass
class Side:
    """One side of a comparison: submissions (a run) or a bare COCO detections file."""

    label: str
    entries: list[Entry] = field(default_factory=list)
    detections: Path | None = None
    superseded: int = 0  # older submissions of a cell that appears twice (latest wins)
    clashes: list[str] = field(default_factory=list)  # other cells with the same compare coordinates, not compared
    unfinished: list[str] = field(default_factory=list)  # a run folder's cells that did not end ok, with their status


def _coords(sub: Submission) -> dict[str, Any]:
    mode = sub.timing.get("mode")
    return {"model": sub.model.id or "unknown", "hardware": sub.hardware_id,
            "backend": f"{sub.runtime.format or '?'}/{sub.runtime.provider or '?'}",
            "precision": sub.runtime.precision or "?", "input_size": sub.input_size, "batch_size": sub.batch_size,
            "variant": f"{sub.dataset_id}{_split(sub)} {sub.dataset_variant or '?'}",
            "mode": mode if isinstance(mode, str) else "latency", "protocol": _protocol(sub),
            "preprocess": sub.preprocess_choice}


def _protocol(sub: Submission) -> str:
    """The thresholds and evaluation cap a cell was scored at, as aggregate keys rows by: other ones are another
    measurement (their mAP deltas are the protocol's as much as the model's)."""
    conf, iou, max_det = sub.protocol
    return (f"conf {_g(conf)}, iou {_g(iou)}, max_det {_g(max_det)}, AP at {sub.eval_cap or COCO_MAX_DETS} "
            "detections")


def _g(value) -> str:
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def _split(sub: Submission) -> str:
    """' test': the split of a dataset other than COCO val2017 (the splits of one dataset are other images)."""
    split = sub.dataset.split if sub.dataset else None
    return f" {split}" if sub.dataset_id != "coco2017" and isinstance(split, str) and split else ""


def _entry(path: Path) -> Entry:
    file = read_submission(path)
    sub = file.submission
    return Entry(path, file.doc, _coords(sub), file.run_dir, file.identity, sub.timestamp, sub.image_id_sha256,
                 sub.annotations_sha256)


def _is_detections_file(path: Path) -> bool:
    with path.open("rb") as fh:
        head = fh.read(64).lstrip()
    return head.startswith(b"[")


def load_side(path: str | Path) -> Side:
    """A run folder (its submissions/), a folder of submissions, a submission file or a detections file."""
    path = Path(path)
    if path.is_dir():
        refuse_fleet_or_campaign(path, "compare", campaign=False)  # a campaign's row compares with another's
        files = submission_files(path, loose=True)
        if not files:
            runs, unreadable = run_folders_in(path)
            if runs:  # outputs/ itself: which run is a side is the user's to say
                raise UsageError(f"{path} holds {len(runs)} run folder(s) ({', '.join(runs[:3])}"
                                 f"{', ...' if len(runs) > 3 else ''}), not one run; compare one of them, e.g. "
                                 f"{path / runs[-1]}")
            closed = (f" ({len(unreadable)} folder(s) inside could not be read: {', '.join(unreadable[:3])}"
                      f"{', ...' if len(unreadable) > 3 else ''})") if unreadable else ""
            raise UsageError(f"{path}: no submissions (*.json) in it or its submissions/{closed}; pass a run folder "
                             "outputs/<run_id>/")
        entries = [_entry(f) for f in files]
    elif path.is_file():
        if _is_detections_file(path):
            return Side(str(path), detections=path)
        entries = [_entry(path)]
    else:
        raise UsageError(path_problem("", path, not_a_file_or_folder(path)) + "; pass a run folder, submission "
                         "files or a COCO detections file")
    # a cell written twice (a resumed run, a folder of several runs): the latest wins
    kept, superseded = latest_wins(entries, key=lambda e: e.identity, when=lambda e: e.timestamp,
                                   name=lambda e: str(e.path))
    # cells that differ only in what compare does not pair on (weights, thresholds, ONNX Runtime's TensorRT
    # provider beside a native engine): one is compared, and the note says so
    paired, clashes = latest_wins(kept, key=lambda e: tuple(e.coords[k] for k, _ in COORDS), when=lambda e: e.timestamp,
                                  name=lambda e: str(e.path))
    return Side(str(path), paired, superseded=len(superseded),
                clashes=[f"{old.path.name} (kept {new.path.name})" for old, new in clashes],
                unfinished=_unfinished_cells(path) if path.is_dir() else [])


def _unfinished_cells(run_dir: Path) -> list[str]:
    """The cells a run folder's run.json lists as not ok (failed, oom, skipped, interrupted, pending), each with its
    status: a side that lost cells has no submission to say so."""
    doc, problem = read_json(run_dir / RUN_FILE) if (run_dir / RUN_FILE).is_file() else (None, None)
    cells = doc.get("cells") if isinstance(doc, dict) and problem is None else None
    return [f"{c.get('cell')} ({c.get('status')})" for c in cells or []
            if isinstance(c, dict) and c.get("status") != "ok"]


# --------------------------------------------------------------------------------- statistics --
@dataclass(frozen=True)
class Significance:
    """Verdict on per-image latency B vs A from the per-batch samples."""

    verdict: str  # slower | faster | no significant change | too few samples | unavailable
    ratio: float | None = None  # median B / median A
    ci95: tuple[float, float] | None = None  # bootstrap CI of the ratio
    p_value: float | None = None  # two-sided Mann-Whitney U
    n_a: int = 0
    n_b: int = 0
    reason: str | None = None
    basis: str = "batches"  # "batches": one process's timed batches; "processes": --repeats' process medians;
    # "batch means": the batches' means in blocks, the batches themselves being autocorrelated
    alpha: float = ALPHA  # the significance level the verdict was taken at (--alpha)

    @property
    def is_noise(self) -> bool:
        return self.verdict == "no significant change"

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "ratio_of_medians": self.ratio,
                "ratio_ci95": list(self.ci95) if self.ci95 else None, "p_value": self.p_value,
                "samples_a": self.n_a, "samples_b": self.n_b, "samples_are": self.basis, "alpha": self.alpha,
                "reason": self.reason}


def batch_significance(a: np.ndarray, b: np.ndarray, alpha: float = ALPHA, seed: int = 0) -> Significance:
    """latency_significance of one process's batch samples. Batch times drift together (a shared host's load, the
    clocks): where either side's are autocorrelated, each side's block means are compared instead; testing
    autocorrelated batches as independent calls a change significant several times as often as alpha says."""
    if not (autocorrelated(a) or autocorrelated(b)):
        return latency_significance(a, b, alpha, seed)
    r = f"{lag1_autocorrelation(a):.2f} / {lag1_autocorrelation(b):.2f}"
    size = block_size(min(len(a), len(b)))  # one block length: a median of 8-batch means is not one of 32-batch means
    means_a, means_b = block_means(a, size), block_means(b, size)
    sig = replace(latency_significance(means_a, means_b, alpha, seed), basis="batch means")
    if sig.verdict == "too few samples":
        blocks = next(k for k in range(2, 100) if 2 / math.comb(2 * k, k) < alpha)
        return replace(sig, reason=f"batch times autocorrelated (lag-1 {r}): {len(means_a)} vs {len(means_b)} "
                                   f"block means cannot reach p < {alpha:g}; {blocks * blocks} batches a side can "
                                   f"(--min-timed-batches {blocks * blocks})")
    return sig


def latency_significance(a: np.ndarray, b: np.ndarray, alpha: float = ALPHA, seed: int = 0) -> Significance:
    """Mann-Whitney U (two-sided) and a bootstrap CI of median(B)/median(A); significant when both agree. For
    independent samples (processes' medians, block means); one process's batches go through batch_significance."""
    n_a, n_b = len(a), len(b)
    # the smallest p-value an exact two-sided Mann-Whitney test can reach with these sample counts
    min_p = min(1.0, 2.0 / math.comb(n_a + n_b, n_a)) if n_a and n_b else 1.0
    if min_p >= alpha:
        return Significance("too few samples", n_a=n_a, n_b=n_b,
                            reason=f"{n_a} vs {n_b} samples cannot reach p < {alpha:g}")
    def ratio_of_medians(x, y, axis=-1):
        return np.median(y, axis=axis) / np.median(x, axis=axis)

    with np.errstate(all="ignore"):  # a ratio past floating point's range is answered below, not warned about
        ratio = float(np.median(b) / np.median(a))
        ci = bootstrap_ci((a, b), ratio_of_medians, seed=seed)
    if not (math.isfinite(ratio) and all(math.isfinite(v) for v in ci)):
        return Significance("unavailable", n_a=n_a, n_b=n_b,
                            reason="the ratio of median latencies is not a finite number (latencies of 0 or "
                                   "beyond floating point's range)")
    p_value = float(scipy_stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    significant = p_value < alpha and not ci[0] <= 1.0 <= ci[1]
    verdict = ("slower" if ratio > 1 else "faster") if significant else "no significant change"
    # the ranks differ but the medians' ratio does not settle: typical of times in two or more modes, where a
    # median sits in the gap between them; said rather than left as plain noise
    unsettled = (f"the samples' ranks differ (p={p_value:.2g}) but the ratio of medians is unsettled (95 % CI "
                 f"{ci[0]:.3f}-{ci[1]:.3f}): samples in several modes? compare their distributions"
                 if p_value < alpha and not significant else None)
    return Significance(verdict, ratio, ci, p_value, n_a, n_b, reason=unsettled, alpha=alpha)


def _process_samples(entry: Entry) -> np.ndarray | None:
    """--repeats: each process's median per image (timing.repeats.batch_ms_p50 / batch size); None without two.
    Used when both sides have them and they are enough to reach the significance level (4 a side at 0.05);
    fewer fall back to the batches of one process."""
    timing = entry.doc.get("timing") if isinstance(entry.doc.get("timing"), dict) else {}
    if timing.get("mode") == "overlapped":  # the processes' medians are of end-to-end latency there, not per image
        return None
    repeats = timing.get("repeats") if isinstance(timing.get("repeats"), dict) else {}
    values = repeats.get("batch_ms_p50")
    batch = entry.coords["batch_size"]
    ok = isinstance(values, list) and len(values) >= 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values)
    return np.asarray(values, dtype=np.float64) / batch if ok and isinstance(batch, int) and batch >= 1 else None


def _per_image_samples(entry: Entry) -> tuple[np.ndarray | None, str | None]:
    """Each timed batch's per-image time, the quantity total_ms summarises, or (None, why not): in latency mode
    timing.batch_samples_ms / batch size; in overlapped mode timing.interval_samples_ms (the interval since the
    previous completion: there a batch's own sample is its end-to-end latency, queueing included)."""
    timing = entry.doc.get("timing") if isinstance(entry.doc.get("timing"), dict) else {}
    overlapped = timing.get("mode") == "overlapped"
    field = "interval_samples_ms" if overlapped else "batch_samples_ms"
    samples = timing.get(field)
    if samples is None:
        return None, (f"{entry.path.name} is an overlapped cell without timing.interval_samples_ms (written before "
                      "they were recorded): its batch samples are latencies, not its per-image time"
                      if overlapped else f"{entry.path.name} has no timing.batch_samples_ms (per-batch samples "
                      "not recorded)")
    ok = isinstance(samples, list) and samples and all(
        isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s > 0 for s in samples)
    batch = entry.coords["batch_size"]
    if not ok or not isinstance(batch, int) or batch < 1:
        return None, f"{entry.path.name}: timing.{field} is not a list of positive numbers"
    return np.asarray(samples, dtype=np.float64) / (1 if overlapped else batch), None


# ---------------------------------------------------------------------------------- results --
@dataclass(frozen=True)
class CellDelta:
    """Performance of one paired cell."""

    label: str
    coords: dict[str, Any]
    p50_a: float | None  # ms per image (timing.total_ms)
    p50_b: float | None
    p95_a: float | None
    p95_b: float | None
    ips_a: float | None  # images/s
    ips_b: float | None
    significance: Significance
    # the timing warnings each side's run gave this cell (a busy machine, high variation): a verdict may be theirs
    warnings_a: tuple[str, ...] = ()
    warnings_b: tuple[str, ...] = ()

    def change(self, metric: str) -> float | None:
        """B/A - 1 of p50, p95 or ips."""
        a, b = getattr(self, f"{metric}_a"), getattr(self, f"{metric}_b")
        return None if a is None or b is None or a <= 0 or b <= 0 else b / a - 1  # 0 on a side: no figure

    def to_dict(self) -> dict:
        return {"cell": self.label, "coordinates": self.coords,
                "latency_ms_per_image": {"p50": [self.p50_a, self.p50_b], "p95": [self.p95_a, self.p95_b]},
                "images_per_s": [self.ips_a, self.ips_b],
                "change": {"p50": self.change("p50"), "p95": self.change("p95"), "images_per_s": self.change("ips")},
                "significance": self.significance.to_dict(),
                "timing_warnings": {"a": list(self.warnings_a), "b": list(self.warnings_b)}}


@dataclass(frozen=True)
class AccuracyDelta:
    """The 12 COCO metrics of one accuracy identity (cells whose accuracy is the same on both sides)."""

    label: str
    a: dict[str, float | None]
    b: dict[str, float | None]
    unavailable: str | None = None
    per_class: list[dict] = field(default_factory=list)  # {id, name, a, b, delta} of AP 50:95, largest |delta| first
    per_class_unavailable: str | None = None  # why the classes were not compared (a side has no readable file)
    # --map-ci: the paired bootstrap interval of B - A over the images both scored, or why there is none
    delta_interval: dict | None = None
    delta_interval_unavailable: str | None = None
    other_images: str | None = None  # why A and B's accuracy is not of the same images (a delta mixes the two)

    def delta(self, name: str) -> float | None:
        a, b = self.a.get(name), self.b.get(name)
        return None if a is None or b is None else b - a

    @property
    def names(self) -> tuple[str, ...]:
        """The metrics shown: the 12 COCO statistics (of masks, for segmentation files), their bbox_* ones, then the
        operating point's confidence, precision, recall and F1 (eval.operating_point) where a side has one."""
        return (*STAT_NAMES, *(f"bbox_{k}" for k in SITE_BBOX_KEYS if f"bbox_{k}" in self.a or f"bbox_{k}" in self.b),
                *(name for name, _ in OPERATING_POINT_KEYS if name in self.a or name in self.b))

    @property
    def of(self) -> str:
        """What the plain statistics score: "masks" (both sides segmentation files) or "boxes"."""
        return "masks" if any(k.startswith("bbox_") for k in self.a) else "boxes"

    def to_dict(self) -> dict:
        if self.unavailable:
            return {"label": self.label, "status": "unavailable", "reason": self.unavailable}
        return {"label": self.label, "status": "ok", "scored": self.of,
                "metrics": {n: {"a": self.a.get(n), "b": self.b.get(n), "delta": self.delta(n)} for n in self.names},
                "per_class": self.per_class, "per_class_unavailable": self.per_class_unavailable,
                **({"delta_interval": self.delta_interval, "delta_interval_unavailable":
                    self.delta_interval_unavailable}
                   if self.delta_interval or self.delta_interval_unavailable else {}),
                **({"other_images": self.other_images} if self.other_images else {})}


@dataclass(frozen=True)
class DetectionRow:
    """The detection diff of one pair of detection files (the cells that share them)."""

    label: str
    diff: DetectionDiff | None
    unavailable: str | None = None

    def to_dict(self) -> dict:
        body = self.diff.to_dict() if self.diff else {"status": "unavailable", "reason": self.unavailable}
        return {"label": self.label, **body}


@dataclass
class Comparison:
    """A vs B."""

    a: str
    b: str
    same: dict[str, Any] = field(default_factory=dict)
    differ: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    accuracy: list[AccuracyDelta] = field(default_factory=list)
    detections: list[DetectionRow] = field(default_factory=list)
    cells: list[CellDelta] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def geomean(self) -> dict[str, float | None]:
        """Geometric mean of B/A across the cells that have both figures (p50 latency, p95 latency, images/s)."""
        out: dict[str, float | None] = {}
        for metric in ("p50", "p95", "ips"):
            ratios = [1 + c.change(metric) for c in self.cells if c.change(metric) is not None]
            out[metric] = float(scipy_stats.gmean(ratios)) if ratios else None
        return out

    def geomean_cells(self) -> dict[str, int]:
        """How many cells each geometric mean is over (a cell without the figure on a side is left out)."""
        return {metric: sum(c.change(metric) is not None for c in self.cells) for metric in ("p50", "p95", "ips")}

    def to_dict(self) -> dict:
        g, n = self.geomean(), self.geomean_cells()
        return {"a": self.a, "b": self.b, "same": self.same,
                "differ": {k: list(v) for k, v in self.differ.items()},
                "only_in_a": self.only_a, "only_in_b": self.only_b,
                "accuracy": [x.to_dict() for x in self.accuracy],
                "detections": [x.to_dict() for x in self.detections],
                "performance": {"unit": "ms per image (latency mode: batch time / batch size; overlapped: "
                                         "interval between completions / batch size); change = B/A - 1",
                                "cells": [c.to_dict() for c in self.cells],
                                "geometric_mean_ratio": {"latency_p50": g["p50"], "latency_p95": g["p95"],
                                                         "images_per_s": g["ips"]},
                                "geometric_mean_cells": {"latency_p50": n["p50"], "latency_p95": n["p95"],
                                                         "images_per_s": n["ips"]}},
                "notes": self.notes}


# ---------------------------------------------------------------------------------- compare --
def _num(value) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _label(coords: dict[str, Any], keys: list[str]) -> str:
    """'b4 640px ...' of the keys given; a key the coordinates lack (the treatment, not a pairing key) is left out."""
    parts = []
    for k in keys:
        if k not in coords:
            continue
        v = coords[k]
        parts.append(f"b{v}" if k == "batch_size" else f"{v}px" if k == "input_size" else str(v))
    return " ".join(parts)


def _accuracy_of(entry: Entry) -> tuple[dict[str, float | None] | None, str | None]:
    """The file's COCO statistics; a segmentation file's (model.task segment) are of its masks, with its box
    statistics as bbox_*."""
    acc = entry.doc.get("accuracy")
    if not isinstance(acc, dict) or _num(acc.get("mAP_50_95")) is None:
        reason = acc.get("reason") if isinstance(acc, dict) and isinstance(acc.get("reason"), str) else "no accuracy"
        return None, f"{entry.path.name}: {reason}"
    boxes = {f"bbox_{k}": _num(acc.get(f"bbox_{k}")) for k in SITE_BBOX_KEYS} if _segmentation(entry) else {}
    evaluation = entry.doc.get("eval") if isinstance(entry.doc.get("eval"), dict) else {}
    point = evaluation.get("operating_point")
    at_point = ({name: _num(point.get(key)) for name, key in OPERATING_POINT_KEYS}
                if isinstance(point, dict) and "F1" in point else {})
    return {**{n: _num(acc.get(n)) for n in STAT_NAMES}, **boxes, **at_point}, None



def _segmentation(entry: Entry) -> bool:
    model = entry.doc.get("model")
    return isinstance(model, dict) and model.get("task") in SEGMENT_TASKS


def _cell_delta(label: str, key: dict, ea: Entry, eb: Entry, alpha: float) -> CellDelta:
    def figures(e: Entry) -> tuple[float | None, float | None, float | None]:
        timing = e.doc.get("timing") if isinstance(e.doc.get("timing"), dict) else {}
        total = timing.get("total_ms") if isinstance(timing.get("total_ms"), dict) else {}
        thr = e.doc.get("throughput") if isinstance(e.doc.get("throughput"), dict) else {}
        ips = _num(thr.get("images_per_s"))
        return _num(total.get("p50")), _num(total.get("p95")), ips if ips is not None else _num(thr.get("fps_mean"))

    (p50a, p95a, ipsa), (p50b, p95b, ipsb) = figures(ea), figures(eb)
    warned = _timing_warnings(ea), _timing_warnings(eb)
    pa, pb = _process_samples(ea), _process_samples(eb)
    if pa is not None and pb is not None:  # both measured in several processes: the spread that matters
        across = replace(latency_significance(pa, pb, alpha), basis="processes")
        if across.verdict != "too few samples":
            return CellDelta(label, key, p50a, p50b, p95a, p95b, ipsa, ipsb, across, *warned)
    sa, why_a = _per_image_samples(ea)
    sb, why_b = _per_image_samples(eb)
    if sa is None or sb is None:
        sig = Significance("unavailable", reason="; ".join(w for w in (why_a, why_b) if w))
    else:
        sig = batch_significance(sa, sb, alpha)
    return CellDelta(label, key, p50a, p50b, p95a, p95b, ipsa, ipsb, sig, *warned)


def _timing_warnings(e: Entry) -> tuple[str, ...]:
    timing = e.doc.get("timing") if isinstance(e.doc.get("timing"), dict) else {}
    found = timing.get("warnings") if isinstance(timing.get("warnings"), list) else []
    return tuple(str(w) for w in found)


def timing_warning_notes(comparison: Comparison) -> list[str]:
    """One note per side whose cells were timed with warnings, by kind (the text before its first ':') and cell: a
    latency verdict of such a cell may be the machine's, not the change's."""
    notes = []
    for side, label in (("a", comparison.a), ("b", comparison.b)):
        kinds: dict[str, list[str]] = {}
        for cell in comparison.cells:
            for warning in getattr(cell, f"warnings_{side}"):
                kinds.setdefault(warning.split(":", 1)[0], []).append(cell.label)
        if kinds:
            found = "; ".join(f"{kind} ({', '.join(dict.fromkeys(cells))})" for kind, cells in kinds.items())
            notes.append(f"{label}: its run warned of its timing, so a latency verdict there may be the machine's, "
                         f"not the change's: {found}")
    return notes


class _DetectionCache:
    """Each detections file read once per compare, a file under two names (the hard link of a cell whose detections
    were an earlier cell's) once, and let go after the last diff that reads it: a sweep's files held together
    would be ~100 MB each at full val. The diffs are kept by the files' identities: two pairs of the same files
    are one diff."""

    def __init__(self, paths: list[Path] | None = None):
        self._sets: dict[object, Any] = {}
        self._diffs: dict[tuple, tuple[DetectionDiff | None, str | None]] = {}
        self._uses = Counter(file_identity(p) for p in paths or [])

    def get(self, path: Path):
        key = file_identity(path)
        if key not in self._sets:
            try:
                self._sets[key] = load_coco_detections(path)
            except DetectionFileError as exc:
                self._sets[key] = str(exc)
        return self._sets[key]

    def diff(self, pa: Path, pb: Path, iou: float, conf: float) -> tuple[DetectionDiff | None, str | None]:
        """The diff of two files, and each let go once no later diff reads it."""
        ids = (file_identity(pa), file_identity(pb))
        if ids not in self._diffs:
            da, db = self.get(pa), self.get(pb)
            problem = next((f"{side}: {d}" for d, side in ((da, "A"), (db, "B")) if isinstance(d, str)), None)
            self._diffs[ids] = (None, problem) if problem else (diff_detections(da, db, iou=iou, conf=conf), None)
        for key in ids:
            self._uses[key] -= 1
            if self._uses[key] <= 0:
                self._sets.pop(key, None)
        return self._diffs[ids]


def _accuracy_deltas(pairs: list[tuple[dict, Entry, Entry]], vary: list[str],
                     intervals: ImageSets | None = None) -> list[AccuracyDelta]:
    """One table per accuracy identity; cells of one identity share it when their accuracy agrees; with
    `intervals`, each table's paired bootstrap interval of B - A (from its first pair of cells)."""
    groups: dict[tuple, list[tuple[dict, Entry, Entry]]] = {}
    for key, ea, eb in pairs:
        ident = (tuple(key[k] for k in vary if k not in ACCURACY_FREE),
                 json.dumps(_accuracy_of(ea)[0], sort_keys=True), json.dumps(_accuracy_of(eb)[0], sort_keys=True))
        groups.setdefault(ident, []).append((key, ea, eb))
    out = []
    for members in groups.values():
        key, ea, eb = members[0]
        label = _label(key, [k for k in vary if k not in ACCURACY_FREE])
        label = " ".join(filter(None, [label, _cells_label(members, vary)]))
        (acc_a, why_a), (acc_b, why_b) = _accuracy_of(ea), _accuracy_of(eb)
        unavailable = "; ".join(f"{side} {w}" for side, w in (("A", why_a), ("B", why_b)) if w) or None
        if unavailable is None and _segmentation(ea) != _segmentation(eb):
            unavailable = ("one side scores masks (segmentation board), the other boxes: their mAPs are not "
                           "comparable; compare runs of the same task")
        per_class, missing = _per_class_deltas(ea, eb)
        interval, why = (None, None) if intervals is None or unavailable else intervals.paired(ea, eb)
        out.append(AccuracyDelta(label, acc_a or {}, acc_b or {}, unavailable, per_class, missing, interval, why,
                                 _other_images(ea, eb)))
    return out


class ImageSets:
    """What a paired bootstrap of two cells needs besides their files: the dataset's annotations (COCO val2017
    under `coco_dir`, or `dataset`, an annotation file as `run --dataset` takes it; else the ones the run recorded
    in its run.json) and the very images the cells scored, found again by the variant they name and checked
    against their image_id_sha256. Each detections file is evaluated once (a baseline against several runs too)."""

    def __init__(self, resamples: int, coco_dir: str | Path | None = None, dataset: str | None = None):
        self.resamples, self.coco_dir, self.dataset = resamples, coco_dir, dataset
        self._loaded: dict[tuple, tuple[Any, list[int]] | str] = {}
        self._evaluated: dict[tuple, Any] = {}  # (file, images, cap, task) -> ImageBootstrap, or why not

    def paired(self, ea: Entry, eb: Entry) -> tuple[dict | None, str | None]:
        """(the interval of B - A, None) or (None, why not)."""
        from harness.eval.bootstrap import paired_interval
        from harness.eval.coco_eval import cell_bootstrap

        files = [e.detections_file() for e in (ea, eb)]
        missing = next((f"{side}: {note}" for (path, note), side in zip(files, "AB", strict=True) if path is None),
                       None)
        if missing:
            return None, f"needs both cells' detections ({missing})"
        if (other := _other_images(ea, eb)) or not (ea.fingerprint and eb.fingerprint):
            return None, other or "needs two cells scored on the same recorded images (image_id_sha256 on both sides)"
        found = self._images(ea)
        if isinstance(found, str):
            return None, found
        coco, image_ids = found
        task = "segment" if _segmentation(ea) else "detect"
        caps = [(e.doc.get("eval") or {}).get("maxDets") or [COCO_MAX_DETS] for e in (ea, eb)]
        if caps[0][-1] != caps[1][-1]:
            return None, f"the cells were scored at different evaluation caps ({caps[0][-1]} and {caps[1][-1]})"
        for (path, _), entry, side in zip(files, (ea, eb), "AB", strict=True):
            if (replaced := entry.replaced_detections(path)) is not None:
                return None, f"{side}: {replaced}"
        digests = [_file_digest(path) for path, _ in files]
        if digests[0] is not None and digests[0] == digests[1]:
            return None, "A and B have the same detections (byte for byte): the delta is 0 on every image"
        sides = []
        for (path, _), entry, side in zip(files, (ea, eb), "AB", strict=True):
            key = (file_identity(path), entry.fingerprint, caps[0][-1], task)
            if key not in self._evaluated:
                try:
                    self._evaluated[key] = cell_bootstrap(coco, path, image_ids, "faster-coco-eval", caps[0][-1],
                                                          task)
                except (DetectionFileError, ValueError, OSError) as exc:
                    self._evaluated[key] = f"{side}'s detections could not be scored ({exc})"
            found = self._evaluated[key]
            if isinstance(found, str):
                return None, found
            # the file must be the one the cell was scored from: its figures are the submission's
            own = found.of(np.ones(found.images, dtype=np.int64))
            recorded = [_num((entry.doc.get("accuracy") or {}).get(n)) for n in ("mAP_50_95", "mAP_50")]
            if any(r is None or abs(o - r) > 1e-6 for o, r in zip(own, recorded, strict=True)):
                return None, (f"{side}'s detections file scores mAP {own[0]:.4f}, its submission records "
                              f"{recorded[0]}: not the file the cell was scored from")
            sides.append(found)
        return paired_interval(sides[0], sides[1], self.resamples), None

    def _images(self, entry: Entry) -> tuple[Any, list[int]] | str:
        """(the dataset's COCO index, the scored image ids) of a cell, or why they cannot be found."""
        block = entry.doc.get("dataset") if isinstance(entry.doc.get("dataset"), dict) else {}
        key = (block.get("id"), block.get("variant"), entry.fingerprint)
        if key not in self._loaded:
            self._loaded[key] = self._load(block, entry.fingerprint, _recorded_config(entry.run_dir))
        return self._loaded[key]

    def _load(self, block: dict, fingerprint: str, recorded: dict) -> tuple[Any, list[int]] | str:
        from harness.data.coco import CocoDataset

        name, base = block.get("variant"), block.get("base_variant") or block.get("variant")
        dataset = self.dataset or (recorded.get("dataset") if self.coco_dir is None else None)
        coco_dir = self.coco_dir or recorded.get("coco_dir")
        split = recorded.get("split")
        if dataset is not None and not self.dataset and not Path(dataset).is_absolute():
            # relative to the run's working directory: the ground truth's absolute path, as the run recorded it
            dataset, split = recorded.get("annotation_file") or dataset, recorded.get("annotation_split", split)
        if dataset is not None:
            named = "--dataset" if self.dataset else "the run's --dataset"
            source, opened = f"{named} {dataset}", (lambda: CocoDataset.from_path(dataset, split))
        elif block.get("id") == "coco2017":
            source, opened = f"COCO under {coco_dir or 'the default COCO folder'}", (lambda: CocoDataset(coco_dir))
        else:
            return (f"the cells were scored on dataset {block.get('id')!r}: give its annotation file with "
                    "--dataset PATH")
        try:
            dataset = opened()
            limit = block.get("num_images") if name != base else None
            variant = dataset.variant(str(base), limit)
        except (VaBenchError, OSError, ValueError) as exc:
            if self.dataset or self.coco_dir:  # the user's own path: bad input, not a figure the cells lack
                raise UsageError(f"--map-ci: the scored images could not be found in {source} ({exc})") from exc
            return f"the scored images could not be found in {source} ({exc})"
        if variant.image_id_sha256 != fingerprint:
            return (f"the {name} images of {source} are not the ones the cells scored (image_id_sha256 differs): "
                    "point --coco-dir or --dataset at the dataset the run used")
        return dataset.coco, list(variant.image_ids)


def _recorded_config(run_dir: Path) -> dict:
    """The run's own configuration (run.json's config), where the folder has one: where its dataset was. With it,
    `annotation_file`, the absolute path of the ground truth the run read (a YOLO dataset's YAML, read with the
    split it was: `annotation_split`; an annotation JSON, which is one split)."""
    doc, problem = read_json(run_dir / RUN_FILE) if (run_dir / RUN_FILE).is_file() else (None, None)
    config = doc.get("config") if isinstance(doc, dict) and problem is None else None
    if not isinstance(config, dict):
        return {}
    header = doc.get("dataset") if isinstance(doc.get("dataset"), dict) else {}
    if isinstance(header.get("annotation_file"), str) and Path(header["annotation_file"]).is_absolute():
        yolo = header.get("annotation_format") == "yolo"
        config = {**config, "annotation_file": header["annotation_file"],
                  "annotation_split": header.get("split") if yolo else None}
    return config


def _per_class(entry: Entry) -> tuple[dict[int, dict] | None, str | None]:
    """Category id -> {name, AP, AP50} from the cell's per_class file (eval.per_class); (None, why) when there is
    none to read."""
    rel = (entry.doc.get("eval") or {}).get("per_class") if isinstance(entry.doc.get("eval"), dict) else None
    if not isinstance(rel, str):
        return None, "names no per_class file (eval.per_class)"
    path = inside_run_folder(entry.run_dir, rel)
    if path is None:
        return None, f"names a per_class file outside its run folder ({brief(rel)})"
    if not path.is_file():
        return None, f"has no per_class file {brief(rel)}"
    doc, problem = read_json(path)
    if problem or not isinstance(doc, dict) or not isinstance(doc.get("categories"), list):
        why = problem.message if problem else "no categories list"  # the Finding's message, never its repr
        return None, f"per_class file {brief(rel)} is not readable ({why})"
    return {c["id"]: c for c in doc["categories"] if isinstance(c, dict) and isinstance(c.get("id"), int)}, None


def _per_class_deltas(ea: Entry, eb: Entry) -> tuple[list[dict], str | None]:
    """Per-category AP 50:95 of both sides (categories both evaluated), the largest |B - A| first; or no rows and
    why, when a side has no per_class file to read."""
    (a, why_a), (b, why_b) = _per_class(ea), _per_class(eb)
    if a is None or b is None:
        return [], "; ".join(f"{side} {why}" for side, why in (("A", why_a), ("B", why_b)) if why)
    rows, renamed = [], []
    for category in sorted(set(a) & set(b)):
        if a[category].get("name") != b[category].get("name"):  # one id, two classes (two datasets' numbering)
            renamed.append(f"id {category}: {a[category].get('name')} in A, {b[category].get('name')} in B")
            continue
        ap_a, ap_b = _num(a[category].get("AP")), _num(b[category].get("AP"))
        delta = None if ap_a is None or ap_b is None else ap_b - ap_a
        rows.append({"id": category, "name": a[category].get("name"), "a": ap_a, "b": ap_b, "delta": delta})
    why = (f"{len(renamed)} categories share an id but not a name ({'; '.join(renamed[:3])}"
           f"{', ...' if len(renamed) > 3 else ''})") if renamed else None
    return sorted(rows, key=lambda r: (r["delta"] is None, -abs(r["delta"] or 0))), why  # no AP on a side: last


def _cells_label(members: list[tuple[dict, Entry, Entry]], vary: list[str]) -> str:
    """'b1, b4' (plus the timing mode where it varies); 'b1 vs b2' where the batch size is what A and B differ in
    (the pairing key lacks it)."""
    keys = [k for k in ACCURACY_FREE if k in vary or k == "batch_size"]

    def one(key: dict, ea: Entry, eb: Entry) -> str:
        treatment = "" if "batch_size" in key else f"b{ea.coords['batch_size']} vs b{eb.coords['batch_size']}"
        return " ".join(filter(None, [treatment, _label(key, keys)]))

    return ", ".join(one(*member) for member in members)


def _other_images(ea: Entry, eb: Entry) -> str | None:
    """Why the two cells' accuracy is not of the same images and ground truth: another dataset, split or variant, or
    (both known) another image_id_sha256 or annotations_sha256 under the same names; None when it is, also under
    other names where both fingerprints say so."""
    # the same ground truth (its file's bytes) and image ids: the same data, whatever its folder was named (image ids
    # alone are not: every YOLO dataset of N images numbers them 1..N)
    if ea.ground_truth and ea.ground_truth == eb.ground_truth and ea.fingerprint and ea.fingerprint == eb.fingerprint:
        return None
    if ea.coords["variant"] != eb.coords["variant"] or (ea.fingerprint and eb.fingerprint
                                                        and ea.fingerprint != eb.fingerprint):
        return (f"A and B scored different image sets ({ea.coords['variant']} vs {eb.coords['variant']}, "
                f"image_id_sha256 {(ea.fingerprint or '?')[:12]} vs {(eb.fingerprint or '?')[:12]})")
    if ea.ground_truth and eb.ground_truth and ea.ground_truth != eb.ground_truth:
        return (f"A and B were scored on different ground truth (annotations_sha256 {ea.ground_truth[:12]} vs "
                f"{eb.ground_truth[:12]}: the labels changed between them)")
    return None


def _detection_rows(pairs: list[tuple[dict, Entry, Entry]], vary: list[str], iou: float,
                    conf: float) -> tuple[list[DetectionRow], list[str]]:
    """One diff per distinct pair of detection files; notes on files found in a moved run folder."""
    groups: dict[tuple, list[tuple[dict, Entry, Entry]]] = {}
    notes: list[str] = []
    for key, ea, eb in pairs:
        (pa, note_a), (pb, note_b) = ea.detections_file(), eb.detections_file()
        if other := _other_images(ea, eb):
            why = other
        elif pa is None or pb is None:
            why = "; ".join(f"{side}: {n}" for side, n, p in (("A", note_a, pa), ("B", note_b, pb)) if p is None)
        else:
            why = None
            notes += [f"{side}: {n}" for side, n in (("A", note_a), ("B", note_b)) if n]
            notes += [f"{side}: {n}; the diff is of the files as they are" for side, n in
                      (("A", ea.replaced_detections(pa)), ("B", eb.replaced_detections(pb))) if n]
        groups.setdefault((pa, pb, why), []).append((key, ea, eb))
    rows = []
    cache = _DetectionCache([p for pa, pb, why in groups if why is None for p in (pa, pb)])
    for (pa, pb, why), members in groups.items():
        label = " ".join(filter(None, [_label(members[0][0], [k for k in vary if k not in ACCURACY_FREE]),
                                       _cells_label(members, vary)]))
        if why is None:
            diff, why = cache.diff(pa, pb, iou, conf)
            rows.append(DetectionRow(label, diff, why))
        else:
            rows.append(DetectionRow(label, None, why))
    return rows, sorted(set(notes))


def _pair_cells(a: list[Entry], b: list[Entry]
                ) -> tuple[dict[str, tuple], list[tuple[dict, Entry, Entry]], list[str], list[str]]:
    """(treatment, pairs, only in A, only in B). The treatment is every coordinate constant within each
    side but different between them; cells pair on all the other coordinates."""
    keys = [k for k, _ in COORDS]
    values_a = {k: {e.coords[k] for e in a} for k in keys}
    values_b = {k: {e.coords[k] for e in b} for k in keys}
    treatment = {k: (next(iter(values_a[k])), next(iter(values_b[k]))) for k in keys
                 if len(values_a[k]) == len(values_b[k]) == 1 and values_a[k] != values_b[k]}
    pair_keys = [k for k in keys if k not in treatment]

    def pairs_on(on: list[str]) -> list[tuple[dict, Entry, Entry]]:
        index_b = {tuple(e.coords[k] for k in on): e for e in b}
        return [({k: ea.coords[k] for k in on}, ea, index_b[tuple(ea.coords[k] for k in on)])
                for ea in sorted(a, key=lambda e: tuple(str(e.coords[k]) for k in keys))
                if tuple(ea.coords[k] for k in on) in index_b]

    pairs = pairs_on(pair_keys)
    if "protocol" in pair_keys and len(values_a["protocol"] | values_b["protocol"]) > 1:
        # thresholds that vary within a side (each family's own defaults) and change between the sides pair
        # nothing on them: cells then pair without them where that is unambiguous, each pair's change said
        loose = [k for k in pair_keys if k != "protocol"]
        unique = all(len({tuple(e.coords[k] for k in loose) for e in side}) == len(side) for side in (a, b))
        if unique and len(pairs_on(loose)) > len(pairs):
            pair_keys, pairs = loose, pairs_on(loose)

    def pair_key(e: Entry) -> tuple:
        return tuple(e.coords[k] for k in pair_keys)

    paired = {pair_key(ea) for _, ea, _ in pairs}
    # name unpaired cells by the coordinates that vary at all
    name_keys = [k for k in pair_keys if len(values_a[k] | values_b[k]) > 1] or ["batch_size"]
    only_a = [_label(e.coords, name_keys) for e in a if pair_key(e) not in paired]
    only_b = [_label(e.coords, name_keys) for e in b if pair_key(e) not in paired]
    return treatment, pairs, only_a, only_b


def compare_sides(a: Side, b: Side, iou: float = 0.5, conf: float = 0.4, alpha: float = ALPHA,
                  intervals: ImageSets | None = None) -> Comparison:
    """Pair the cells of A and B and compute every delta (with `intervals`, the paired bootstrap interval of each
    accuracy delta over the images)."""
    if not 0 < iou <= 1:
        raise UsageError(f"--pair-iou {iou}: must be in (0, 1]")
    if not 0 <= conf <= 1:
        raise UsageError(f"--diff-conf {conf}: must be in [0, 1]")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha {alpha}: must be in (0, 1)")
    out = Comparison(a.label, b.label)
    if a.detections or b.detections:
        if not (a.detections and b.detections):
            raise UsageError("compare a COCO detections file with another detections file, not with a run "
                             f"({a.label} vs {b.label})")
        det, why = _DetectionCache([a.detections, b.detections]).diff(a.detections, b.detections, iou, conf)
        if why is not None:  # the two files are all there is to compare: one that holds no COCO detections is bad
            side, _, problem = why.partition(": ")  # input, not an "unavailable" diff and exit 0
            raise UsageError(f"{(a if side == 'A' else b).label}: {problem}; pass two COCO detections files (JSON "
                             "lists of {image_id, category_id, bbox, score})")
        out.detections.append(DetectionRow("detection files", det, why))
        out.notes.append("detection files carry no COCO metrics, timings or image list: compared the detections "
                         "on the images either file has")
        if intervals is not None:
            out.notes.append("--map-ci needs run folders or submission files (their images and mAP): no interval "
                             "for bare detections files")
        return out
    same_files = {e.path.resolve() for e in a.entries} == {e.path.resolve() for e in b.entries}
    if a.entries and same_files:  # a gate pointed at one run twice passes whatever the run measured
        out.notes.append("A and B are the same submission files: every delta is 0 by construction, and a gate "
                         "cannot fail; give the run to compare against as A")
    for side in (a, b):
        if side.unfinished:
            out.notes.append(f"{side.label}: {len(side.unfinished)} cell(s) of its run did not end ok: "
                             f"{', '.join(side.unfinished)}")
        if side.superseded:
            out.notes.append(f"{side.label}: {side.superseded} older submission(s) of a repeated cell ignored "
                             "(latest timestamp wins)")
        if side.clashes:
            out.notes.append(f"{side.label}: {len(side.clashes)} cell(s) share their coordinates with a later one "
                             "and differ in weights, thresholds or runtime.backend; not compared: "
                             f"{', '.join(side.clashes)}")
    out.differ, pairs, out.only_a, out.only_b = _pair_cells(a.entries, b.entries)
    keyed = [k for k, _ in COORDS if k not in out.differ and (not pairs or k in pairs[0][0])]  # paired on
    vary = [k for k in keyed if len({key[k] for key, _, _ in pairs}) > 1]
    out.same = {k: pairs[0][0][k] for k in keyed if k not in vary} if pairs else {}
    if not pairs:
        out.notes.append("no cell of A has a counterpart in B: nothing to compare (see only in A / only in B)")
        return out
    label_keys = vary if "batch_size" in vary else [*vary, "batch_size"]
    treatment = "b{} vs b{}".format(*out.differ["batch_size"]) if "batch_size" in out.differ else ""
    out.cells = [_cell_delta(_label(key, label_keys) or treatment, key, ea, eb, alpha) for key, ea, eb in pairs]
    out.notes += timing_warning_notes(out)
    out.accuracy = _accuracy_deltas(pairs, vary, intervals)
    out.detections, notes = _detection_rows(pairs, vary, iou, conf)
    out.notes += notes
    out.notes += [f"{_label(key, label_keys) or treatment}: scored at another protocol ({ea.coords['protocol']} -> "
                  f"{eb.coords['protocol']}): its accuracy deltas are the protocol's too"
                  for key, ea, eb in pairs if "protocol" not in key and "protocol" not in out.differ
                  and ea.coords["protocol"] != eb.coords["protocol"]]
    if any(_other_images(ea, eb) for _, ea, eb in pairs):
        out.notes.append("A and B scored different image sets or ground truth: accuracy deltas mix model and data "
                         "differences")
    return out


def compare_paths(baseline: str | Path, others: list[str | Path], iou: float = 0.5, conf: float = 0.4,
                  alpha: float = ALPHA, intervals: ImageSets | None = None) -> list[Comparison]:
    """The baseline against each other path."""
    base = load_side(baseline)
    return [compare_sides(base, load_side(p), iou, conf, alpha, intervals) for p in others]
