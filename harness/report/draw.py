"""Images with their detections drawn (outputs/<run_id>/images/)."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from harness.records import ImageDetections

MIN_SCORE = 0.3
MASK_OPACITY = 0.45


def draw_detections(path: Path, detections: ImageDetections, class_names: tuple[str | None, ...]) -> bytes:
    """JPEG bytes of the image with boxes scoring >= 0.3 and their class names (the label where unnamed); a
    segmentation model's masks are shaded under their boxes, one colour per detection."""
    # read as bytes, then decoded: cv2.imread cannot open a non-ASCII path on Windows (C:\Users\José\...)
    try:
        image = cv2.imdecode(np.fromfile(path, dtype=np.uint8), cv2.IMREAD_COLOR)
    except OSError:
        image = None
    if image is None:
        raise ValueError(f"{path} could not be decoded for drawing")
    if detections.masks is not None:
        palette = np.random.default_rng(0)
        for k in np.flatnonzero(detections.scores >= MIN_SCORE):
            on = mask_utils.decode(detections.masks[k]).astype(bool)
            colour = palette.integers(64, 256, 3)
            image[on] = ((1 - MASK_OPACITY) * image[on] + MASK_OPACITY * colour).astype(np.uint8)
    for box, score, label in zip(detections.boxes, detections.scores, detections.labels, strict=True):
        if score < MIN_SCORE:
            continue
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        name = class_names[label] or str(label)
        cv2.rectangle(image, (x1, y1), (x2, y2), (0, 200, 0), 2)
        cv2.putText(image, f"{name} {score:.2f}", (x1, max(y1 - 4, 10)), cv2.FONT_HERSHEY_SIMPLEX, 0.45,
                    (0, 200, 0), 1, cv2.LINE_AA)
    ok, encoded = cv2.imencode(".jpg", image)
    return encoded.tobytes()
