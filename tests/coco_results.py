"""COCO results (dicts, as json.loads gives them) grouped per image: the plain reading tests compare against."""

from __future__ import annotations

import numpy as np

from harness.records import ImageDetections


def detections_from_coco(results: list[dict]) -> list[ImageDetections]:
    """COCO-format results (bbox xywh, and `segmentation` RLEs where every result of an image has one) -> per-image
    detections; labels are the COCO category ids."""
    grouped: dict[int, list[dict]] = {}
    for r in results:
        grouped.setdefault(r["image_id"], []).append(r)
    out = []
    for image_id, rows in grouped.items():
        xywh = np.array([r["bbox"] for r in rows], dtype=np.float64).reshape(-1, 4)
        boxes = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        masks = [r["segmentation"] for r in rows] if all("segmentation" in r for r in rows) else None
        out.append(ImageDetections(image_id, boxes, np.array([r["score"] for r in rows]),
                                   np.array([r["category_id"] for r in rows]), masks))
    return out
