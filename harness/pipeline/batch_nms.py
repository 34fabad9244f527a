"""Class-aware NMS of a whole batch in a fixed number of tensor operations, for a GPU.

torchvision's NMS takes one image per call, and on a GPU each call launches its kernels, keeps its boxes by a
one-block scan along the sorted boxes and synchronises to size its output: a batch of 32 is 32 such calls and some
130 Python calls that each take the interpreter lock, which the eager forward's kernel launches need too. No kept
library does NMS for a batch of images at once, so this module does, with torchvision's rule unchanged: sorted by
score, a box is dropped when its IoU with a kept, higher-scoring box of its class exceeds the threshold.

Greedy NMS is the fixed point of `keep[j] = not any(keep[i] and S[i, j] for i before j)`, where S marks the pairs
of the same class whose IoU exceeds the threshold. Starting from every box kept and applying the rule to all boxes at
once reaches that fixed point exactly (Cluster-NMS, Zheng et al., "Enhancing Geometric Factors in Model Learning and
Inference for Object Detection and Instance Segmentation", 2021): after t rounds the first t boxes of each image are
final, and the rounds stop as soon as nothing changes, which takes a handful on detector outputs; an image still
changing after MAX_LOOKS goes to torchvision's NMS by itself. The IoU is torchvision's own arithmetic,
inter / ((area_i + area_j) - inter) in the boxes' dtype, on the boxes as they are (no class offsets added, so no
rounding from them), and equal scores keep the candidates' order (stable sorts), as torchvision's CPU kernel does.

The suppression matrix is images x K x K for K candidates in the most crowded image: images go in chunks whose
matrix fits the scratch budget (scratch.py), and an image with more candidates than fit alone goes to torchvision's
NMS by itself (the same boxes either way; only the cost differs).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from harness.pipeline.nms_kernel import nms
from harness.pipeline.scratch import HOST_BYTES

# Scratch bytes per entry of a chunk's suppression matrix: three float32 temporaries while the IoU is worked out, then
# the matrix in half precision and its booleans
BYTES_PER_ENTRY = 16
# Looks (two rounds each) before an image still changing goes to torchvision's NMS alone: detector outputs settle in
# two to four; a chain of boxes each overlapping only the next takes a round per box
MAX_LOOKS = 8


def nms_whole_batch(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, counts: list[int],
                    iou: float, max_det: int, scratch: int = HOST_BYTES) -> torch.Tensor:
    """Indices of the candidates kept by class-aware NMS in each image, each image's best `max_det`, grouped by image
    in batch order and best first. The candidates are grouped by image in batch order, `counts[i]` of image i.
    `scratch`: the bytes its temporaries may take (scratch.scratch_bytes), which set the chunks of images."""
    entries = scratch // BYTES_PER_ENTRY
    starts = np.concatenate(([0], np.cumsum(counts))).tolist()
    threshold = _below_or_at(iou, boxes.dtype)
    kept: list[torch.Tensor] = []
    first = 0
    while first < len(counts):
        if counts[first] ** 2 > entries:  # too crowded for the matrix: torchvision's NMS on it alone
            lo, hi = starts[first], starts[first + 1]
            kept.append(_one_image(boxes[lo:hi], scores[lo:hi], labels[lo:hi], iou)[:max_det] + lo)
            first += 1
            continue
        last, widest = first, 0  # the chunk: images first .. last - 1
        while last < len(counts) and (last - first + 1) * max(widest, counts[last]) ** 2 <= entries:
            widest = max(widest, counts[last])
            last += 1
        if widest:
            lo, hi = starts[first], starts[last]
            whole = lo == 0 and hi == len(scores)  # most batches: one chunk, no slicing
            chunk = (boxes, scores, labels) if whole else (boxes[lo:hi], scores[lo:hi], labels[lo:hi])
            found = _chunk(*chunk, counts[first:last], iou, threshold, max_det)
            kept.append(found if whole else found + lo)
        first = last
    if len(kept) == 1:
        return kept[0]
    return torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long, device=boxes.device)


def _one_image(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou: float) -> torch.Tensor:
    """torchvision's NMS on each class of one image, by decreasing score (its batched_nms without the offsets)."""
    kept = [torch.nonzero(labels == c).squeeze(1) for c in labels.unique().tolist()]
    kept = [members[nms(boxes[members], scores[members], iou)] for members in kept]
    keep = torch.cat(kept).sort().values if kept else torch.zeros(0, dtype=torch.long, device=boxes.device)
    return keep[torch.argsort(scores[keep], descending=True, stable=True)]  # equal scores in the candidates' order


@cache
def _below_or_at(threshold: float, dtype: torch.dtype) -> float:
    """The largest value of `dtype` at or below `threshold`: `ratio > it` in `dtype` is torchvision's CPU comparison
    of a ratio in the boxes' dtype with the threshold as a double (0.6 rounds up to float32 0.60000002, and a ratio
    of exactly that suppresses there)."""
    value = torch.tensor(threshold, dtype=dtype)
    if value.item() > threshold:
        value = torch.nextafter(value, torch.tensor(-torch.inf, dtype=dtype))
    return value.item()


def _chunk(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, counts: list[int], iou: float,
           threshold: float, max_det: int) -> torch.Tensor:
    """nms_whole_batch on one chunk of images, through the suppression matrix (module docstring). The layout is
    worked out on the host (numpy: no device work, no tensor call) and goes up in one copy."""
    device, n_images, width = boxes.device, len(counts), max(counts)
    # each candidate's slot in a row of `width` per image
    starts = np.repeat(np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
    slots = np.repeat(np.arange(n_images) * width, counts) + np.arange(len(starts)) - starts
    slot = torch.from_numpy(slots).to(device, non_blocking=True)
    # each image's candidates sorted by score; the padding sorts last and is never kept
    padded = torch.full((n_images * width,), -torch.inf, dtype=scores.dtype, device=device)
    padded[slot] = scores
    order = torch.argsort(padded.view(n_images, width), dim=1, descending=True, stable=True)
    index = torch.full((n_images * width,), -1, dtype=torch.long, device=device)
    index[slot] = torch.arange(len(starts), device=device)
    index = index.view(n_images, width).gather(1, order)
    valid = index >= 0
    safe = index.clamp(min=0)
    picked = boxes[safe]
    # row i (the higher score) against column j, torchvision's arithmetic: [n, K, 1] against [n, 1, K]
    x1, y1, x2, y2 = picked.unsqueeze(2).unbind(-1)
    x1_, y1_, x2_, y2_ = picked.unsqueeze(1).unbind(-1)
    area = (x2 - x1).mul_(y2 - y1)
    inter = torch.minimum(x2, x2_).sub_(torch.maximum(x1, x1_))
    height = torch.minimum(y2, y2_).sub_(torch.maximum(y1, y1_))
    inter.clamp_(min=0).mul_(height.clamp_(min=0))
    del height
    union = (area + area.mT).sub_(inter)
    suppresses = inter.div_(union) > threshold  # [n, K, K]: i suppresses j, if i is kept, j after i, same class
    del inter, union
    suppresses &= torch.ones(width, width, dtype=torch.bool, device=device).triu_(1)
    lab = labels[safe]
    suppresses &= lab.unsqueeze(2) == lab.unsqueeze(1)
    # A round is one batched product: the kept as 0/1 rows [n, 1, K] times the matrix counts, for each box, the kept
    # boxes suppressing it, and a box stays kept where that count is 0 (exact in half precision: a sum of ones and
    # zeros is 0 only when every term is). A padding slot is never kept (not valid), so it suppresses nothing.
    matrix = suppresses.to(torch.float16 if device.type == "cuda" else torch.float32)
    del suppresses
    valid_row = valid.unsqueeze(1).to(matrix.dtype)
    keep = valid_row
    for _ in range(MAX_LOOKS):
        # two rounds per look: a round at the fixed point changes nothing, and each look waits for the device
        once = valid_row * (torch.bmm(keep, matrix) == 0)
        keep = valid_row * (torch.bmm(once, matrix) == 0)
        if torch.equal(once, keep):
            unsettled = []
            break
    else:  # an image whose rounds still change it (a long chain of boxes each suppressing the next): torchvision's
        unsettled = (once != keep).any(dim=2).squeeze(1).nonzero().squeeze(1).tolist()
    keep = keep.squeeze(1).bool()
    if unsettled:
        keep[unsettled] = False
    keep &= torch.cumsum(keep, dim=1) <= max_det
    rows, columns = keep.nonzero(as_tuple=True)  # row-major: grouped by image, best first
    kept = index[rows, columns]
    if not unsettled:
        return kept
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()  # image i's candidates: bounds[i] .. bounds[i + 1]
    alone = [_one_image(boxes[bounds[i]:bounds[i + 1]], scores[bounds[i]:bounds[i + 1]],
                        labels[bounds[i]:bounds[i + 1]], iou)[:max_det] + bounds[i] for i in unsettled]
    image = torch.cat([rows, *(torch.full_like(found, i) for i, found in zip(unsettled, alone, strict=True))])
    return torch.cat([kept, *alone])[torch.argsort(image, stable=True)]  # grouped by image again, best first
