"""Matching two detection sets of the same images (batch invariance, run comparison)."""

from __future__ import annotations

import torch
from torchvision.ops import box_iou

from harness.records import ImageDetections, MatchReport


def _match_image(a: ImageDetections, b: ImageDetections, iou_thr: float, tol: float) -> tuple[int, float]:
    """Greedy one-to-one matching in score order: same class, IoU >= thr, |score delta| <= tol."""
    if len(a.scores) == 0 or len(b.scores) == 0:
        return 0, 0.0
    boxes_a, boxes_b = torch.from_numpy(a.boxes).double(), torch.from_numpy(b.boxes).double()
    iou = box_iou(boxes_a, boxes_b)
    # a box clipped to zero area has IoU 0/0 = NaN even with itself: identical boxes match exactly
    identical = (boxes_a[:, None, :] == boxes_b[None, :, :]).all(dim=-1)
    iou = torch.where(identical, torch.ones_like(iou), torch.nan_to_num(iou, nan=0.0))
    same = torch.from_numpy(a.labels)[:, None] == torch.from_numpy(b.labels)[None, :]
    delta = (torch.from_numpy(a.scores).double()[:, None] - torch.from_numpy(b.scores).double()[None, :]).abs()
    ok = same & (iou >= iou_thr) & (delta <= tol)
    taken = torch.zeros(len(b.scores), dtype=torch.bool)
    matched, worst = 0, 0.0
    for i in torch.argsort(torch.from_numpy(a.scores), descending=True).tolist():
        candidates = (ok[i] & ~taken).nonzero().squeeze(1)
        if candidates.numel():
            j = candidates[torch.argmax(iou[i, candidates])].item()
            taken[j] = True
            matched += 1
            worst = max(worst, float(delta[i, j]))
    return matched, worst


def match_detections(a: list[ImageDetections], b: list[ImageDetections], iou_threshold: float = 0.99,
                     score_tolerance: float = 1e-3) -> MatchReport:
    """Compare detections of the images both sets cover."""
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
        m, w = _match_image(det_a, det_b, iou_threshold, score_tolerance)
        matched += m
        worst = max(worst, w)
    return MatchReport(images, n_a, n_b, matched, worst, iou_threshold, score_tolerance)
