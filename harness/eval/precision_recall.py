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
    """One category's detections over the evaluated images, as COCO's matching at each IoU threshold collected
    takes them."""

    scores: list[np.ndarray] = field(default_factory=list)  # in image order, each image's highest first, to the cap
    images: list[np.ndarray] = field(default_factory=list)  # each detection's image id
    true_positive: list[np.ndarray] = field(default_factory=list)  # [T, n]: matched to a ground truth that counts
    counted: list[np.ndarray] = field(default_factory=list)  # [T, n]: not matched to a crowd region
    by_image: dict[int, int] = field(default_factory=dict)  # image id -> its non-crowd ground truths of the category

    @property
    def ground_truths(self) -> int:
        """The non-crowd ground truths of the category among the evaluated images."""
        return sum(self.by_image.values())


class MatchCollector:
    """Each category's matches at the IoU thresholds asked (the operating point's 0.50; COCO's ten for the
    bootstrap of mAP), gathered from evaluated COCOevals (one per group of categories) so that the classes are
    summarised together. The IoUs are the evaluator's own (`coco_eval.ious`, which pycocotools and faster-coco-eval
    both keep after `evaluate()`, detections highest score first); the matching is COCOeval's evaluateImg, which
    faster-coco-eval runs in C++ out of Python's reach."""

    def __init__(self, thresholds: tuple[float, ...] = (IOU,)) -> None:
        self.thresholds = thresholds
        self.classes: dict[int, ClassMatches] = {}

    def row(self, threshold: float) -> int:
        """The index of an IoU threshold in the collected [T, n] arrays."""
        return int(np.flatnonzero(np.isclose(self.thresholds, threshold))[0])

    def add(self, coco_eval, detections: tuple[np.ndarray, np.ndarray, np.ndarray],
            ground_truths: dict[int, dict[int, int]], cap: int) -> None:
        """The matches of one evaluated COCOeval: `detections`, (category, image, score) of its categories on its
        images; `ground_truths`, each of its categories' non-crowd ground truths per image.

        Within an (image, category) pair the evaluator's IoU rows are its detections highest score first, so the
        k-th row is the pair's k-th highest score whatever the order of equal scores: the scores come from the
        results file, and only pairs holding a ground truth are matched (the rest are false positives, in bulk)."""
        category, image, score = detections
        order = np.lexsort((-score, image, category))
        category, image, score = category[order], image[order], score[order]
        first = np.ones(len(score), dtype=bool)
        first[1:] = (category[1:] != category[:-1]) | (image[1:] != image[:-1])
        starts = np.flatnonzero(first)
        ends = np.append(starts[1:], len(score))
        keep = min(cap, max(coco_eval.params.maxDets))
        kept = np.arange(len(score)) - np.repeat(starts, ends - starts) < keep  # each pair's top detections
        true_positive = np.zeros((len(self.thresholds), len(score)), dtype=bool)
        ignored = np.zeros((len(self.thresholds), len(score)), dtype=bool)
        ground_truths_of = _ground_truths_of(coco_eval)
        pairs = zip(image[starts].tolist(), category[starts].tolist(), strict=True)
        for start, end, pair in zip(starts.tolist(), np.minimum(ends, starts + keep).tolist(), pairs, strict=True):
            ious = coco_eval.ious.get(pair, [])
            if len(ious) == 0:  # no ground truth of the category on the image: every detection a false positive
                continue
            crowd = np.asarray([bool(g.get("iscrowd", 0)) for g in ground_truths_of(*pair)])
            for t, threshold in enumerate(self.thresholds):
                true_positive[t, start:end], ignored[t, start:end], _ = coco_match(np.asarray(ious)[:end - start],
                                                                                   crowd, threshold)
        category, score, image = category[kept], score[kept], image[kept]
        true_positive, ignored = true_positive[:, kept], ignored[:, kept]
        bounds = np.flatnonzero(np.diff(category)) + 1
        by_category = {int(c[0]): (s, i, t, ~g) for c, s, i, t, g in zip(
            np.split(category, bounds), np.split(score, bounds), np.split(image, bounds),
            np.split(true_positive, bounds, axis=1), np.split(ignored, bounds, axis=1), strict=True) if len(c)}
        for c, counts in ground_truths.items():
            matches = self.classes.setdefault(int(c), ClassMatches())
            matches.by_image.update(counts)
            if c in by_category:  # one array per category and group: a dataset of small arrays costs more
                scores, images, tp, counted = by_category[c]
                matches.scores.append(scores)
                matches.images.append(images)
                matches.true_positive.append(tp)
                matches.counted.append(counted)


def _ground_truths_of(coco_eval):
    """An (image, category) pair's ground truths in the order of the evaluator's IoU columns."""
    if hasattr(coco_eval, "gt_dataset"):  # faster-coco-eval
        return lambda image, category: coco_eval.gt_dataset.get_instances([image], [category], True)[0][0]
    return lambda image, category: coco_eval._gts[image, category]


def coco_match(ious: np.ndarray, crowd: np.ndarray,
               threshold: float = IOU) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """COCOeval.evaluateImg's greedy matching at one IoU threshold of detections (rows, highest score first) to
    ground truths (columns, the pair's order): each takes the still unmatched ground truth of highest IoU >= the
    threshold, a non-crowd one before any crowd region (crowd regions match any number of times). Returns (true
    positive, ignored: matched to a crowd region, the column each detection took or -1)."""
    columns = np.argsort(crowd, kind="mergesort")  # non-crowd ground truths first, as evaluateImg sorts them
    ious, crowd = ious[:, columns], crowd[columns]
    taken = np.zeros(len(crowd), dtype=bool)
    true_positive = np.zeros(len(ious), dtype=bool)
    ignored = np.zeros(len(ious), dtype=bool)
    took = np.full(len(ious), -1, dtype=np.int64)
    for d, row in enumerate(ious):
        best_iou, m = min(threshold, 1 - 1e-10), -1
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
            ignored[d], true_positive[d], took[d] = crowd[m], not crowd[m], columns[m]
    return true_positive, ignored, took


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


def _sorted_class(matches: ClassMatches, t: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores highest first, cumulative true positives) of a category's counted detections at the t-th threshold
    collected, ordered as COCOeval's accumulate orders them (a stable sort of the images' lists in image order)."""
    if not matches.scores:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    scores = np.concatenate(matches.scores)
    true_positive = np.concatenate([a[t] for a in matches.true_positive])
    counted = np.concatenate([a[t] for a in matches.counted])
    order = np.argsort(-scores, kind="mergesort")
    keep = order[counted[order]]
    return scores[keep], np.cumsum(true_positive[keep])


def operating_point(collector: MatchCollector) -> OperatingPoint | None:
    """The best-mean-F1 operating point over the collected classes; None when no class has ground truth."""
    classes = {c: m for c, m in sorted(collector.classes.items()) if m.ground_truths > 0}
    if not classes:
        return None
    t = collector.row(IOU)
    sorted_classes = {c: _sorted_class(m, t) for c, m in classes.items()}
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
    f1_sum = _f1_sum(sorted_classes, {c: m.ground_truths for c, m in classes.items()}, thresholds)
    # the first maximum: the lowest score, the most recall at that F1 (equal F1s differ in their last bits)
    best = int(np.argmax(f1_sum >= f1_sum.max() - 1e-12 * len(classes)))
    at = thresholds[best:best + 1]
    per_class = {}
    for c, (scores, cum_tp) in sorted_classes.items():
        precision, recall, f1 = (float(v[0]) for v in _at(scores, cum_tp, classes[c].ground_truths, at))
        per_class[c] = {"precision": precision, "recall": recall, "F1": f1}
    mean = {k: float(np.mean([v[k] for v in per_class.values()])) for k in ("precision", "recall", "F1")}
    return OperatingPoint(float(at[0]), mean["precision"], mean["recall"], mean["F1"], len(classes), per_class, curve)


def _f1_sum(sorted_classes: dict[int, tuple[np.ndarray, np.ndarray]], ground_truths: dict[int, int],
            thresholds: np.ndarray) -> np.ndarray:
    """The classes' F1 summed at each of `thresholds` (ascending, every class's scores among them). A class's F1
    only changes at its own scores, so each class adds its steps there and one cumulative sum over all thresholds
    gives the totals: the detections' count times log, where each class at every threshold would be classes times
    thresholds (minutes for hundreds of classes)."""
    positions, steps = [], []
    for c, (scores, cum_tp) in sorted_classes.items():
        if not scores.size:
            continue
        distinct = np.flatnonzero(np.append(scores[1:] != scores[:-1], True))  # the last of each equal score
        f1 = _at(scores, cum_tp, ground_truths[c], scores[distinct])[2]  # keeping each score and those above
        positions.append(np.searchsorted(thresholds, scores[distinct]))
        steps.append(np.diff(f1, prepend=0.0))  # from the highest score down: what the class adds at each
    if not positions:
        return np.zeros(thresholds.size)
    added = np.zeros(thresholds.size)
    np.add.at(added, np.concatenate(positions), np.concatenate(steps))
    return np.cumsum(added[::-1])[::-1]  # at a threshold: every step at it or above it


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
