"""Post-processing shared by every family: per-image NMS, rescale to the original image, COCO ids.

Everything but the NMS kernel runs once per batch on the concatenated candidates of all images, so
the only per-image work is one `torchvision.ops.nms` call, which releases the GIL and can therefore
run on a thread pool. (Fewer tensor ops alone did not measurably shorten the stage: its time is in
the NMS kernel and in the decode's large reductions.)
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
import torch
from torchvision.ops import nms

from harness.models.protocol import Candidates
from harness.pipeline.preprocess import ImageTransform


@dataclass
class ImageDetections:
    """Final detections of one image, in original-image pixels (xyxy)."""

    image_id: int
    boxes: np.ndarray  # [K, 4] float32
    scores: np.ndarray  # [K]
    labels: np.ndarray  # [K] contiguous class index

    def to_coco(self, class_map: tuple[int, ...]) -> list[dict]:
        """COCO results format: bbox [x, y, w, h], category_id in the 91-id scheme."""
        out = []
        for (x1, y1, x2, y2), score, label in zip(self.boxes.tolist(), self.scores.tolist(),
                                                   self.labels.tolist(), strict=True):
            out.append({"image_id": self.image_id, "category_id": class_map[label],
                        "bbox": [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)],
                        "score": round(score, 6)})
        return out


@dataclass
class BatchCandidates:
    """The candidates of every image of a batch, concatenated, grouped by image in batch order."""

    boxes: torch.Tensor  # [N, 4] xyxy, input-tensor pixels
    scores: torch.Tensor  # [N]
    labels: torch.Tensor  # [N] contiguous class index
    image: torch.Tensor  # [N] index of the image in the batch
    counts: list[int]  # candidates per image

    @classmethod
    def from_images(cls, candidates: Sequence[Candidates], conf: float) -> BatchCandidates:
        """Concatenate per-image candidates and apply the score threshold."""
        boxes = torch.cat([c.boxes for c in candidates]).float()
        scores = torch.cat([c.scores for c in candidates]).float()
        labels = torch.cat([c.labels for c in candidates])
        sizes = torch.tensor([c.scores.shape[0] for c in candidates], device=boxes.device)
        image = torch.repeat_interleave(torch.arange(len(candidates), device=boxes.device), sizes)
        keep = (scores >= conf).nonzero().squeeze(1)
        image = image[keep]
        return cls(boxes[keep], scores[keep], labels[keep], image,
                   torch.bincount(image, minlength=len(candidates)).tolist())


def nms_batch(cands: BatchCandidates, iou: float, max_det: int, executor: Executor | None = None) -> BatchCandidates:
    """Class-aware NMS per image, each image's best `max_det` kept, best first.

    Same result as `torchvision.ops.batched_nms` on each image: its coordinate trick (boxes of
    class c shifted by c x (that image's largest coordinate + 1), then one `torchvision.ops.nms`),
    with the shifts computed for the whole batch at once. (batched_nms itself falls back to a
    Python loop over classes above 1000 boxes on CPU: slower here, and it holds the GIL.)
    With an executor, images' NMS kernels run in parallel (the kernel releases the GIL).
    """
    n_images = len(cands.counts)
    if cands.scores.numel() == 0:
        return cands
    per_box_max = cands.boxes.max(dim=1).values
    image_max = torch.zeros(n_images, dtype=per_box_max.dtype, device=per_box_max.device)
    image_max.scatter_reduce_(0, cands.image, per_box_max, reduce="amax", include_self=False)
    offsets = cands.labels.to(cands.boxes) * (image_max + torch.tensor(1).to(cands.boxes))[cands.image]
    shifted = cands.boxes + offsets[:, None]
    starts = np.concatenate(([0], np.cumsum(cands.counts)[:-1])).tolist()

    def one(i: int) -> torch.Tensor:
        start, count = starts[i], cands.counts[i]
        return nms(shifted[start:start + count], cands.scores[start:start + count], iou)[:max_det] + start

    images = [i for i in range(n_images) if cands.counts[i]]
    if executor is not None and len(images) > 1:
        by_size = sorted(images, key=lambda i: -cands.counts[i])  # most crowded first: workers finish together
        kept = dict(zip(by_size, executor.map(one, by_size), strict=True))
        keep = torch.cat([kept[i] for i in images])
    else:
        keep = torch.cat([one(i) for i in images])
    image = cands.image[keep]
    return BatchCandidates(cands.boxes[keep], cands.scores[keep], cands.labels[keep], image,
                           torch.bincount(image, minlength=n_images).tolist())


def to_original(cands: BatchCandidates, transforms: Sequence[ImageTransform]) -> torch.Tensor:
    """Undo each image's letterbox/resize and clip to it: torchvision's clip_boxes_to_image per image,
    written as one clamp with per-box limits so the whole batch is two tensor ops."""
    table = torch.tensor([[t.pad[0], t.pad[1], t.ratio[0], t.ratio[1], t.orig_size[1], t.orig_size[0]]
                          for t in transforms], dtype=cands.boxes.dtype, device=cands.boxes.device)
    rows = table[cands.image]
    pad, ratio, limit = rows[:, 0:2].repeat(1, 2), rows[:, 2:4].repeat(1, 2), rows[:, 4:6].repeat(1, 2)
    return torch.minimum(((cands.boxes - pad) / ratio).clamp_(min=0), limit)


def split_by_image(cands: BatchCandidates, boxes: torch.Tensor, image_ids: Sequence[int]) -> list[ImageDetections]:
    """One ImageDetections per image of the batch (host numpy arrays)."""
    cuts = np.cumsum(cands.counts)[:-1]
    per_image = zip(image_ids, np.split(boxes.cpu().numpy(), cuts), np.split(cands.scores.cpu().numpy(), cuts),
                    np.split(cands.labels.cpu().numpy(), cuts), strict=True)
    return [ImageDetections(image_id, b, s, lab) for image_id, b, s, lab in per_image]
