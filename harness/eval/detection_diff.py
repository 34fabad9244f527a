"""Detection diff of two COCO-format detection sets.

Greedy pairing per image and class: A's detections in descending score order each take the
unpaired B detection of the same class with the highest IoU >= the threshold. Greedy pairing keeps a
shifted detection count from cascading into false mismatches. Torch-free (numpy + pycocotools'
box IoU), so `va-bench compare` can run where torch is not installed. harness/eval/matching.py pairs
the same way for a run's batch invariance, where a pair also needs its scores within a tolerance and
every candidate pair is listed at once (thousands of images a cell); it reads ImageDetections, this
module COCO result files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pycocotools import mask as mask_utils

from harness.errors import json_problem
from harness.json_stream import NotAJsonArray, iter_json_array, read_json_text


class DetectionFileError(ValueError):
    """A detections file that cannot be read as COCO results; the message says why."""


@dataclass(frozen=True)
class DetectionSet:
    """COCO results as columns: one row per detection, boxes [x, y, w, h] in image pixels; `masks` the COCO RLEs
    when every result has one (instance segmentation)."""

    image_ids: np.ndarray  # int64 [N]
    category_ids: np.ndarray  # int64 [N]
    boxes: np.ndarray  # float64 [N, 4]
    scores: np.ndarray  # float64 [N]
    masks: list[dict] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    def above(self, conf: float) -> DetectionSet:
        """Only the detections scoring at least `conf`."""
        keep = self.scores >= conf
        masks = None if self.masks is None else [self.masks[i] for i in np.flatnonzero(keep).tolist()]
        return DetectionSet(self.image_ids[keep], self.category_ids[keep], self.boxes[keep], self.scores[keep], masks)


def _number(value, what: str, index: int) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise DetectionFileError(f"detection {index}: {what} is {value!r}, not a finite number")
    return float(value)


def parse_coco_detections(results) -> DetectionSet:
    """COCO results (list of {image_id, category_id, bbox [x,y,w,h], score}) -> columns; strict."""
    if not isinstance(results, list):
        raise DetectionFileError(f"expected a JSON list of COCO detections, found {type(results).__name__}")
    columns = _Columns()
    for i, r in enumerate(results):
        columns.add(r, i)
    return columns.finish()


class _Columns:
    """Checked COCO results gathered into columns, one result at a time."""

    def __init__(self):
        self.ids, self.cats, self.boxes, self.scores, self.masks = [], [], [], [], []
        self.count = 0

    def add(self, r, i: int) -> None:
        """Result `i`, checked (DetectionFileError names what is wrong with it), appended to the columns."""
        if not isinstance(r, dict):
            raise DetectionFileError(f"detection {i} is {type(r).__name__}, not an object")
        missing = [k for k in ("image_id", "category_id", "bbox", "score") if k not in r]
        if missing:
            raise DetectionFileError(f"detection {i} has no {', '.join(missing)}")
        for key, bucket in (("image_id", self.ids), ("category_id", self.cats)):
            if isinstance(r[key], bool) or not isinstance(r[key], int):
                raise DetectionFileError(f"detection {i}: {key} is {r[key]!r}, not an integer")
            bucket.append(r[key])
        bbox = r["bbox"]
        if not isinstance(bbox, list) or len(bbox) != 4:
            raise DetectionFileError(f"detection {i}: bbox is not a list [x, y, w, h]")
        self.boxes.extend(_number(v, "a bbox value", i) for v in bbox)
        self.scores.append(_number(r["score"], "score", i))
        if "segmentation" in r:
            self.masks.append(_rle(r["segmentation"], i))
        self.count += 1

    def finish(self) -> DetectionSet:
        """The columns gathered, as a DetectionSet: masks for every result or for none."""
        if self.masks and len(self.masks) != self.count:
            raise DetectionFileError(f"{len(self.masks)} of {self.count} detections have a segmentation; a results "
                                     "file has masks for every detection or for none")
        return DetectionSet(np.asarray(self.ids, dtype=np.int64), np.asarray(self.cats, dtype=np.int64),
                            np.asarray(self.boxes, dtype=np.float64).reshape(-1, 4),
                            np.asarray(self.scores, dtype=np.float64), self.masks or None)


def _rle(value, index: int) -> dict:
    """A compressed COCO RLE ({"size": [h, w], "counts": str}), checked."""
    size = value.get("size") if isinstance(value, dict) else None
    if not (isinstance(size, list) and len(size) == 2 and all(isinstance(v, int) and v >= 0 for v in size)
            and isinstance(value.get("counts"), str)):
        raise DetectionFileError(f"detection {index}: segmentation is not a COCO RLE {{size: [h, w], counts: str}}")
    return value


def _reject_constant(name: str):
    raise DetectionFileError(f"{name} is not a JSON number")


def load_coco_detections(path: Path) -> DetectionSet:
    """Read and check a COCO detections JSON file; DetectionFileError says what is wrong. Parsed one result at a
    time into columns (json.loads of a full-val file would hold a dict per detection, ~0.6 KB each, at once)."""
    try:
        text = read_json_text(path)
    except OSError as exc:
        raise DetectionFileError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise DetectionFileError(f"{path} is not valid JSON ({json_problem(exc)})") from exc
    decoder = json.JSONDecoder(parse_constant=_reject_constant)
    columns = _Columns()
    try:
        for item in iter_json_array(text, decoder):
            columns.add(item, columns.count)
    except DetectionFileError:
        raise
    except NotAJsonArray:  # whatever it is, said as the whole-document reading says it
        return parse_coco_detections(_whole(text, path, decoder))
    except ValueError as exc:
        raise DetectionFileError(f"{path} is not valid JSON ({json_problem(exc)})") from exc
    except RecursionError as exc:
        raise DetectionFileError(f"{path} is not valid JSON ({json_problem(exc)})") from exc
    return columns.finish()


def _whole(text: str, path: Path, decoder: json.JSONDecoder):
    """The whole document, decoded at once (one that is not an array: only to say what it is)."""
    try:
        return decoder.decode(text)
    except (ValueError, RecursionError) as exc:
        raise DetectionFileError(f"{path} is not valid JSON ({json_problem(exc)})") from exc


@dataclass(frozen=True)
class DetectionDiff:
    """How detections B reproduce detections A at a score cut."""

    images: int  # images with at least one detection (any score) in A or B
    conf: float
    iou: float
    detections_a: int  # at or above the cut
    detections_b: int
    matched: int
    conf_deltas: tuple[float, ...]  # |score A - score B| of every matched pair
    iou_type: str = "bbox"  # "segm": both sides have masks, paired by mask IoU

    @property
    def matched_share(self) -> float:
        """Matched pairs over the larger detection count (1.0 when both are empty)."""
        denom = max(self.detections_a, self.detections_b)
        return 1.0 if denom == 0 else self.matched / denom

    @property
    def unmatched_a(self) -> int:
        return self.detections_a - self.matched

    @property
    def unmatched_b(self) -> int:
        return self.detections_b - self.matched

    def conf_delta_stats(self) -> dict[str, float] | None:
        """Mean, p95 and max |Δconf| over matched pairs; None without pairs."""
        if not self.conf_deltas:
            return None
        d = np.asarray(self.conf_deltas)
        return {"mean": float(d.mean()), "p95": float(np.percentile(d, 95)), "max": float(d.max())}

    def to_dict(self) -> dict:
        return {"status": "ok", "images": self.images, "conf": self.conf, "iou": self.iou, "iou_type": self.iou_type,
                "detections_a": self.detections_a, "detections_b": self.detections_b, "matched": self.matched,
                "matched_share": self.matched_share, "unmatched_a": self.unmatched_a,
                "unmatched_b": self.unmatched_b, "abs_conf_delta": self.conf_delta_stats()}


def _pair(boxes_a, scores_a: np.ndarray, boxes_b, iou_thr: float) -> list[tuple[int, int]]:
    """Greedy pairs (i, j) of one image and class; `boxes_*` are [x, y, w, h] rows or COCO RLE masks."""
    iou = np.asarray(mask_utils.iou(boxes_a, boxes_b, [0] * len(boxes_b)), dtype=np.float64)
    iou = iou.reshape(len(boxes_a), len(boxes_b))
    # a box clipped to zero area (or an empty mask) has IoU 0 even with itself (pycocotools): identical ones pair
    if isinstance(boxes_a, np.ndarray):
        identical = (boxes_a[:, None, :] == boxes_b[None, :, :]).all(axis=-1)
    else:
        identical = np.array([[ma == mb for mb in boxes_b] for ma in boxes_a], dtype=bool).reshape(iou.shape)
    iou = np.where(identical, 1.0, iou)
    taken = np.zeros(len(boxes_b), dtype=bool)
    pairs = []
    for i in np.argsort(-scores_a, kind="stable"):
        candidates = np.flatnonzero(~taken & (iou[i] >= iou_thr))
        if candidates.size:
            j = candidates[np.argmax(iou[i, candidates])]
            taken[j] = True
            pairs.append((int(i), int(j)))
    return pairs


def _groups(d: DetectionSet) -> dict[tuple[int, int], np.ndarray]:
    """Row indices per (image, category)."""
    order = np.lexsort((d.category_ids, d.image_ids))
    keys = np.stack([d.image_ids[order], d.category_ids[order]], axis=1)
    if len(keys) == 0:
        return {}
    starts = np.flatnonzero(np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)])
    return {(int(keys[s, 0]), int(keys[s, 1])): rows
            for s, rows in zip(starts, np.split(order, starts[1:]), strict=True)}


def diff_detections(a: DetectionSet, b: DetectionSet, iou: float = 0.5, conf: float = 0.4) -> DetectionDiff:
    """Pair A's and B's detections scoring >= conf, per image and class, at IoU >= iou: the masks' IoU where both
    sets have masks, else the boxes'."""
    images = len(np.union1d(a.image_ids, b.image_ids))
    a, b = a.above(conf), b.above(conf)
    segm = a.masks is not None and b.masks is not None
    groups_b = _groups(b)
    deltas: list[float] = []
    for key, rows_a in _groups(a).items():
        rows_b = groups_b.get(key)
        if rows_b is None:
            continue
        if segm:
            shapes_a, shapes_b = [a.masks[k] for k in rows_a.tolist()], [b.masks[k] for k in rows_b.tolist()]
        else:
            shapes_a, shapes_b = a.boxes[rows_a], b.boxes[rows_b]
        for i, j in _pair(shapes_a, a.scores[rows_a], shapes_b, iou):
            deltas.append(abs(float(a.scores[rows_a[i]]) - float(b.scores[rows_b[j]])))
    return DetectionDiff(images, conf, iou, len(a), len(b), len(deltas), tuple(deltas), "segm" if segm else "bbox")
