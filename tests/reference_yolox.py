"""An independent, deliberately plain batch-1 YOLOX evaluation: the yardstick for the harness's mAP.

Follows YOLOX's own reference steps (ValTransform letterbox, grid decode, score = obj x cls,
class-aware NMS, divide by the resize ratio) with numpy only and the *unmodified* ONNX file, one
image at a time. Shares no code with harness/.
"""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime as ort


def letterbox(img: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    padded = np.ones((size, size, 3), dtype=np.uint8) * 114
    r = min(size / img.shape[0], size / img.shape[1])
    resized = cv2.resize(img, (int(img.shape[1] * r), int(img.shape[0] * r)), interpolation=cv2.INTER_LINEAR)
    padded[: int(img.shape[0] * r), : int(img.shape[1] * r)] = resized
    return np.ascontiguousarray(padded.transpose(2, 0, 1), dtype=np.float32), r


def decode(out: np.ndarray, size: int) -> np.ndarray:
    grids, strides = [], []
    for s in (8, 16, 32):
        n = size // s
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), s))
    grid, stride = np.concatenate(grids), np.concatenate(strides)
    out = out.copy()
    out[:, :2] = (out[:, :2] + grid) * stride
    out[:, 2:4] = np.exp(out[:, 2:4]) * stride
    return out


def nms(boxes: np.ndarray, scores: np.ndarray, thr: float) -> list[int]:
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1) * (y2 - y1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size:
        i = order[0]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]]))
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]]))
        inter = w * h
        iou = inter / (areas[i] + areas[order[1:]] - inter)
        order = order[1:][iou <= thr]
    return keep


def detect(session: ort.InferenceSession, img: np.ndarray, size: int, conf: float, iou: float, max_det: int):
    x, r = letterbox(img, size)
    out = decode(session.run(None, {session.get_inputs()[0].name: x[None]})[0][0], size)
    cls = out[:, 5:].argmax(1)
    scores = out[:, 4] * out[:, 5:].max(1)
    keep = scores >= conf
    out, cls, scores = out[keep], cls[keep], scores[keep]
    boxes = np.stack([out[:, 0] - out[:, 2] / 2, out[:, 1] - out[:, 3] / 2,
                      out[:, 0] + out[:, 2] / 2, out[:, 1] + out[:, 3] / 2], 1)
    picked = []
    for c in np.unique(cls):
        idx = np.nonzero(cls == c)[0]
        picked += [idx[k] for k in nms(boxes[idx], scores[idx], iou)]
    picked = sorted(picked, key=lambda k: -scores[k])[:max_det]
    return boxes[picked] / r, scores[picked], cls[picked]


def coco_detections(onnx_path, images, coco80_to_91, size=416, conf=0.001, iou=0.6, max_det=300) -> list[dict]:
    """COCO-format detections for [(image_id, path), ...]."""
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    results = []
    for image_id, path in images:
        boxes, scores, cls = detect(session, cv2.imread(str(path)), size, conf, iou, max_det)
        for (x1, y1, x2, y2), s, c in zip(boxes, scores, cls, strict=True):
            results.append({"image_id": image_id, "category_id": coco80_to_91[int(c)],
                            "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)], "score": float(s)})
    return results
