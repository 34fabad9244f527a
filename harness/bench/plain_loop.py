"""The yardstick of `make bench-run`: a plain batch-1 YOLOX loop doing the same accuracy work as
`va-bench run` (decode, letterbox, ONNX Runtime, grid decode, class-aware NMS, COCO mAP with pycocotools),
written the way a user would write it, and sharing no code with the harness (it imports nothing from
harness/): cv2 letterbox, its own grid decode, `torchvision.ops.batched_nms`, pycocotools.

    python -m harness.bench.plain_loop [--coco-dir DIR] [--onnx FILE] [--limit N]

Prints one JSON line: images, mAP (pycocotools stats[0], stats[1]), wall seconds from interpreter start.
"""

import time

START = time.perf_counter()  # before the heavy imports: they are part of what the loop costs

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from pycocotools.coco import COCO  # noqa: E402
from pycocotools.cocoeval import COCOeval  # noqa: E402
from torchvision.ops import batched_nms  # noqa: E402

SIZE = 416
STRIDES = (8, 16, 32)
CONF, IOU, MAX_DET = 0.001, 0.6, 300  # the site's protocol


def letterbox(image: np.ndarray) -> tuple[np.ndarray, float]:
    """YOLOX's ValTransform: resize by the long side into the top-left of a 114-grey square, BGR, 0-255."""
    r = min(SIZE / image.shape[0], SIZE / image.shape[1])
    resized = cv2.resize(image, (int(image.shape[1] * r), int(image.shape[0] * r)), interpolation=cv2.INTER_LINEAR)
    canvas = np.full((SIZE, SIZE, 3), 114, dtype=np.uint8)
    canvas[: resized.shape[0], : resized.shape[1]] = resized
    return np.ascontiguousarray(canvas.transpose(2, 0, 1), dtype=np.float32)[None], r


def grid() -> np.ndarray:
    """(x, y, stride) of every anchor, strides 8/16/32, row-major: the head's output order."""
    parts = []
    for s in STRIDES:
        n = SIZE // s
        ys, xs = np.mgrid[0:n, 0:n]
        parts.append(np.stack([xs.ravel(), ys.ravel(), np.full(n * n, s)], 1))
    return np.concatenate(parts).astype(np.float32)


def detect(session: ort.InferenceSession, image: np.ndarray, anchors: np.ndarray):
    x, r = letterbox(image)
    out = session.run(None, {session.get_inputs()[0].name: x})[0][0]  # [N, 85]
    xy = (out[:, :2] + anchors[:, :2]) * anchors[:, 2:3]
    wh = np.exp(out[:, 2:4]) * anchors[:, 2:3]
    cls_scores = out[:, 5:] * out[:, 4:5]
    labels = cls_scores.argmax(1)
    scores = cls_scores[np.arange(len(labels)), labels]
    keep = scores >= CONF
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)[keep]
    boxes_t = torch.from_numpy(boxes)
    scores_t, labels_t = torch.from_numpy(scores[keep]), torch.from_numpy(labels[keep])
    kept = batched_nms(boxes_t, scores_t, labels_t, IOU)[:MAX_DET]
    h, w = image.shape[:2]
    final = (boxes_t[kept] / r).numpy()
    final[:, 0::2] = final[:, 0::2].clip(0, w)
    final[:, 1::2] = final[:, 1::2].clip(0, h)
    return final, scores_t[kept].numpy(), labels_t[kept].numpy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--coco-dir", default=os.environ.get("VA_BENCH_COCO", "../shared/assets/coco"))
    parser.add_argument("--onnx", default=os.environ.get("VA_BENCH_YOLOX_NANO",
                                                         "../shared/assets/onnx/yolox_nano.onnx"))
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    root = Path(args.coco_dir)
    annotations = next(p for p in (root / "annotations" / "instances_val2017.json",
                                   root / "annotations" / "instances_val2017_subset.json") if p.is_file())
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(annotations))
    image_ids = sorted(coco.getImgIds())[: args.limit]
    category_ids = sorted(coco.getCatIds())  # the 80 contiguous classes -> COCO's 91-id scheme
    session = ort.InferenceSession(args.onnx, providers=["CPUExecutionProvider"])
    anchors = grid()
    results = []
    for image_id in image_ids:
        image = cv2.imread(str(root / "val2017" / coco.imgs[image_id]["file_name"]))
        boxes, scores, labels = detect(session, image, anchors)
        for (x1, y1, x2, y2), s, c in zip(boxes.tolist(), scores.tolist(), labels.tolist(), strict=True):
            results.append({"image_id": image_id, "category_id": category_ids[c], "bbox": [x1, y1, x2 - x1, y2 - y1],
                            "score": s})
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = COCOeval(coco, coco.loadRes(results), "bbox")
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    print(json.dumps({"images": len(image_ids), "detections": len(results), "mAP_50_95": evaluator.stats[0],
                      "mAP_50": evaluator.stats[1], "wall_s": time.perf_counter() - START}))


if __name__ == "__main__":
    main()
