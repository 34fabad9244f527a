"""Post-processing shared by every family: per-image NMS, rescale to the original image, COCO ids."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchvision.ops import batched_nms, clip_boxes_to_image

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


def nms_per_image(cands: Candidates, conf: float, iou: float, max_det: int):
    """Score threshold, class-aware NMS (torchvision batched_nms), keep the best max_det."""
    keep = cands.scores >= conf
    boxes, scores, labels = cands.boxes[keep], cands.scores[keep], cands.labels[keep]
    order = batched_nms(boxes.float(), scores.float(), labels, iou)[:max_det]
    return boxes[order], scores[order], labels[order]


def to_original(boxes: torch.Tensor, transform: ImageTransform) -> torch.Tensor:
    """Undo letterbox/resize and clip to the original image."""
    pad = boxes.new_tensor([transform.pad[0], transform.pad[1]] * 2)
    ratio = boxes.new_tensor([transform.ratio[0], transform.ratio[1]] * 2)
    return clip_boxes_to_image((boxes - pad) / ratio, transform.orig_size)
