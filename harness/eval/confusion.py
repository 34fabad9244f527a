"""The confusion matrix of a cell's boxes at its operating point: where each class's misses and false positives went.

Rows are the ground truth's classes, columns the detections' (sklearn's orientation), each with a last "background"
entry: a ground truth no detection found is (class, background), a detection on no object (background, class).
Built in two passes over each image's detections scoring at least the operating point's confidence (each image and
category's best up to the evaluation cap, as COCOeval keeps them):

1. COCO's own matching at IoU 0.50 (`precision_recall.coco_match` on pycocotools' box IoUs, crowd regions
   included): the diagonal. Each class's diagonal is then its true positives at the operating point, its row sum its
   ground truths and its column sum its counted detections, so recall = diagonal / row and precision = diagonal /
   column, the per_class file's figures.
2. What is left of both, matched across classes, highest IoU >= 0.50 first, one to one: the confusions off the
   diagonal. (Ultralytics' matrix matches across classes from the start, so a detection of the wrong class with a
   better overlap takes an object that COCO scores as found; here a confusion is only what COCO scored as an error.)

Written by hand: no library builds one on COCO's matching (Ultralytics' and supervision's match class-blind at
their own thresholds, without crowd regions or the cap)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pycocotools import mask as mask_utils

from harness.eval.precision_recall import IOU, coco_match


@dataclass
class ConfusionMatrix:
    """Counts [K + 1, K + 1] over `categories` (K) and background (the last row and column)."""

    categories: list[int]
    counts: np.ndarray
    confidence: float
    iou: float = IOU

    def to_dict(self) -> dict:
        """As the per_class file carries it: the non-zero cells as [ground-truth category, detected category, count]
        (null for background)."""
        ids: list[int | None] = [*self.categories, None]
        rows, cols = np.nonzero(self.counts)
        return {"iou": self.iou, "confidence": self.confidence, "iou_type": "bbox",
                "rows": "ground truth", "columns": "detections", "background": None,
                "cells": [[ids[r], ids[c], int(self.counts[r, c])] for r, c in zip(rows.tolist(), cols.tolist(),
                                                                                    strict=True)]}


def confusion_matrix(coco_gt, image_id: np.ndarray, category_id: np.ndarray, boxes: np.ndarray, score: np.ndarray,
                     image_ids: list[int], confidence: float, cap: int) -> ConfusionMatrix:
    """The matrix of the detections (a results file's columns: image, category, xywh box, score) on `image_ids`
    against `coco_gt`, keeping those scoring >= `confidence`, each (image, category)'s best `cap`."""
    categories = sorted(coco_gt.getCatIds())
    index = {c: k for k, c in enumerate(categories)}
    background = len(categories)
    counts = np.zeros((background + 1, background + 1), dtype=np.int64)
    wanted = set(image_ids)
    # the detections kept at the confidence, per image, then category, highest score first; equal scores in file
    # order (COCOeval's stable sort). Those above the confidence are a prefix of each image and category's list, so
    # its best `cap` among them are the ones COCOeval's cap keeps there.
    # a detection of a category the dataset lacks is not scored (COCOeval evaluates the ground truth's categories)
    candidates = np.flatnonzero((score >= confidence) & np.isin(image_id, image_ids) & np.isin(category_id, categories))
    order = candidates[np.lexsort((-score[candidates], category_id[candidates], image_id[candidates]))]
    per_image: dict[int, list[int]] = {}
    for row in order.tolist():
        per_image.setdefault(int(image_id[row]), []).append(row)
    for image in sorted(wanted):
        rows = per_image.get(image, [])
        truths = coco_gt.imgToAnns.get(image, [])
        kept, leftover_rows = _within_cap(rows, category_id, score, confidence, cap), []
        found = np.zeros(len(truths), dtype=bool)
        for category, detections in kept.items():
            of_class = [g for g, t in enumerate(truths) if t["category_id"] == category]
            if not of_class:
                leftover_rows += detections
                continue
            crowd = np.array([bool(truths[g].get("iscrowd", 0)) for g in of_class])
            ious = _ious(boxes[detections], [truths[g]["bbox"] for g in of_class], crowd)
            true_positive, ignored, took = coco_match(ious, crowd, IOU)
            for d, row in enumerate(detections):
                if true_positive[d]:
                    found[of_class[took[d]]] = True
                    counts[index[category], index[category]] += 1
                elif not ignored[d]:
                    leftover_rows.append(row)
        missed = [g for g, t in enumerate(truths) if not found[g] and not t.get("iscrowd", 0)]
        for g, row in _across_classes(leftover_rows, missed, boxes, score, truths):
            counts[index[truths[g]["category_id"]], index[int(category_id[row])]] += 1
            missed.remove(g)
            leftover_rows.remove(row)
        for g in missed:
            counts[index[truths[g]["category_id"]], background] += 1
        for row in leftover_rows:
            counts[background, index[int(category_id[row])]] += 1
    return ConfusionMatrix(categories, counts, confidence)


def _within_cap(rows: list[int], category_id: np.ndarray, score: np.ndarray, confidence: float,
                cap: int) -> dict[int, list[int]]:
    """An image's detections (rows sorted by category, then score) by category: each category's best `cap`, then
    those scoring >= `confidence` (a prefix of them: thresholding and the cap commute)."""
    kept: dict[int, list[int]] = {}
    for row in rows:
        of_category = kept.setdefault(int(category_id[row]), [])
        if len(of_category) < cap and score[row] >= confidence:
            of_category.append(row)
    return {c: r for c, r in kept.items() if r}


def _ious(detections: np.ndarray, truths: list, crowd: np.ndarray) -> np.ndarray:
    """pycocotools' box IoU (COCOeval's computeIoU for bbox: intersection over the detection's area for a crowd
    region), [detections, truths]."""
    ious = mask_utils.iou(np.asarray(detections, dtype=np.float64).reshape(-1, 4).tolist(),
                          np.asarray(truths, dtype=np.float64).reshape(-1, 4).tolist(), crowd.astype(np.uint8).tolist())
    return np.asarray(ious, dtype=np.float64).reshape(len(detections), len(truths))


def _across_classes(rows: list[int], missed: list[int], boxes: np.ndarray, score: np.ndarray,
                    truths: list) -> list[tuple[int, int]]:
    """One-to-one (ground truth, detection) pairs of an image's leftovers, the highest IoU >= 0.50 first (equal IoUs:
    the higher score, then the earlier ground truth)."""
    if not rows or not missed:
        return []
    ious = _ious(boxes[rows], [truths[g]["bbox"] for g in missed], np.zeros(len(missed), dtype=bool))
    d, g = np.nonzero(ious >= IOU)
    ranked = sorted(zip(d.tolist(), g.tolist(), strict=True),
                    key=lambda pair: (-ious[pair], -score[rows[pair[0]]], pair[1]))
    pairs, used_d, used_g = [], set(), set()
    for di, gi in ranked:
        if di not in used_d and gi not in used_g:
            used_d.add(di)
            used_g.add(gi)
            pairs.append((missed[gi], rows[di]))
    return pairs
