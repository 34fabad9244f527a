"""Precision and recall beside COCO's mAP: the averaged precision-recall curves of an accumulated COCOeval, and the
operating point a deployment would pick (the confidence at which the classes' mean F1 is highest) with each class's
precision, recall and F1 there.

mAP summarises a detector over every confidence; someone shipping it runs it at one. The operating point follows
faster-coco-eval's `extended_metrics` definition (the mean over classes of F1, maximised over the detections' own
scores; precision and recall not interpolated; Ultralytics' validator smooths an interpolated F1 curve instead), on
COCO's matching: IoU 0.50, area "all", each image's top detections up to the evaluation cap, a detection matched to
a crowd region neither a true nor a false positive (COCOeval's ignore). Written by hand because no library computes
it over a subset of a dataset's images with COCO's crowd and cap rules: faster-coco-eval's counts every ground truth
of the annotation file and every detection matched at any IoU threshold (several per object: recall above 1 with
duplicate detections), and is quadratic in the number of distinct scores."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

IOU = 0.5  # the operating point's IoU threshold (COCO's AP50 matches)
CONFIDENCE_GRID = tuple(round(0.01 * k, 2) for k in range(101))  # the confidence curve's thresholds


@dataclass
class ClassMatches:
    """One category's detections over the evaluated images, as COCO's matching at IoU 0.50 takes them."""

    scores: list[np.ndarray] = field(default_factory=list)  # in image order, each image's highest first, to the cap
    true_positive: list[np.ndarray] = field(default_factory=list)  # matched to a ground truth that counts
    counted: list[np.ndarray] = field(default_factory=list)  # not matched to a crowd region
    ground_truths: int = 0  # the non-crowd ground truths of the category among the evaluated images


class MatchCollector:
    """Each category's matches at IoU 0.50, gathered from evaluated COCOevals (one per group of categories) so that
    the operating point is found over every category at once. The IoUs are the evaluator's own (`coco_eval.ious`,
    which pycocotools and faster-coco-eval both keep after `evaluate()`, detections highest score first); the
    matching is COCOeval's evaluateImg at one threshold, which faster-coco-eval runs in C++ out of Python's reach."""

    def __init__(self) -> None:
        self.classes: dict[int, ClassMatches] = {}

    def add(self, coco_eval, pairs: list[tuple[int, int]], ground_truths: dict[int, int], cap: int) -> None:
        """The matches of one evaluated COCOeval: `pairs`, the (image, category) pairs holding a detection, in image
        order; `ground_truths`, each of its categories' non-crowd ground truths among its images."""
        instances = _instances(coco_eval)
        keep = min(cap, max(coco_eval.params.maxDets))
        per_class: dict[int, tuple[list, list, list]] = {}
        for image, category in pairs:
            gts, dts = instances(image, category)
            if not dts:
                continue
            order = np.argsort([-d["score"] for d in dts], kind="mergesort")[:keep]  # the IoUs' row order
            scores = np.asarray([dts[i]["score"] for i in order], dtype=np.float64)
            ious = coco_eval.ious.get((image, category), [])
            if len(ious) == 0:  # no ground truth of the category on the image: every detection is a false positive
                true_positive, ignored = np.zeros(len(scores), dtype=bool), np.zeros(len(scores), dtype=bool)
            else:
                crowd = np.asarray([bool(g.get("iscrowd", 0)) for g in gts])
                true_positive, ignored = _match(np.asarray(ious)[:len(scores)], crowd)
            lists = per_class.setdefault(int(category), ([], [], []))
            lists[0].append(scores)
            lists[1].append(true_positive)
            lists[2].append(~ignored)
        for category, count in ground_truths.items():
            matches = self.classes.setdefault(int(category), ClassMatches())
            matches.ground_truths += count
            if category in per_class:  # one array per category and group: a dataset of small arrays costs more
                scores, true_positive, counted = per_class[category]
                matches.scores.append(np.concatenate(scores))
                matches.true_positive.append(np.concatenate(true_positive))
                matches.counted.append(np.concatenate(counted))


def _instances(coco_eval):
    """(ground truths, detections) of an (image, category) pair as the evaluator listed them for its IoUs."""
    if hasattr(coco_eval, "gt_dataset"):  # faster-coco-eval
        def instances(image: int, category: int):
            return (coco_eval.gt_dataset.get_instances([image], [category], True)[0][0],
                    coco_eval.dt_dataset.get_instances([image], [category], True)[0][0])
        return instances
    return lambda image, category: (coco_eval._gts[image, category], coco_eval._dts[image, category])


def _match(ious: np.ndarray, crowd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """COCOeval.evaluateImg's greedy matching at IoU 0.50 of detections (rows, highest score first) to ground
    truths (columns, the pair's order): each takes the still unmatched ground truth of highest IoU >= 0.50, a
    non-crowd one before any crowd region (crowd regions match any number of times). Returns (true positive,
    ignored: matched to a crowd region)."""
    columns = np.argsort(crowd, kind="mergesort")  # non-crowd ground truths first, as evaluateImg sorts them
    ious, crowd = ious[:, columns], crowd[columns]
    taken = np.zeros(len(crowd), dtype=bool)
    true_positive = np.zeros(len(ious), dtype=bool)
    ignored = np.zeros(len(ious), dtype=bool)
    for d, row in enumerate(ious):
        best_iou, m = min(IOU, 1 - 1e-10), -1
        for g in range(len(crowd)):
            if taken[g] and not crowd[g]:
                continue
            if m > -1 and not crowd[m] and crowd[g]:
                break
            if row[g] < best_iou:
                continue
            best_iou, m = row[g], g
        if m > -1:
            taken[m] = True
            ignored[d], true_positive[d] = crowd[m], not crowd[m]
    return true_positive, ignored


@dataclass
class OperatingPoint:
    """The confidence with the highest mean F1 over the classes that have ground truth, and the means there."""

    confidence: float | None  # None: no detection counted (no threshold to pick)
    precision: float
    recall: float
    f1: float
    classes: int  # the classes averaged: those with a non-crowd ground truth among the evaluated images
    per_class: dict[int, dict[str, float]]  # category id -> precision, recall, F1 at that confidence
    # the classes' mean precision, recall and F1 keeping the detections >= each of CONFIDENCE_GRID
    confidence_curve: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The point as a submission carries it (the curve stays in the per_class file)."""
        return {"confidence": None if self.confidence is None else round(self.confidence, 6),
                "precision": round(self.precision, 6), "recall": round(self.recall, 6), "F1": round(self.f1, 6),
                "classes": self.classes, "iou": IOU, "area": "all",
                "rule": "the detection score with the highest mean F1 over the classes (the lowest such score at a "
                        "tie); precision and recall are the classes' means there, not interpolated"}


def _sorted_class(matches: ClassMatches) -> tuple[np.ndarray, np.ndarray]:
    """(scores highest first, cumulative true positives) of a category's counted detections, ordered as
    COCOeval's accumulate orders them (a stable sort of the images' lists in image order)."""
    if not matches.scores:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    scores = np.concatenate(matches.scores)
    true_positive = np.concatenate(matches.true_positive)
    counted = np.concatenate(matches.counted)
    order = np.argsort(-scores, kind="mergesort")
    keep = order[counted[order]]
    return scores[keep], np.cumsum(true_positive[keep])


def operating_point(collector: MatchCollector) -> OperatingPoint | None:
    """The best-mean-F1 operating point over the collected classes; None when no class has ground truth."""
    classes = {c: m for c, m in sorted(collector.classes.items()) if m.ground_truths > 0}
    if not classes:
        return None
    sorted_classes = {c: _sorted_class(m) for c, m in classes.items()}
    thresholds = np.unique(np.concatenate([s for s, _ in sorted_classes.values()] + [np.zeros(0)]))  # ascending
    grid = np.asarray(CONFIDENCE_GRID)
    sums = np.zeros((3, grid.size))
    for c, (scores, cum_tp) in sorted_classes.items():
        sums += np.stack(_at(scores, cum_tp, classes[c].ground_truths, grid))
    curve = {"confidence": list(CONFIDENCE_GRID),
             **{k: [round(float(v), 6) for v in row / len(classes)] for k, row in zip(("precision", "recall", "F1"),
                                                                                       sums, strict=True)}}
    if thresholds.size == 0:
        return OperatingPoint(None, 0.0, 0.0, 0.0, len(classes),
                              {c: {"precision": 0.0, "recall": 0.0, "F1": 0.0} for c in classes}, curve)
    f1_sum = np.zeros(thresholds.size)
    for c, (scores, cum_tp) in sorted_classes.items():
        f1_sum += _at(scores, cum_tp, classes[c].ground_truths, thresholds)[2]
    # the first maximum: the lowest score, the most recall at that F1 (equal F1s differ in their last bits)
    best = int(np.argmax(f1_sum >= f1_sum.max() - 1e-12 * len(classes)))
    at = thresholds[best:best + 1]
    per_class = {}
    for c, (scores, cum_tp) in sorted_classes.items():
        precision, recall, f1 = (float(v[0]) for v in _at(scores, cum_tp, classes[c].ground_truths, at))
        per_class[c] = {"precision": precision, "recall": recall, "F1": f1}
    mean = {k: float(np.mean([v[k] for v in per_class.values()])) for k in ("precision", "recall", "F1")}
    return OperatingPoint(float(at[0]), mean["precision"], mean["recall"], mean["F1"], len(classes), per_class, curve)


def _at(scores: np.ndarray, cum_tp: np.ndarray, ground_truths: int,
        thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall and F1 of one class keeping its detections scoring >= each threshold (precision 0 where it
    keeps none)."""
    kept = np.searchsorted(-scores, -thresholds, side="right")  # scores are descending: how many are >= threshold
    tp = np.where(kept > 0, cum_tp[np.maximum(kept - 1, 0)] if cum_tp.size else 0, 0).astype(np.float64)
    precision = np.divide(tp, kept, out=np.zeros_like(tp), where=kept > 0)
    recall = tp / ground_truths
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    return precision, recall, f1


def pr_curves(coco_eval_eval: dict, params, cap: int) -> dict:
    """COCO's interpolated precision at its 101 recall points, averaged over the classes with ground truth, at IoU
    0.50, 0.75 and averaged over 0.50:0.95 (area "all", at the cap); a curve's mean is that mAP. Empty when no class
    has ground truth."""
    precision = coco_eval_eval["precision"][:, :, :, list(params.areaRngLbl).index("all"),
                                            list(params.maxDets).index(cap)]  # [T, R, K]
    valid = (precision > -1).all(axis=(0, 1))  # a class without ground truth is -1 throughout
    if not valid.any():
        return {}
    iou_thrs = np.asarray(params.iouThrs)
    by_class = precision[:, :, valid]
    curves = {"0.50": by_class[np.isclose(iou_thrs, 0.5)][0].mean(axis=1),
              "0.75": by_class[np.isclose(iou_thrs, 0.75)][0].mean(axis=1),
              "0.50:0.95": by_class.mean(axis=(0, 2))}
    return {"recall": [round(float(r), 2) for r in params.recThrs], "classes": int(valid.sum()),
            "precision": {k: [round(float(v), 6) for v in curve] for k, curve in curves.items()}}
