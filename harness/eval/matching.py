"""Matching two detection sets of the same images (batch invariance, run comparison)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pycocotools import mask as mask_utils

from harness.records import ImageDetections, MatchReport


def match_detections(a: list[ImageDetections], b: list[ImageDetections], iou_threshold: float = 0.99,
                     score_tolerance: float = 1e-3, mask_iou_threshold: float | None = None) -> MatchReport:
    """Compare detections of the images both sets cover: greedy one-to-one matching in score order, per image and
    class, of pairs with IoU >= `iou_threshold` and |score delta| <= `score_tolerance`; with `mask_iou_threshold`,
    a pair whose images both carry masks also needs that mask IoU (pycocotools' RLE IoU).

    Only pairs of the same image and class with scores within the tolerance are ever candidates, so they are listed
    for 64 images at once and their IoUs computed as vectors (not a loop over images and classes)."""
    by_id = {d.image_id: d for d in b}
    pairs = [(d, by_id[d.image_id]) for d in a if d.image_id in by_id]
    with_masks = mask_iou_threshold is not None and any(d.masks is not None for d in a)
    matched, worst = 0, 0.0
    for start in range(0, len(pairs), CHUNK_IMAGES):
        m, w = _match_images(pairs[start:start + CHUNK_IMAGES], iou_threshold, score_tolerance,
                             mask_iou_threshold if with_masks else None)
        matched, worst = matched + m, max(worst, w)
    return MatchReport(len(pairs), sum(len(p[0].scores) for p in pairs), sum(len(p[1].scores) for p in pairs),
                       matched, worst, iou_threshold, score_tolerance, mask_iou_threshold if with_masks else None)


# Images matched in one pass: with a loose score tolerance a crowded image has ~10^4 same-class pairs
CHUNK_IMAGES = 64


def _match_images(pairs: list[tuple[ImageDetections, ImageDetections]], iou_threshold: float,
                  score_tolerance: float, mask_iou_threshold: float | None) -> tuple[int, float]:
    """(matched, largest score delta of a match) over some images' detection pairs."""
    side_a, side_b = _Side.of([p[0] for p in pairs]), _Side.of([p[1] for p in pairs])
    rows, cols = _candidate_pairs(side_a, side_b, score_tolerance)
    iou = _pair_iou(side_a.boxes[rows], side_b.boxes[cols])
    delta = np.abs(side_a.scores[rows] - side_b.scores[cols])
    ok = iou >= iou_threshold
    if mask_iou_threshold is not None:
        ok &= _masks_agree(pairs, side_a, side_b, rows, cols, mask_iou_threshold)
    return _greedy(rows[ok], cols[ok], iou[ok], delta[ok], side_a.scores, len(side_b.scores))


@dataclass
class _Side:
    """One detection set's images concatenated: float64 boxes and scores, and each detection's (image, class)
    group as one integer."""

    boxes: np.ndarray
    scores: np.ndarray
    group: np.ndarray
    image: np.ndarray  # position of its image in the list
    index: np.ndarray  # its row within its image

    @classmethod
    def of(cls, images: list[ImageDetections]) -> _Side:
        counts = np.array([len(d.scores) for d in images], dtype=np.int64)
        image = np.repeat(np.arange(len(images)), counts)
        index = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        if not len(image):
            return cls(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), image, index)
        labels = np.concatenate([d.labels for d in images]).astype(np.int64)
        return cls(np.concatenate([d.boxes for d in images]).astype(np.float64),
                   np.concatenate([d.scores for d in images]).astype(np.float64),
                   image * (1 << 32) + labels, image, index)


def _candidate_pairs(a: _Side, b: _Side, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """Every (row of a, row of b) of the same group whose scores are within `tol`, grouped by row of a, each row's
    b rows in their original order. One sorted key per detection, its group's dense rank spaced wider than any
    score window plus the score, so a window of the key never reaches another group: at the usual tolerance of
    1e-3 a detection has one or two candidates, not its whole class (1.4 million pairs -> ~30 thousand for a
    cell of the sample)."""
    groups = np.unique(np.concatenate([a.group, b.group]))
    scores = np.concatenate([a.scores, b.scores])
    spacing = (float(scores.max() - scores.min()) if len(scores) else 0.0) + 2 * tol + 1.0
    key_a = np.searchsorted(groups, a.group) * spacing + a.scores
    key_b = np.searchsorted(groups, b.group) * spacing + b.scores
    order = np.argsort(key_b, kind="stable")
    sorted_b = key_b[order]
    margin = tol + 1e-9 * spacing * len(groups)  # the key's float rounding; the exact test comes after
    lo, hi = np.searchsorted(sorted_b, key_a - margin, "left"), np.searchsorted(sorted_b, key_a + margin, "right")
    counts = hi - lo
    rows = np.repeat(np.arange(len(key_a)), counts)
    cols = order[lo[rows] + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)]
    keep = (a.group[rows] == b.group[cols]) & (np.abs(a.scores[rows] - b.scores[cols]) <= tol)
    rows, cols = rows[keep], cols[keep]
    by_row = np.lexsort((cols, rows))
    return rows[by_row], cols[by_row]


def _pair_iou(boxes_a: np.ndarray, boxes_b: np.ndarray) -> np.ndarray:
    """IoU of each pair (torchvision's box_iou, pairwise, float64). A box clipped to zero area has IoU 0/0 = NaN
    even with itself: identical boxes are IoU 1, other NaNs 0."""
    area_a = (boxes_a[:, 2] - boxes_a[:, 0]) * (boxes_a[:, 3] - boxes_a[:, 1])
    area_b = (boxes_b[:, 2] - boxes_b[:, 0]) * (boxes_b[:, 3] - boxes_b[:, 1])
    wh = np.clip(np.minimum(boxes_a[:, 2:], boxes_b[:, 2:]) - np.maximum(boxes_a[:, :2], boxes_b[:, :2]), 0, None)
    inter = wh[:, 0] * wh[:, 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        iou = inter / (area_a + area_b - inter)
    return np.where((boxes_a == boxes_b).all(axis=1), 1.0, np.nan_to_num(iou, nan=0.0))


def _masks_agree(pairs: list[tuple[ImageDetections, ImageDetections]], side_a: _Side, side_b: _Side,
                 rows: np.ndarray, cols: np.ndarray, threshold: float) -> np.ndarray:
    """Per pair: mask IoU >= threshold, or both masks empty (pycocotools gives two empty masks IoU 0), or True
    where either image has no masks. One pycocotools call per (image, class) group."""
    agree = np.ones(len(rows), dtype=bool)
    if not len(rows):
        return agree
    starts = np.flatnonzero(np.r_[True, np.diff(side_a.group[rows]) != 0])
    for start, end in zip(starts, [*starts[1:], len(rows)], strict=True):
        det_a, det_b = pairs[side_a.image[rows[start]]]
        if det_a.masks is None or det_b.masks is None:
            continue
        block_rows, block_cols = rows[start:end], cols[start:end]
        ra, ca = np.unique(side_a.index[block_rows]), np.unique(side_b.index[block_cols])
        masks_a, masks_b = [det_a.masks[i] for i in ra], [det_b.masks[j] for j in ca]
        iou = np.asarray(mask_utils.iou(masks_a, masks_b, [0] * len(ca)), dtype=np.float64).reshape(len(ra), len(ca))
        empty = (mask_areas(masks_a) == 0)[:, None] & (mask_areas(masks_b) == 0)[None, :]
        good = (iou >= threshold) | empty
        agree[start:end] = good[np.searchsorted(ra, side_a.index[block_rows]),
                                np.searchsorted(ca, side_b.index[block_cols])]
    return agree


def mask_areas(rles: list[dict]) -> np.ndarray:
    """Pixel count of each COCO RLE. One at a time: pycocotools' `area` of a list overflows past 255 masks."""
    return np.array([mask_utils.area(r) for r in rles], dtype=np.int64)


def _greedy(rows: np.ndarray, cols: np.ndarray, iou: np.ndarray, delta: np.ndarray, scores_a: np.ndarray,
            n_b: int) -> tuple[int, float]:
    """Greedy matching over the candidate pairs (rows of a, cols of b, grouped by row, each row's cols in their
    original order). A detection with one candidate that no other detection wants is matched without the loop
    (greedy matches them the same); batch-invariant cells are almost all such pairs. The rest in score order,
    each taking its free candidate of highest IoU (the first of equal ones)."""
    per_row, per_col = np.bincount(rows, minlength=len(scores_a)), np.bincount(cols, minlength=n_b)
    alone = (per_row[rows] == 1) & (per_col[cols] == 1)  # each other's only candidate
    matched = int(alone.sum())
    worst = float(delta[alone].max()) if matched else 0.0
    taken = np.zeros(n_b, dtype=bool)
    taken[cols[alone]] = True
    rest = ~alone
    if not rest.any():
        return matched, worst
    rows, cols, iou, delta = rows[rest], cols[rest], iou[rest], delta[rest]
    starts = np.searchsorted(rows, np.arange(len(scores_a) + 1))
    for i in np.unique(rows)[np.argsort(-scores_a[np.unique(rows)], kind="stable")]:
        lo, hi = starts[i], starts[i + 1]
        free = np.flatnonzero(~taken[cols[lo:hi]])
        if free.size:
            k = lo + free[np.argmax(iou[lo:hi][free])]
            taken[cols[k]] = True
            matched += 1
            worst = max(worst, float(delta[k]))
    return matched, worst
