"""Matching two detection sets of the same images (batch invariance, run comparison)."""

from __future__ import annotations

import numpy as np
import torch
from pycocotools import mask as mask_utils
from torchvision.ops import box_iou

from harness.records import ImageDetections, MatchReport


def _match_image(a: ImageDetections, b: ImageDetections, iou_thr: float, tol: float,
                 mask_thr: float | None) -> tuple[int, float]:
    """Greedy one-to-one matching in score order: same class, IoU >= thr, |score delta| <= tol (and, with
    `mask_thr` where both have masks, mask IoU >= it). Detections only ever match within their class, so each
    class is matched on its own (the same greedy result, without the IoU of every cross-class pair)."""
    matched, worst = 0, 0.0
    masks = mask_thr is not None and a.masks is not None and b.masks is not None
    for label in np.intersect1d(a.labels, b.labels):
        rows, cols = np.flatnonzero(a.labels == label), np.flatnonzero(b.labels == label)
        mask_ok = None
        if masks:
            masks_a, masks_b = [a.masks[i] for i in rows], [b.masks[j] for j in cols]
            mask_iou = np.asarray(mask_utils.iou(masks_a, masks_b, [0] * len(cols)),
                                  dtype=np.float64).reshape(len(rows), len(cols))
            # two empty masks are the same mask (pycocotools gives their IoU as 0)
            empty_a, empty_b = mask_areas(masks_a) == 0, mask_areas(masks_b) == 0
            mask_ok = (mask_iou >= mask_thr) | (empty_a[:, None] & empty_b[None, :])
        m, w = _match_class(a.boxes[rows], a.scores[rows], b.boxes[cols], b.scores[cols], iou_thr, tol, mask_ok)
        matched, worst = matched + m, max(worst, w)
    return matched, worst


def mask_areas(rles: list[dict]) -> np.ndarray:
    """Pixel count of each COCO RLE. One at a time: pycocotools' `area` of a list overflows past 255 masks."""
    return np.array([mask_utils.area(r) for r in rles], dtype=np.int64)


def _match_class(boxes_a: np.ndarray, scores_a: np.ndarray, boxes_b: np.ndarray, scores_b: np.ndarray,
                 iou_thr: float, tol: float, mask_ok: np.ndarray | None = None) -> tuple[int, float]:
    """One class: a detection with one candidate that no other detection wants is matched without the loop
    (greedy matches them the same); batch-invariant cells are almost all such pairs."""
    ta, tb = torch.from_numpy(boxes_a).double(), torch.from_numpy(boxes_b).double()
    iou = box_iou(ta, tb)
    # a box clipped to zero area has IoU 0/0 = NaN even with itself: identical boxes match exactly
    identical = (ta[:, None, :] == tb[None, :, :]).all(dim=-1)
    iou = torch.where(identical, torch.ones_like(iou), torch.nan_to_num(iou, nan=0.0)).numpy()
    delta = np.abs(scores_a.astype(np.float64)[:, None] - scores_b.astype(np.float64)[None, :])
    ok = (iou >= iou_thr) & (delta <= tol)
    if mask_ok is not None:
        ok &= mask_ok
    per_row, per_col = ok.sum(1), ok.sum(0)
    first = ok.argmax(1)
    alone = (per_row == 1) & (per_col[first] == 1)  # each other's only candidate
    matched = int(alone.sum())
    worst = float(delta[alone, first[alone]].max()) if matched else 0.0
    taken = np.zeros(len(scores_b), dtype=bool)
    taken[first[alone]] = True
    contested = ~alone & (per_row > 0)
    for i in np.argsort(-scores_a, kind="stable"):
        if not contested[i]:
            continue
        candidates = np.flatnonzero(ok[i] & ~taken)
        if candidates.size:
            j = candidates[np.argmax(iou[i, candidates])]
            taken[j] = True
            matched += 1
            worst = max(worst, float(delta[i, j]))
    return matched, worst


def match_detections(a: list[ImageDetections], b: list[ImageDetections], iou_threshold: float = 0.99,
                     score_tolerance: float = 1e-3, mask_iou_threshold: float | None = None) -> MatchReport:
    """Compare detections of the images both sets cover; with `mask_iou_threshold`, a pair whose images both
    carry masks also needs that mask IoU (pycocotools' RLE IoU)."""
    by_id = {d.image_id: d for d in b}
    matched = n_a = n_b = images = 0
    worst = 0.0
    for det_a in a:
        det_b = by_id.get(det_a.image_id)
        if det_b is None:
            continue
        images += 1
        n_a += len(det_a.scores)
        n_b += len(det_b.scores)
        m, w = _match_image(det_a, det_b, iou_threshold, score_tolerance, mask_iou_threshold)
        matched += m
        worst = max(worst, w)
    with_masks = mask_iou_threshold is not None and any(d.masks is not None for d in a)
    return MatchReport(images, n_a, n_b, matched, worst, iou_threshold, score_tolerance,
                       mask_iou_threshold if with_masks else None)
